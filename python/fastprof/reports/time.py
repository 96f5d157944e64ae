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

from fastprof.recording.names import LOADER_PREFIX, RECORD_PREFIX, STEP_SPAN, TORCH_WINDOW_PREFIX
from fastprof.reports import long_run
from fastprof.reports.data import KINETO_CATEGORIES as _KINETO_CATS
from fastprof.reports.data import RunData, grouped_quantiles
from fastprof.reports.resumed import idle_ns

_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+|\*)$")
#: Kept rows sorted at once by the time table (a block of whole ranks).
_BLOCK_ROWS = 1 << 20
_MODEL = re.compile(r"(forward|backward|optimizer|zero_grad|training_step|loss)", re.IGNORECASE)
_CHECKPOINT = re.compile(r"(checkpoint|save)", re.IGNORECASE)
_VALIDATION = re.compile(r"(validation|val_|eval|test_step|predict)", re.IGNORECASE)


def classify(name: str) -> str:
    """The concise group of a span name ("other" is left out of concise)."""
    if name == STEP_SPAN or _PROFILER_STEP.match(name):
        return "step"
    if name.startswith(LOADER_PREFIX) or name.startswith("enumerate(DataLoader)"):
        return "loader"
    if name.startswith(TORCH_WINDOW_PREFIX) or name.startswith(RECORD_PREFIX):
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
        # Per name id (lookup tables indexed by the name and cat columns: no
        # full-length copy of a column before the rows are filtered).
        present = np.flatnonzero(np.bincount(s["name"], minlength=len(names)))
        # ProfilerStep#N -> one row "ProfilerStep#*" (under the smallest such id).
        lut = np.arange(len(names), dtype=np.int64)
        psteps = [int(i) for i in present if _PROFILER_STEP.match(names[int(i)])]
        star: int | None = psteps[0] if psteps else None
        lut[psteps] = star if star is not None else 0
        kineto_ids = [i for i, c in enumerate(cats) if any(p in _KINETO_CATS for p in c.split(","))]
        from_kineto = data.category_mask(kineto_ids)[s["cat"]]
        if verbose:
            keep = np.ones(n, bool)
        else:
            concise = [int(i) for i in present if classify(names[int(lut[i])]) != "other"]
            keep = data.name_mask(concise)[s["name"]] & ~from_kineto
            if star is not None:
                keep |= data.name_mask(psteps)[s["name"]]
        # A block of whole ranks at a time (each (rank, name) group lies in
        # one): the sort's keys, durations and order are a block's, not the
        # run's (at 1,024 ranks x 2,000 steps the run's were ~0.4 GB at once).
        walls = {r: data.wall(r) for r in data.ranks}
        idle = {r: idle_ns(data, r, w) for r, w in walls.items()}
        for lo, hi, ids in _blocks(data, s, keep, lut):
            inside = keep if lo is None else keep & (s["rank"] >= lo) & (s["rank"] <= hi)
            if ids is not None:
                inside &= data.name_mask(ids)[s["name"]]
            rows += _group_rows(data, s, inside, from_kineto, lut, star, walls, idle)
    note = "totals of nested spans overlap (a step holds its forward); torch window rows cover only the profiled steps"
    if data.long is not None:
        rows += _sketched_rows(data, verbose)
        note += (
            f"; a long run: the p50 and p95 of the spans every step records come from a sketch of their "
            f"durations, within {long_run.SKETCH_ERROR:.0%} of the exact value"
        )
    rows.sort(key=lambda r: (r["rank"], -r["total_s"]))
    return {"verbose": verbose, "note": note, "rows": rows}


def _sketched_rows(data: RunData, verbose: bool) -> list[dict[str, Any]]:
    """The rows of a long run's names the step pass read (no rows of them
    in the columns): its counts, totals and longest, p50 and p95 from its
    sketches."""
    rows: list[dict[str, Any]] = []
    for r, got in sorted((data.long or {}).items()):
        w0, w1 = data.wall(r)
        wall = max(w1 - w0 - idle_ns(data, r, (w0, w1)), 1)
        for name, st in sorted(got.stats.items()):
            if not st.count or (not verbose and classify(name) == "other"):
                continue
            p50, p95 = st.sketch.quantile(0.5), st.sketch.quantile(0.95)
            rows.append(_row(r, name, "fastprof", st.count, st.total, p50, p95, st.longest, wall))
    return rows


