"""benches/gpu_check.py (issue #18): on a machine without a GPU it runs,
skips every GPU item with the reason and exits 0; its CPU dry run exercises
the window and overhead checks' own logic; the GPU-containment rule on a
hand-made trace."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benches" / "gpu_check.py"
GPU_ITEMS = (
    "nvml_sampler",
    "energy",
    "cuda_window",
    "overhead",
    "demo_report",
    "step_memory",
    "oom_capture",
    "memory_history",
    "oom_observer",
    "collect_snapshots",
    "triggered_window",
    "anatomy",
)

torch = pytest.importorskip("torch")
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check runs for real")


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "gpu_check.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    return p, json.loads(out.read_text())


@needs_no_gpu
def test_without_a_gpu_every_gpu_item_is_skipped_with_its_reason(tmp_path: Path) -> None:
    p, doc = _run(tmp_path)
    assert p.returncode == 0, p.stderr
    items = {i["name"]: i for i in doc["items"]}
    assert set(GPU_ITEMS) <= set(items)
    for name in GPU_ITEMS:
        assert items[name]["status"] == "SKIP" and items[name]["detail"].startswith("no GPU"), items[name]
    # NVML's own reason, as the sampler's probe gives it.
    assert doc["nvml"]["available"] is False and doc["nvml"]["reason"] in items["nvml_sampler"]["detail"]
    assert "0 failed" in p.stdout and list(tmp_path.iterdir()) == [tmp_path / "gpu_check.json"]


@needs_no_gpu
@pytest.mark.timeout(300)  # 104 s under a CPU hog and 3 workers
def test_the_cpu_dry_run_exercises_the_window_and_overhead_checks(tmp_path: Path) -> None:
    p, doc = _run(tmp_path, "--dry-run-cpu")
    assert p.returncode == 0, p.stdout + p.stderr
    items = {i["name"]: i for i in doc["items"]}
    window, overhead = items["cuda_window"], items["overhead"]
    assert window["status"] == "PASS" and window["figures"]["dry_run_cpu"] is True, window
    assert window["figures"]["breakdown_steps"] > 0 and window["figures"]["parts_sum_to_step"] is True
    assert overhead["status"] == "PASS" and len(overhead["figures"]["overhead_pct_rounds"]) == 3, overhead
    assert items["nvml_sampler"]["status"] == "SKIP" and items["energy"]["status"] == "SKIP"
    trig = items["triggered_window"]
    assert trig["status"] == "PASS" and trig["figures"]["latency_steps"] <= 1, trig
    assert trig["figures"]["window"]["active_steps"] == 3 and trig["figures"]["flight_dumps"], trig
    # The anatomy item: no CUDA, so no GPU phase times, and the status says why.
    anat = items["anatomy"]
    assert anat["status"] == "PASS", anat
    for shape in ("gpu_bound", "host_bound"):
        assert "GPU phase times: unavailable: no CUDA device" in anat["figures"][shape]["status"], anat


def _gpu_check_module() -> Any:
    """benches/gpu_check.py imported as a module (its helpers, no GPU needed)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return mod


def test_gpu_events_outside_their_step_are_counted() -> None:
    mod = _gpu_check_module()

    def x(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 7, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}

    events = [
        x("user_annotation", "ProfilerStep#1", 0, 100),
        x("user_annotation", "ProfilerStep#2", 100, 100),
        x("gpu_user_annotation", "ProfilerStep#1", 10, 140, pid=0),
        x("gpu_user_annotation", "ProfilerStep#2", 150, 100, pid=0),
        x("cuda_runtime", "cudaLaunchKernel", 20, 2, correlation=1),
        x("cuda_runtime", "cudaLaunchKernel", 120, 2, correlation=2),
        x("cuda_runtime", "cudaMemcpyAsync", 130, 2, correlation=3),
        x("kernel", "inside_1", 30, 100, pid=0, correlation=1),
        x("kernel", "inside_2", 160, 50, pid=0, correlation=2),
        # Launched in step 2 but running 11 µs past its GPU span.
        x("gpu_memcpy", "late_copy", 240, 21, pid=0, correlation=3),
        x("kernel", "no_launch", 30, 1, pid=0, correlation=99),
        # Kineto leaves these out of ProfilerStep#N's GPU span: launched under a
        # nested annotation, or from another thread (CUDA autograd's). Counted only.
        x("user_annotation", "Optimizer.step#AdamW.step", 170, 20),
        x("cuda_runtime", "cudaLaunchKernel", 175, 2, correlation=4),
        x("kernel", "multi_tensor_apply", 400, 5, pid=0, correlation=4),
        x("cuda_runtime", "cudaLaunchKernel", 60, 2, tid=8, correlation=5),
        x("kernel", "backward_kernel", 300, 5, pid=0, correlation=5),
        # A kernel that starts before its launch: the clocks are not aligned.
        x("cuda_runtime", "cudaLaunchKernel", 50, 2, correlation=6),
        x("kernel", "too_early", 40, 5, pid=0, correlation=6),
    ]
    got = mod.containment(events)
    assert (got["checked"], got["outside"], got["unmatched"]) == (4, 1, 1), got
    assert (got["nested"], got["other_thread"], got["before_launch"]) == (1, 1, 1), got
    assert got["worst_us"][0][1:] == ("late_copy", 2) and got["worst_us"][0][0] == pytest.approx(11)
    assert got["earliest_before_launch_us"][0] == (pytest.approx(10), "too_early")


