"""Step-time breakdown (``fastprof.reports.breakdown``): a Kineto trace
written here by hand with every number worked out by hand, a real CPU
torch.profiler run through ``fastprof.Profiler``, and a merged multi-rank
trace made by ``fastprof.merge``."""

from __future__ import annotations

import csv
import gzip
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from fastprof.reports.breakdown import ROLES, step_breakdown

BASE = 1_700_000_000_000_000_000
US = 1000


def _x(name: str, cat: str, pid: int, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _kernel(name: str, ts: float, dur: float, stream: int, corr: int, **more: Any) -> dict[str, Any]:
    return _x(name, "kernel", 0, stream, ts, dur, device=0, stream=stream, correlation=corr, **more)


def _launch(ts: float, dur: float, corr: int) -> dict[str, Any]:
    return _x("cudaLaunchKernel", "cuda_runtime", 1, 1, ts, dur, correlation=corr)


def _gpu_trace(rank: int | None = None) -> dict[str, Any]:
    """Two steps on GPU 0 (µs relative to baseTimeNanoseconds).

    Step 1, host [0, 100): loader [0,20); aten::mm [20,50) holding
    aten::addmm [25,45); launches [30,35) c1, [40,42) c2, [44,46) c3;
    tensor-core gemm [36,60) stream 7 (0.5 blocks/SM, 50 % occupancy);
    NCCL kernel [55,80) stream 20 (2 blocks/SM); memcpy [82,90) stream 7.
    Step 2, host [100, 200): aten::relu [100,130); launches [110,112) c4,
    [138,139) c5; nccl:all_reduce op [160,170); memset [140,145) stream 7;
    relu kernel [150,210) stream 7, grid 216 blocks on a 108-SM GPU.
    """
    ev = [
        _x("ProfilerStep#1", "user_annotation", 1, 1, 0, 100),
        _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 1, 1, 0, 20),
        _x("aten::mm", "cpu_op", 1, 1, 20, 30),
        _x("aten::addmm", "cpu_op", 1, 1, 25, 20),
        _launch(30, 5, 1),
        _launch(40, 2, 2),
        _launch(44, 2, 3),
        _kernel("sm80_xmma_gemm_f16f16", 36, 24, 7, 1, **{"blocks per SM": 0.5, "est. achieved occupancy %": 50}),
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 55, 25, 20, 2, **{"blocks per SM": 2.0}),
        _x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 0, 7, 82, 8, device=0, stream=7, correlation=3),
        _x("ProfilerStep#2", "user_annotation", 1, 1, 100, 100),
        _x("aten::relu", "cpu_op", 1, 1, 100, 30),
        _launch(110, 2, 4),
        _launch(138, 1, 5),
        _x("nccl:all_reduce", "cpu_op", 1, 1, 160, 10),
        _x("Memset (Device)", "gpu_memset", 0, 7, 140, 5, device=0, stream=7, correlation=5),
        _kernel("vectorized_relu_kernel", 150, 60, 7, 4, grid=[216, 1, 1], block=[128, 1, 1]),
        # Not part of any role: the plugin leaves python_function out.
        _x("train.py(10): <module>", "python_function", 1, 1, 0, 300),
    ]
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "fake", "numSms": 108}],
        "traceEvents": ev,
        "baseTimeNanoseconds": BASE,
    }
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    return doc


