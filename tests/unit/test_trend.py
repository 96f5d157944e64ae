"""The step-time trend (issue #34, item 15) on arrays of step times with a
known trend: the median of the last tenth of the measured steps against the
first tenth's, never below -100%, none under 10 measured steps."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from fastprof.reports import SCHEMA_PATH
from fastprof.reports.speed import (
    TREND_DEFINITION,
    TREND_MIN_STEPS,
    step_trend,
    trend_note,
    trend_text,
    trend_window,
)

MS = 1e-3


def pct(*per_rank: np.ndarray[Any, np.dtype[np.float64]]) -> float | None:
    return step_trend(list(per_rank))["change_pct_over_run"]


@pytest.mark.parametrize("n", [10, 30, 100, 1000, 100_000])
def test_steps_growing_evenly_from_10_to_20_ms_read_between_60_and_110_pct(n: int) -> None:
    got = pct(np.linspace(10 * MS, 20 * MS, n))
    assert got is not None and 60 <= got <= 110, got


@pytest.mark.parametrize("n", [10, 30, 100, 1000])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flat_run_with_one_half_second_step_reads_flat(n: int, where: str) -> None:
    d = np.full(n, 10 * MS)
    d[{"first": 0, "middle": n // 2, "last": n - 1}[where]] = 0.5
    got = pct(d)
    assert got is not None and -10 <= got <= 10, got


@pytest.mark.parametrize("steps", [20, 30, 50, 101])
def test_a_run_whose_first_10_steps_take_100_ms_reads_a_fall_never_below_100_pct(steps: int) -> None:
    d = np.where(np.arange(steps) < 10, 100 * MS, 10 * MS)[1:]  # the first step is the warm-up
    got = pct(d)
    assert got is not None and -100 <= got <= -75, got
    assert got == pytest.approx(-90.0)


def test_no_run_falls_by_more_than_100_pct() -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(10, 400))
        d = rng.lognormal(rng.normal(-4, 1), 2.0, n) * np.linspace(rng.uniform(1, 50), 1, n)
        got = pct(d)
        assert got is not None and got >= -100, got
    assert pct(np.concatenate([np.full(5, 1.0), np.zeros(95)])) == -100.0


@pytest.mark.parametrize("n", [0, 1, 2, 5, TREND_MIN_STEPS - 1])
def test_fewer_than_10_measured_steps_give_no_trend(n: int) -> None:
    assert step_trend([np.linspace(10 * MS, 20 * MS, n)]) == {"slope_s_per_step": None, "change_pct_over_run": None}
    assert step_trend([]) == {"slope_s_per_step": None, "change_pct_over_run": None}


def test_first_steps_that_took_no_time_give_no_percentage() -> None:
    first: np.ndarray[Any, np.dtype[np.float64]] = np.zeros(10)
    t = step_trend([np.concatenate([first, np.full(20, 10 * MS)])])
    assert t["change_pct_over_run"] is None and t["slope_s_per_step"] is not None


def test_the_windows_are_a_tenth_rounded_up_and_at_least_3() -> None:
    assert [trend_window(n) for n in (10, 29, 30, 31, 99, 100, 101, 1000)] == [3, 3, 3, 4, 10, 10, 11, 100]


def test_it_can_be_checked_by_hand() -> None:
    """29 measured steps: the last 3 against the first 3, medians."""
    d = np.array([7, 9, 8] + [50] * 23 + [12, 100, 11], dtype=np.float64) * MS
    t = step_trend([d])
    assert t["change_pct_over_run"] == pytest.approx(100 * (12 - 8) / 8)
    assert t["slope_s_per_step"] == pytest.approx((12 - 8) * MS / (29 - 3))


def test_linear_growth_s_slope_is_the_slope() -> None:
    d: np.ndarray[Any, np.dtype[np.float64]] = 0.010 + 0.0001 * np.arange(200, dtype=np.float64)
    assert step_trend([d])["slope_s_per_step"] == pytest.approx(0.0001)


def test_ranks_are_pooled_and_a_rank_with_too_few_steps_takes_no_part() -> None:
    a = np.linspace(10 * MS, 20 * MS, 40)
    b = np.linspace(10 * MS, 20 * MS, 40) + 1 * MS
    both, alone_a, alone_b = pct(a, b), pct(a), pct(b)
    assert both is not None and alone_a is not None and alone_b is not None
    assert min(alone_a, alone_b) <= both <= max(alone_a, alone_b)
    assert pct(a, np.full(5, 1.0)) == alone_a
    assert pct(np.full(5, 1.0), np.full(9, 1.0)) is None


def _speed(steps_measured: list[int], warm: int, pct_: float | None) -> dict[str, Any]:
    return {
        "warmup": {"steps_excluded": warm},
        "train": {"per_rank": [{"rank": r, "steps_measured": n} for r, n in enumerate(steps_measured)]},
        "step_time": {"trend": {"change_pct_over_run": pct_, "slope_s_per_step": None}},
    }


def test_the_report_says_the_value_the_windows_and_why_there_is_none() -> None:
    assert trend_text(_speed([29], 1, -90.0)) == "-90.0%"
    assert trend_text(_speed([7], 1, None)) == "none (7 measured steps, fewer than 10)"
    note = trend_note(_speed([29], 1, -90.0))
    assert "the median of the last 3 of the 29 measured steps against the median of the first 3 (" in note
    assert "1 warm-up step(s) left out" in note
    assert "every rank's pooled" in trend_note(_speed([40, 40], 1, 5.0))
    # No windows to name: the definition.
    assert trend_note(_speed([7], 1, None)) == f"Step time trend: {TREND_DEFINITION}."
    assert trend_note(_speed([40, 41], 1, 5.0)) == f"Step time trend: {TREND_DEFINITION}."


def test_the_schema_describes_the_trend_as_the_report_says_it() -> None:
    schema = json.loads((SCHEMA_PATH).read_text())
    trend = schema["properties"]["speed"]["properties"]["step_time"]["properties"]["trend"]
    assert TREND_DEFINITION in trend["description"]
    assert set(trend["properties"]) == {"slope_s_per_step", "change_pct_over_run"}
