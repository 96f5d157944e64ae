"""The anatomy's phase split in blocks of steps (issue #38, item 1): the
same figures as all steps at once, in memory that does not grow with the
run beyond the result (~8 bytes per step and phase)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from fastprof.recording.names import PHASES
from fastprof.reports.phases import split


def _run(n: int, seed: int = 0, overlapping_steps: bool = False) -> tuple[Any, Any, dict[str, list[tuple[Any, Any]]]]:
    """``n`` steps of 1-3 ms with nested, overlapping phase spans: a
    recomputed forward and a collective inside backward, an optimizer step
    in backward's hook on some steps, spans past their step's end, a loader
    wait before the first step; two names for optimizer."""
    rng = np.random.default_rng(seed)
    dur = rng.integers(1_000_000, 3_000_000, n)
    gap = rng.integers(0, 50_000, n)
    if overlapping_steps:
        gap[rng.random(n) < 0.05] = -200_000  # some steps start before the last one ended
    ts = 1_000_000 + np.concatenate([[0], np.cumsum(dur + gap)[:-1]])
    f = dur // 4
    fw = (ts + dur // 10, ts + dur // 10 + f)
    bw_ts = fw[1] + 10_000
    bw = (bw_ts, bw_ts + dur // 2)
    re_ts = bw_ts + dur // 20  # the recomputed forward, inside backward
    comm = (bw_ts + dur // 3, bw_ts + dur // 3 + dur // 8)
    fw_all = np.concatenate([fw[0], re_ts]), np.concatenate([fw[1], re_ts + f // 2])
    o = np.argsort(fw_all[0], kind="stable")
    hook = rng.random(n) < 0.3
    opt_a = (
        np.where(hook, bw_ts + dur // 4, bw[1] + 5_000),
        np.where(hook, bw_ts + dur // 4 + dur // 20, ts + dur + 400_000),
    )
    opt_b = (ts[::7] + dur[::7] - 100_000, ts[::7] + dur[::7] - 50_000)
    dl = (np.concatenate([[0], ts[1:] + 1_000]), np.concatenate([[900_000], ts[1:] + 60_000]))
    spans = {
        "dataloader": [dl],
        "forward": [(fw_all[0][o], fw_all[1][o])],
        "backward": [bw],
        "optimizer": [opt_a, opt_b],
        "communication": [comm],
    }
    return ts, dur, spans


@pytest.mark.parametrize("overlapping_steps", [False, True])
@pytest.mark.parametrize("block", [1, 7, 64, 999])
def test_blocks_of_steps_give_the_figures_of_all_steps_at_once(block: int, overlapping_steps: bool) -> None:
    ts, dur, spans = _run(1000, seed=block, overlapping_steps=overlapping_steps)
    whole = split(ts, dur, spans, block=10**9)
    parts = split(ts, dur, spans, block=block)
    assert set(whole.per_step) == set(parts.per_step) == set(PHASES)
    for p in PHASES:
        np.testing.assert_array_equal(parts.per_step[p], whole.per_step[p], err_msg=p)
    assert set(parts.given) == set(whole.given) and ("forward", "backward") in whole.given
    for k, v in whole.given.items():
        np.testing.assert_array_equal(parts.given[k], v, err_msg=str(k))
    # The rule's promise holds either way.
    assert (np.sum([parts.per_step[p] for p in PHASES], axis=0) == dur).all()


def _peak(n: int) -> int:
    ts, dur, spans = _run(n)
    tracemalloc.start()
    try:
        got = split(ts, dur, spans, block=BLOCK)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got.per_step["other"]) == n
    return peak


#: Steps a block (the default's temporaries, ~40 MB, would blur a small run's peak).
BLOCK = 4096


def test_memory_grows_by_under_100_bytes_a_step() -> None:
    # Beyond its inputs: the result (6 phases and the overlap's 3 pairs, 8
    # bytes a step each) and a block's temporaries, no full-length one (all
    # steps at once took ~600 bytes a step).
    small, large = 100_000, 300_000
    grow = (_peak(large) - _peak(small)) / (large - small)
    assert grow <= 100, f"{grow:.0f} bytes a step"


@pytest.mark.parametrize("block", [7, 10**9])
def test_ends_given_as_a_function_of_a_slice_give_the_same_figures(block: int) -> None:
    # How the report hands a name's spans over: the begins, and the ends gathered a block at a time.
    ts, dur, spans = _run(500, seed=3)
    lazy = {p: [(b, (lambda i, j, e=e: e[i:j])) for b, e in pairs] for p, pairs in spans.items()}
    want, got = split(ts, dur, spans, block=block), split(ts, dur, lazy, block=block)
    for p in PHASES:
        np.testing.assert_array_equal(got.per_step[p], want.per_step[p], err_msg=p)
    assert got.given.keys() == want.given.keys()
