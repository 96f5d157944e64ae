"""Step-time breakdown per (rank, step), computed in Rust in one streaming pass.

:func:`step_breakdown` wraps ``fastprof._core.analyze_steps``: the files are
read by the core's scanner with the GIL released and come back as numpy
columns, one row per (rank, step), sorted by rank then step start.

Steps are ``ProfilerStep#N`` where a rank has any, else fastprof ``step``
spans. The columns (times in integer ns):

- the TensorBoard PyTorch-profiler plugin's breakdown, each instant of the
  step given to the first role covering it: ``kernel_ns`` > ``memcpy_ns`` >
  ``memset_ns`` > ``communication_ns`` > ``runtime_ns`` > ``dataloader_ns`` >
  ``cpu_exec_ns``, the rest ``other_ns``; the parts sum to ``duration_ns``;
- ``gpu_utilization``, ``sm_efficiency`` (0..1), ``achieved_occupancy`` (%),
  ``tensor_core_share`` (0..1): NaN where not measurable;
- HolisticTraceAnalysis's temporal breakdown (``compute_ns``,
  ``non_compute_ns``, ``idle_ns``, summing to the step), idle-time breakdown
  (``idle_host_wait_ns``, ``idle_kernel_wait_ns``, ``idle_other_ns``: gaps
  between consecutive GPU activities on each stream), kernel types
  (``kernel_communication_ns``, ``kernel_computation_ns``,
  ``kernel_memory_ns``, ``kernel_other_ns``) and communication kernel time
  overlapped by computation (``comm_kernel_ns``, ``comm_overlap_ns``,
  ``comm_overlap_pct``).

``has_gpu`` is False on a rank without GPU activity: its GPU columns are 0 or
NaN and :meth:`Breakdown.row` gives None for them ("no GPU activity"), while
the host breakdown (DataLoader / CPU Exec / Other) is complete.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fastprof import _core

NO_GPU = "no GPU activity"

#: The plugin's roles, in priority order, as column names.
ROLES = (
    "kernel_ns",
    "memcpy_ns",
    "memset_ns",
    "communication_ns",
    "runtime_ns",
    "dataloader_ns",
    "cpu_exec_ns",
    "other_ns",
)

#: Columns that mean nothing without GPU activity.
GPU_COLUMNS = (
    "gpu_utilization",
    "sm_efficiency",
    "achieved_occupancy",
    "tensor_core_share",
    "gpu_busy_ns",
    "compute_ns",
    "non_compute_ns",
    "idle_ns",
    "idle_host_wait_ns",
    "idle_kernel_wait_ns",
    "idle_other_ns",
    "kernel_communication_ns",
    "kernel_computation_ns",
    "kernel_memory_ns",
    "kernel_other_ns",
    "comm_kernel_ns",
    "comm_overlap_ns",
    "comm_overlap_pct",
)


@dataclass(frozen=True)
class Breakdown:
    """What :func:`step_breakdown` returns."""

    #: Column name -> 1-D array, one row per (rank, step); ``duration_ns``
    #: is added here (``end_ns - start_ns``); ``source`` is a list of str.
    steps: dict[str, Any]
    #: Per (rank, device) over the rank's steps: ``rank``, ``device``,
    #: ``gpu_utilization``, ``sm_efficiency``, ``achieved_occupancy``.
    devices: dict[str, npt.NDArray[Any]]
    files: list[dict[str, Any]]
    warnings: list[str]
    #: HTA's gap under which idle time counts as kernel wait.
    kernel_wait_ns: int

    def __len__(self) -> int:
        return len(self.steps["step"])

    @property
    def gpu_activity(self) -> bool:
        """Whether any rank had GPU activity."""
        return bool(np.any(self.steps["has_gpu"]))

    @property
    def note(self) -> str | None:
        """``"no GPU activity"`` when no rank had any, else None."""
        return None if self.gpu_activity or len(self) == 0 else NO_GPU

    def share(self, column: str) -> npt.NDArray[np.float64]:
        """A part's share of each step (0..1; NaN for an empty step)."""
        dur = self.steps["duration_ns"].astype(np.float64)
        part = self.steps[column].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out: npt.NDArray[np.float64] = np.where(dur > 0, part / dur, np.nan)
        return out

    def total_share(self, column: str) -> float:
        """A part's share of all steps' time together (NaN without steps)."""
        total = int(self.steps["duration_ns"].sum())
        return float(self.steps[column].sum()) / total if total > 0 else math.nan

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as plain Python values; GPU fields None without GPU
        activity, NaN ratios None."""
        out: dict[str, Any] = {}
        gpu = bool(self.steps["has_gpu"][i])
        for k, col in self.steps.items():
            v = col[i]
            if isinstance(v, np.generic):
                v = v.item()
            if k in GPU_COLUMNS and not gpu:
                v = None
            elif isinstance(v, float) and math.isnan(v):
                v = None
            out[k] = v
        return out

    def rows(self) -> list[dict[str, Any]]:
        return [self.row(i) for i in range(len(self))]

    def to_section(self) -> dict[str, Any]:
        """The report's ``breakdown`` section (``$defs/breakdown`` of
        ``reports/schema/report.v2.json``): per rank, the role totals, step
        time percentiles and GPU means. The per-step rows are
        :meth:`csv_rows` (``breakdown.csv``): a million-step run's rows as
        JSON were most of a report's time and memory."""
        st = self.steps
        rank = np.asarray(st["rank"])
        dur = np.asarray(st["duration_ns"], dtype=np.int64)
        has_gpu = np.asarray(st["has_gpu"], dtype=bool)
        per_rank = []
        for r in np.unique(rank).tolist():
            m = rank == r
            d = dur[m]
            p50, p95 = np.percentile(d, [50, 95]).tolist() if d.size else (None, None)
            g = m & has_gpu

            def mean(col: str, g: npt.NDArray[np.bool_] = g) -> float | None:
                v = np.asarray(st[col], dtype=np.float64)[g]
                v = v[~np.isnan(v)]
                return float(v.mean()) if v.size else None

            per_rank.append(
                {
                    "rank": int(r),
                    "steps": int(m.sum()),
                    "duration_ns": int(d.sum()),
                    "step_mean_ns": float(d.mean()),
                    "step_p50_ns": p50,
                    "step_p95_ns": p95,
                    "step_max_ns": int(d.max()),
                    **{k: int(np.asarray(st[k])[m].sum()) for k in ROLES},
                    "gpu_steps": int(g.sum()),
                    "gpu_util": mean("gpu_utilization"),
                    "sm_efficiency": mean("sm_efficiency"),
                    "occupancy": mean("achieved_occupancy"),
                    "tensor_core_share": mean("tensor_core_share"),
                    "overlap_pct": mean("comm_overlap_pct"),
                }
            )
        sources = sorted(set(st["source"]))
        section: dict[str, Any] = {
            "source": ", ".join(sources) if sources else "none",
            "gpu_activity": self.gpu_activity,
            "step_count": len(self),
            "per_rank": per_rank,
            "rows": "breakdown.csv",
        }
        if self.note:
            section["note"] = self.note
        return section

    #: breakdown.csv's columns: (CSV name, column), GPU ones empty without GPU activity.
    CSV_COLUMNS = (
        ("step", "step"),
        ("rank", "rank"),
        ("source", "source"),
        ("start_ns", "start_ns"),
        ("duration_ns", "duration_ns"),
        *((k, k) for k in ROLES),
        ("gpu_util", "gpu_utilization"),
        ("sm_efficiency", "sm_efficiency"),
        ("occupancy", "achieved_occupancy"),
        ("tensor_core_share", "tensor_core_share"),
        ("compute_ns", "compute_ns"),
        ("non_compute_ns", "non_compute_ns"),
        ("idle_ns", "idle_ns"),
        ("idle_host_wait_ns", "idle_host_wait_ns"),
        ("idle_kernel_wait_ns", "idle_kernel_wait_ns"),
        ("idle_other_ns", "idle_other_ns"),
        ("kernel_communication_ns", "kernel_communication_ns"),
        ("kernel_computation_ns", "kernel_computation_ns"),
        ("kernel_memory_ns", "kernel_memory_ns"),
        ("overlap_pct", "comm_overlap_pct"),
    )

    def csv_rows(self, chunk: int = 65536) -> Iterator[list[Any]]:
        """breakdown.csv's rows (header first), built a chunk of columns at a
        time (numpy's ``tolist``), never one dict per step: NaN and GPU
        fields of steps without GPU activity are empty."""
        yield [name for name, _ in self.CSV_COLUMNS]
        st = self.steps
        n = len(self)
        gpu = np.asarray(st["has_gpu"], dtype=bool)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            cols = []
            for _, col in self.CSV_COLUMNS:
                v = st[col][lo:hi]
                if isinstance(v, np.ndarray):
                    out = v.tolist()
                    if v.dtype.kind == "f":
                        out = ["" if x != x else x for x in out]
                    if col in GPU_COLUMNS:
                        g = gpu[lo:hi].tolist()
                        out = [x if ok else "" for x, ok in zip(out, g, strict=True)]
                    cols.append(out)
                else:
                    cols.append(list(v))
            yield from (list(r) for r in zip(*cols, strict=True))


def step_breakdown(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Breakdown:
    """The step-time breakdown of traces, run directories or a merged trace
    (as ``fastprof merge`` takes them)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    raw = _core.analyze_steps([os.fspath(p) for p in paths])
    steps: dict[str, Any] = dict(raw["steps"])
    steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
    return Breakdown(
        steps=steps,
        devices=dict(raw["devices"]),
        files=list(raw["files"]),
        warnings=list(raw["warnings"]),
        kernel_wait_ns=int(raw["kernel_wait_ns"]),
    )