def _row(
    rank: int, name: str, source: str, count: int, total: float, p50: float, p95: float, longest: float, wall: float
) -> dict[str, Any]:
    """One row of the time table (times in ns; ``wall``: the rank's time
    less its idle gaps)."""
    return {
        "rank": rank,
        "name": name,
        "group": classify(name),
        "source": source,
        "count": count,
        "total_s": total / 1e9,
        "mean_s": total / count / 1e9,
        "p50_s": p50 / 1e9,
        "p95_s": p95 / 1e9,
        "max_s": longest / 1e9,
        "pct_wall": 100.0 * total / wall,
    }


def _blocks(data: RunData, s: dict[str, Any], keep: Any, lut: Any) -> list[tuple[int | None, int | None, Any]]:
    """The time table's blocks: :func:`_rank_blocks`, and a rank with more
    than :data:`_BLOCK_ROWS` kept rows (a long run) by its names, a few
    whole names at a time (each (rank, name) group lies in one block):
    ``(lo, hi, ids)``, ``ids`` the name ids of the block (None: every name)."""
    out: list[tuple[int | None, int | None, Any]] = []
    for lo, hi in _rank_blocks(s["rank"], keep):
        if lo is None or lo != hi:
            out.append((lo, hi, None))
            continue
        here = keep & (s["rank"] == lo)
        if int(here.sum()) <= _BLOCK_ROWS:
            out.append((lo, hi, None))
            continue
        # Rows per name as the table groups them (lut: every ProfilerStep#N is one name).
        raw = np.bincount(s["name"][here], minlength=len(lut))
        del here
        per = np.bincount(lut, weights=raw, minlength=len(lut)).astype(np.int64)
        group: list[int] = []
        acc = 0
        for nid in np.flatnonzero(per).tolist():
            if group and acc + int(per[nid]) > _BLOCK_ROWS:
                out.append((lo, hi, np.flatnonzero(np.isin(lut, group))))
                group, acc = [], 0
            group.append(nid)
            acc += int(per[nid])
        out.append((lo, hi, np.flatnonzero(np.isin(lut, group))))
    return out


def _rank_blocks(rank: Any, keep: Any) -> list[tuple[int | None, int | None]]:
    """Blocks of whole ranks of at most :data:`_BLOCK_ROWS` kept rows each
    (one block of every rank where they fit: ``(None, None)``)."""
    if int(keep.sum()) <= _BLOCK_ROWS:
        return [(None, None)]
    lo_r = int(rank.min())
    per = np.bincount(rank[keep].astype(np.int64) - lo_r)
    out: list[tuple[int | None, int | None]] = []
    a, acc = 0, 0
    for i, c in enumerate(per.tolist()):
        if acc and acc + c > _BLOCK_ROWS:
            out.append((a + lo_r, i - 1 + lo_r))
            a, acc = i, 0
        acc += c
    out.append((a + lo_r, len(per) - 1 + lo_r))
    return out


def _group_rows(
    data: RunData,
    s: dict[str, Any],
    keep: Any,
    from_kineto: Any,
    lut: Any,
    star: int | None,
    walls: dict[int, tuple[int, int]],
    idle: dict[int, int],
) -> list[dict[str, Any]]:
    """The time table's rows of the spans ``keep`` selects: one per (rank, name)."""
    names = data.cols.names
    rows: list[dict[str, Any]] = []
    # One int64 key per row orders by (rank, name) as the two columns would.
    width = max(len(names), 1)
    key = (s["rank"][keep].astype(np.int64) + 1) * width + lut[s["name"][keep]]
    dur = s["dur"][keep].astype(np.float64)
    kin = from_kineto[keep]
    order = np.lexsort((dur, key))
    key, dur, kin = key[order], dur[order], kin[order]
    del order
    if not len(dur):
        return rows
    brk = np.flatnonzero(np.diff(key) != 0) + 1
    starts = np.concatenate([[0], brk]).astype(np.int64)
    counts = np.diff(np.concatenate([starts, [len(dur)]])).astype(np.int64)
    totals = np.add.reduceat(dur, starts)
    maxes = np.maximum.reduceat(dur, starts)
    p50 = grouped_quantiles(dur, starts, counts, 0.5)
    p95 = grouped_quantiles(dur, starts, counts, 0.95)
    kin_any = np.maximum.reduceat(kin.astype(np.int8), starts)
    rank = key[starts] // width - 1
    nid = key[starts] % width
    for g in range(len(starts)):
        r = int(rank[g])
        name = "ProfilerStep#*" if star is not None and nid[g] == star else names[int(nid[g])]
        w0, w1 = walls.get(r, (0, 0))
        wall = max(w1 - w0 - idle.get(r, 0), 1)
        source = "torch window" if kin_any[g] else "fastprof"
        rows.append(
            _row(r, name, source, int(counts[g]), float(totals[g]), float(p50[g]), float(p95[g]), float(maxes[g]), wall)
        )
    return rows
