"""The slow-step rule's replay judges a block of steps at a time (issue #38,
item 1): the same slow steps as all at once, in memory that does not grow
with the run beyond its inputs (a long run's temporaries were ~70 bytes a
step)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fastprof.profiler import slow_step
from fastprof.profiler.slow_step import SlowStepRule


def _steps(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dur = rng.integers(9_000_000, 11_000_000, n)
    slow = rng.random(n) < 0.002
    dur[slow] *= 5  # slow steps, some in bursts
    dur[np.flatnonzero(slow)[::3] + 1 if n > 1 else []] *= 5
    judged = rng.random(n) > 0.01
    return dur, judged


@pytest.mark.parametrize("block", [1, 13, 1000])
def test_blocks_find_the_slow_steps_of_all_at_once(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    dur, judged = _steps(20_000, seed=block)
    rule = SlowStepRule()
    whole = rule.find(dur, judged, not_the_jobs=[5, 77])
    assert len(whole) >= 10
    monkeypatch.setattr(slow_step, "JUDGE_BLOCK", block)
    assert rule.find(dur, judged, not_the_jobs=[5, 77]) == whole


def _peak(n: int) -> int:
    dur, judged = _steps(n)
    tracemalloc.start()
    try:
        SlowStepRule().find(dur, judged)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_by_the_judged_steps_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slow_step, "JUDGE_BLOCK", 4096)
    small, large = 200_000, 600_000
    grow = (_peak(large) - _peak(small)) / (large - small)
    # The judged steps' indices and durations (8 bytes each) and a block's temporaries.
    assert grow <= 24, f"{grow:.0f} bytes a step"
