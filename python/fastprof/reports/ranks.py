"""Across ranks: each rank's step-time distribution, the slowest rank of each
step and the spread (slowest minus fastest) of each step.

Steps are matched by their position on each rank (the k-th step of every
rank), which is the same step in a data-parallel loop. A step's slowest rank
counts as *clearly* slowest only where it leads the next slowest by more than
:data:`CLEAR_JITTERS` times the run's own jitter of step times between ranks
(ties are no one's: under DDP every rank's step takes the same time, and
``argmax`` would hand each tie to the lowest rank), and a rank is the most
often slowest only where it is clearly slowest more often than chance would
make it (:data:`MIN_Z` standard deviations of the binomial count). Which rank
made the others wait is the anatomy's straggler verdict
(``reports/stragglers.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastprof.reports.data import RunData, step_spans
from fastprof.reports.stragglers import MAD_TO_SD, MIN_Z

#: A step's slowest rank leads the next by more than this many jitters to count.
CLEAR_JITTERS = 3.0


def ranks_report(data: RunData, warmup: int) -> dict[str, Any]:
    per_rank: list[dict[str, Any]] = []
    durs: dict[int, np.ndarray[Any, np.dtype[np.float64]]] = {}
    for r in data.ranks:
        steps, _src = step_spans(data, r)
        d = steps.dur.astype(np.float64) / 1e9
        durs[r] = d
        kept = d[warmup:] if len(d) > warmup else d
        per_rank.append(
            {
                "rank": r,
                "steps": len(d),
                "mean_s": float(kept.mean()) if len(kept) else None,
                "p50_s": float(np.percentile(kept, 50)) if len(kept) else None,
                "p95_s": float(np.percentile(kept, 95)) if len(kept) else None,
                "max_s": float(kept.max()) if len(kept) else None,
            }
        )
    ranks = [r for r in durs if len(durs[r])]
    out: dict[str, Any] = {"per_rank": per_rank, "slowest": [], "spread": None}
    if len(ranks) < 2:
        out["note"] = "one rank: no comparison across ranks"
        return out
    n = min(len(durs[r]) for r in ranks)
    m = np.vstack([durs[r][:n] for r in ranks])  # ranks x steps
    slow = np.argmax(m, axis=0)
    spread = m.max(axis=0) - m.min(axis=0)
    med = np.median(m, axis=0)
    names = np.asarray(ranks)
    # Step-time jitter between ranks: the robust spread of each rank's step
    # time around the step's median across ranks.
    jitter = MAD_TO_SD * float(np.median(np.abs(m - med[None, :])))
    srt = np.sort(m, axis=0)
    clear = (srt[-1] - srt[-2]) > CLEAR_JITTERS * jitter
    out["slowest"] = [
        {
            "step": int(k),
            "slowest_rank": int(names[slow[k]]),
            "duration_s": float(m[slow[k], k]),
            "spread_s": float(spread[k]),
            "spread_pct": 100.0 * float(spread[k] / med[k]) if med[k] > 0 else None,
            "clear": bool(clear[k]),
        }
        for k in range(n)
    ]
    kept = spread[warmup:] if n > warmup else spread
    counts = np.bincount(slow[clear], minlength=len(ranks))
    worst: int | None = int(np.argmax(counts))
    # Clearly slowest more often than chance (each of N ranks 1/N of the clear steps)?
    c, p = int(clear.sum()), 1.0 / len(ranks)
    if c == 0 or counts[worst] - c * p < MIN_Z * (c * p * (1 - p)) ** 0.5:
        worst = None
    out["spread"] = {
        "steps_compared": n,
        "p50_s": float(np.percentile(kept, 50)),
        "max_s": float(kept.max()),
        "mean_pct": float(np.mean(100.0 * kept / np.maximum(med[-len(kept) :], 1e-12))),
        "most_often_slowest_rank": None if worst is None else int(names[worst]),
        "slowest_share_pct": 0.0 if worst is None else 100.0 * float(counts[worst]) / n,
        "jitter_s": jitter,
        "clear_steps": int(clear.sum()),
    }
    return out
