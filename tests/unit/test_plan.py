"""The merged action sequence (fastprof.profiler.plan): a triggered capture
asked for at every step of schedules' windows (WAIT, WARMUP, ACTIVE,
ACTIVE_AND_SAVE, DISABLED), at an epoch's end, overlapping a window's end,
longer than the gap to the next window, and again as soon as one ended, is
run through the plan as the Profiler does, and every window the torch
driver is handed is checked against torch.profiler's own transition table:
no step torch warns about ("Incorrect schedule: RECORD followed by WARMUP")
and none that makes it hand out a trace while the same object records on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from fastprof.profiler import schedule
from fastprof.profiler.plan import ActionPlan
from fastprof.profiler.schedule import Action, Schedule, to_torch

W, U, A, AS, D = Action.WAIT, Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE, Action.DISABLED
_RECORDS = (U, A, AS)


@pytest.fixture(scope="module")
def torch_table() -> Callable[[Action, Action], list[str]]:
    """What torch.profiler does when a live profiler object steps from one
    action to the next: its own table (a profile object made, never started)."""
    torch_profiler = pytest.importorskip("torch.profiler")
    tp = torch_profiler.profile(activities=[torch_profiler.ProfilerActivity.CPU])

    def name(f: object) -> str:
        func = getattr(f, "func", None)  # functools.partial(warn, ...)
        if func is not None:
            return f"{getattr(func, '__name__', func)}: {' '.join(map(str, getattr(f, 'args', ())))}"
        return str(getattr(f, "__name__", f))

    def step(prev: Action, nxt: Action) -> list[str]:
        return [name(f) for f in tp.action_map[(to_torch(prev), to_torch(nxt))]]

    return step


@dataclass
class Capture:
    asked: int
    first: int
    last: int
    done_at: int | None = None
    with_schedule: bool = False


@dataclass
class Run:
    """One simulated run: the action of each step, the captures."""

    actions: list[Action] = field(default_factory=list)
    scheduled: list[Action] = field(default_factory=list)
    captures: list[Capture] = field(default_factory=list)
    coalesced: list[int] = field(default_factory=list)


def _positions(epochs: int, epoch_len: int, known: bool) -> Iterator[tuple[int, int, int, int | None, bool]]:
    """(step, epoch, batch in epoch, epoch length as the Profiler knows it,
    last of its epoch) of a run of ``epochs`` passes over ``epoch_len`` batches."""
    step = 0
    for e in range(epochs):
        for b in range(epoch_len):
            yield step, e, b, (epoch_len if known else None), b == epoch_len - 1
            step += 1


def run(
    sch: Schedule,
    asks: Callable[[int], int | None],
    *,
    epochs: int = 3,
    epoch_len: int = 16,
    known: bool = True,
    lead: int = 0,
) -> Run:
    """Drive an ActionPlan as Profiler._on_begin/_on_end do. ``asks(step)``:
    the steps of a capture asked for at that step's begin (None: none).
    One capture at a time (a request while one is armed or running is
    coalesced); ``lead``: it starts that many steps later (a capture every
    rank takes). At each epoch's end a fetch finds the loader exhausted: a
    begin of the next global step, at the old epoch's position, that is no
    step (the Profiler is asked again at the next epoch's first batch)."""
    plan = ActionPlan()
    out = Run()
    pending: Capture | None = None
    for step, epoch, b, elen, last_in_epoch in _positions(epochs, epoch_len, known):
        n = asks(step)
        if n is not None:
            if pending is None:
                pending = Capture(step, step + lead, step + lead + n - 1)
            else:
                out.coalesced.append(step)
        capture = None if pending is None else (pending.first, pending.last)
        scheduled = sch.at(step, epoch, b, elen)
        action = plan.action(step, scheduled, capture)
        # Asking again for the same step gives the same answer.
        assert plan.action(step, scheduled, capture) is action
        out.actions.append(action)
        out.scheduled.append(scheduled)
        closed = plan.end(step, action)
        if pending is not None and step >= pending.first and closed:
            pending.done_at, pending.with_schedule = step, plan.with_schedule
            out.captures.append(pending)
            pending = None
        if last_in_epoch:
            # The fetch past the epoch's end: a begin that is no step.
            plan.action(step + 1, sch.at(step + 1, epoch, b + 1, elen), capture)
    if pending is not None:
        out.captures.append(pending)
    return out


def windows(actions: list[Action]) -> list[tuple[int, int, bool]]:
    """The torch windows the driver makes of the actions: (first, last,
    saved) step. A window begins at a step in a window, saves at
    ACTIVE_AND_SAVE, and is stopped at the first step outside one."""
    out: list[tuple[int, int, bool]] = []
    first = None
    for i, a in enumerate(actions):
        if a not in _RECORDS:
            if first is not None:
                out.append((first, i - 1, False))
            first = None
            continue
        if first is None:
            first = i
        if a is AS:
            out.append((first, i, True))
            first = None
    if first is not None:
        out.append((first, len(actions) - 1, False))
    return out


def check(r: Run, torch_table: Callable[[Action, Action], list[str]]) -> None:
    acts = r.actions
    for first, last, _saved in windows(acts):
        for i in range(first, last):
            done = torch_table(acts[i], acts[i + 1])
            # Inside one profiler object: no "Incorrect schedule" warning,
            # no trace handed out (the driver stops the object to save it).
            assert not any(d.startswith("warn") for d in done), (i, acts[first : last + 1], done)
            assert "_trace_ready" not in done, (i, acts[first : last + 1], done)
            assert acts[i] is not AS
    # Every step the schedule records is recorded.
    for i, s in enumerate(r.scheduled):
        if s.records:
            assert acts[i].records, (i, s, acts[i])
    by_last = {w[1]: w for w in windows(acts)}
    for c in r.captures:
        if c.done_at is None:  # the run ended first: every step it had recorded
            assert c.last >= len(acts) - 1, c
            assert all(a.records for a in acts[c.first :]), (c, acts[c.first :])
            continue
        # Each step of the capture recorded, in one window that closes at
        # or after its last step, where the schedule does not go on.
        assert all(acts[i].records for i in range(c.first, c.last + 1)), (c, acts[c.first : c.last + 1])
        first, last, saved = by_last[c.done_at] if c.done_at in by_last else by_last[c.done_at - 1]
        assert first <= c.first and last >= c.last, (c, first, last)
        assert saved or acts[c.done_at] not in _RECORDS
        for i in range(c.last, last):
            assert r.scheduled[i] in (U, A), (c, i, r.scheduled[i])
        # It shares a window with the schedule exactly when the window holds a scheduled step.
        assert c.with_schedule == any(r.scheduled[i] in _RECORDS for i in range(first, last + 1)), c


EPOCH = schedule.epoch(wait=1, warmup=1, active=2)  # per epoch of 16: windows 1-3, 5-7; DISABLED from 8


def test_without_a_capture_the_actions_are_the_schedules(torch_table):
    for sch in (
        EPOCH,
        schedule.epoch(skip_first=2, wait=0, warmup=2, active=3, repeat=0),
        schedule.cyclic(wait=2, warmup=2, active=3),
        schedule.cyclic(wait=0, warmup=1, active=1, repeat=3, skip_first=4),
        schedule.steps([(3, 6), (6, 9), 20, (30, 40)], warmup=2),
        schedule.never(),
    ):
        r = run(sch, lambda _s: None)
        assert r.actions == r.scheduled, sch
        check(r, torch_table)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12, 20])
