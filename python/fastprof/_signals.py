"""Signal dispositions fastprof gives back, process-wide.

The trigger signal (``kill -USR2 <pid>``, :mod:`fastprof.always_on.triggers`)
is documented as safe to send to a running job. Its default action kills the
process, so once fastprof has asked users to send it, giving the default back
when a Profiler stops would let a late trigger (one sent while the job
finishes, or from a script that loops over ranks) end the job. So when the
job had the default, the signal stays harmless for the rest of the process: a
no-op handler installed at the C level (the interpreter puts Python-level
handlers back to the default early in its finalization, and the teardown of a
torch process is long), with Python's own table set to ``SIG_IGN`` so that the
interpreter leaves it alone. A handler the job had is given back as it was.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from fastprof import _core

__all__ = ["give_back", "job_disposition"]

_lock = threading.Lock()
#: Signals fastprof made harmless (read as the default when asked what the job has).
_harmless: set[int] = set()


def job_disposition(num: int) -> Any:
    """``signal.getsignal(num)``, except that fastprof's own harmless handler
    reads as ``SIG_DFL`` (the job's disposition under it)."""
    current = signal.getsignal(num)
    with _lock:
        if current is signal.SIG_IGN and num in _harmless:
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
        with _lock:
            _harmless.add(num)
    else:
        signal.signal(num, signal.SIG_DFL)
