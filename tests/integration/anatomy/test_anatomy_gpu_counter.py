"""The anatomy's GPU phase times (issue #35, item 6): ``phase.gpu [ms]``
holds milliseconds only; the timed step's number is a counter of its own,
``phase.gpu.step``, recorded just before it (it was a series ``step`` of the
ms counter, which a viewer plots as milliseconds), and the readers pair the
two. A GPU timing failure says what it cost.

No CUDA here: an event that stands in for CUDA's (the host's clock, as in
test_anatomy.py) drives the real ``_GpuPhases`` inside the real hooks;
gpu_check's ``anatomy`` item runs it with CUDA events."""

from __future__ import annotations

import functools
import gzip
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import fastprof
from fastprof.profiler.anatomy import Anatomy, _GpuPhases
from fastprof.recording.names import GPU_PHASE_COUNTER as GPU_COUNTER
from fastprof.recording.names import GPU_PHASE_STEP_COUNTER as GPU_STEP_COUNTER

torch = pytest.importorskip("torch")

STEPS = 12


class _HostClockEvent:
    """Stands in for torch.cuda.Event: completes at once, timed by the host's clock."""

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _HostClockEvent) -> float:
        return (end.t - self.t) * 1e3


def _run(tmp_path: Path, event: type[Any]) -> tuple[fastprof.Profiler, _GpuPhases, Anatomy]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # The Profiler's own anatomy is off: this one is driven by hand, with the
    # stand-in events, on the Profiler's steps.
    prof = fastprof.Profiler(tmp_path, "gpu", torch=False, sample_hz=0, anatomy=False)
    anatomy = Anatomy()
    with prof:
        anatomy.step_of = functools.partial(getattr, prof, "batch")
        anatomy.start()
        cuda = SimpleNamespace(Event=event, is_initialized=lambda: True)
        anatomy._gpu = gpu = _GpuPhases(SimpleNamespace(cuda=cuda), anatomy)
        try:
            for _ in prof.loader(range(STEPS)):
                model(torch.randn(16, 32)).sum().backward()
                opt.step()
                opt.zero_grad()
                time.sleep(0.02)  # far beyond 100 timed steps' cost of the stand-in: every step is timed
                prof.step()
        finally:
            anatomy.stop()
    return prof, gpu, anatomy


def _counters(trace: Path | None) -> list[dict[str, Any]]:
    assert trace is not None
    with gzip.open(trace, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "C"]
    return sorted((e for e in events if e["name"] in (GPU_COUNTER, GPU_STEP_COUNTER)), key=lambda e: e["ts"])


def test_the_ms_counter_holds_milliseconds_and_the_step_number_is_its_own_counter(tmp_path: Path) -> None:
    prof, gpu, _ = _run(tmp_path, _HostClockEvent)
    assert gpu.recorded == gpu.timed_steps == STEPS, (gpu.recorded, gpu.timed_steps, gpu.failed)
    events = _counters(prof.trace_path)
    ms = [e for e in events if e["name"] == GPU_COUNTER]
    assert len(ms) == STEPS
    for e in ms:
        assert set(e["args"]) == {"forward", "backward", "optimizer", "communication", "span"}, e
    # Each ms event follows its step's, which holds the step's number.
    names = [e["name"] for e in events]
    assert names == [GPU_STEP_COUNTER, GPU_COUNTER] * STEPS
    assert [int(e["args"]["value"]) for e in events if e["name"] == GPU_STEP_COUNTER] == list(range(STEPS))
    # The report reads the new pair: every timed step, the GPU phases beside the host's.
    jsonschema = pytest.importorskip("jsonschema")
    fastprof.report(prof.run_dir, out_dir=tmp_path / "rep", formats=("json",))
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    (r,) = doc["anatomy"]["per_rank"]
    assert r["gpu"]["timed_steps"] == STEPS
    assert r["gpu"]["phases"]["backward"]["p50_ns"] > 0


def test_gpu_steps_lost_to_a_failure_are_counted_in_the_status(tmp_path: Path) -> None:
    """The events stop completing, then fail: the steps waiting for them are
    lost with GPU timing, and the status says how many, beside the reason."""

    class FailsLater(_HostClockEvent):
        """The first 3 steps' events complete (8 a step), the next ones do
        not, and the 5th query after that raises."""

        queries = 0

        def query(self) -> bool:
            FailsLater.queries += 1
            if FailsLater.queries > 28:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return FailsLater.queries <= 24

    _, gpu, anatomy = _run(tmp_path, FailsLater)
    assert gpu.failed == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert (gpu.recorded, gpu.lost) == (3, 5)  # steps 0-2 recorded; 3-7 waiting when it failed
    status = anatomy.status
    assert (
        "GPU phase times: stopped: RuntimeError: CUDA error: an illegal memory access was encountered; "
        "3 timed steps recorded before it, 5 lost"
    ) in status, status
