"""Many ranks, read at a glance (issue #38, item 3): what the terminal report,
``fastprof summary`` and report.html show in place of one line per rank once
a run has more than :data:`MANY_RANKS` ranks.

A per-rank figure becomes its distribution across the ranks (min, median,
p95 and max, and the ranks at the ends) and the top-k ranks that stand out;
a per-rank list of events (slow steps, captures) becomes a count and its
worst few. Up to :data:`MANY_RANKS` ranks the reports keep one line per
rank, as before. report.json and the CSV files keep every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastprof.profiler.drivers.hang.verdict import rank_ranges

#: Above this many ranks the terminal and the page show distributions and
#: the top ranks, not one line (or one plot line) per rank.
MANY_RANKS = 16
#: How many ranks (or steps) a "the k worst" list names.
TOP_K = 5


def many(n_ranks: int) -> bool:
    """True when a run of ``n_ranks`` ranks is shown collapsed."""
    return n_ranks > MANY_RANKS


@dataclass(frozen=True)
class Spread:
    """One figure across the ranks that have it."""

    n: int  #: ranks with a value
    min: float
    min_rank: int
    p50: float
    p95: float
    max: float
    max_rank: int


def spread(pairs: Iterable[tuple[int, Any]]) -> Spread | None:
    """The distribution of ``(rank, value)`` pairs, values None left out
    (None when no rank has one). Ties at the ends go to the lowest rank."""
    got = [(int(r), float(v)) for r, v in pairs if v is not None and np.isfinite(float(v))]
    if not got:
        return None
    ranks = np.asarray([r for r, _ in got])
    vals = np.asarray([v for _, v in got], dtype=np.float64)
    lo, hi = int(np.argmin(vals)), int(np.argmax(vals))
    return Spread(
        n=len(got),
        min=float(vals[lo]),
        min_rank=int(ranks[lo]),
        p50=float(np.percentile(vals, 50)),
        p95=float(np.percentile(vals, 95)),
        max=float(vals[hi]),
        max_rank=int(ranks[hi]),
    )


def spread_text(s: Spread | None, fmt: Callable[[float], str], of: int | None = None) -> str:
    """ "min X (rank a) / median Y / p95 Z / max W (rank b)", and on how many
    ranks when ``of`` (all ranks) is more."""
    if s is None:
        return "-"
    text = (
        f"min {fmt(s.min)} (rank {s.min_rank}) / median {fmt(s.p50)} / p95 {fmt(s.p95)} "
        f"/ max {fmt(s.max)} (rank {s.max_rank})"
    )
    if of is not None and s.n < of:
        text += f" on {s.n:,} of {of:,} ranks"
    return text


@dataclass(frozen=True)
class NameSpread:
    """One span name of the time table across the ranks that have it."""

    name: str
    ranks: int  #: ranks with a row for the name
    count: int  #: its spans, every rank's together
    total: Spread | None  #: each rank's total seconds
    p95: Spread | None  #: each rank's p95 seconds
    max: Spread | None  #: each rank's longest span, seconds
    pct_wall: Spread | None  #: each rank's share of its wall time, %


def by_span_name(rows: Iterable[dict[str, Any]]) -> list[NameSpread]:
    """The time table's rows (one per rank and span name) by span name, the
    name with the largest total over its ranks first (ties in the order the
    rows name them), each figure's spread across the ranks. The terminal and
    report.html both show this table."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(str(r["name"]), []).append(r)
    out: list[NameSpread] = []
    for name in sorted(by, key=lambda n: -sum(float(r["total_s"] or 0.0) for r in by[n])):
        rs = by[name]
        out.append(
            NameSpread(
                name=name,
                ranks=len(rs),
                count=sum(int(r["count"]) for r in rs),
                total=spread((r["rank"], r["total_s"]) for r in rs),
                p95=spread((r["rank"], r["p95_s"]) for r in rs),
                max=spread((r["rank"], r["max_s"]) for r in rs),
                pct_wall=spread((r["rank"], r["pct_wall"]) for r in rs),
            )
        )
    return out


def top(pairs: Iterable[tuple[int, Any]], k: int = TOP_K, largest: bool = True) -> list[tuple[int, float]]:
    """The ``k`` ranks with the largest (or smallest) values, None left out;
    ties in rank order."""
    got = [(int(r), float(v)) for r, v in pairs if v is not None]
    got.sort(key=lambda rv: (-rv[1] if largest else rv[1], rv[0]))
    return got[:k]


#: A rank stands out when its figure is this many MADs (scaled to a standard
#: deviation) above the median of the ranks ...
OUTLIER_MADS = 6.0
#: ... and at least this fraction of the median above it.
OUTLIER_SHARE = 0.05


def outliers(pairs: Iterable[tuple[int, Any]]) -> list[tuple[int, float]]:
    """The ranks whose value stands out above the others': more than
    :data:`OUTLIER_MADS` robust deviations and :data:`OUTLIER_SHARE` of the
    median above the median; the largest first."""
    got = [(int(r), float(v)) for r, v in pairs if v is not None and np.isfinite(float(v))]
    if len(got) < 3:
        return []
    vals = np.asarray([v for _, v in got])
    med = float(np.median(vals))
    mad = 1.4826 * float(np.median(np.abs(vals - med)))
    bar = med + max(OUTLIER_MADS * mad, OUTLIER_SHARE * abs(med))
    return sorted(((r, v) for r, v in got if v > bar), key=lambda rv: (-rv[1], rv[0]))


def ranges(ranks: Sequence[int]) -> str:
    """Ranks as runs: "0-1023", "0-3, 8, 10-12"."""
    return rank_ranges({int(r) for r in ranks})


def named(ranks: Sequence[int], limit: int = 10) -> str:
    """Ranks listed, at most ``limit`` of them, the rest counted."""
    rs = [int(r) for r in ranks]
    text = ", ".join(str(r) for r in rs[:limit])
    return text + (f" and {len(rs) - limit:,} more" if len(rs) > limit else "")


def representatives(pairs: Iterable[tuple[int, Any]], k: int = TOP_K) -> list[tuple[str, int]]:
    """Which ranks stand for the rest in a table: the ``k`` with the largest
    value ("slowest 1".."slowest k"), then the median rank and the smallest;
    each rank once, as (label, rank)."""
    got = sorted(((int(r), float(v)) for r, v in pairs if v is not None), key=lambda rv: (-rv[1], rv[0]))
    if not got:
        return []
    out: list[tuple[str, int]] = [(f"slowest {i + 1}", r) for i, (r, _) in enumerate(got[:k])]
    seen = {r for _, r in out}
    for label, (r, _) in (("median", got[len(got) // 2]), ("fastest", got[-1])):
        if r not in seen:
            out.append((label, r))
            seen.add(r)
    return out
