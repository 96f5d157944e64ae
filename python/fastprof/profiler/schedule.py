"""Profiling schedules: which state each training step is in.

A schedule is a pure function of the loop's position (global step, epoch,
batch in epoch) to an :class:`Action`. Nothing here records, imports torch at
module level, or keeps state between calls, so a schedule can be asked about
any step in any order (the profiler asks once per step; tests ask about
thousands).

Four kinds, all frozen dataclasses checked when made:

* :func:`epoch`: Composer's per-epoch schedule, counted by batch in epoch
  (restarts every epoch).
* :func:`cyclic`: ``torch.profiler.schedule``'s global-step schedule, action for
  action (``skip_first_wait`` included).
* :func:`steps`: explicit windows of global steps.
* :func:`from_callable`: any ``(step) -> Action`` function (a
  ``torch.profiler.schedule`` function is accepted too).

The states, and what ``torch.profiler`` calls them (:func:`to_torch`):

=================  ========================  ====================================
Action             torch ``ProfilerAction``  Meaning
=================  ========================  ====================================
SKIP_FIRST         NONE                      the first ``skip_first`` steps
WAIT               NONE                      between windows, nothing recorded
WARMUP             WARMUP                    tracer started, results discarded
ACTIVE             RECORD                    recorded
ACTIVE_AND_SAVE    RECORD_AND_SAVE           recorded; last step of a window
DISABLED           NONE                      the schedule has ended (for a
                                             per-epoch schedule: until the
                                             next epoch)
=================  ========================  ====================================
"""

from __future__ import annotations

import bisect
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastprof._core import ConfigError

__all__ = [
    "Action",
    "CallableSchedule",
    "CyclicSchedule",
    "EpochSchedule",
    "NeverSchedule",
    "Position",
    "Schedule",
    "StepsSchedule",
    "as_schedule",
    "cyclic",
    "epoch",
    "from_callable",
    "from_torch",
    "never",
    "parse",
    "steps",
    "to_torch",
]


class Action(enum.Enum):
    """The state of one step under a schedule (see the module's table)."""

    SKIP_FIRST = "skip_first"
    WAIT = "wait"
    WARMUP = "warmup"
    ACTIVE = "active"
    ACTIVE_AND_SAVE = "active_and_save"
    DISABLED = "disabled"

    @property
    def records(self) -> bool:
        """True for the steps whose events are kept (ACTIVE, ACTIVE_AND_SAVE)."""
        return self in (Action.ACTIVE, Action.ACTIVE_AND_SAVE)

    @property
    def saves(self) -> bool:
        """True for the last step of a window: the window is written after it."""
        return self is Action.ACTIVE_AND_SAVE


#: The steps of a window: the recorder's gate is open and the allocator
#: history records during them.
RECORDING = frozenset((Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE))
#: The steps that need nothing from Python while they last.
QUIET = frozenset((Action.SKIP_FIRST, Action.WAIT, Action.DISABLED))


def to_torch(action: Action) -> Any:
    """The ``torch.profiler.ProfilerAction`` for ``action``: SKIP_FIRST, WAIT and
    DISABLED are all ``NONE`` to torch. Imports torch."""
    from torch.profiler import ProfilerAction

    return {
        Action.SKIP_FIRST: ProfilerAction.NONE,
        Action.WAIT: ProfilerAction.NONE,
        Action.DISABLED: ProfilerAction.NONE,
        Action.WARMUP: ProfilerAction.WARMUP,
        Action.ACTIVE: ProfilerAction.RECORD,
        Action.ACTIVE_AND_SAVE: ProfilerAction.RECORD_AND_SAVE,
    }[action]


def from_torch(action: Any) -> Action:
    """The :class:`Action` for a ``torch.profiler.ProfilerAction`` (``NONE`` is
    WAIT: torch does not say whether a step is skipped, waiting or past the end)."""
    name = getattr(action, "name", None)
    mapped = (
        {
            "NONE": Action.WAIT,
            "WARMUP": Action.WARMUP,
            "RECORD": Action.ACTIVE,
            "RECORD_AND_SAVE": Action.ACTIVE_AND_SAVE,
        }.get(name)
        if isinstance(name, str)
        else None
    )
    if mapped is None or type(action).__name__ != "ProfilerAction":
        raise ConfigError(f"not a torch.profiler.ProfilerAction: {action!r}")
    return mapped


