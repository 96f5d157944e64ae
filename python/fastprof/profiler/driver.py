"""The feature protocol: what the Profiler asks of each thing it does.

:class:`fastprof.Profiler` (``loop.py``) is a coordinator: it keeps the public
API, its state (new, running, stopping, stopped) and the seam to the core's
step loop. Everything a feature does sits in a driver
(``fastprof/profiler/drivers/``): torch.profiler windows, the step anatomy,
memory, triggers and flight dumps, DataLoader workers, the clock syncs, the
recorder's gate, the steps inferred from ``optimizer.step()``, exits, and the
run's end (summary, merge, upload). Each implements the methods of
:class:`Driver` it needs; the coordinator calls each hook only on the drivers
that override it, in the order the drivers were made (that order is the
contract: a later driver sees what an earlier one did at the same moment).

A step's hooks run only where the step needs Python: the core's step loop
never calls back on a quiet stretch of the schedule (see
``Schedule.quiet_steps``) unless a driver is :attr:`Driver.live`. The close
runs in phases, each over every driver before the next begins:

1. :meth:`Driver.unhook` before the last step ends (no more hooks into the job);
2. :meth:`Driver.close` after it ended (what records for the Profiler stops);
3. :meth:`Driver.finish` while the recorder still records (outputs written,
   threads joined);
4. the recorder stops (when the Profiler started it);
5. :meth:`Driver.stopped` after it (the run's end: files, summary, merge).

No hook may raise into the job: the coordinator catches a driver's failure
at the close as one warning; a step hook catches its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastprof.profiler.schedule import Action

__all__ = ["Closing", "Driver", "first_of", "overrides"]


@dataclass(frozen=True)
class Closing:
    """How the Profiler closes: ``reason`` None for a normal end, else
    ``"exit"``, ``"SIGTERM"`` or ``"exception: <type>"``."""

    reason: str | None
    #: The interpreter exits or SIGTERM came: bounded waits, no collective.
    abrupt: bool
    #: ``fastprof run``'s Profiler whose loop a script's Profiler took (it
    #: wrote the run's summary and memory files).
    handed_over: bool
    #: A script's Profiler under ``fastprof run`` (its host ends the run).
    hosted: bool


class Driver:
    """One feature of the Profiler. Every method is optional (this class's
    are no-ops); see the module documentation for when each runs."""

    #: Its entry in ``profiler.json`` (None: it adds none).
    key: str | None = None

    @property
    def live(self) -> bool:
        """Steps need this driver's hooks even on a quiet stretch of the
        schedule (a torch.profiler window still open)."""
        return False

    def prepare(self) -> None:
        """Before the recorder starts (its run directory is chosen): check
        what must be writable. An OSError here means the run directory
        cannot be written: the Profiler then records nothing."""

    def start(self, steps: Any) -> None:
        """The Profiler starts: the recorder runs and ``steps``, the core's
        step loop, exists; step 0 has not begun."""

    def capture(self, batch: int, epoch: int) -> tuple[int, int] | None:
        """Steps ``(first, last)`` to record with torch.profiler that this
        driver asks for at step ``batch``'s begin (a triggered capture)."""
        return None

    def begin(self, action: Action, batch: int, epoch: int, fetched: bool) -> bool:
        """Step ``batch`` begins with ``action``. ``fetched``: its batch is
        there (else the step waits for its loader's ``next()``); return True
        to be called at :meth:`fetch` once the batch came."""
        return False

    def fetch(self, action: Action, batch: int, epoch: int) -> bool:
        """The batch of a step begun without one came. Return True when a
        torch.profiler window records this step (it then begins after
        torch's step boundary)."""
        return False

    def end_annotation(self) -> None:
        """fastprof's step span was just recorded (torch's ProfilerStep ends here)."""

    def end(
        self, action: Action, epoch: int, batch: int, batch_in_epoch: int, closed: bool, with_schedule: bool
    ) -> None:
        """A step that needed Python ended, with ``action``, at that position.
        ``closed``: the plan closed a window at this step; ``with_schedule``:
        a schedule (not only captures) opens windows. (Arguments, not an
        object: an object made at every such step cost 0.4 µs.)"""

    def step_done(self, epoch: int, batch: int, batch_in_epoch: int) -> None:
        """Every step's end, quiet steps too, for a driver that asked the step
        loop for it (``memory_hook``)."""

    def window_saved(self) -> None:
        """A torch.profiler window's export ended (on the exporter thread)."""

    def on_exception(self, exc: BaseException) -> None:
        """An exception is leaving the profiled code (before the close)."""

    def on_exit_event(self, reason: str) -> None:
        """An event that ends the run (``"sigterm"``, ``"exception"``, ``"oom"``)."""

    def unhook(self) -> None:
        """Close, phase 1: no more hooks into the job (the last step has not ended)."""

    def close(self, closing: Closing) -> None:
        """Close, phase 2: what records for the Profiler stops."""

    def finish(self, closing: Closing) -> None:
        """Close, phase 3: outputs written while the recorder still records."""

    def stopped(self, closing: Closing) -> None:
        """Close, phase 5: the recorder has stopped."""

    def release(self) -> None:
        """The very end of the close, whatever failed before: what the driver
        holds in the process (handlers, listeners) is let go."""

    def step_aside(self) -> None:
        """``fastprof run``: a script's Profiler took the loop; what this
        driver records for the host ends here."""

    def account(self) -> Any:
        """Its entry in ``profiler.json`` (under :attr:`key`)."""
        return None

    def idle(self) -> frozenset[str]:
        """Hooks it implements but needs not be called at, as configured
        (asked once, when the Profiler takes its drivers): a step's hooks
        cost at every step that needs Python."""
        return frozenset()


def first_of(errors: list[str]) -> str:
    """A part's failures in one line: the first, and how many more (all are
    in profiler.json)."""
    more = f" (and {len(errors) - 1} more: see profiler.json)" if len(errors) > 1 else ""
    return errors[0] + more


def overrides(driver: Driver, name: str) -> bool:
    """Whether ``driver`` implements hook ``name`` and wants it called."""
    return getattr(type(driver), name) is not getattr(Driver, name) and name not in driver.idle()
