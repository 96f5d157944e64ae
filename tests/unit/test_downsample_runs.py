"""report.html's downsampling of a long series (every step's time at 10^7
steps): each of MAX_POINTS/2 equal-count runs keeps its smallest value (the
first of equal ones) and its largest (the last of equal ones), in order,
made a run at a time. Checked against the definition, written here from
scratch, on random series with and without ties, at the lengths around the
limit and past it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fastprof.reports.html import MAX_POINTS, downsample, extremes


def _by_definition(y: np.ndarray[Any, Any], max_points: int) -> list[int]:
    n, buckets = len(y), max_points // 2
    keep: set[int] = set()
    for b in range(buckets):
        idx = [i for i in range(n) if i * buckets // n == b]
        vals = [y[i] for i in idx]
        keep.add(idx[vals.index(min(vals))])  # the first smallest
        keep.add(idx[len(vals) - 1 - vals[::-1].index(max(vals))])  # the last largest
    return sorted(keep)


@pytest.mark.parametrize("n", [1, 19, 20, 21, 37, 200, 1001])
@pytest.mark.parametrize("ties", [False, True])
def test_each_run_keeps_its_first_smallest_and_last_largest(n: int, ties: bool) -> None:
    rng = np.random.default_rng(n)
    y = rng.integers(0, 3, n).astype(np.float64) if ties else rng.random(n)
    got = extremes(y, 20)
    if n <= 20:
        assert got is None
        return
    assert got is not None and got.tolist() == _by_definition(y, 20)
    x, yy = downsample(np.arange(n, dtype=np.float64) * 0.5, y.astype(np.float64), 20)
    assert np.array_equal(x, got * 0.5) and np.array_equal(yy, y[got])


def test_integer_durations_keep_the_same_steps_as_their_milliseconds() -> None:
    dur = np.random.default_rng(1).integers(1_000, 9_000_000, 50_000)
    keep = extremes(dur)
    assert keep is not None and np.array_equal(keep, extremes(dur / 1e6))
    assert len(keep) <= MAX_POINTS