# ------------------------------------------------------------------ checks


def _int(where: str, name: str, value: object, minimum: int) -> int:
    # bool is an int to Python, never to a schedule; a float 2.0 is a typo
    # waiting to become 2.5, so it is refused too.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: invalid {name}: expected an integer >= {minimum}, got {value!r}")
    return value


def _flag(value: object) -> bool:
    # torch's skip_first_wait is an int read as "!= 0"; a bool says it better.
    if not isinstance(value, (bool, int)) or value < 0:
        raise ConfigError(f"schedule.cyclic: invalid skip_first_wait: expected a bool (or an int >= 0), got {value!r}")
    return bool(value)


@dataclass(frozen=True)
class Position:
    """Where the training loop is: the global step (0-based, counted over the
    whole run), the epoch, the batch within the epoch, and, when known, the
    number of batches in this epoch (``epoch_len``). ``batch_in_epoch``
    defaults to ``step`` (a run of one epoch)."""

    step: int
    epoch: int = 0
    batch_in_epoch: int | None = None
    epoch_len: int | None = None

    def __post_init__(self) -> None:
        _int("Position", "step", self.step, 0)
        _int("Position", "epoch", self.epoch, 0)
        if self.batch_in_epoch is not None:
            _int("Position", "batch_in_epoch", self.batch_in_epoch, 0)
        if self.epoch_len is not None:
            _int("Position", "epoch_len", self.epoch_len, 1)

    @property
    def batch(self) -> int:
        """The batch in the epoch (``step`` when not given)."""
        return self.step if self.batch_in_epoch is None else self.batch_in_epoch

    @property
    def last_in_epoch(self) -> bool:
        """True on the epoch's last batch, when ``epoch_len`` is known."""
        return self.epoch_len is not None and self.batch == self.epoch_len - 1


def _position(at: Position | int) -> Position:
    return at if isinstance(at, Position) else Position(step=at)


