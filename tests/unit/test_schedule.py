"""Schedules: Composer's documented per-epoch table, torch.profiler.schedule
action for action, explicit windows, callables, and the checks."""

from __future__ import annotations

import itertools
import re
import sys
import warnings

import pytest

import fastprof
from fastprof import ConfigError
from fastprof.profiler import schedule
from fastprof.profiler.schedule import Action, Position

S, W, U, A, AS, D = (
    Action.SKIP_FIRST,
    Action.WAIT,
    Action.WARMUP,
    Action.ACTIVE,
    Action.ACTIVE_AND_SAVE,
    Action.DISABLED,
)


def test_module_imports_no_torch_and_is_reachable_from_fastprof():
    assert fastprof.schedule is schedule
    assert fastprof.profiler.schedule is schedule
    # Importing the schedule must not pull torch in (the profiler imports it lazily).
    import subprocess

    code = "import sys, fastprof.profiler.schedule; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ Composer


def test_epoch_schedule_reproduces_composers_documented_table_in_every_epoch():
    # Composer's docs: skip_first=1, wait=1, warmup=1, active=2, repeat=1.
    # batch 0 skip_first, 1 wait, 2 warmup, 3-4 active (saved at 4),
    # 5 wait, 6 warmup, 7-8 active (saved at 8), 9 and later disabled.
    expected_epoch = [S, W, U, A, AS, W, U, A, AS, D, D, D, D]
    sched = schedule.epoch(skip_first=1, wait=1, warmup=1, active=2, repeat=1)
    n = len(expected_epoch)
    got = []
    for step in range(2 * n):  # two epochs of 13 batches, global steps 0..25
        ep, b = divmod(step, n)
        got.append(sched(Position(step=step, epoch=ep, batch_in_epoch=b)))
    assert got == expected_epoch + expected_epoch
    saves = [s for s in range(2 * n) if sched.ends_window(Position(step=s, epoch=s // n, batch_in_epoch=s % n))]
    assert saves == [4, 8, 13 + 4, 13 + 8]
    assert sched.windows_per_epoch == 2


def test_epoch_schedule_repeat_zero_repeats_to_the_end_of_the_epoch():
    sched = schedule.epoch(skip_first=1, wait=1, warmup=1, active=2, repeat=0)
    got = [sched(Position(step=100 + b, epoch=3, batch_in_epoch=b)) for b in range(14)]
    assert got == [S, W, U, A, AS, W, U, A, AS, W, U, A, AS, W]
    assert sched.windows_per_epoch is None


def test_epoch_schedule_saves_a_window_the_epoch_cuts_short():
    sched = schedule.epoch(skip_first=0, wait=0, warmup=1, active=4, repeat=0)
    # Epoch of 4 batches: warmup 0, active 1..3, the last batch ends the window.
    got = [sched(Position(step=b, batch_in_epoch=b, epoch_len=4)) for b in range(4)]
    assert got == [U, A, A, AS]
    # Without the epoch length it cannot know.
    assert sched(Position(step=3, batch_in_epoch=3)) is A


def test_epoch_schedule_defaults_are_composers():
    s = schedule.epoch()
    assert (s.skip_first, s.wait, s.warmup, s.active, s.repeat) == (0, 0, 1, 4, 1)


# ---------------------------------------------------------------- torch


def torch_actions(n_steps: int, **kw: int) -> list[object]:
    import torch.profiler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about warmup=0
        fn = torch.profiler.schedule(**kw)
    return [fn(step) for step in range(n_steps)]


GRID = [
    dict(wait=w, warmup=u, active=a, repeat=r, skip_first=s, skip_first_wait=f)
    for w, u, a, r, s, f in itertools.product((0, 1, 3), (0, 1, 2), (1, 2, 5), (0, 1, 3), (0, 1, 4), (0, 1))
]


def test_the_torch_grid_is_large():
    assert len(GRID) >= 300


@pytest.mark.parametrize("n_steps", [61])
def test_cyclic_matches_torch_profiler_schedule_action_for_action(n_steps):
    for kw in GRID:
        sched = schedule.cyclic(**kw)
        ours = [schedule.to_torch(sched(step)) for step in range(n_steps)]
        assert ours == torch_actions(n_steps, **kw), kw
        # The wrapper torch.profiler.profile(schedule=...) would take agrees too.
        fn = sched.as_torch()
        assert [fn(step) for step in range(n_steps)] == ours


def test_cyclic_names_the_states_torch_leaves_as_none():
    sched = schedule.cyclic(wait=1, warmup=1, active=2, repeat=2, skip_first=2)
    got = [sched(step) for step in range(12)]
    assert got == [S, S, W, U, A, AS, W, U, A, AS, D, D]
    assert [s for s in range(12) if sched.ends_window(s)] == [5, 9]


def test_cyclic_skip_first_wait_starts_the_first_cycle_at_warmup():
    sched = schedule.cyclic(wait=3, warmup=1, active=1, repeat=2, skip_first=2, skip_first_wait=True)
    got = [sched(step) for step in range(10)]
    assert got == [S, S, U, AS, W, W, W, U, AS, D]
    assert sched.skip_first_wait is True


def test_action_mapping_to_and_from_torch():
    from torch.profiler import ProfilerAction as PA

    assert {a: schedule.to_torch(a) for a in Action} == {
        S: PA.NONE,
        W: PA.NONE,
        D: PA.NONE,
        U: PA.WARMUP,
        A: PA.RECORD,
        AS: PA.RECORD_AND_SAVE,
    }
    assert [schedule.from_torch(p) for p in (PA.NONE, PA.WARMUP, PA.RECORD, PA.RECORD_AND_SAVE)] == [W, U, A, AS]
    with pytest.raises(ConfigError, match="ProfilerAction"):
        schedule.from_torch(PA.DEVICE_STOPPED)
    with pytest.raises(ConfigError, match="ProfilerAction"):
        schedule.from_torch("RECORD")
    assert [a for a in Action if a.records] == [A, AS]
    assert [a for a in Action if a.saves] == [AS]


# ------------------------------------------------------- steps and callables


def test_steps_explicit_windows_with_warmup():
    sched = schedule.steps([(3, 5), range(8, 11)], warmup=2)
    got = [sched(step) for step in range(13)]
    assert got == [W, U, U, A, AS, W, U, U, A, A, AS, D, D]
    assert sched.windows == ((3, 5), (8, 11))


def test_steps_bare_steps_that_follow_each_other_make_one_window():
    sched = schedule.steps({12, 10, 11, 50}, warmup=0)
    assert sched.windows == ((10, 13), (50, 51))
    assert [s for s in range(60) if sched.ends_window(s)] == [12, 50]
    assert sched(13) is W and sched(49) is W and sched(51) is D


def test_steps_warmup_is_cut_at_zero_and_at_the_previous_window():
    sched = schedule.steps([(1, 3), (4, 6), (6, 7)], warmup=3)
    got = [sched(step) for step in range(8)]
    # Window (6, 7) touches (4, 6): no room for warmup; (4, 6) has one step.
    assert got == [U, A, AS, U, A, AS, AS, D]


def test_from_callable_accepts_actions_and_torch_actions():
    import torch.profiler

    mine = schedule.from_callable(lambda step: AS if step % 3 == 2 else A)
    assert [mine(s) for s in range(6)] == [A, A, AS, A, A, AS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tfn = torch.profiler.schedule(wait=1, warmup=1, active=1)
    theirs = schedule.as_schedule(tfn)
    assert [theirs(s) for s in range(4)] == [W, U, AS, W]
    assert schedule.as_schedule(mine) is mine
    bad = schedule.from_callable(lambda step: "active")
    with pytest.raises(ConfigError, match="returned 'active' for step 0"):
        bad(0)


# -------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: schedule.cyclic(wait=1, warmup=1, active=0),
            r"schedule.cyclic: invalid active: expected an integer >= 1, got 0",
        ),
        (lambda: schedule.cyclic(wait=-1, warmup=1, active=1), r"invalid wait: expected an integer >= 0, got -1"),
        (lambda: schedule.cyclic(wait=1, warmup=1.0, active=1), r"invalid warmup: expected an integer >= 0, got 1.0"),
        (lambda: schedule.cyclic(wait=1, warmup=1, active=True), r"invalid active: expected an integer >= 1, got True"),
        (lambda: schedule.cyclic(wait=1, warmup=1, active=1, repeat="2"), r"invalid repeat: .* got '2'"),
        (lambda: schedule.cyclic(wait=1, warmup=1, active=1, skip_first=-3), r"invalid skip_first"),
        (lambda: schedule.cyclic(wait=1, warmup=1, active=1, skip_first_wait=-1), r"invalid skip_first_wait"),
        (lambda: schedule.cyclic(wait=1, warmup=1, active=1, skip_first_wait="yes"), r"invalid skip_first_wait"),
        (lambda: schedule.epoch(active=0), r"schedule.epoch: invalid active: expected an integer >= 1, got 0"),
        (lambda: schedule.epoch(repeat=-1), r"schedule.epoch: invalid repeat"),
        (lambda: schedule.epoch(skip_first=None), r"schedule.epoch: invalid skip_first: .* got None"),
        (lambda: schedule.steps([]), r"expected at least one window"),
        (lambda: schedule.steps([(5, 5)]), r"expected stop > start"),
        (lambda: schedule.steps([(0, 5), (3, 8)]), r"overlaps"),
        (lambda: schedule.steps([(0, 5), 4]), r"overlaps"),
        (lambda: schedule.steps([(-1, 5)]), r"start of window \(-1, 5\): expected an integer >= 0"),
        (lambda: schedule.steps([(1, 2, 3)]), r"expected \(start, stop\) integers"),
        (lambda: schedule.steps([range(0, 10, 2)]), r"range with step 1"),
        (lambda: schedule.steps([1.5]), r"invalid step: expected an integer >= 0, got 1.5"),
        (lambda: schedule.steps(7), r"expected an iterable of windows"),
        (lambda: schedule.steps([1], warmup=-1), r"schedule.steps: invalid warmup"),
        (lambda: schedule.from_callable(42), r"expected a callable"),
        (lambda: schedule.as_schedule("cyclic"), r"invalid schedule"),
        (lambda: Position(step=-1), r"Position: invalid step: expected an integer >= 0, got -1"),
        (lambda: Position(step=0, epoch_len=0), r"invalid epoch_len"),
    ],
)
def test_bad_parameters_raise_config_error_naming_them(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_config_error_is_a_value_error_and_schedules_are_frozen():
    sched = schedule.cyclic(wait=1, warmup=1, active=1)
    with pytest.raises(ValueError):
        schedule.epoch(active=0)
    with pytest.raises(AttributeError):
        sched.active = 3  # type: ignore[misc]
    assert sched == schedule.cyclic(wait=1, warmup=1, active=1)
    assert hash(sched) == hash(schedule.cyclic(wait=1, warmup=1, active=1))
    with pytest.raises(ConfigError, match="invalid step"):
        sched(-1)


def test_parse_reads_the_text_form_of_every_kind():
    assert schedule.parse("epoch:skip_first=1,wait=1,warmup=1,active=2,repeat=1") == schedule.epoch(
        skip_first=1, wait=1, warmup=1, active=2, repeat=1
    )
    assert schedule.parse(" cyclic: wait=1, warmup=0, active=3 ") == schedule.cyclic(wait=1, warmup=0, active=3)
    assert schedule.parse("steps:10-12,50,warmup=2") == schedule.steps([(10, 13), 50], warmup=2)
    assert schedule.parse("epoch") == schedule.epoch()
    never = schedule.parse(" never ")
    assert never == schedule.never() == schedule.parse("off")
    assert {never.at(s, 0, s, None) for s in range(1000)} == {Action.WAIT}
    assert never.quiet_steps(0, 0, 0, None) >= 1 << 40
    for bad, match in (
        ("weekly:x=1", "expected epoch:..., cyclic:..., steps:... or never"),
        ("epoch:wait", "expected name=integer items"),
        ("epoch:wait=1.5", "expected name=integer items"),
        ("epoch:colour=1", "unexpected keyword"),
        ("steps:a-b", "not a step"),
        ("cyclic:wait=1,warmup=1,active=0", "active"),
    ):
        with pytest.raises(ConfigError, match=match):
            schedule.parse(bad)


QUIET = {Action.SKIP_FIRST, Action.WAIT, Action.DISABLED}


@pytest.mark.parametrize(
    "sched",
    [
        schedule.epoch(),
        schedule.epoch(skip_first=3, wait=2, warmup=1, active=2, repeat=2),
        schedule.epoch(wait=5, warmup=0, active=1, repeat=0),
        schedule.cyclic(wait=3, warmup=1, active=2, repeat=2, skip_first=4),
        schedule.cyclic(wait=2, warmup=2, active=1, skip_first=1, skip_first_wait=True),
        schedule.steps([(5, 8), (20, 22), range(40, 41)], warmup=2),
        schedule.steps([(0, 2), (3, 5)], warmup=3),
        schedule.from_callable(lambda s: Action.WAIT),
    ],
    # The repr, but a function's address differs between processes (pytest-xdist's
    # workers must collect the same ids).
    ids=lambda s: re.sub(r" at 0x[0-9a-f]+", "", repr(s)),
)
@pytest.mark.parametrize("epoch_len", [None, 7, 30])
def test_quiet_steps_never_overstates_a_quiet_run(sched, epoch_len):
    """The profiler begins quiet_steps(...) steps without asking the schedule:
    each of them must have this step's (non-recording) action; and the answer
    is exact for the built-in schedules (it reaches the next change)."""
    steps_per_epoch = epoch_len or 60
    for epoch in range(2):
        for b in range(steps_per_epoch):
            step = epoch * steps_per_epoch + b
            act = sched.at(step, epoch, b, epoch_len)
            n = sched.quiet_steps(step, epoch, b, epoch_len)
            assert n >= 0
            if act not in QUIET:
                assert n == 0, (step, act, n)
                continue
            last = min(b + n, steps_per_epoch - 1)
            for k in range(b + 1, last + 1):
                assert sched.at(epoch * steps_per_epoch + k, epoch, k, epoch_len) is act, (step, n, k)
            if isinstance(sched, schedule.CallableSchedule):
                assert n == 0
            elif last < steps_per_epoch - 1:
                nxt = last + 1
                assert sched.at(epoch * steps_per_epoch + nxt, epoch, nxt, epoch_len) is not act, (step, n)
