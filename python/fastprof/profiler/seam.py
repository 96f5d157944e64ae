"""The step loop's seam: what the core's step loop
(``rust/fastprof-py/src/steps.rs``) calls back when a step needs Python,
never on a quiet stretch of the schedule (see ``Schedule.quiet_steps``).
Each step's action is decided here, the schedule's merged with a triggered
capture's by the plan (:mod:`fastprof.profiler.plan`), and the drivers'
step hooks run (:mod:`fastprof.profiler.driver`).

What it records, always (about a microsecond per step on the training thread):

* a ``step`` span per training step, args ``epoch``, ``batch`` (global),
  ``batch_in_epoch`` and ``action`` (the schedule's state); a
  ``fastprof.step`` counter (the recorder's step marker) and a
  ``profiler.action`` counter track that changes with the schedule state;
* ``loader.<name>.next``: the time blocked in the loader's ``next()``, and a
  ``loader.<name>.wait_ms`` counter (and ``loader.<name>.batch_size`` once
  per pass when the loader has one); with a DataLoader with workers, each
  worker's fetch of a batch in the worker's own process
  (:mod:`fastprof.profiler.workers`).

What the schedule governs: ``torch.profiler`` windows
(:class:`~fastprof.profiler.torch_windows.TorchWindows`); with
``gate_spans=True`` also the recorder (paused outside warmup and active steps,
as Composer's profiler records).

Steps: each :meth:`Profiler.step` call ends a step. A step begins at the
train loader's next ``next()`` (so a step holds its wait for data, and
validation between epochs falls outside steps), or at once when no train
loader is iterating. When :meth:`Profiler.step` is never called, every
``optimizer.step()`` (torch's global optimizer step hooks) ends a step; the
first explicit :meth:`Profiler.step` call switches that off.

Epochs: each new pass over the train loader (``name="train"``, or
``epoch=True``) starts an epoch; the batch in epoch restarts at 0 and, when
the loader has a length, the epoch schedule knows the epoch's last batch.

Loops a framework runs (Lightning: :mod:`fastprof.integrations.lightning`)
say the same without :meth:`Profiler.loader`: ``start(defer_step=True)``
(no step until the first batch), :meth:`Profiler.begin_epoch` /
:meth:`Profiler.end_epoch` around each pass over the training data,
:meth:`Profiler.begin_step` where a batch is fetched, :meth:`Profiler.step`
where it ends.
"""

from __future__ import annotations

from typing import Any

from fastprof._loop_api import RunHost
from fastprof.profiler.driver import Driver
from fastprof.profiler.plan import ActionPlan
from fastprof.profiler.schedule import QUIET, Action, Schedule

__all__ = ["ACTION_LEVEL", "StepSeam"]

#: Numeric levels of the profiler.action counter track.
ACTION_LEVEL = {
    Action.SKIP_FIRST: 0,
    Action.WAIT: 1,
    Action.DISABLED: 1,
    Action.WARMUP: 2,
    Action.ACTIVE: 3,
    Action.ACTIVE_AND_SAVE: 4,
}


class StepSeam:
    """``prof``: the Profiler (its loop position, its optimizer hook); the
    drivers' step hooks come with :meth:`use`."""

    def __init__(self, prof: RunHost, schedule: Schedule) -> None:
        self.prof = prof
        self.schedule = schedule
        self._capture: list[Driver] = []
        self._begin: list[Driver] = []
        self._live: list[Driver] = []
        self._end_annotation: list[Driver] = []
        self._end: list[Driver] = []
        self._step_done: list[Driver] = []
        self._fetch: list[Driver] = []
        #: The Profiler stopped (set by it): a callback from inside the loop passes through.
        self.stopped = False
        self.plan = ActionPlan()
        #: The current step's action.
        self.action = Action.WAIT
        #: The position of the step that began last (read while the core's
        #: loop is inside a callback and cannot be).
        self.begun: dict[str, int] = {}
        #: Train passes begun (the loop's own count stands in for it).
        self.passes = 0

    def use(self, hooks: dict[str, list[Driver]]) -> None:
        """For each hook of the driver protocol, the drivers that have it."""
        self._capture, self._begin, self._live = hooks["capture"], hooks["begin"], hooks["live"]
        self._end_annotation, self._end = hooks["end_annotation"], hooks["end"]
        self._step_done, self._fetch = hooks["step_done"], hooks["fetch"]

    def _on_begin(
        self, batch: int, epoch: int, batch_in_epoch: int, epoch_len: int | None, fetched: bool
    ) -> tuple[int, str, int, bool]:
        """Step ``batch`` begins: its action, then the drivers (now, or once
        its batch came when ``fetched`` is False). Returns (action level,
        action, quiet steps after this one, a driver waits for the fetch)."""
        if self.stopped:  # closed from inside the step loop (see Profiler.close)
            return ACTION_LEVEL[self.action], self.action.value, 0, False
        self.begun = {"batch": batch, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "train_passes": self.passes}
        scheduled = self.schedule.at(batch, epoch, batch_in_epoch, epoch_len)
        capture = None
        for d in self._capture:
            capture = d.capture(batch, epoch) or capture
        # The schedule's action merged with a capture's, in the one order a
        # torch.profiler window takes (see fastprof.profiler.plan).
        action = self.plan.action(batch, scheduled, capture)
        self.action = action
        due = False
        for d in self._begin:
            due = d.begin(action, batch, epoch, fetched) or due
        quiet = 0
        if action in QUIET and not any(d.live for d in self._live):
            quiet = self.plan.quiet(batch, self.schedule.quiet_steps(batch, epoch, batch_in_epoch, epoch_len), capture)
        return ACTION_LEVEL[action], action.value, quiet, due

    def _on_end_annotation(self) -> None:
        if not self.stopped:
            for d in self._end_annotation:
                d.end_annotation()

    def _on_end(self, epoch: int, batch: int, batch_in_epoch: int) -> None:
        closed = self.plan.end(batch, self.action)
        if not self.stopped:
            action, with_schedule = self.action, self.plan.with_schedule
            for d in self._end:
                d.end(action, epoch, batch, batch_in_epoch, closed, with_schedule)

    def _on_memory(self, epoch: int, batch: int, batch_in_epoch: int) -> None:
        """Every step's end (quiet steps too), for the drivers that asked."""
        for d in self._step_done:
            d.step_done(epoch, batch, batch_in_epoch)

    def _on_fetched(self) -> bool:
        """A batch came for a step whose drivers waited for it. True when a
        window is live (the step then begins here, after torch's
        ProfilerStep boundary, so the two still nest)."""
        if self.stopped:
            return False
        live = False
        for d in self._fetch:
            live = d.fetch(self.action, self.prof.batch, self.prof.epoch) or live
        return live

    def _on_explicit(self) -> None:
        """The loop says where steps end (the first step() or begin_step()):
        optimizer steps no longer do."""
        self.prof.remove_optimizer_hook()

    def position(self, steps: Any, name: str) -> int:
        """A position of the core's step loop ``steps``; while the loop is
        inside one of its callbacks (a signal handler closing the Profiler
        there) it cannot be read, and the step that began last stands in."""
        if steps is None:
            return 0
        try:
            return int(getattr(steps, name))
        except RuntimeError:  # already mutably borrowed
            return self.begun.get(name, 0)
