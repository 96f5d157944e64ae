"""Memory report: each rank's per-step memory and whether it grows step over
step (:mod:`fastprof.memory.leaks`), from the Profiler's per-step counters
(:mod:`fastprof.memory.step_stats`): the CUDA allocator's bytes allocated at
each step's end where the job used CUDA, else the process's resident memory.
Warm-up steps are left out, as from the rates, and so are the steps of the
profiler's own windows (torch.profiler and allocator history: their steps
and the step after each, while its export runs), whose growth is the
profiler's (:func:`fastprof.memory.leaks.growth`)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import numpy.typing as npt

from fastprof.memory.leaks import MIN_FLAT_SHARE, MIN_GROWTH_BYTES, MIN_GROWTH_SHARE, growth
from fastprof.memory.operators import operator_table
from fastprof.recording.names import (
    CUDA_ALLOCATED,
    CUDA_ALLOCATED_PEAK,
    MODEL_SUMMARY_JSON,
    OPERATORS_JSON,
    RSS_COUNTER,
)
from fastprof.reports.data import RunData, step_spans, where_now

#: The allocator's per-step peak.
CUDA_PEAK = CUDA_ALLOCATED_PEAK
#: The per-step series judged, first found first.
SERIES = (CUDA_ALLOCATED, RSS_COUNTER)
NO_STATS = (
    "no per-step memory statistics in this trace (the Profiler records them at each step's end "
    "unless memory_stats=False)"
)


def memory_report(data: RunData, warmup_steps: int) -> tuple[dict[str, Any] | None, str | None]:
    """The report's ``memory`` section, or None and the reason."""
    per_rank = []
    for r in data.ranks:
        for name in SERIES:
            ts, values = data.counter(name, r)
            if len(values):
                break
        else:
            continue
        at = reading_steps(data, r, ts)
        skip = warmup_steps if int(at[-1]) >= warmup_steps else 0
        judged = at >= skip
        _, peaks = data.counter(CUDA_PEAK, r)
        windows, why = _windows(data, r)
        per_rank.append(
            {
                "rank": r,
                "series": name,
                "warmup_steps_excluded": skip,
                "window_steps_excluded": len(windows & set(at[judged].tolist())),
                **growth(values[judged], excluded=windows, not_judged=why, steps=at[judged]),
                # The highest per-step peak of the allocator (all steps):
                # what `fastprof diff --max-memory-growth` compares first.
                "cuda_allocated_peak_b": float(peaks.max()) if len(peaks) else None,
            }
        )
    ooms = [_oom_row(r, doc) for r, doc in sorted(data.oom.items())]
    model = _model(data)
    operators = _operators(data)
    if not per_rank and not ooms and model is None and operators is None:
        return None, NO_STATS
    return {
        "operators": operators,
        "model": model,
        "oom": ooms,
        "method": (
            "Theil-Sen slope of the per-step series (warm-up and the profiler's window steps left out, "
            "the rest stitched by their step-over-step changes) with Sen's 95% interval; a leak when growth still goes "
            "on at the end: the interval (of the run, or of its rising part at the end) above zero and adding at least "
            f"{MIN_GROWTH_BYTES >> 20} MiB and {100 * MIN_GROWTH_SHARE:g}% of the median; growth that ended (a rise "
            f"of that much, then flat for at least {100 * MIN_FLAT_SHARE:g}% of the steps judged) is "
            "'grew until step N, flat since', not a leak"
        ),
        "per_rank": per_rank,
    }, None


