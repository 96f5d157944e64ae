"""The hang watchdog's options, from the environment (``FASTPROF_HANG_*``).

- ``FASTPROF_HANG_TIMEOUT``: seconds without a step ending before the ranks
  write their evidence; ``auto`` (the default) for the default rule (before
  two steps ended, 300 s; then the larger of 60 s and 20 times the median
  recent step: a job with 1 s steps is reported within about a minute, one
  whose steps merely become slower never); ``off`` (or 0) turns the watchdog off.
- ``FASTPROF_HANG_ACTION``: ``report`` (the default) or ``abort``: once the
  evidence is written (and the verdict said), the hung process ends with exit
  status :data:`HANG_EXIT_STATUS`, so that the scheduler restarts the job
  instead of waiting out the backend's timeout.
- ``FASTPROF_HANG_GRACE``: seconds the interpreter gets to answer before the
  watchdog writes the evidence itself (a thread holding the GIL), default 3.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["HANG_EXIT_STATUS", "HangConfig"]

#: The exit status of a process ended by ``hang_action=abort`` (as
#: coreutils' ``timeout`` says a command timed out).
HANG_EXIT_STATUS = 124

ACTIONS = ("report", "abort")


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
    def from_env(cls, env: dict[str, str] | None = None) -> HangConfig:
        """The options the environment sets; a value that does not parse is a
        ValueError naming the variable."""
        e = os.environ if env is None else env
        timeout: float | None = None
        raw = e.get("FASTPROF_HANG_TIMEOUT", "").strip().lower()
        if raw in ("off", "0", "false", "no"):
            timeout = 0.0
        elif raw not in ("", "auto"):
            try:
                timeout = float(raw)
            except ValueError:
                raise ValueError(f"FASTPROF_HANG_TIMEOUT={raw!r}: expected seconds (> 0), auto or off") from None
            if not timeout > 0 or timeout != timeout:
                raise ValueError(f"FASTPROF_HANG_TIMEOUT={raw!r}: expected seconds (> 0), auto or off")
        action = e.get("FASTPROF_HANG_ACTION", "report").strip().lower() or "report"
        if action not in ACTIONS:
            raise ValueError(f"FASTPROF_HANG_ACTION={action!r}: expected report or abort")
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
