"""fastprof.reports.many (issue #38, item 3): the distributions, outliers and
rank lists the terminal and the page show in place of a line per rank.
Percentiles are checked against Python's ``statistics`` (not numpy, which
the module uses)."""

from __future__ import annotations

import random
import statistics

import pytest

from fastprof.reports.many import (
    MANY_RANKS,
    OUTLIER_SHARE,
    by_span_name,
    many,
    named,
    outliers,
    ranges,
    representatives,
    spread,
    spread_text,
)


def test_many_starts_above_the_threshold() -> None:
    assert not many(1) and not many(MANY_RANKS) and many(MANY_RANKS + 1)


def test_spread_is_the_distribution_and_the_ranks_at_its_ends() -> None:
    rng = random.Random(1)
    pairs: list[tuple[int, float | None]] = [(r, rng.uniform(1.0, 2.0)) for r in range(1000)]
    pairs[417] = (417, 9.0)
    pairs[3] = (3, 0.5)
    pairs.append((1000, None))  # a rank without the figure is left out
    s = spread(pairs)
    assert s is not None
    vals = [v for _, v in pairs if v is not None]
    assert s.n == 1000
    assert (s.min, s.min_rank, s.max, s.max_rank) == (0.5, 3, 9.0, 417)
    assert s.p50 == pytest.approx(statistics.median(vals))
    # statistics' "inclusive" method is numpy's default "linear" one.
    assert s.p95 == pytest.approx(statistics.quantiles(vals, n=20, method="inclusive")[-1])
    assert spread([(0, None)]) is None
    text = spread_text(s, "{:.1f}".format, of=1001)
    assert text == "min 0.5 (rank 3) / median 1.5 / p95 " + f"{s.p95:.1f} / max 9.0 (rank 417) on 1,000 of 1,001 ranks"


def test_by_span_name_groups_the_time_rows_largest_total_first() -> None:
    rows = [
        {"rank": 0, "name": "step", "count": 10, "total_s": 1.0, "p95_s": 0.2, "max_s": 0.3, "pct_wall": 90.0},
        {"rank": 0, "name": "forward", "count": 10, "total_s": 0.4, "p95_s": 0.05, "max_s": 0.1, "pct_wall": 36.0},
        {"rank": 1, "name": "step", "count": 11, "total_s": 3.0, "p95_s": 0.4, "max_s": 0.9, "pct_wall": 95.0},
        {"rank": 2, "name": "step", "count": 9, "total_s": 2.0, "p95_s": None, "max_s": 0.5, "pct_wall": 93.0},
        # A name no rank timed sorts after the timed ones, its spreads None.
        {"rank": 1, "name": "idle", "count": 0, "total_s": None, "p95_s": None, "max_s": None, "pct_wall": None},
        {"rank": 2, "name": "forward", "count": 9, "total_s": 0.8, "p95_s": 0.07, "max_s": 0.2, "pct_wall": 37.0},
    ]
    got = by_span_name(rows)
    assert [(g.name, g.ranks, g.count) for g in got] == [("step", 3, 30), ("forward", 2, 19), ("idle", 1, 0)]
    step = got[0]
    assert step.total is not None and (step.total.p50, step.total.max, step.total.max_rank) == (2.0, 3.0, 1)
    assert step.p95 is not None and step.p95.n == 2  # rank 2 has no p95
    assert step.max is not None and (step.max.max, step.max.max_rank) == (0.9, 1)
    assert step.pct_wall is not None and step.pct_wall.p50 == 93.0
    idle = got[2]
    assert (idle.total, idle.p95, idle.max, idle.pct_wall) == (None, None, None, None)
    assert by_span_name([]) == []


def test_outliers_are_the_ranks_well_above_the_others() -> None:
    rng = random.Random(2)
    pairs = [(r, 100.0 + rng.gauss(0, 0.5)) for r in range(1024)]
    slow = {89, 135, 948}
    for r in slow:
        pairs[r] = (r, 180.0)
    pairs[500] = (500, 103.0)  # 6 jitters up but not 5% of the median: not named
    got = outliers(pairs)
    assert {r for r, _ in got} == slow
    assert all(v == 180.0 for _, v in got)
    # Ties are no one's: equal ranks have no outlier.
    assert outliers([(r, 1.0) for r in range(64)]) == []
    # Within the share of the median, however steady the rest: none.
    assert outliers([(r, 1.0) for r in range(63)] + [(63, 1.0 + OUTLIER_SHARE / 2)]) == []


def test_ranges_and_named() -> None:
    assert ranges(list(range(1024))) == "0-1023"
    assert ranges([10, 11, 12, 0, 1, 2, 3, 8]) == "0-3, 8, 10-12"
    assert ranges([5]) == "5"
    assert named(list(range(13)), 10) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 3 more"
    assert named([4, 2]) == "4, 2"


def test_representatives_are_the_slowest_the_median_and_the_fastest_once_each() -> None:
    pairs = [(r, float(r % 7)) for r in range(64)]
    got = representatives(pairs, k=3)
    labels = [label for label, _ in got]
    assert labels == ["slowest 1", "slowest 2", "slowest 3", "median", "fastest"]
    ranks = [r for _, r in got]
    assert len(set(ranks)) == len(ranks)
    # The slowest are those with the largest values (6: ranks 6, 13, 20 ... in rank order).
    assert ranks[:3] == [6, 13, 20]
    assert dict(pairs)[ranks[-1]] == 0.0
    # Two ranks: the median and the fastest are among the slowest, listed once.
    assert representatives([(0, 1.0), (1, 2.0)]) == [("slowest 1", 1), ("slowest 2", 0)]
