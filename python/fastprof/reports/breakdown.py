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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    #: is added here (``end_ns - start_ns``); ``source`` holds str (an
    #: object array). Empty when the rows were not kept (a report's case:
    #: they go to breakdown.csv as they are computed).
    steps: dict[str, Any]
    #: Per (rank, device) over the rank's steps: ``rank``, ``device``,
    #: ``gpu_utilization``, ``sm_efficiency``, ``achieved_occupancy``.
    devices: dict[str, npt.NDArray[Any]]
    files: list[dict[str, Any]]
    warnings: list[str]
    #: HTA's gap under which idle time counts as kernel wait.
    kernel_wait_ns: int
    #: Per rank with steps: the report's ``per_rank`` entries (NaN for a
    #: mean with nothing to average) and the steps' ``source``.
    summaries: list[dict[str, Any]] = field(default_factory=list)
    #: Per rank: ``rank``, ``per`` (steps a bar), ``step`` (each bar's first
    #: step) and the mean of each of :data:`ROLES` per bar, at most
    #: ``max_bars`` bars, in order of step start.
    bars: list[dict[str, Any]] = field(default_factory=list)
    #: Steps over all ranks.
    step_count: int = 0
    #: breakdown.csv, when it was written.
    csv_path: Path | None = None

    def __len__(self) -> int:
        return self.step_count

    @property
    def gpu_activity(self) -> bool:
        """Whether any rank had GPU activity."""
        return any(s["gpu_steps"] > 0 for s in self.summaries)

    @property
    def note(self) -> str | None:
        """``"no GPU activity"`` when no rank had any, else None."""
        return None if self.gpu_activity or len(self) == 0 else NO_GPU

    def _rows_kept(self) -> None:
        if len(self) and not len(self.steps):
            raise ValueError("the breakdown's rows were not kept (step_breakdown(..., keep_rows=False))")

    def share(self, column: str) -> npt.NDArray[np.float64]:
        """A part's share of each step (0..1; NaN for an empty step)."""
        self._rows_kept()
        dur = self.steps["duration_ns"].astype(np.float64)
        part = self.steps[column].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out: npt.NDArray[np.float64] = np.where(dur > 0, part / dur, np.nan)
        return out

    def total_share(self, column: str) -> float:
        """A part's share of all steps' time together (NaN without steps)."""
        total = sum(int(s["duration_ns"]) for s in self.summaries)
        part = sum(int(s[column]) for s in self.summaries)
        return part / total if total > 0 else math.nan

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as plain Python values; GPU fields None without GPU
        activity, NaN ratios None."""
        self._rows_kept()
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
        ``reports/schema/report.v4.json``): per rank, the role totals, step
        time percentiles and GPU means, as the core summed them while the
        rows went to ``breakdown.csv`` (a million-step run's rows as JSON,
        or held as columns, were most of a report's time and memory)."""

        def clean(v: Any) -> Any:
            return None if isinstance(v, float) and math.isnan(v) else v

        per_rank = []
        for s in self.summaries:
            gpu = s["gpu_steps"] > 0
            per_rank.append(
                {
                    "rank": int(s["rank"]),
                    "steps": int(s["steps"]),
                    "duration_ns": int(s["duration_ns"]),
                    "step_mean_ns": float(s["step_mean_ns"]),
                    "step_p50_ns": float(s["step_p50_ns"]),
                    "step_p95_ns": float(s["step_p95_ns"]),
                    "step_max_ns": int(s["step_max_ns"]),
                    **{k: int(s[k]) for k in ROLES},
                    "gpu_steps": int(s["gpu_steps"]),
                    **{
                        k: clean(s[k]) if gpu else None
                        for k in ("gpu_util", "sm_efficiency", "occupancy", "tensor_core_share", "overlap_pct")
                    },
                }
            )
        sources = sorted({str(s["source"]) for s in self.summaries})
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


def step_breakdown(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    csv: str | os.PathLike[str] | None = None,
    keep_rows: bool = True,
    max_bars: int = 1000,
) -> Breakdown:
    """The step-time breakdown of traces, run directories or a merged trace
    (as ``fastprof merge`` takes them). ``csv``: write breakdown.csv there,
    a row per (rank, step), as the rows are computed (NaN and the GPU
    fields of a step without GPU activity are empty cells);
    ``keep_rows=False``: keep only the per-rank summaries and bars (what a
    report uses), not 240 bytes a step; ``max_bars``: bars per rank."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    raw = _core.analyze_steps(
        [os.fspath(p) for p in paths],
        csv=None if csv is None else os.fspath(csv),
        keep_rows=keep_rows,
        max_bars=max_bars,
    )
    steps: dict[str, Any] = dict(raw["steps"])
    if steps:
        steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
        # Source codes -> names (one shared str object per row: 8 bytes each).
        steps["source"] = np.asarray(raw["step_sources"], dtype=object)[steps["source"]]
    return Breakdown(
        steps=steps,
        devices=dict(raw["devices"]),
        files=list(raw["files"]),
        warnings=list(raw["warnings"]),
        kernel_wait_ns=int(raw["kernel_wait_ns"]),
        summaries=list(raw["summaries"]),
        bars=list(raw["bars"]),
        step_count=int(raw["step_count"]),
        csv_path=None if csv is None else Path(csv),
    )


def steps_from(section: dict[str, Any], triggers: dict[str, Any] | None) -> str:
    """Which steps the breakdown covers, in words, so that its figures are
    quoted as what they are (issue #36, item 3): every step (fastprof step
    spans), or the steps of torch.profiler windows, named by the captures
    that recorded them ("the 5 steps captured after the anomaly at step
    84"). ``triggers``: the report's ``triggers`` section."""
    n = int(section.get("step_count") or 0)
    if "ProfilerStep" not in str(section.get("source")):
        return f"every step ({n} steps)"
    told: list[str] = []
    per_rank = section.get("per_rank") or []
    ranks = {int(r["rank"]) for r in per_rank}
    captured = 0
    for r in (triggers or {}).get("per_rank") or []:
        if int(r["rank"]) not in ranks:
            continue
        for c in r.get("captures") or []:
            if c.get("status") != "done":
                continue
            first, k = int(c["first_step"]), int(c["steps"])
            if c.get("source") == "anomaly":
                before = [int(a["step"]) for a in r.get("anomalies") or [] if int(a["step"]) < first]
                why = f"after the anomaly at step {max(before)}" if before else "after an anomaly"
            else:
                why = f"on a {c.get('source')} request"
            said = f"the {k} steps captured {why} (steps {first}..{first + k - 1})"
            if int(r["rank"]) == min(ranks):
                captured += k
            if said not in told:
                told.append(said)
    if not told:
        return f"the {n} steps of torch.profiler windows only, not every step"
    rest = int(next(r for r in per_rank if int(r["rank"]) == min(ranks))["steps"]) - captured
    if rest > 0:
        told.append(f"{rest} steps of the schedule's windows")
    return f"{'; '.join(told)}: torch.profiler windows only, not every step"
