"""Exits and signals: a :class:`fastprof.Profiler` still running when the
process leaves is closed before torch and the interpreter tear down.

Two ways out are covered here (an exception through ``with Profiler()`` or
Lightning's ``on_exception`` is the Profiler's own ``__exit__`` / the
integration's business):

* **Interpreter exit** with a Profiler never stopped (``sys.exit`` or an
  uncaught exception outside ``with``, a forgotten ``stop()``): an ``atexit``
  hook closes it. A ``torch.profiler`` left running at exit crashes the
  process in the C++ static destructors that run after the interpreter is
  gone (``ProfilerStateBase``'s destructor, SIGSEGV); every Python ``atexit``
  hook runs before those, so stopping the window there keeps the job's own
  exit code. The hook is registered after the recorder's (whose own hook
  would otherwise stop the recording under the Profiler's feet): ``atexit``
  runs last-registered first.
* **SIGTERM** (preemption; torchrun tearing a job down): a Python handler
  saves what it can (the open window stopped, its export given a bounded
  wait, the recorder flushed and closed, ``profiler.json`` written; no
  collective, no wait for other ranks, no merge), prints how to merge what is
  there, then does what would have happened without fastprof: the handler
  that was installed before (called as Python would have called it), else
  the default action (SIG_DFL restored and the signal raised again: the
  process dies by SIGTERM). A handler installed after fastprof's replaces
  it, as Python's semantics say; when that handler exits the interpreter,
  the ``atexit`` hook still saves the data. A handler installed after
  fastprof's that calls the one it replaced (a library's chain) stays in
  place when the Profiler stops, so fastprof's under it stays too: each
  installation is its own handler that remembers the job's, and passes the
  signal on to it for the rest of the process. Called from such a chain
  with only the default under it, fastprof's saves and returns: the handler
  on top decides, as it would have with the default under it (Lightning's
  calls the handlers it replaced that are callable, stops training, and
  the job ends normally).

The handler runs on the main thread between two bytecodes of whatever it
interrupted; everything it does is caught (it never raises its own error),
and a Profiler already stopping when the signal lands is left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import warnings
from typing import Any

from fastprof import _signals
from fastprof._loop_api import ExitHost
from fastprof._process import PROCESS
from fastprof.profiler.outputs import merge_command

__all__ = ["SIGNAL_EXPORT_WAIT_S", "register", "unregister"]

#: How long a signal or interpreter exit waits for torch window exports.
SIGNAL_EXPORT_WAIT_S = 10.0

# The Profilers to close and the SIGTERM handler installed: PROCESS.exits.


def register(prof: ExitHost) -> None:
    """``prof`` started: close it at exit or SIGTERM if it is still running."""
    state = PROCESS.exits
    with state.lock:
        state.live.append(prof)
        if not state.atexit_registered:
            atexit.register(_at_exit)
            state.atexit_registered = True
    _install()


def unregister(prof: ExitHost) -> None:
    """``prof`` stopped: forget it; with none left, give SIGTERM back."""
    state = PROCESS.exits
    with state.lock:
        if prof in state.live:
            state.live.remove(prof)
        empty = not state.live
    if empty:
        _uninstall()


def _install() -> None:
    state = PROCESS.exits
    if state.sigterm_handler is not None or threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    try:
        current = signal.getsignal(signal.SIGTERM)
        # SIG_IGN: the job ignores SIGTERM and goes on; None: a handler set
        # from C that Python cannot call on. Both are left alone.
        if current is signal.SIG_IGN or current is None:
            return
        handler = _chained(current)
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        return
    state.sigterm_handler = handler


def _uninstall() -> None:
    state = PROCESS.exits
    handler = state.sigterm_handler
    if handler is None or threading.current_thread() is not threading.main_thread():
        return
    state.sigterm_handler = None
    # A handler installed on top of fastprof's (a library's that calls the
    # one it replaced) stays where it is; fastprof's under it still passes
    # the signal on to the job's own (it remembers it), with nothing left
    # to save. Only when fastprof's is on top is the job's put back.
    previous = handler.previous
    with contextlib.suppress(ValueError, OSError, TypeError):
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)


def _chained(previous: Any) -> Any:
    """A SIGTERM handler that saves every live Profiler, then does what
    ``previous`` (the disposition it replaces) would have done. A new one
    per installation: a handler that a library chained on top of an earlier
    one keeps calling that one, which still knows the job's own handler."""

    def on_sigterm(signum: int, frame: Any) -> None:
        if _signals.held(on_sigterm, signum, frame):
            return  # inside a call into torch.profiler: runs as it returns
        # Read first: saving stops the last Profiler, which gives SIGTERM back.
        on_top = signal.getsignal(signum) is on_sigterm
        _save_all_at_sigterm()
        if callable(previous):
            # The job's own handler decides (its exit, its exception: marked
            # as the job's, so that fastprof code it lands in lets it go on).
            _signals.call_job(previous, signum, frame)
            return
        if not on_top:
            # Called by a handler installed over fastprof's that chains to
            # the one it replaced (Lightning's signal connector): that one
            # decides, as it would have with the default under it, which is
            # nothing to call (Lightning stops training and the job ends
            # normally).
            return
        # The default action: die by the signal, as without fastprof.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    on_sigterm.previous = previous  # type: ignore[attr-defined]
    _signals.own(on_sigterm)
    return on_sigterm