def _write(path: Path, doc: dict[str, Any]) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def _check_gpu_rows(rows: list[dict[str, Any]], rank: int, sm_counts: bool = True) -> None:
    s1, s2 = rows
    assert (s1["rank"], s1["step"], s1["source"]) == (rank, 1, "ProfilerStep")
    # Step 1 keeps its host window: its device work ends at 90 < 100.
    assert (s1["start_ns"], s1["end_ns"], s1["duration_ns"]) == (BASE, BASE + 100 * US, 100 * US)
    # kernel [36,60) 24; memcpy [82,90) 8; NCCL [55,80) minus the kernel: 20;
    # runtime [30,35) 5 (the others run under kernels); loader 20;
    # cpu [20,30) + [35,36) 11; other [80,82) + [90,100) 12.
    assert [s1[k] for k in ROLES] == [x * US for x in (24, 8, 0, 20, 5, 20, 11, 12)]
    assert s1["gpu_utilization"] == pytest.approx(44 / 100)  # kernels [36,80)
    # min(blocks/SM, 1), overlapping kernels adding up to at most 1:
    # 0.5 on [36,55), 1 on [55,80): 34.5 µs.
    assert s1["sm_efficiency"] == pytest.approx(34.5 / 100)
    assert s1["achieved_occupancy"] == pytest.approx(50.0)
    assert s1["tensor_core_share"] == pytest.approx(24 / 49)
    # GPU busy [36,80) + [82,90) = 52; compute = the gemm 24; idle 48.
    assert [s1[k] for k in ("gpu_busy_ns", "compute_ns", "non_compute_ns", "idle_ns")] == [
        52 * US,
        24 * US,
        28 * US,
        48 * US,
    ]
    # Stream 7 gaps: [60,82) launched at 44 (before 60), 22 µs < 30 µs: kernel
    # wait; [90,140) launched at 138 > 90: host wait, 10 µs inside step 1.
    assert [s1["idle_host_wait_ns"], s1["idle_kernel_wait_ns"], s1["idle_other_ns"]] == [10 * US, 22 * US, 0]
    assert [
        s1["kernel_communication_ns"],
        s1["kernel_computation_ns"],
        s1["kernel_memory_ns"],
    ] == [25 * US, 24 * US, 8 * US]
    # NCCL [55,80) overlapped by the gemm on [55,60): 5 of 25 µs.
    assert (s1["comm_kernel_ns"], s1["comm_overlap_ns"]) == (25 * US, 5 * US)
    assert s1["comm_overlap_pct"] == pytest.approx(20.0)

    # Step 2: host [100,200), extended to 210 by the relu kernel it launched.
    assert (s2["start_ns"], s2["end_ns"]) == (BASE + 100 * US, BASE + 210 * US)
    # kernel [150,210) 60; memset 5; the nccl:all_reduce op is under the
    # kernel: 0; runtime 2 + 1; cpu [100,130) minus [110,112): 28;
    # other [130,138) + [139,140) + [145,150): 14.
    assert [s2[k] for k in ROLES] == [x * US for x in (60, 0, 5, 0, 3, 0, 28, 14)]
    assert s2["gpu_utilization"] == pytest.approx(60 / 110)
    if sm_counts:
        assert s2["sm_efficiency"] == pytest.approx(60 / 110)  # 216 / 108 = 2 -> 1
    else:
        # No deviceProperties (a merge output keeps none) and no "blocks per
        # SM" in the kernel's args: not measurable.
        assert s2["sm_efficiency"] is None
    assert s2["achieved_occupancy"] is None
    assert s2["tensor_core_share"] == pytest.approx(0.0)
    assert [s2[k] for k in ("gpu_busy_ns", "compute_ns", "non_compute_ns", "idle_ns")] == [
        65 * US,
        60 * US,
        5 * US,
        45 * US,
    ]
    # [100,140) of the host-wait gap; [145,150) is 5 µs, launched at 110.
    assert [s2["idle_host_wait_ns"], s2["idle_kernel_wait_ns"], s2["idle_other_ns"]] == [40 * US, 5 * US, 0]
    assert s2["comm_overlap_pct"] is None
    for r in rows:
        assert sum(r[k] for k in ROLES) == r["duration_ns"]
        assert r["compute_ns"] + r["non_compute_ns"] + r["idle_ns"] == r["duration_ns"]


def _csv_rows(trace: Path, kept: Any, tmp_path: Path) -> list[dict[str, str]]:
    """breakdown.csv as a report writes it (rows streamed, none kept), read
    back with Python's csv; the summaries it keeps are those of the rows."""
    path = tmp_path / "breakdown.csv"
    b = step_breakdown(trace, csv=path, keep_rows=False)
    assert not b.steps and len(b) == len(kept) and b.to_section() == kept.to_section()
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_hand_placed_kineto_trace(tmp_path: Path) -> None:
    trace = _write(tmp_path / "host_1.pt.trace.json.gz", _gpu_trace(rank=0))
    b = step_breakdown(trace)
    assert len(b) == 2 and b.gpu_activity and b.note is None
    _check_gpu_rows(b.rows(), rank=0)
    assert b.devices["device"].tolist() == [0]
    assert b.devices["gpu_utilization"][0] == pytest.approx(104 / 210)
    assert b.devices["sm_efficiency"][0] == pytest.approx(94.5 / 210)
    assert b.total_share("kernel_ns") == pytest.approx(84 / 210)
    section = b.to_section()
    json.dumps(section, allow_nan=False)
    # report.json's section: per-rank totals of the rows, and GPU means.
    (pr,) = section["per_rank"]
    rows = b.rows()
    assert pr["steps"] == 2 and section["step_count"] == 2
    assert pr["duration_ns"] == sum(r["duration_ns"] for r in rows)
    assert all(pr[k] == sum(r[k] for r in rows) for k in ROLES)
    assert pr["gpu_util"] == pytest.approx(sum(r["gpu_utilization"] for r in rows) / 2)
    assert pr["step_max_ns"] == max(r["duration_ns"] for r in rows)
    p50, p95 = np.percentile([r["duration_ns"] for r in rows], [50, 95])
    assert (pr["step_p50_ns"], pr["step_p95_ns"]) == (p50, p95)
    # The per-step rows go to breakdown.csv, read back with Python's csv.
    got = _csv_rows(trace, b, tmp_path)
    assert [int(g["step"]) for g in got] == [1, 2]
    assert [int(got[0][k]) for k in ("compute_ns", "non_compute_ns", "idle_ns")] == [24 * US, 28 * US, 48 * US]
    assert all(int(g[k]) == r[k] for g, r in zip(got, rows, strict=True) for k in ROLES)
    assert [float(g["gpu_util"]) for g in got] == [r["gpu_utilization"] for r in rows]
    assert [g["overlap_pct"] for g in got] == [
        "" if r["comm_overlap_pct"] is None else str(r["comm_overlap_pct"]) for r in rows
    ]


