"""Out of memory (issue #16): an OOM leaving the Profiler is captured
(step, phase, where in the user's code; the allocator's state or, without
CUDA, why not) in rank{R}/memory/oom.json with one stderr line, and the
job's exception, exit code and traceback are what they would be without
fastprof. No GPU here: torch's own OutOfMemoryError is raised where the
allocator would raise it (the CUDA parts are in benches/gpu_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

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

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
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
    call differs by a line with and without the Profiler)."""
    lines = stderr.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Traceback"))
    lines = lines[start:]
    return lines[next(i for i, ln in enumerate(lines) if ln.endswith(", in train")) :]


@pytest.mark.parametrize("phase", ["forward", "backward"])
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
    culprit = "forward" if phase == "forward" else "backward"
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
