"""Across ranks: each rank's step-time distribution, the slowest rank of each
step and the spread (slowest minus fastest) of each step.

Steps are matched by their position on each rank (the k-th step of every
rank), which is the same step in a data-parallel loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastprof.reports.data import RunData, step_spans


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
    out["slowest"] = [
        {
            "step": int(k),
            "slowest_rank": int(names[slow[k]]),
            "duration_s": float(m[slow[k], k]),
            "spread_s": float(spread[k]),
            "spread_pct": 100.0 * float(spread[k] / med[k]) if med[k] > 0 else None,
        }
        for k in range(n)
    ]
    counts = np.bincount(slow, minlength=len(ranks))
    worst = int(np.argmax(counts))
    kept = spread[warmup:] if n > warmup else spread
    out["spread"] = {
        "steps_compared": n,
        "p50_s": float(np.percentile(kept, 50)),
        "max_s": float(kept.max()),
        "mean_pct": float(np.mean(100.0 * kept / np.maximum(med[-len(kept) :], 1e-12))),
        "most_often_slowest_rank": int(names[worst]),
        "slowest_share_pct": 100.0 * float(counts[worst]) / n,
    }
    return out
