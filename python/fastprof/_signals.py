"""The job's signal handlers and fastprof, process-wide: what fastprof gives
back, and how a job's handler keeps its outcome when it runs inside fastprof.

**Giving back.** The trigger signal (``kill -USR2 <pid>``,
:mod:`fastprof.profiler.drivers.triggers`) is documented as safe to send to a running
job. Its default action kills the process, so giving the default back when a
Profiler stops would let a late trigger (one sent while the job finishes, or
from a script that loops over ranks) end the job. So when the job had the
default, the signal stays harmless for the rest of the process: a no-op
handler installed at the C level (the interpreter puts Python-level handlers
back to the default early in its finalization, and the teardown of a torch
process is long), with Python's own table set to ``SIG_IGN`` so that the
interpreter leaves it alone. A handler the job had is given back as it was.

**The job's handlers inside fastprof.** Python runs a signal handler on the
main thread between two bytecodes of whatever it interrupted, fastprof's code
included. An exception the job's handler raises there (a ``SIGALRM`` timeout,
a handler that raises to stop training) is the job's, not a profiling
failure: fastprof must not report and swallow it. :func:`is_job` tells them
apart (the handler's frame is in its traceback, or fastprof's chaining
handler marked it). While a Profiler closes, the job's handlers are deferred
(:func:`deferred`): the close completes, then each signal that came is raised
again and its handler runs where the close returns, so both the saved run and
the job's outcome survive. SIGTERM (a preemption must not wait for the save)
and Python's default SIGINT handler (``KeyboardInterrupt`` is not an
``Exception``) are never deferred.

**Critical sections.** fastprof's own SIGTERM handler closes the Profiler,
which stops torch.profiler; landing inside a call into torch.profiler (its
``step()`` between creating the next ``ProfilerStep#N`` annotation and
entering it, say) it found torch half-way and lost the window ("Expected
record to be set"). Such calls run inside :data:`CRITICAL` (main thread,
a few ms at most, seconds for a window's start): fastprof's handler that
lands there is held (:func:`held`) and runs as the section ends, the call
complete.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from fastprof import _core
from fastprof._process import PROCESS

__all__ = ["CRITICAL", "call_job", "deferred", "give_back", "held", "is_job", "job_disposition", "own"]

# The signals made harmless and fastprof's own handlers: PROCESS.signals.
#: The attribute :func:`call_job` sets on an exception the job's handler raised.
_MARK = "_fastprof_job_signal"


def job_disposition(num: int) -> Any:
    """``signal.getsignal(num)``, except that fastprof's own harmless handler
    reads as ``SIG_DFL`` (the job's disposition under it)."""
    current = signal.getsignal(num)
    state = PROCESS.signals
    with state.lock:
        if current is signal.SIG_IGN and num in state.harmless:
            return signal.SIG_DFL
    return current


def give_back(num: int, previous: Any) -> None:
    """Put back what the job had for ``num`` (main thread only): its handler
    as it was, or, for the default, a handler that does nothing for the rest
    of the process. Raises what ``signal.signal`` raises."""
    if previous is not signal.SIG_DFL:
        signal.signal(num, previous)
        return
    # SIG_IGN first: never the default in between, and the interpreter's
    # finalization leaves an ignored signal as it is.
    signal.signal(num, signal.SIG_IGN)
    if _core._signal_harmless(num):
        state = PROCESS.signals
        with state.lock:
            state.harmless.add(num)
    else:
        signal.signal(num, signal.SIG_DFL)


def own(handler: Callable[..., Any]) -> None:
    """Say that ``handler`` (a function; a bound method's function) is fastprof's."""
    state = PROCESS.signals
    with state.lock:
        state.own.add(getattr(handler, "__func__", handler))


def _is_own(handler: Any) -> bool:
    return getattr(handler, "__func__", handler) in PROCESS.signals.own


def call_job(handler: Callable[[int, Any], Any], signum: int, frame: Any) -> None:
    """Call the job's handler from one of fastprof's; what it raises is marked
    as the job's (see :func:`is_job`) and goes on."""
    try:
        handler(signum, frame)
    except BaseException as e:
        with contextlib.suppress(AttributeError, TypeError):
            setattr(e, _MARK, True)
        raise


def _handler_codes() -> set[Any]:
    codes = set()
    for num in signal.valid_signals():
        try:
            h = signal.getsignal(num)
        except (ValueError, OSError):
            continue
        if callable(h) and not _is_own(h):
            code = getattr(getattr(h, "__func__", h), "__code__", None)
            if code is not None:
                codes.add(code)
    return codes


def is_job(e: BaseException, tb: TracebackType | None = None) -> bool:
    """Did the job's own signal handler raise ``e`` (inside fastprof's code,
    which must then let it go on as the job's)? ``tb``: its traceback, when
    not (yet) on the exception (an error fetched in C)."""
    if getattr(e, _MARK, False):
        return True
    tb = tb or e.__traceback__
    if tb is None:
        return False
    codes = _handler_codes()
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold the job's signal handlers while the block runs (the main thread
    only; elsewhere a no-op): a signal that comes is noted, and once the block
    is over each one is raised again for the job's handler, which then runs
    (and raises) where the block ends. See the module docs for what is never
    deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def note(signum: int, frame: Any) -> None:
        if signum not in came:
            came.append(signum)

    held: dict[int, Any] = {}
    for num in signal.valid_signals():
        if num == signal.SIGTERM:
            continue
        try:
            h = signal.getsignal(num)
            if not callable(h) or _is_own(h) or h is signal.default_int_handler:
                continue
            signal.signal(num, note)
        except (ValueError, OSError, TypeError):
            continue
        held[num] = h
    try:
        yield
    finally:
        for signum, h in held.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(signum) is note:
                    signal.signal(signum, h)
        for signum in came:
            if signum in held:
                signal.raise_signal(signum)  # its handler runs now, here


class Critical:
    """A section the main thread's fastprof handlers wait for (see the module
    docs): ``with CRITICAL: ...``. Nested sections count; the outermost one
    runs a held handler as it ends. Other threads pass through."""

    __slots__ = ()

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            PROCESS.signals.critical += 1

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        state = PROCESS.signals
        state.critical -= 1
        if state.critical == 0 and state.held is not None:
            handler, signum, frame = state.held
            state.held = None
            handler(signum, frame)


#: The one instance: a section holds no state of its own.
CRITICAL = Critical()


def held(handler: Callable[[int, Any], Any], signum: int, frame: Any) -> bool:
    """Called first by a fastprof handler: inside a critical section of the
    main thread, note the call (it runs as the section ends) and say so."""
    state = PROCESS.signals
    if state.critical <= 0 or threading.current_thread() is not threading.main_thread():
        return False
    if state.held is None:
        state.held = (handler, signum, frame)
    return True
