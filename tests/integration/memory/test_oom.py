"""Out of memory (issue #16): an OOM leaving the Profiler is captured
(step, phase, where in the user's code; the allocator's state or, without
CUDA, why not) in rank{R}/memory/oom.json with one stderr line, and the
job's exception, exit code and traceback are what they would be without
fastprof. No GPU here: torch's own OutOfMemoryError is raised where the
allocator would raise it (the CUDA parts are in benches/gpu_check.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import sys, torch, fastprof
    out, phase, with_fastprof = sys.argv[1], sys.argv[2], sys.argv[3] == "1"

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
        def forward(self, x):
            if phase == "forward" and step == 3:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")  # the culprit
            return self.lin(x)

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()
        @staticmethod
        def backward(ctx, g):
            raise torch.OutOfMemoryError("CUDA out of memory in backward")

    class Greedy(torch.optim.SGD):
        def step(self, closure=None):
            if phase == "optimizer" and step == 3:
                raise torch.OutOfMemoryError("CUDA out of memory in the optimizer's step")
            return super().step(closure)

    net = Net()
    opt = Greedy(net.parameters(), lr=0.1)
    def train(loader):
        global step
        for step, x in enumerate(loader):
            y = net(x)
            if phase == "backward" and step == 3:
                y = Boom.apply(y)
            y.sum().backward()
            opt.step()
            opt.zero_grad()
            if prof is not None:
                prof.step()

    data = [torch.randn(2, 4) for _ in range(6)]
    prof = None
    if with_fastprof:
        prof = fastprof.Profiler(out_dir=out, run_name="run", torch=False, sample_hz=0)
        with prof:
            train(prof.loader(data))
    else:
        train(data)
    """
)


