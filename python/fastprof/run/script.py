"""``fastprof run``'s run of the code, in this process, as ``python
script.py`` would run it, under a Profiler that :mod:`.zero_code` feeds:

* the code runs in a fresh module that *is* ``sys.modules["__main__"]``
  from then on (pickling ``__main__.X`` for spawned workers, atexit handlers
  reading the script's globals), with the globals of its
  :class:`~fastprof.run.target.Target`;
* stdin, the signal dispositions and ``sys.excepthook`` are the process's;
* the ending mirrors Python's: what Python would print is printed first (an
  exception through ``sys.excepthook`` from the script's own frame, a
  ``sys.exit("message")``'s message), then the Profiler closes, so the
  trace is safe before the caller exits; code that failed before its first
  step leaves nothing (:func:`_discard`).
"""

from __future__ import annotations

import shutil
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from fastprof import _signals
from fastprof._loop_api import RunHost
from fastprof.memory.oom import is_oom
from fastprof.run.target import Target, set_path0
from fastprof.run.zero_code import ZeroCode

__all__ = ["Ended", "print_exception", "run"]


class Ended(NamedTuple):
    """How the code ended, as :func:`run` returns it."""

    #: None when the code ended normally, else what ended it (``SystemExit`` included).
    error: BaseException | None
    #: It failed before its first step (an argparse error, an import that
    #: failed): its files were removed, nothing is recorded.
    discarded: bool = False


def run(target: Target, args: Sequence[str], prof: RunHost) -> Ended:
    """Run ``target`` with ``args`` under ``prof`` (started here, closed
    here). What Python would print is printed first (an exception through
    ``sys.excepthook`` with the traceback from the script's own frame; a
    ``sys.exit("message")``'s message), then the Profiler closes: the trace
    is safe before the caller exits. Code that fails before its first step
    leaves nothing (:func:`_discard`)."""
    sys.argv = [target.argv0, *args]
    if target.path0 is not None:
        set_path0(target.path0)
    main = types.ModuleType("__main__")
    main.__dict__.update(target.main_globals)
    sys.modules["__main__"] = main
    zero = ZeroCode(prof)
    out_dir_made = not prof.run_dir.parent.exists()
    # File times come from the kernel's coarse clock (a tick behind time.time()).
    started = time.time() - 1.0
    prof.start()
    # The script asked for no torch.profiler window: Kineto's log lines of
    # one that a trigger opens are not its output.
    prof.quiet_torch_windows()
    zero.install()
    # A Profiler the script starts itself takes the loop (its steps are the
    # run's): the inferred steps are unhooked then, not counted twice.
    prof.host_run(zero.uninstall)
    ended: BaseException | None = None
    try:
        exec(target.code, main.__dict__)
    except BaseException as e:  # noqa: BLE001 - the script's ending, whatever it is, is handled below
        ended = e
    try:
        if isinstance(ended, SystemExit):
            if ended.code is not None and not isinstance(ended.code, int):
                # Python prints such an exit's message, then exits 1: printed
                # here, before fastprof's own lines.
                print(ended.code, file=sys.stderr, flush=True)
        elif ended is not None:
            print_exception(ended, target.code)
        discard = _failed_before_a_step(prof, zero, ended) and _written_since(prof.rank_dir, started)
        if discard:
            prof.merge_enabled = False  # nor wait for the other ranks: there is nothing to merge
        _close(prof, ended)
        if discard:
            discard = _discard(prof, started, out_dir_made)
    finally:
        zero.uninstall()
    return Ended(ended, discard)


def _failed_before_a_step(prof: RunHost, zero: ZeroCode, ended: BaseException | None) -> bool:
    """The code failed (an exception, a non-zero exit) before any step of
    the run began: before its first optimizer step and before a batch of
    its train loader. An out-of-memory error is kept (its capture is the
    point), and so is a run that a script's own Profiler took over."""
    if ended is None or not prof.running or prof.successor is not None or zero.fetched or prof.batch:
        return False
    if isinstance(ended, SystemExit):
        return ended.code is not None and ended.code != 0
    return not is_oom(ended)


def _written_since(folder: Path, started: float) -> bool:
    """Whether every file in ``folder`` was written since ``started``: a
    resumed run's folder holds the earlier run's files, not this run's."""
    try:
        return all(p.lstat().st_mtime >= started for p in folder.rglob("*") if not p.is_dir())
    except OSError:
        return False


def _discard(prof: RunHost, started: float, out_dir_made: bool) -> bool:
    """Remove what this run wrote (it failed before its first step): this
    rank's folder (every file in it written since ``started``); then the run
    directory and the out_dir when nothing else is in them (the run
    directory's own hidden files, written since ``started``, go with it; the
    out_dir only when this process made it)."""
    rank_dir = prof.rank_dir
    try:
        if not _written_since(rank_dir, started):
            return False
        shutil.rmtree(rank_dir)
        run_dir = prof.run_dir
        left = list(run_dir.iterdir())
        if all(p.name.startswith(".") and p.is_file() and p.lstat().st_mtime >= started for p in left):
            for p in left:
                p.unlink()
            run_dir.rmdir()
            if out_dir_made:
                run_dir.parent.rmdir()
    except OSError:
        pass  # another rank's files, or the user's: left where they are
    return not rank_dir.exists()


def print_exception(exc: BaseException, code: types.CodeType | None = None) -> None:
    """Print ``exc`` as Python prints an uncaught exception: through
    ``sys.excepthook`` (the script's, if it set one), with the traceback
    starting at the frame of ``code`` (the script's top level), not in
    fastprof. Without ``code`` (the script never ran: it does not compile),
    no traceback, as Python prints a script's ``SyntaxError``."""
    tb = exc.__traceback__ if code is not None else None
    t = tb
    while t is not None and t.tb_frame.f_code is not code:
        t = t.tb_next
    if t is not None:
        tb = t
    try:
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    except BaseException as hook_error:  # noqa: BLE001 - as Python: say so, then the default print
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(exc), exc, tb)
    sys.stderr.flush()


def _close(prof: RunHost, ended: BaseException | None) -> None:
    """Close the Profiler as ``with prof:`` would on the way out (an OOM is
    captured, the reason recorded); a failure is one stderr line (the
    script may have turned warnings into errors)."""
    try:
        prof.close_after(ended)
    except Exception as e:  # noqa: BLE001 - profiling never changes how the job ends
        if _signals.is_job(e):
            # The job's own signal handler, held while the Profiler closed,
            # raised as it ran (torch's "DataLoader worker ... exited
            # unexpectedly" on a worker's SIGCHLD): after the script's ending,
            # as Python prints an exception raised on its way out.
            print_exception(e, e.__traceback__.tb_frame.f_code if e.__traceback__ is not None else None)
            return
        print(f"fastprof run: closing the profiler failed: {type(e).__name__}: {e}", file=sys.stderr)