def test_a_capture_asked_at_every_step_of_the_epoch_schedule(torch_table, n):
    """Asked in WAIT (0, 4), WARMUP (1, 5), ACTIVE (2, 6), ACTIVE_AND_SAVE
    (3, 7), DISABLED (8-15) and at the epoch's last step; ``n`` from one
    step to longer than the gap to the next window and than an epoch."""
    saw = set()
    for at in range(40):
        r = run(EPOCH, lambda s, at=at: n if s == at else None, epochs=4)
        check(r, torch_table)
        [c] = r.captures
        saw.add(r.scheduled[at])
        # The schedule's windows not met by the capture are its own, untouched.
        for first, last, _saved in windows(r.scheduled):
            if last < c.first or first > c.done_at:
                assert r.actions[first : last + 1] == r.scheduled[first : last + 1]
    assert saw == {W, U, A, AS, D}


def test_the_readme_crash_a_capture_over_the_epoch_end_into_the_next_window(torch_table):
    """The crash: a slow step at batch 14 of each epoch asks at batch 15
    (DISABLED) for 5 steps; the next epoch's window warms up at its batch 1
    while the capture records. Now one window records 15..(next epoch) 3 and
    saves at the schedule's own save step."""
    r = run(EPOCH, lambda s: 5 if s % 16 == 15 and 48 <= s < 90 else None, epochs=6)
    check(r, torch_table)
    assert [(c.first, c.done_at, c.with_schedule) for c in r.captures] == [(63, 67, True), (79, 83, True)]
    assert r.actions[63:68] == [A, A, A, A, AS]
    assert r.scheduled[63:68] == [D, W, U, A, AS]