def _run(tmp: Path, phase: str, with_fastprof: bool) -> subprocess.CompletedProcess[str]:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    out = tmp / ("out" if with_fastprof else "bare")
    return subprocess.run(
        [sys.executable, str(script), str(out), phase, "1" if with_fastprof else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        cwd=tmp,
    )


def _traceback(stderr: str) -> list[str]:
    """The traceback from the training function inward (the module-level
    call differs by a line with and without the Profiler): the script's own
    frames, each with its source line, and the last line. Library frames are
    left out: the step anatomy's hooks take torch's module call through its
    hook path and wrap backward() (one fastprof frame), as the exit matrix
    allows; no other fastprof frame may appear."""
    lines = stderr.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Traceback"))
    lines = lines[start:]
    lines = lines[next(i for i, ln in enumerate(lines) if ln.endswith(", in train")) :]
    for ln in lines:
        if "/fastprof/" in ln and ln.lstrip().startswith("File "):
            assert "/fastprof/profiler/anatomy.py" in ln, ln
    out, keep = [], False
    for ln in lines:
        if ln.startswith("  File "):
            keep = "train.py" in ln
            if keep:
                out.append(re.sub(r", line \d+,", ",", ln))
        elif not ln.startswith(" "):
            out.append(ln)  # the exception's line
        elif keep and not set(ln.strip()) <= set("^~"):
            out.append(ln)
    return out


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer"])
def test_an_oom_is_captured_and_the_job_fails_as_it_would_without_fastprof(tmp_path: Path, phase: str) -> None:
    bare = _run(tmp_path, phase, with_fastprof=False)
    prof = _run(tmp_path, phase, with_fastprof=True)
    # The job's own failure: exit code, exception and traceback.
    assert bare.returncode == prof.returncode == 1
    assert _traceback(prof.stderr) == _traceback(bare.stderr)
    # One line saying where everything is.
    said = [ln for ln in prof.stderr.splitlines() if ln.startswith("fastprof: out of memory")]
    assert len(said) == 1, prof.stderr
    oom_path = tmp_path / "out" / "run" / "rank0" / "memory" / "oom.json"
    assert str(oom_path) in said[0]
    doc = json.loads(oom_path.read_text())
    assert doc["step"] == 3 and doc["epoch"] == 0 and doc["phase"] == phase
    assert doc["exception"].startswith("OutOfMemoryError: CUDA out of memory")
    culprit = {"forward": "forward", "backward": "backward", "optimizer": "step"}[phase]
    assert doc["where"][0].startswith(str(tmp_path / "train.py")) and culprit in doc["where"][0]
    if not __import__("torch").cuda.is_available():
        assert doc["cuda"] == {"available": False, "reason": "no CUDA device (torch.cuda.is_available() is False)"}
        assert "no allocator snapshot (no CUDA device" in said[0]
    # The run is saved and reads back: the step it died in, the instant marking it.
    run = tmp_path / "out" / "run"
    assert json.loads((run / "rank0" / "profiler.json").read_text())["exit"] == "exception: OutOfMemoryError"
    import fastprof

    cols = fastprof.read_columns(run, kinds=["instants"], names=["memory.oom"])
    assert len(cols.instants["ts"]) == 1
    # The report's memory section and the terminal say it.
    jsonschema = pytest.importorskip("jsonschema")
    rep = fastprof.report(run, formats=("json",))
    report_doc = json.loads((run / "reports" / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(report_doc)
    (o,) = rep["memory"]["oom"]
    assert (o["rank"], o["step"], o["phase"], o["where"]) == (0, 3, phase, doc["where"][0])
    summary = subprocess.run(
        [sys.executable, "-m", "fastprof", "summary", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert summary.returncode == 0, summary.stderr
    assert f"Out of memory on rank 0 at step 3 ({phase})" in summary.stdout
    # The merge command fastprof prints works on this run directory too:
    # oom.json is fastprof's own, skipped (listed with -v), never an input.
    merged = subprocess.run(
        [sys.executable, "-m", "fastprof", "merge", str(run), "-o", str(run / "trace.json.gz"), "--force", "-v"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert merged.returncode == 0, merged.stderr
    assert "oom.json" in merged.stdout + merged.stderr


def test_an_exception_that_is_not_an_oom_writes_nothing(tmp_path: Path) -> None:
    from fastprof.memory.oom import is_oom, phase_and_where

    assert not is_oom(ValueError("x")) and not is_oom(None)
    try:
        raise RuntimeError("plain")
    except RuntimeError as e:
        phase, where = phase_and_where(e.__traceback__)
    assert phase == "other" and where[0].startswith(__file__)


def test_an_oom_the_job_catches_is_captured_once_per_step_by_the_observer(tmp_path: Path) -> None:
    """torch's OOM observer (no CUDA here: called as the allocator calls it,
    from inside the allocating forward): captured with its step and phase,
    at most once per step; the job that catches the OOM goes on; an OOM
    leaving the Profiler in a step the observer captured adds its text only;
    listeners hear of each capture, a failing one is a warning."""
    import warnings as _warnings

    torch = __import__("torch")
    import fastprof
    from fastprof.memory import add_oom_listener, oom, remove_oom_listener

    heard: list[tuple[int, str | None]] = []

    def listener(prof: Any, exc: BaseException | None) -> None:
        heard.append((prof.batch, None if exc is None else type(exc).__name__))

    def broken(prof: Any, exc: BaseException | None) -> None:
        raise RuntimeError("listener bug")

    class Net(torch.nn.Module):
        def forward(self, x: Any, calls: int) -> Any:
            for _ in range(calls):
                oom._on_oom(0, 1 << 40, 0, 0)  # as torch's allocator does, before it raises
            return x

    net = Net()
    add_oom_listener(listener)
    add_oom_listener(broken)
    prof = fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=False, sample_hz=0)
    try:
        with _warnings.catch_warnings(record=True) as caught:
            _warnings.simplefilter("always")
            with pytest.raises(torch.OutOfMemoryError), prof:
                for step in prof.loader(range(6)):
                    net(torch.ones(1), {2: 1, 4: 2}.get(step, 0))  # the job caught the OOM at 2; twice at 4
                    if step == 4:
                        raise torch.OutOfMemoryError("CUDA out of memory at step 4")
                    prof.step()
    finally:
        remove_oom_listener(listener)
        remove_oom_listener(broken)
    assert heard == [(2, None), (4, None)]
    bugs = [w for w in caught if "listener" in str(w.message)]
    assert len(bugs) == 2 and "listener bug" in str(bugs[0].message)
    doc = json.loads((prof.rank_dir / "memory" / "oom.json").read_text())
    assert (doc["step"], doc["phase"], doc["source"]) == (4, "forward", "observer")
    assert doc["exception"] == "OutOfMemoryError: CUDA out of memory at step 4"  # the exception's text, added
    assert doc["where"][0].startswith(__file__) and "in forward" in doc["where"][0]
    assert doc["earlier"] == [{"step": 2, "phase": "forward", "source": "observer", "exception": None}]
    summary = json.loads((prof.rank_dir / "profiler.json").read_text())["memory"]["oom"]
    assert summary["captures"] == 2 and summary["last"]["oom"] == str(prof.rank_dir / "memory" / "oom.json")
    if not torch.cuda.is_available():
        assert summary["observer"] == "unavailable: no CUDA device (torch.cuda.is_available() is False)"
    cols = fastprof.read_columns(prof.rank_dir, kinds=["instants"], names=["memory.oom"])
    assert len(cols.instants["ts"]) == 2