class Schedule(ABC):
    """What every schedule answers. Call it with a :class:`Position` or a global
    step (an int, taken as a one-epoch run)."""

    @abstractmethod
    def action(self, at: Position | int) -> Action:
        """The action for the step at ``at``."""

    def __call__(self, at: Position | int) -> Action:
        return self.action(at)

    def at(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> Action:
        """:meth:`action` for a position the caller has already checked (the
        profiler asks once per step; a :class:`Position` is built and checked
        only where a schedule needs one)."""
        return self.action(Position(step, epoch, batch_in_epoch, epoch_len))

    def quiet_steps(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> int:
        """How many steps after this one, in the same epoch, surely have the
        same action as this one when that action records nothing (SKIP_FIRST,
        WAIT, DISABLED); 0 otherwise or when the schedule cannot tell. The
        profiler begins that many steps without asking the schedule again
        (an answer too small costs time, never correctness)."""
        return 0

    def ends_window(self, at: Position | int) -> bool:
        """True when the step at ``at`` is a save point: the last of a window."""
        return self.action(at).saves

    def as_torch(self) -> Callable[[int], Any]:
        """A ``(step) -> torch.profiler.ProfilerAction`` function for
        ``torch.profiler.profile(schedule=...)``, steps taken as global steps."""
        return lambda step: to_torch(self.action(step))


#: quiet_steps' answer for "the same action until the epoch or run ends".
_QUIET_FOREVER = 1 << 62


def _cycle(pos_in_cycle: int, wait: int, warmup: int, active: int) -> Action:
    if pos_in_cycle < wait:
        return Action.WAIT
    if pos_in_cycle < wait + warmup:
        return Action.WARMUP
    return Action.ACTIVE_AND_SAVE if pos_in_cycle == wait + warmup + active - 1 else Action.ACTIVE


@dataclass(frozen=True)
class EpochSchedule(Schedule):
    """Composer's per-epoch schedule (see :func:`epoch`)."""

    skip_first: int = 0
    wait: int = 0
    warmup: int = 1
    active: int = 4
    repeat: int = 1

    def __post_init__(self) -> None:
        for name, minimum in (("skip_first", 0), ("wait", 0), ("warmup", 0), ("active", 1), ("repeat", 0)):
            _int("schedule.epoch", name, getattr(self, name), minimum)

    @property
    def windows_per_epoch(self) -> int | None:
        """Windows in each epoch: ``repeat + 1``, or None (unbounded) for repeat=0."""
        return self.repeat + 1 if self.repeat else None

    def action(self, at: Position | int) -> Action:
        pos = _position(at)
        return self.at(pos.step, pos.epoch, pos.batch, pos.epoch_len)

    def at(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> Action:
        b = batch_in_epoch
        last_in_epoch = epoch_len is not None and b == epoch_len - 1
        if b < self.skip_first:
            return Action.SKIP_FIRST
        b -= self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat and b >= cycle * (self.repeat + 1):
            return Action.DISABLED
        act = _cycle(b % cycle, self.wait, self.warmup, self.active)
        # Composer saves a window the epoch cuts short on the epoch's last batch.
        if act is Action.ACTIVE and last_in_epoch:
            return Action.ACTIVE_AND_SAVE
        return act

    def quiet_steps(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> int:
        b = batch_in_epoch
        left = _QUIET_FOREVER if epoch_len is None else max(epoch_len - 1 - b, 0)
        if b < self.skip_first:
            return min(self.skip_first - 1 - b, left)
        b -= self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat and b >= cycle * (self.repeat + 1):
            return left
        p = b % cycle
        return min(self.wait - 1 - p, left) if p < self.wait else 0


@dataclass(frozen=True)
class CyclicSchedule(Schedule):
    """``torch.profiler.schedule``'s global-step schedule (see :func:`cyclic`)."""

    wait: int
    warmup: int
    active: int
    repeat: int = 0
    skip_first: int = 0
    skip_first_wait: bool = False

    def __post_init__(self) -> None:
        for name, minimum in (("wait", 0), ("warmup", 0), ("active", 1), ("repeat", 0), ("skip_first", 0)):
            _int("schedule.cyclic", name, getattr(self, name), minimum)
        object.__setattr__(self, "skip_first_wait", _flag(self.skip_first_wait))

    def action(self, at: Position | int) -> Action:
        return self.at(_position(at).step, 0, 0, None)

    def at(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> Action:
        if step < self.skip_first:
            return Action.SKIP_FIRST
        step -= self.skip_first
        if self.skip_first_wait:
            # The first cycle starts at its warmup: torch shifts the steps by `wait`.
            step += self.wait
        cycle = self.wait + self.warmup + self.active
        if self.repeat and step >= cycle * self.repeat:
            return Action.DISABLED
        return _cycle(step % cycle, self.wait, self.warmup, self.active)

    def quiet_steps(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> int:
        if step < self.skip_first:
            return self.skip_first - 1 - step
        step -= self.skip_first
        if self.skip_first_wait:
            step += self.wait
        cycle = self.wait + self.warmup + self.active
        if self.repeat and step >= cycle * self.repeat:
            return _QUIET_FOREVER
        p = step % cycle
        return self.wait - 1 - p if p < self.wait else 0


@dataclass(frozen=True)
class StepsSchedule(Schedule):
    """Explicit windows of global steps (see :func:`steps`)."""

    #: Half-open ``(start, stop)`` windows, sorted, not overlapping.
    windows: tuple[tuple[int, int], ...]
    warmup: int = 1
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int("schedule.steps", "warmup", self.warmup, 0)
        if not self.windows:
            raise ConfigError("schedule.steps: invalid windows: expected at least one window, got none")
        prev_stop = 0
        for i, w in enumerate(self.windows):
            ok = isinstance(w, tuple) and len(w) == 2
            start, stop = w if ok else (None, None)
            if not ok or isinstance(start, bool) or isinstance(stop, bool):
                raise ConfigError(f"schedule.steps: invalid window {w!r}: expected (start, stop) integers")
            _int("schedule.steps", f"start of window {w!r}", start, 0)
            _int("schedule.steps", f"stop of window {w!r}", stop, 1)
            assert isinstance(start, int) and isinstance(stop, int)
            if stop <= start:
                raise ConfigError(f"schedule.steps: invalid window {w!r}: expected stop > start (half-open)")
            if i and start < prev_stop:
                raise ConfigError(
                    f"schedule.steps: invalid window {w!r}: overlaps or precedes the window before it "
                    f"{self.windows[i - 1]!r} (expected sorted, non-overlapping windows)"
                )
            prev_stop = stop
        object.__setattr__(self, "_starts", tuple(w[0] for w in self.windows))

    def action(self, at: Position | int) -> Action:
        step = _position(at).step
        i = bisect.bisect_right(self._starts, step) - 1
        if i >= 0:
            stop = self.windows[i][1]
            if step < stop:
                return Action.ACTIVE_AND_SAVE if step == stop - 1 else Action.ACTIVE
        if i + 1 < len(self.windows):
            nxt = self.windows[i + 1][0]
            prev_stop = self.windows[i][1] if i >= 0 else 0
            # Warmup never reaches back into the previous window.
            return Action.WARMUP if step >= max(nxt - self.warmup, prev_stop) else Action.WAIT
        return Action.DISABLED

    def quiet_steps(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> int:
        i = bisect.bisect_right(self._starts, step) - 1
        if i >= 0 and step < self.windows[i][1]:
            return 0  # inside a window
        if i + 1 >= len(self.windows):
            return _QUIET_FOREVER  # DISABLED: past the last window
        prev_stop = self.windows[i][1] if i >= 0 else 0
        warm_from = max(self.windows[i + 1][0] - self.warmup, prev_stop)
        return warm_from - 1 - step if step < warm_from else 0


@dataclass(frozen=True)
class CallableSchedule(Schedule):
    """A user function ``(step) -> Action`` (or ``-> torch ProfilerAction``)."""

    fn: Callable[[int], Any]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(
                f"schedule.from_callable: invalid fn: expected a callable (step) -> Action, got {self.fn!r}"
            )

    def action(self, at: Position | int) -> Action:
        step = _position(at).step
        result = self.fn(step)
        if isinstance(result, Action):
            return result
        if type(result).__name__ == "ProfilerAction":
            return from_torch(result)
        raise ConfigError(
            f"schedule function {self.fn!r} returned {result!r} for step {step}: "
            "expected a fastprof.schedule.Action or a torch.profiler.ProfilerAction"
        )


@dataclass(frozen=True)
class NeverSchedule(Schedule):
    """No window at all (see :func:`never`)."""

    def action(self, at: Position | int) -> Action:
        return Action.WAIT

    def at(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> Action:
        return Action.WAIT

    def quiet_steps(self, step: int, epoch: int, batch_in_epoch: int, epoch_len: int | None) -> int:
        return _QUIET_FOREVER


# ----------------------------------------------------------------- makers
# Keyword-only: Composer's order (skip_first first) and torch's (wait first)
# differ, and a positional call would silently mean the other one.


def epoch(*, skip_first: int = 0, wait: int = 0, warmup: int = 1, active: int = 4, repeat: int = 1) -> EpochSchedule:
    """Composer's per-epoch schedule, counted by batch in epoch and restarted
    every epoch: ``skip_first`` batches, then cycles of ``wait``, ``warmup`` and
    ``active`` batches, the last active batch saving the window.

    ``repeat`` counts the windows *after the first*, as Composer's documented
    table does (skip_first=1, wait=1, warmup=1, active=2, repeat=1 records two
    windows per epoch: batches 3-4 and 7-8); ``repeat=0`` repeats to the end of
    the epoch. (Composer's code records ``repeat`` windows; its table is
    followed here.) After the last window the epoch's batches are DISABLED.
    A window still open on the epoch's last batch saves there when the
    position says how long the epoch is (``Position.epoch_len``)."""
    return EpochSchedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)


def never() -> NeverSchedule:
    """No fixed torch.profiler window: every step WAITs. For long jobs whose
    windows come from triggers only (``fastprof.Triggers``: a signal, the
    trigger file, a slow step). Text form ``never``."""
    return NeverSchedule()


def cyclic(
    *, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0, skip_first_wait: bool | int = 0
) -> CyclicSchedule:
    """``torch.profiler.schedule(wait=, warmup=, active=, repeat=, skip_first=,
    skip_first_wait=)`` over global steps, action for action (mapped by
    :func:`to_torch`): ``repeat`` is the number of windows, 0 = no end;
    ``skip_first_wait`` starts the first cycle at its warmup."""
    return CyclicSchedule(
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        skip_first=skip_first,
        skip_first_wait=_flag(skip_first_wait),
    )


def steps(windows: Iterable[int | tuple[int, int] | range], *, warmup: int = 1) -> StepsSchedule:
    """Explicit windows of global steps.

    Each item is a window: ``(start, stop)`` or ``range(start, stop)``
    (half-open, as ``range``: steps start..stop-1, saved at stop-1), or a bare
    step ``n``; bare steps that follow each other make one window, so
    ``steps({10, 11, 12, 50})`` records 10-12 (saved at 12) and 50. The
    ``warmup`` steps before each window are WARMUP (cut short at step 0 and at
    the previous window); other steps before the last window are WAIT, and
    every step after it is DISABLED. Windows may touch but not overlap."""
    if isinstance(windows, (str, bytes)) or not isinstance(windows, Iterable):
        raise ConfigError(f"schedule.steps: invalid windows: expected an iterable of windows, got {windows!r}")
    explicit: list[tuple[int, int]] = []
    bare: list[int] = []
    for w in windows:
        if isinstance(w, range):
            if w.step != 1:
                raise ConfigError(f"schedule.steps: invalid window {w!r}: expected a range with step 1")
            explicit.append((w.start, w.stop))
        elif isinstance(w, (tuple, list)):
            if len(w) != 2:
                raise ConfigError(f"schedule.steps: invalid window {w!r}: expected (start, stop) integers")
            explicit.append(
                (
                    _int("schedule.steps", f"start of window {w!r}", w[0], 0),
                    _int("schedule.steps", f"stop of window {w!r}", w[1], 1),
                )
            )
        else:
            bare.append(_int("schedule.steps", "step", w, 0))
    runs: list[tuple[int, int]] = []
    for s in sorted(set(bare)):
        if runs and runs[-1][1] == s:
            runs[-1] = (runs[-1][0], s + 1)
        else:
            runs.append((s, s + 1))
    merged = sorted(explicit + runs)
    return StepsSchedule(windows=tuple(merged), warmup=warmup)


def from_callable(fn: Callable[[int], Any]) -> CallableSchedule:
    """A schedule from ``fn(step) -> Action`` (or a function returning
    ``torch.profiler.ProfilerAction``, such as ``torch.profiler.schedule(...)``,
    whose ``NONE`` reads as WAIT)."""
    return CallableSchedule(fn)


def as_schedule(value: Schedule | Callable[[int], Any]) -> Schedule:
    """A :class:`Schedule` as given, or a callable wrapped by :func:`from_callable`."""
    if isinstance(value, Schedule):
        return value
    if callable(value):
        return CallableSchedule(value)
    raise ConfigError(f"invalid schedule: expected a fastprof schedule or a callable (step) -> Action, got {value!r}")


_MAKERS: dict[str, Callable[..., Schedule]] = {"epoch": epoch, "cyclic": cyclic}


def parse(text: str) -> Schedule:
    """A schedule from its text form (``FASTPROF_SCHEDULE``):
    ``epoch:skip_first=1,wait=1,warmup=1,active=2,repeat=1``,
    ``cyclic:wait=1,warmup=1,active=3,repeat=2``, or ``steps:10-12,50``
    (inclusive ranges and bare steps; ``warmup=N`` may be one of the items).
    Raises :class:`fastprof.ConfigError` naming what is wrong."""
    kind, sep, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind in ("never", "none", "off") and not rest.strip():
        return never()
    items = [x.strip() for x in rest.split(",") if x.strip()] if sep else []
    if kind == "steps":
        windows: list[int | tuple[int, int]] = []
        warmup = 1
        for item in items:
            key, eq, value = item.partition("=")
            try:
                if eq:
                    if key.strip() != "warmup":
                        raise ValueError(item)
                    warmup = int(value, 10)
                elif "-" in item:
                    a, b = item.split("-", 1)
                    windows.append((int(a, 10), int(b, 10) + 1))
                else:
                    windows.append(int(item, 10))
            except ValueError:
                raise ConfigError(
                    f"invalid schedule {text!r}: {item!r} is not a step, an inclusive range a-b or warmup=N"
                ) from None
        return steps(windows, warmup=warmup)
    maker = _MAKERS.get(kind)
    if maker is None:
        raise ConfigError(f"invalid schedule {text!r}: expected epoch:..., cyclic:..., steps:... or never")
    kwargs: dict[str, int] = {}
    for item in items:
        key, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError(item)
            kwargs[key.strip()] = int(value.strip(), 10)
        except ValueError:
            raise ConfigError(f"invalid schedule {text!r}: expected name=integer items, got {item!r}") from None
    try:
        return maker(**kwargs)
    except TypeError as e:
        raise ConfigError(f"invalid schedule {text!r}: {e}") from None
