"""The step anatomy's phases are noted at their ends and recorded at the
step's end by the step loop (issue #35, the anatomy's cost): every phase
still lands in the trace, in its own step, whatever the loop's shape: more
phases in a step than the clock notes (gradient accumulation), phases after
the last step, a step the job's exception cut short, a loop the Profiler
does not drive (each phase then recorded at its end). Real torch on CPU,
real subprocesses; traces read with Python's json."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

JOB = """
import sys, torch, fastprof
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 8)
mode, micro = sys.argv[2], int(sys.argv[3])
prof = fastprof.Profiler(sys.argv[1], "run", torch=False, sample_hz=0, merge=True, triggers=False)
clock = None
with prof:
    for i in prof.loader(range(6)):
        for _ in range(micro):
            model(x).sum().backward()
        if mode == "raise" and i == 4:
            raise SystemExit(3)
        opt.step(); opt.zero_grad()
        prof.step()
        if i == 1:
            anatomy = [d.anatomy for d in prof._drivers if type(d).__name__ == "AnatomyDriver"][0]
            print("by_loop", anatomy._clock.by_loop, flush=True)
    if mode == "after":
        # After the loop's last step, before the Profiler closes.
        model(x).sum().backward()
"""


def _run(tmp: Path, mode: str, micro: int) -> tuple[subprocess.CompletedProcess[str], dict[str, list[dict[str, Any]]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp), mode, str(micro)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    with gzip.open(tmp / "run" / "trace.json.gz", "rt") as f:
        doc = json.load(f)
    spans: dict[str, list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            spans.setdefault(e["name"], []).append(e)
    return p, spans


def _per_step(spans: dict[str, list[dict[str, Any]]], name: str) -> list[int]:
    """How many `name` spans lie inside each step span, in step order."""
    steps = sorted(spans["step"], key=lambda e: e["ts"])
    starts = np.array([s["ts"] for s in steps])
    counts = [0] * len(steps)
    for e in spans.get(name, []):
        k = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        assert k >= 0 and e["ts"] + e["dur"] <= steps[k]["ts"] + steps[k]["dur"] + 1, (name, e)
        counts[k] += 1
    return counts


@pytest.mark.parametrize("micro", [1, 20])
def test_every_phase_is_recorded_inside_its_own_step_however_many_a_step_has(tmp_path: Path, micro: int) -> None:
    # 20 forwards and 20 backwards a step: more than the clock notes before
    # the step's end (16); the rest are recorded at their ends.
    p, spans = _run(tmp_path, "plain", micro)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "by_loop True" in p.stdout, p.stdout  # the loop records the phases
    assert _per_step(spans, "phase.forward") == [micro] * 6
    assert _per_step(spans, "phase.backward") == [micro] * 6
    assert _per_step(spans, "phase.optimizer") == [2] * 6  # step() and zero_grad()


def test_a_phase_after_the_last_step_is_recorded_at_the_close(tmp_path: Path) -> None:
    p, spans = _run(tmp_path, "after", 1)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(spans["step"]) == 6
    last_step_end = max(s["ts"] + s["dur"] for s in spans["step"])
    after = [e for e in spans["phase.backward"] if e["ts"] >= last_step_end]
    assert len(after) == 1, spans["phase.backward"]
    assert len([e for e in spans["phase.forward"] if e["ts"] >= last_step_end]) == 1


def test_the_phases_of_a_step_the_jobs_exit_cut_short_are_recorded(tmp_path: Path) -> None:
    p, spans = _run(tmp_path, "raise", 2)
    assert p.returncode == 3, p.stderr[-3000:]
    # Steps 0-3 ended; step 4 ran two forwards and backwards, then the job
    # exited: the Profiler ends it at its close, with its phases inside.
    assert len(spans["step"]) == 5
    assert _per_step(spans, "phase.forward") == [2] * 5
    assert _per_step(spans, "phase.backward") == [2] * 5
    assert _per_step(spans, "phase.optimizer") == [2] * 4 + [0]


def test_phases_are_recorded_at_their_ends_where_no_step_loop_numbers_them(tmp_path: Path) -> None:
    """The clock with a callable for the step (what a loop the Profiler does
    not drive gives it): no loop to record at a step's end, so each phase is
    recorded when it ends, with the step the callable says."""
    script = """
import sys, torch, fastprof
from fastprof.profiler.anatomy import Anatomy
model = torch.nn.Linear(4, 2); x = torch.randn(1, 4)
step = [0]
with fastprof.Recorder(sys.argv[1]):
    an = Anatomy()
    an.step_of = lambda: step[0]
    an.start()
    for s in range(3):
        step[0] = s
        model(x).sum().backward()
    print("by_loop", an._clock.by_loop, sorted(an.recent()), flush=True)
    an.stop()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "rec")], capture_output=True, text=True, timeout=180, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "by_loop False [0, 1, 2]" in p.stdout, p.stdout
    events = []
    for seg in sorted((tmp_path / "rec").rglob("*.json.gz")):
        with gzip.open(seg, "rt") as f:
            events += json.load(f)["traceEvents"]
    assert len([e for e in events if e.get("name") == "phase.backward" and e.get("ph") == "X"]) == 3
