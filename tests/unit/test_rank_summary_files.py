"""Rank summaries' parts (issue #38, item 2) and the leak slope's bounded
points (item 1): what a summary packs comes back bit for bit, a summary
is refused where it is not its rank's of its segments now, and the
Theil-Sen slope is taken over the rule's evenly spaced points."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import summarised_rank
from fastprof.memory import leaks
from fastprof.recording.names import RANK_SUMMARY_JSON
from fastprof.reports import summaries


@pytest.mark.parametrize(
    "a",
    [
        np.array([1_795_887_302_508_466_304, 1_795_887_302_508_466_000, -5, 0, 2**62], np.int64),
        np.arange(0, 10**7, 997, dtype=np.int64) * 1_000_003 + 1_700_000_000_000_000_000,
        np.array([0.5, np.nan, np.inf, -np.inf, 1e-300, -0.0], np.float64),
        np.zeros(0, np.int64),
    ],
)
def test_a_packed_column_comes_back_bit_for_bit(a: np.ndarray) -> None:
    back = summaries._unpack(json.loads(json.dumps(summaries.pack(a))))
    assert back.dtype.kind == a.dtype.kind
    assert back.tobytes() == a.tobytes()


_rank = summarised_rank


def test_every_rank_summary_current_is_read_and_any_other_is_refused_with_why(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for r in range(3):
        _rank(run, r)
    got, why = summaries.read_all(run)
    assert got is not None and [s["rank"] for s in got] == [0, 1, 2] and why == ""
    cases = {
        "rank 3 wrote no": lambda d: (d / RANK_SUMMARY_JSON).unlink(),
        "segments changed": lambda d: (d / "fastprof.1.json.gz").write_bytes(b"y"),
        "by fastprof 0.0.0": lambda d: summaries.write(
            d, json.loads((d / RANK_SUMMARY_JSON).read_text()) | {"fastprof_version": "0.0.0"}
        ),
        "of rank 7": lambda d: summaries.write(d, json.loads((d / RANK_SUMMARY_JSON).read_text()) | {"rank": 7}),
        "of run 'other'": lambda d: summaries.write(
            d, json.loads((d / RANK_SUMMARY_JSON).read_text()) | {"run_name": "other"}
        ),
        "unreadable": lambda d: (d / RANK_SUMMARY_JSON).write_text("{"),
    }
    for i, (said, spoil) in enumerate(cases.items()):
        one = tmp_path / f"case{i}"
        for r in range(3):
            _rank(one, r)
        d = _rank(one, 3)
        assert summaries.read_all(one)[0] is not None
        spoil(d)
        got, why = summaries.read_all(one)
        assert got is None and said in why, (said, why)


def test_the_leak_slope_is_taken_over_the_rules_evenly_spaced_points() -> None:
    rng = np.random.default_rng(38)
    x = np.arange(1000, dtype=np.float64)
    y = 1e9 + 2e4 * x + rng.normal(0, 5e6, len(x))
    pick = np.unique(np.linspace(0, len(x) - 1, leaks.SLOPE_POINTS).astype(np.int64))
    assert len(pick) == leaks.SLOPE_POINTS and pick[0] == 0 and pick[-1] == len(x) - 1
    assert leaks.theil_sen(x, y) == leaks.theil_sen(x[pick], y[pick])
    # The slope still finds the growth, within its own interval.
    _slope, lo, hi = leaks.theil_sen(x, y)
    assert lo < 2e4 < hi and lo > 0
