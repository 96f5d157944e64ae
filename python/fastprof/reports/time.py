"""Time report: per rank and span name, count, total, mean, p50, p95, max and
share of the rank's wall time, grouped with numpy over the span columns.

Concise keeps what a training loop is made of (steps, loaders, forward /
backward / optimizer, checkpoint, validation, Lightning actions, fastprof's
own window work); verbose keeps every span name (torch ops included).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from fastprof.reports.data import RunData, grouped_quantiles

#: Kineto categories (record_function annotations included): events inside torch windows (partial coverage of the
#: run), never part of the concise table.
_KINETO_CATS = frozenset(
    {
        "cpu_op",
        "python_function",
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "cuda_runtime",
        "cuda_driver",
        "ac2g",
        "Trace",
        "gpu_user_annotation",
        "cpu_instant_event",
        "user_annotation",
    }
)
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_MODEL = re.compile(r"(forward|backward|optimizer|zero_grad|training_step|loss)", re.IGNORECASE)
_CHECKPOINT = re.compile(r"(checkpoint|save)", re.IGNORECASE)
_VALIDATION = re.compile(r"(validation|val_|eval|test_step|predict)", re.IGNORECASE)


def classify(name: str) -> str:
    """The concise group of a span name ("other" is left out of concise)."""
    if name == "step" or _PROFILER_STEP.match(name):
        return "step"
    if name.startswith("loader.") or name.startswith("enumerate(DataLoader)"):
        return "loader"
    if name.startswith("torch.window.") or name.startswith("fastprof."):
        return "fastprof"
    if name.startswith("[") or name.startswith("run_training") or name.startswith("run_"):
        return "lightning"
    if _CHECKPOINT.search(name):
        return "checkpoint"
    if _VALIDATION.search(name):
        return "validation"
    if _MODEL.search(name):
        return "model"
    return "other"


def time_report(data: RunData, verbose: bool = False) -> dict[str, Any]:
    s = data.cols.spans
    names = data.cols.names
    cats = data.cols.categories
    n = len(s["ts"])
    rows: list[dict[str, Any]] = []
    if n:
        # ProfilerStep#N -> one row "ProfilerStep#*".
        name_ids = s["name"].astype(np.int64)
        uniq = np.unique(name_ids)
        remap = {int(i): int(i) for i in uniq}
        star: int | None = None
        for i in uniq:
            if _PROFILER_STEP.match(names[int(i)]):
                if star is None:
                    star = int(i)
                remap[int(i)] = star
        if star is not None:
            lut = np.arange(int(uniq.max()) + 1, dtype=np.int64)
            for k, v in remap.items():
                lut[k] = v
            name_ids = lut[name_ids]
        kineto_ids = np.array([i for i, c in enumerate(cats) if any(p in _KINETO_CATS for p in c.split(","))])
        from_kineto = np.isin(s["cat"], kineto_ids) if len(kineto_ids) else np.zeros(n, bool)
        keep = np.ones(n, bool)
        if not verbose:
            concise = {int(i) for i in np.unique(name_ids) if classify(names[int(i)]) != "other"}
            keep = np.isin(name_ids, list(concise)) & ~from_kineto
            if star is not None:
                keep |= name_ids == star
        rank = s["rank"].astype(np.int64)[keep]
        nid = name_ids[keep]
        dur = s["dur"].astype(np.float64)[keep]
        kin = from_kineto[keep]
        order = np.lexsort((dur, nid, rank))
        rank, nid, dur, kin = rank[order], nid[order], dur[order], kin[order]
        if len(dur):
            brk = np.flatnonzero((np.diff(rank) != 0) | (np.diff(nid) != 0)) + 1
            starts = np.concatenate([[0], brk]).astype(np.int64)
            counts = np.diff(np.concatenate([starts, [len(dur)]])).astype(np.int64)
            totals = np.add.reduceat(dur, starts)
            maxes = np.maximum.reduceat(dur, starts)
            p50 = grouped_quantiles(dur, starts, counts, 0.5)
            p95 = grouped_quantiles(dur, starts, counts, 0.95)
            kin_any = np.maximum.reduceat(kin.astype(np.int8), starts)
            walls = {r: data.wall(r) for r in data.ranks}
            for g in range(len(starts)):
                r = int(rank[starts[g]])
                name = "ProfilerStep#*" if star is not None and nid[starts[g]] == star else names[int(nid[starts[g]])]
                w0, w1 = walls.get(r, (0, 0))
                wall = max(w1 - w0, 1)
                rows.append(
                    {
                        "rank": r,
                        "name": name,
                        "group": classify(name),
                        "source": "torch window" if kin_any[g] else "fastprof",
                        "count": int(counts[g]),
                        "total_s": float(totals[g]) / 1e9,
                        "mean_s": float(totals[g]) / counts[g] / 1e9,
                        "p50_s": float(p50[g]) / 1e9,
                        "p95_s": float(p95[g]) / 1e9,
                        "max_s": float(maxes[g]) / 1e9,
                        "pct_wall": 100.0 * float(totals[g]) / wall,
                    }
                )
    rows.sort(key=lambda r: (r["rank"], -r["total_s"]))
    return {
        "verbose": verbose,
        "note": "totals of nested spans overlap (a step holds its forward); torch window rows cover only "
        "the profiled steps",
        "rows": rows,
    }