def reading_steps(data: RunData, rank: int, ts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The step each per-step reading (taken at its step's end, sorted by
    time) belongs to: the last step that ended at or before it, counted from
    0 in the rank's step spans. Short steps share a reading (the core reads
    the resident memory within a budget), so a step may have none. Without
    step spans, reading ``k`` is step ``k``."""
    steps, _ = step_spans(data, rank)
    if not len(steps.ts):
        return np.arange(len(ts), dtype=np.int64)
    ends = np.sort(steps.end)
    at = np.searchsorted(ends, ts, side="right") - 1
    # A reading before the first step's end (none is taken so) counts as step 0;
    # readings keep increasing step numbers.
    return np.maximum.accumulate(np.maximum(at, 0)).astype(np.int64)


def _windows(data: RunData, rank: int) -> tuple[set[int], str | None]:
    """The steps of a rank's profiler windows (:func:`window_steps`), or
    why its series cannot be judged: a segment read alone numbers its steps
    from the recording's start only when it is the first, and says which
    steps the windows took only with its recording's ``profiler.json``
    (read beside it by :func:`fastprof.reports.data.load`)."""
    prof = data.profiler.get(rank)
    if data.alone is not None:
        seg = (data.other.get(rank) or {}).get("segment")
        rank_dir = data.alone.parent
        again = "report its run directory instead" + (f" ({rank_dir.parent})" if rank_dir.name == f"rank{rank}" else "")
        if seg not in (None, 0):
            return set(), (
                f"not judged: {data.alone.name} is segment {seg} of its recording, a later part of the run whose "
                f"steps cannot be numbered alone; {again}"
            )
        if prof is None:
            return set(), (
                f"not judged: a segment alone does not say which steps the profiler's torch.profiler and allocator "
                f"history windows took (their memory is the profiler's, left out of the judgement), and no "
                f"profiler.json of its recording is beside {data.alone.name}; {again}"
            )
    return window_steps(prof or {}), None


def window_steps(profiler: dict[str, Any]) -> set[int]:
    """The steps a rank's profiler windows touched (``profiler.json``): each
    torch.profiler and allocator-history window's steps, and the step after
    it (its export or dump runs on a thread then)."""
    steps: set[int] = set()
    for part in ((profiler.get("torch") or {}), ((profiler.get("memory") or {}).get("history") or {})):
        for w in part.get("windows") or []:
            try:
                first, last = int(w["first_step"]), int(w["last_step"])
            except (KeyError, TypeError, ValueError):
                continue
            steps.update(range(first, last + 2))
    return steps


def _oom_row(rank: int, doc: dict[str, Any]) -> dict[str, Any]:
    """One rank's out-of-memory capture (``rank{R}/memory/oom.json``)."""
    cuda = doc.get("cuda") or {}
    largest = cuda.get("largest") or []
    return {
        "rank": rank,
        "exception": str(doc.get("exception", "")),
        "step": doc.get("step"),
        "phase": str(doc.get("phase", "other")),
        "where": (doc.get("where") or [None])[0],
        "reserved_free_b": cuda.get("reserved_free_b"),
        "snapshot": cuda.get("snapshot"),
        "largest": [{"where": str(g["where"]), "bytes": int(g["bytes"]), "blocks": int(g["blocks"])} for g in largest],
        "cuda_reason": None if cuda.get("available") else cuda.get("reason"),
    }


def _model(data: RunData) -> dict[str, Any] | None:
    """The first rank's model summary (``Profiler(model=...)``): totals and
    where the whole table is (model_summary.json / .txt beside the report)."""
    for rank, path in sorted(data.model_summary.items()):
        try:
            doc = json.loads(path.read_text())
            totals = {k: int(v) for k, v in dict(doc["totals"]).items() if isinstance(v, (int, float))}
            return {
                "rank": rank,
                "model": str(doc.get("model", "")),
                "depth": int(doc.get("depth", 0)),
                "layers": len(doc.get("rows") or []),
                "totals": totals,
                "file": MODEL_SUMMARY_JSON,
            }
        except (OSError, ValueError, KeyError, TypeError):
            data.cols.warnings.append(f"{path}: not a model summary; left out")
    return None


#: Operators listed per ranking in the report (operators.json has more).
TOP_OPERATORS = 10
#: A window trace larger than this (on disk) is not read for the report's
#: operator table: the table reads a window's JSON whole.
MAX_OPERATOR_TRACE_BYTES = 64 << 20


#: Windows whose operator tables a report writes (the latest first kept).
MAX_OPERATOR_WINDOWS = 64