def test_the_anatomys_gpu_span_is_compared_with_the_windows_over_the_same_steps() -> None:
    mod = _gpu_check_module()

    def x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}

    events = [
        x("fastprof", "step", 0, 1000, batch=3),
        x("fastprof", "phase.forward", 100, 200),
        x("fastprof", "phase.backward", 300, 300),
        # A copy launched before the first phase: not the anatomy's span, not counted.
        x("cuda_runtime", "cudaMemcpyAsync", 50, 2, correlation=1),
        x("gpu_memcpy", "copy", 60, 40, correlation=1),
        x("cuda_runtime", "cudaLaunchKernel", 120, 2, correlation=2),
        x("kernel", "fwd", 150, 300, correlation=2),
        x("cuda_runtime", "cudaLaunchKernel", 590, 2, correlation=3),
        x("kernel", "bwd", 600, 400, correlation=3),
        {"ph": "C", "name": "phase.gpu [ms]", "ts": 1200, "pid": 1, "args": {"step": 3, "span": 0.86, "forward": 0.3}},
        # A step the anatomy did not time: left out.
        x("fastprof", "step", 1000, 1000, batch=4),
        x("fastprof", "phase.forward", 1100, 200),
        x("cuda_runtime", "cudaLaunchKernel", 1150, 2, correlation=4),
        x("kernel", "fwd", 1160, 100, correlation=4),
    ]
    got = mod.window_agreement(events)
    # The window's span of step 3: 150 -> 1000 µs = 0.85 ms; the anatomy's 0.86 ms.
    assert [(r["step"], r["window_span_ms"], r["anatomy_span_ms"]) for r in got["steps"]] == [(3, 0.85, 0.86)]
    assert got["median_abs_diff_pct"] == pytest.approx(100 * 0.01 / 0.85, abs=0.01)


def test_the_anatomys_gpu_step_is_read_from_its_own_counter() -> None:
    """The anatomy records the timed step's number as ``phase.gpu.step``, just
    before the ``phase.gpu [ms]`` event (issue #35, item 6): window_agreement
    pairs the two, whatever order the merged trace holds them in."""
    mod = _gpu_check_module()

    def x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}

    def c(name: str, ts: float, **args: float) -> dict[str, Any]:
        return {"ph": "C", "name": name, "ts": ts, "pid": 1, "tid": 1, "args": args}

    events = [
        # Step 4's times (recorded a step later), listed before its step counter.
        c("phase.gpu [ms]", 2200.002, span=0.5, forward=0.5),
        c("phase.gpu.step", 2200.001, value=4),
        c("phase.gpu [ms]", 1200.002, span=0.86, forward=0.3),
        c("phase.gpu.step", 1200.001, value=3),
        x("fastprof", "step", 0, 1000, batch=3),
        x("fastprof", "phase.forward", 100, 200),
        x("fastprof", "phase.backward", 300, 300),
        x("cuda_runtime", "cudaLaunchKernel", 120, 2, correlation=2),
        x("kernel", "fwd", 150, 300, correlation=2),
        x("cuda_runtime", "cudaLaunchKernel", 590, 2, correlation=3),
        x("kernel", "bwd", 600, 400, correlation=3),
        x("fastprof", "step", 1000, 1000, batch=4),
        x("fastprof", "phase.forward", 1100, 200),
        x("cuda_runtime", "cudaLaunchKernel", 1150, 2, correlation=4),
        x("kernel", "fwd", 1160, 500, correlation=4),
    ]
    got = mod.window_agreement(events)
    rows = [(r["step"], r["window_span_ms"], r["anatomy_span_ms"]) for r in got["steps"]]
    assert rows == [(3, 0.85, 0.86), (4, 0.5, 0.5)]
