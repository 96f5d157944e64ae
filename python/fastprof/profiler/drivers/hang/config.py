"""The hang watchdog's options. ``hang_timeout`` and ``hang_action`` are the
Profiler's (``Profiler(hang_timeout=...)``, rows of
:data:`fastprof.profiler.options.OPTIONS`: the argument wins over the
variable, which wins over the default); the grace is the environment's only.

- ``FASTPROF_HANG_TIMEOUT`` (``hang_timeout``): seconds without a step ending before the ranks
  write their evidence; ``auto`` (the default) for the default rule (before
  two steps ended, 300 s; then the larger of 60 s and 20 times the median
  recent step: a job with 1 s steps is reported within about a minute, one
  whose steps merely become slower never); ``off`` (or 0) turns the watchdog off.
- ``FASTPROF_HANG_ACTION`` (``hang_action``): ``report`` (the default) or ``abort``: once the
  evidence is written (and the verdict said), the hung process ends with exit
  status :data:`HANG_EXIT_STATUS`, so that the scheduler restarts the job
  instead of waiting out the backend's timeout.
- ``FASTPROF_HANG_GRACE``: seconds the interpreter gets to answer before the
  watchdog writes the evidence itself (a thread holding the GIL), default 3.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["HANG_EXIT_STATUS", "HangConfig", "parse_action", "parse_timeout"]

#: The exit status of a process ended by ``hang_action=abort`` (as
#: coreutils' ``timeout`` says a command timed out).
HANG_EXIT_STATUS = 124

ACTIONS = ("report", "abort")
#: What ``hang_timeout`` takes (the errors say "expected ...").
TIMEOUT_EXPECT = "seconds > 0, auto or off"


def parse_timeout(v: object) -> float | None:
    """``hang_timeout``: seconds (> 0, finite), ``auto`` (None: the default
    rule) or ``off`` (``0``, ``False``: 0.0, no watchdog); else ValueError."""
    if v is False:
        return 0.0
    if isinstance(v, str):
        text = v.strip().lower()
        if text in ("off", "0", "false", "no"):
            return 0.0
        if text == "auto":
            return None
        v = float(text)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"not seconds: {v!r}")
    t = float(v)
    if t == 0:
        return 0.0
    if not 0 < t < 1e9:  # nan and inf fail too
        raise ValueError(f"not seconds: {v!r}")
    return t


def parse_action(v: object) -> str:
    """``hang_action``: ``report`` or ``abort``; else ValueError."""
    if not isinstance(v, str) or v.strip().lower() not in ACTIONS:
        raise ValueError(f"not a hang action: {v!r}")
    return v.strip().lower()


@dataclass(frozen=True)
class HangConfig:
    #: None: the default rule; 0: off.
    timeout: float | None = None
    action: str = "report"
    grace: float = 3.0
    #: How often the watchdog looks at the step heartbeat and the request file.
    poll: float = 0.25

    @property
    def enabled(self) -> bool:
        return self.timeout != 0

    @classmethod
    def with_grace(cls, timeout: float | None, action: str, env: Mapping[str, str] | None = None) -> HangConfig:
        """The Profiler's resolved ``hang_timeout`` and ``hang_action``, and the
        grace ``FASTPROF_HANG_GRACE`` sets; a grace that does not parse is a
        ValueError naming the variable."""
        e = os.environ if env is None else env
        grace_raw = e.get("FASTPROF_HANG_GRACE", "").strip()
        grace = 3.0
        if grace_raw:
            try:
                grace = float(grace_raw)
            except ValueError:
                raise ValueError(f"FASTPROF_HANG_GRACE={grace_raw!r}: expected seconds") from None
            if not 0 < grace <= 600:
                raise ValueError(f"FASTPROF_HANG_GRACE={grace_raw!r}: expected seconds in (0, 600]")
        return cls(timeout=timeout, action=action, grace=grace)
