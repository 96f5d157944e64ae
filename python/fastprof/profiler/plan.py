"""Each step's action, decided in one place: the schedule's action merged
with a triggered capture (:mod:`fastprof.profiler.drivers.triggers`), as the
torch.profiler window driver (:mod:`fastprof.profiler.torch_windows`) is
handed it. Pure: no torch, no recording, testable step by step.

A ``torch.profiler.profile`` object goes one way through a window: WARMUP
steps, then recorded steps, the last of which saves (ACTIVE_AND_SAVE); the
driver stops it there, and a new object begins the next window. A window the
schedule leaves early (a step that records nothing) is stopped at that step,
its recorded steps saved. Any other path torch rejects: RECORD followed by
WARMUP ("Incorrect schedule") stops the trace inside the object and starts it
again on the next step, and exporting that object's trace while it recorded
on killed the process (SIGSEGV in ``export_chrome_trace``).

A schedule alone goes that way. A capture is recorded steps asked for at any
moment: before, inside or across a scheduled window, over an epoch's end,
longer than the gap to the next window, again right after the last one. The
plan merges the two so that the path holds. Its invariants
(``tests/unit/test_plan.py`` walks them over those classes):

1. Within a window, WARMUP never follows a recorded step: a window that
   records goes on recording (the schedule's warm-up steps are recorded).
2. Every step of a capture, first to last, is recorded, in one window that
   saves at the first step from its last on where the schedule does not go
   on with a window: the schedule's own ACTIVE_AND_SAVE, or the capture's
   last step when the schedule is quiet there. A capture and the scheduled
   window it meets share one window and one file; no window is cut in two.
3. Every step the schedule records is recorded. Without a capture the
   actions are the schedule's, step for step (but for 1, which only a
   schedule that goes back to warm-up needs: an epoch schedule whose epoch
   length is unknown, a callable).
4. A step's action depends only on the steps that ended before it: asking
   again for the same step (the step a fetch began that found the loader
   exhausted begins again in the next epoch) changes nothing. The state
   moves at a step's end.
"""

from __future__ import annotations

from fastprof.profiler.schedule import Action

__all__ = ["ActionPlan"]

#: The actions of a window's steps.
_WINDOW = frozenset((Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE))
#: The schedule's actions that go on with a window after this step.
_GOES_ON = frozenset((Action.WARMUP, Action.ACTIVE))


class ActionPlan:
    """The merged action of each step of one Profiler's run.

    ``action`` at a step's begin (any number of times), ``end`` at its end
    (once, for the steps that called back into Python: a quiet stretch of
    the schedule is never inside a window, so it leaves the state as is)."""

    def __init__(self) -> None:
        #: The window after the last step that ended: None (none open),
        #: WARMUP (warming up) or ACTIVE (recording, not saved yet).
        self.open: Action | None = None
        #: The open window, or the last one closed, holds steps that the
        #: schedule itself put in a window (a capture shared the schedule's).
        self.with_schedule = False
        self._begun: tuple[int, Action] | None = None  # (step, the schedule's action) of the last begin

    def action(self, step: int, scheduled: Action, capture: tuple[int, int] | None = None) -> Action:
        """The action of ``step``, whose schedule says ``scheduled``, with
        ``capture`` the (first, last) steps of the capture armed or running
        (None without one)."""
        self._begun = (step, scheduled)
        if capture is not None and capture[0] <= step:
            # The capture's steps record; from its last on, the window saves
            # where the schedule does not go on with one (2).
            if step < capture[1] or scheduled in _GOES_ON:
                return Action.ACTIVE
            return Action.ACTIVE_AND_SAVE
        if self.open is Action.ACTIVE and scheduled is Action.WARMUP:
            return Action.ACTIVE  # never back to warm-up inside a window (1)
        return scheduled

    @staticmethod
    def quiet(step: int, quiet: int, capture: tuple[int, int] | None) -> int:
        """Of the ``quiet`` steps after ``step`` that the schedule says may
        run without Python, those before the capture's first step (the step
        loop must ask at that one)."""
        if capture is None:
            return quiet
        return min(quiet, max(0, capture[0] - step - 1))

    def end(self, step: int, action: Action) -> bool:
        """``step`` ended; ``action`` was its action. True when a window
        closed at this step: saved at its end, or left at its begin (the
        driver stopped it there)."""
        begun, self._begun = self._begun, None
        scheduled = begun[1] if begun is not None and begun[0] == step else action
        if action in _WINDOW:
            if self.open is None:
                self.with_schedule = False  # a new window
            self.with_schedule = self.with_schedule or scheduled in _WINDOW
        closed = action is Action.ACTIVE_AND_SAVE or (self.open is not None and action not in _WINDOW)
        self.open = action if action in _GOES_ON else None
        return closed