def _live() -> list[ExitHost]:
    state = PROCESS.exits
    with state.lock:
        return list(state.live)


def _close_all(reason: str) -> list[tuple[ExitHost, bool]]:
    """Close every live Profiler; each with whether this call saved it (not
    when it was already being closed, e.g. a signal landing in ``stop()``'s
    wait for exports, or when the close failed)."""
    closed = []
    for prof in reversed(_live()):
        try:
            was_running = prof.running
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                prof.close(reason)
            for w in caught:
                print(f"fastprof: {w.message}".replace("fastprof: fastprof: ", "fastprof: "), file=sys.stderr)
            failed = any("Profiler.stop failed" in str(w.message) for w in caught)
            closed.append((prof, was_running and not failed))
        except Exception as e:  # noqa: BLE001 - exits and signals must go on
            print(f"fastprof: could not save the run at {reason}: {type(e).__name__}: {e}", file=sys.stderr)
    return closed


def _at_exit() -> None:
    _close_all("exit")


def _all_in_store(prof: ExitHost) -> bool:
    """Whether a rank recording to object storage has every file in the
    store: its upload's account says nothing was left in the spool."""
    spool = getattr(prof.recorder, "spool", None)
    result = getattr(spool, "result", None)
    if not isinstance(result, dict) or result.get("error"):
        return False
    left = result.get("left_in_spool") or {}
    return not left.get("files") and result.get("done_object", True) is not False


def _save_all_at_sigterm() -> None:
    try:
        for prof in _live():
            # The flight recorder's last seconds first (issue #17): cheap, and
            # what a preempted job most wants kept.
            if prof.running:
                prof.dump_flight_recorder("sigterm")

        for prof, saved in _close_all("SIGTERM"):
            run_url, rank_url = prof.recorder.options.run_url, prof.recorder.options.rank_url
            if rank_url is not None and not _all_in_store(prof):
                # The store did not take it all (unreachable, a missing extra, out
                # of time): the data is in the local spool, and only there.
                run_url, rank_url = None, None
                spooled = " (the local spool: the upload command is above)"
            else:
                spooled = ""
            place = prof.rank_dir if rank_url is None else rank_url
            where = (
                f"rank {prof.rank}'s data is saved in {place}{spooled}"
                if saved
                else f"rank {prof.rank}'s run was being closed; what is in {place} may be incomplete"
            )
            print(
                f"fastprof: SIGTERM: {where}; build the unified trace with: "
                f"{merge_command(prof.run_dir if run_url is None else run_url)}",
                file=sys.stderr,
                flush=True,
            )
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a signal handler must not raise its own error
        pass