def test_older_absolute_microseconds_give_the_same_breakdown(tmp_path: Path) -> None:
    doc = _gpu_trace(rank=0)
    del doc["baseTimeNanoseconds"]
    for e in doc["traceEvents"]:
        e["ts"] = BASE // 1000 + e["ts"]
    rows = step_breakdown(_write(tmp_path / "old.json.gz", doc)).rows()
    _check_gpu_rows(rows, rank=0)


def test_merged_multi_rank_trace_gives_rows_per_rank(tmp_path: Path) -> None:
    d = tmp_path / "run"
    for r in (0, 1):
        (d / f"rank{r}" / "torch").mkdir(parents=True)
        _write(d / f"rank{r}" / "torch" / f"w{r}.pt.trace.json.gz", _gpu_trace(rank=r))
    merged = tmp_path / "trace.json.gz"
    fastprof.merge(d, merged)
    b = step_breakdown(merged)
    assert b.files[0]["kind"] == "merged"
    rows = b.rows()
    assert [(r["rank"], r["step"]) for r in rows] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    _check_gpu_rows(rows[:2], rank=0, sm_counts=False)
    _check_gpu_rows(rows[2:], rank=1, sm_counts=False)
    # The run directory itself reads the same.
    assert [(r["rank"], r["step"]) for r in step_breakdown(d).rows()] == [(0, 1), (0, 2), (1, 1), (1, 2)]


def test_cpu_only_trace_says_no_gpu_activity(tmp_path: Path) -> None:
    doc = _gpu_trace()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["cat"] not in ("kernel", "gpu_memcpy", "gpu_memset")]
    trace = _write(tmp_path / "cpu.json.gz", doc)
    b = step_breakdown(trace)
    assert not b.gpu_activity and b.note == "no GPU activity"
    s1, s2 = b.rows()
    # Without kernels the runtime calls and the nccl op show: step 1 runtime
    # [30,35) [40,42) [44,46) = 9, cpu [20,50) - 9 = 21, other [50,100) = 50.
    assert [s1[k] for k in ROLES] == [x * US for x in (0, 0, 0, 0, 9, 20, 21, 50)]
    # Step 2 keeps its host window; comm [160,170) 10; runtime 3; cpu
    # [100,130) - [110,112) 28; other [130,138) + [139,160) + [170,200) 59.
    assert (s2["start_ns"], s2["end_ns"]) == (BASE + 100 * US, BASE + 200 * US)
    assert [s2[k] for k in ROLES] == [x * US for x in (0, 0, 0, 10, 3, 0, 28, 59)]
    for r in (s1, s2):
        assert r["gpu_utilization"] is None and r["idle_ns"] is None and r["compute_ns"] is None
    assert b.to_section()["per_rank"][0]["gpu_util"] is None
    assert all(g["compute_ns"] == "" and g["gpu_util"] == "" for g in _csv_rows(trace, b, tmp_path))


torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class _SleepySet(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.005)
        return torch.full((16,), float(i))


def _dataloader_share(tmp_path: Path, name: str, num_workers: int) -> float:
    model = torch.nn.Linear(16, 4)
    dl = DataLoader(_SleepySet(), batch_size=8, num_workers=num_workers)
    sched = fastprof.schedule.cyclic(wait=2, warmup=1, active=3, repeat=1)
    with fastprof.Profiler(out_dir=tmp_path, run_name=name, schedule=sched) as prof:
        for x in prof.loader(dl):
            model(x).sum().backward()
            time.sleep(0.02)  # the rest of the step's work
            prof.step()
    b = step_breakdown(prof.trace_path)  # type: ignore[arg-type]
    assert not b.gpu_activity
    assert set(b.steps["source"]) == {"ProfilerStep"}
    assert len(b) == 3, b.rows()
    assert np.all(b.steps["cpu_exec_ns"] > 0)
    share = b.total_share("dataloader_ns")
    assert not math.isnan(share)
    return share


def test_dataloader_share_of_a_real_cpu_run_falls_with_workers(tmp_path: Path) -> None:
    serial = _dataloader_share(tmp_path, "serial", 0)
    # 8 samples x 5 ms of sleep per batch against ~20 ms of work.
    assert serial >= 0.5, serial
    parallel = _dataloader_share(tmp_path, "workers", 2)
    assert parallel <= serial / 2, (serial, parallel)