def _operator_table(data: RunData, path: str) -> Any:
    """:func:`operator_table` of a window trace; an object is read into a
    temporary file first (the table reads the trace whole)."""
    with data.run.local_copy(path) as local:
        return operator_table(local, top=TOP_OPERATORS)


def _window_stem(rank: int, path: str) -> str:
    """``operators.rank{R}.<window file name without its trace suffix>``."""
    name = os.path.basename(path)
    for suffix in (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return f"operators.rank{rank}.{name}"


def _operators(data: RunData) -> dict[str, Any] | None:
    """Every saved torch window of every rank, each read by
    :func:`fastprof.memory.operator_table` (its trace, never torch's printed
    table) into its own table beside the report
    (``operators.rank{R}.<window>.json`` / ``.csv``); report.json keeps the
    top operators by self CPU memory of the lowest rank's last window
    (also ``operators.json`` / ``operators.csv``) and the list of windows."""
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in sorted(data.profiler):
        torch_doc = data.profiler[rank].get("torch") or {}
        kept = [w for w in torch_doc.get("windows") or [] if w.get("saved") and w.get("path")]
        if kept:
            per_rank[rank] = kept
    if not per_rank:
        return None
    # At most MAX_OPERATOR_WINDOWS tables: each rank's latest windows.
    each = max(1, MAX_OPERATOR_WINDOWS // len(per_rank))
    saved = [(rank, w) for rank, ws in per_rank.items() for w in ws[-each:]]
    left_out = sum(len(ws) for ws in per_rank.values()) - len(saved)
    if left_out:
        data.cols.warnings.append(
            f"{left_out} earlier torch window(s) without an operator table in the report (it reads each rank's "
            f"latest {each}); fastprof.memory.operator_table(path) reads one"
        )
    windows: list[dict[str, Any]] = []
    last_of_first: tuple[int, str, Any] | None = None
    lowest = saved[0][0]
    for rank, w in saved:
        path = where_now(data, str(w["path"]))
        row: dict[str, Any] = {
            "rank": rank,
            "window": path,
            "first_step": w.get("first_step"),
            "last_step": w.get("last_step"),
            "memory_recorded": None,
            "files": [],
            "reason": None,
        }
        windows.append(row)
        try:
            size = data.run.file_size(path)
            if size > MAX_OPERATOR_TRACE_BYTES:
                row["reason"] = (
                    f"{size / 2**20:.0f} MB on disk: over {MAX_OPERATOR_TRACE_BYTES >> 20} MB, it is read whole"
                )
                data.cols.warnings.append(
                    f"{path}: no operator table in the report ({row['reason']}); "
                    "fastprof.memory.operator_table(path) reads it"
                )
                continue
            table = _operator_table(data, path)
        except (OSError, ValueError) as e:
            row["reason"] = str(e)
            data.cols.warnings.append(f"{path}: no operator table ({e})")
            continue
        stem = _window_stem(rank, path)
        data.operator_tables.append((stem, table))
        row["memory_recorded"] = bool(table.memory_recorded)
        row["files"] = [f"{stem}.json", f"{stem}.csv"]
        if rank == lowest:
            last_of_first = (rank, path, table)
    if last_of_first is None:
        return None
    rank, path, table = last_of_first
    data.operator_table = table
    return {
        "rank": rank,
        "window": path,
        "memory_recorded": bool(table.memory_recorded),
        "note": table.note,
        "top_self_cpu_memory": [
            {
                "name": r.name,
                "count": int(r.count),
                "self_cpu_memory_b": int(r.self_cpu_memory),
                "allocated_b": None if r.cpu_allocated is None else int(r.cpu_allocated),
                "freed_b": None if r.cpu_freed is None else int(r.cpu_freed),
                "self_cpu_time_us": float(r.self_cpu_time_us),
            }
            for r in table.top.get("self_cpu_memory", [])
        ],
        "files": [OPERATORS_JSON, "operators.csv"],
        "windows": windows,
    }