@pytest.mark.parametrize(
    "sch",
    [
        EPOCH,
        schedule.epoch(wait=0, warmup=2, active=3, repeat=0),
        schedule.cyclic(wait=1, warmup=2, active=2),
        schedule.cyclic(wait=0, warmup=1, active=1),
        schedule.steps([(4, 6), 7, (12, 20), (21, 22)], warmup=3),
        schedule.never(),
    ],
    ids=["epoch", "epoch-back-to-back", "cyclic", "cyclic-no-wait", "steps", "never"],
)
@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_repeated_captures_asked_at_every_step(torch_table, sch, n):
    """A slow step every step (anomaly_max high, min_interval_s 0): a
    capture, coalesced while it is armed or running, another as soon as it
    is done; and the same with a start a few steps ahead (every rank)."""
    for lead in (0, 3):
        r = run(sch, lambda _s: n, epochs=2, lead=lead)
        check(r, torch_table)
        assert r.captures
        assert len(r.captures) + len(r.coalesced) == len(r.actions)  # each ask: taken or coalesced
        for a, b in zip(r.captures, r.captures[1:], strict=False):
            assert b.asked > a.done_at  # one at a time


def test_an_epoch_schedule_whose_epoch_length_is_unknown_never_goes_back_to_warmup(torch_table):
    """A loader without len(): the window the epoch's end cuts short goes on
    into the next epoch, whose first batches warm up. That alone sent torch
    RECORD followed by WARMUP (and crashed): the window records on instead."""
    sch = schedule.epoch(wait=0, warmup=1, active=2, repeat=0)
    r = run(sch, lambda _s: None, epochs=3, epoch_len=17, known=False)
    check(r, torch_table)
    assert r.scheduled[15:20] == [U, A, U, A, AS]
    assert r.actions[15:20] == [U, A, A, A, AS]
    for at in range(40):
        check(run(sch, lambda s, at=at: 4 if s == at else None, epoch_len=17, known=False), torch_table)


def test_a_callable_schedule_going_back_to_warmup(torch_table):
    pattern = [W, U, A, U, A, AS, A, U, AS, W]
    sch = schedule.from_callable(lambda s: pattern[s % len(pattern)])
    r = run(sch, lambda _s: None, epochs=1, epoch_len=30)
    check(r, torch_table)
    for at in range(30):
        check(run(sch, lambda s, at=at: 3 if s == at else None, epochs=1, epoch_len=30), torch_table)


def test_a_capture_asked_at_the_epoch_end_fetch_that_is_no_step():
    """The fetch past an epoch's end is asked about the next global step at
    the old epoch's position (DISABLED there) and finds nothing: the step
    begins again at the next epoch's first batch (WAIT, then the window).
    Asking first at the wrong position changes nothing."""
    plan = ActionPlan()
    for s in range(16):
        assert plan.end(s, plan.action(s, EPOCH.at(s, 0, s, 16))) is (s in (3, 7))
    capture = (16, 19)
    assert plan.action(16, EPOCH.at(16, 0, 16, 16), capture) is A  # the fetch that found no batch
    acts, closed = [], []
    for b in range(6):
        a = plan.action(16 + b, EPOCH.at(16 + b, 1, b, 16), capture)
        acts.append(a)
        closed.append(plan.end(16 + b, a))
        if closed[-1]:
            assert plan.with_schedule  # the window held the schedule's steps 17-19
            capture = None
    assert acts == [A, A, A, AS, W, U]
    assert closed == [False, False, False, True, False, False]
