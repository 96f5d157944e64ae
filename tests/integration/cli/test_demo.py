"""``fastprof demo`` end to end: the console script and ``python -m fastprof``
as real subprocesses, plus one in-process run through ``main([...])``.

The demo promises (python/fastprof/cli/demo.py) a run under
``fastprof.Profiler``: one ``step`` span per step holding its loader wait,
``data``, ``forward``, ``backward`` and ``optimizer_step``, a ``loss``
counter per step, ``train_begin``/``train_end`` instants, torch.profiler
windows, and the unified trace, whose path it prints.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

STEPS = 4
STEP_SPANS = ("data", "forward", "backward", "optimizer_step")


def _console_script() -> str:
    beside = Path(sys.executable).parent / "fastprof"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("fastprof")
    if found is None:
        pytest.fail("the fastprof console script is not installed next to the interpreter or on PATH")
    return found


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{cmd} did not finish within 100 s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")


def _check_demo_trace(trace_dir: Path, stdout: str, traces) -> None:
    unified = trace_dir.parent / "trace.json.gz"
    assert str(unified) in stdout, stdout
    run = traces.read(trace_dir)
    for seg in run.segments:
        traces.time_format(seg.text)
    steps = run.of("X", "step")
    assert len(steps) == STEPS
    assert [e["args"]["epoch"] for e in sorted(steps, key=lambda e: e["ts"])] == [0] * 2 + [1] * 2
    for name in STEP_SPANS:
        assert len(run.of("X", name)) == STEPS, name
    assert len(run.of("X", "loader.train.next")) == STEPS + 2  # + the exhausted next() per epoch
    assert len(run.of("C", "loss")) == STEPS
    assert all(isinstance(e["args"]["value"], (int, float)) for e in run.of("C", "loss"))
    (begin,) = run.of("i", "train_begin")
    assert begin["args"]["steps"] == STEPS
    assert len(run.of("i", "train_end")) == 1
    assert run.final["final"] is True
    assert run.final["drops"]["total"] == 0
    # One window per epoch (warmup 1, active 1), each saved.
    assert sorted(p.name for p in (trace_dir / "torch").iterdir()) == [
        "ep0-ba1.pt.trace.json.gz",
        "ep1-ba3.pt.trace.json.gz",
    ]

    # Each step holds its fetch and its four phases, in order, directly inside it.
    nested = traces.nesting(run)
    (main_tid,) = {e["tid"] for e in steps}
    spans = sorted(nested[main_tid], key=lambda s: s[0])
    order = [e["name"] for _, _, d, e in spans if d == 1 and e["name"] in (*STEP_SPANS, "loader.train.next")]
    assert order == ["loader.train.next", *STEP_SPANS] * STEPS
    assert all(
        e["name"] in ("step", "loader.train.next", "loader.val.next", "loader.train.iter", "loader.val.iter")
        or e["name"].startswith("torch.window")
        # The step anatomy's phases of the validation pass, between steps.
        or e["name"] in ("phase.forward", "phase.optimizer")
        for _, _, d, e in spans
        if d == 0
    )


@pytest.mark.slow
def test_demo_console_script(tmp_path, traces):
    out = tmp_path / "D"
    proc = _run([_console_script(), "demo", "--out-dir", str(out), "--steps", str(STEPS)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    (run_dir,) = out.iterdir()
    trace_dir = run_dir / "rank0"
    assert str(trace_dir) in proc.stdout
    _check_demo_trace(trace_dir, proc.stdout, traces)


@pytest.mark.slow
def test_demo_quiet_prints_the_trace_and_nothing_else(tmp_path):
    # Kineto's per-window log lines and, without a GPU, its "gpuGetDeviceCount
    # failed" ERROR were ~9 lines on stderr even with -q.
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    cmd = [sys.executable, "-m", "fastprof", "demo", "-q", "--out-dir", str(tmp_path / "Q"), "--steps", str(STEPS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    (line,) = proc.stdout.splitlines()
    assert line.endswith("trace.json.gz") and Path(tmp_path, line).is_file()


@pytest.mark.slow
def test_demo_python_dash_m(tmp_path, traces):
    out = tmp_path / "D"
    proc = _run(
        [sys.executable, "-m", "fastprof", "demo", "--out-dir", str(out), "--steps", str(STEPS), "--run-name", "m"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    _check_demo_trace(out / "m" / "rank0", proc.stdout, traces)


def test_demo_rejects_bad_steps_in_one_line(tmp_path):
    out = tmp_path / "D"
    proc = _run([sys.executable, "-m", "fastprof", "demo", "--out-dir", str(out), "--steps", "0"], tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "steps" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_demo_in_process(tmp_path, capsys, traces):
    from fastprof.cli.main import main

    out = tmp_path / "D"
    assert main(["demo", "--out-dir", str(out), "--run-name", "inproc", "--steps", str(STEPS), "-q"]) == 0
    stdout = capsys.readouterr().out
    trace_dir = out / "inproc" / "rank0"
    _check_demo_trace(trace_dir, stdout, traces)
    # --quiet prints only the unified trace's path.
    assert [Path(line) for line in stdout.split()] == [out / "inproc" / "trace.json.gz"]


@pytest.mark.parametrize("device", ["banana", "cuda", "cuda:99", "meta"])
def test_demo_rejects_unusable_devices_in_one_line_and_leaves_nothing(tmp_path, device):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is available: cuda is usable here")
    out = tmp_path / "D"
    proc = _run(
        [sys.executable, "-m", "fastprof", "demo", "--out-dir", str(out), "--steps", "2", "--device", device],
        tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "Traceback" not in line and f"--device {device}" in line.replace("'", "")
    assert not out.exists()


@pytest.mark.slow
def test_demo_progress_raises_no_warning(tmp_path, capsys, traces):
    """Under filterwarnings=error a warning from the demo's own code (e.g. float() of
    a tensor that requires grad, in the progress line) fails the run."""
    from fastprof.cli.main import main

    out = tmp_path / "D"
    assert main(["demo", "--out-dir", str(out), "--run-name", "w", "--steps", str(STEPS), "--device", "cpu"]) == 0
    stdout = capsys.readouterr().out
    assert f"step {STEPS:>5}/{STEPS}" in stdout
    _check_demo_trace(out / "w" / "rank0", stdout, traces)


@pytest.mark.slow
def test_demo_again_under_one_run_name_says_the_directory_it_records_in(tmp_path, capsys):
    # The second run takes NAME-2 at its start: what the demo prints (where it
    # records, the commands to run next) names that one, not the first run's.
    from fastprof.cli.main import main

    out = tmp_path / "D"
    for _ in range(2):
        assert main(["demo", "--out-dir", str(out), "--run-name", "same", "--steps", "4"]) == 0
    stdout = capsys.readouterr().out
    said = [line for line in stdout.splitlines() if "recording into" in line]
    assert [line.rsplit(" ", 1)[-1] for line in said] == [str(out / "same"), str(out / "same-2")]
    assert f"fastprof report {out / 'same-2'}" in stdout
