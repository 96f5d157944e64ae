"""What in a run directory is a trace: one walker in the core decides, for
``fastprof merge``, the Profiler's own merge, the columns and the reports.

fastprof's own non-trace JSON (``profiler.json``, ``reports/report.json``)
is skipped, hidden and temporary files are never inputs, and a temporary
file left by a process that is gone is removed when the run is merged or
reported. Every command fastprof prints about a run directory works on it.
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fastprof


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastprof", *args], capture_output=True, text=True, timeout=110, cwd=cwd
    )


def _events(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return list(doc["traceEvents"])


def _recorder_run(root: Path, name: str = "exp1") -> Path:
    with fastprof.Recorder(out_dir=root, run_name=name, sample_hz=0) as rec:
        for i in range(5):
            with fastprof.span("step", batch=i):
                fastprof.counter("loss", 1.0 / (i + 1))
    return Path(rec.run_dir)


def _dead_pid() -> int:
    """The pid of a process that has just been killed with SIGKILL and reaped."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    p.kill()
    p.wait()
    return p.pid


def test_merge_and_report_of_a_recorder_run_after_a_report(tmp_path: Path) -> None:
    run = _recorder_run(tmp_path)
    r = _cli("report", str(run), "-q")
    assert r.returncode == 0, r.stderr
    assert (run / "reports" / "report.json").is_file()
    # The report.json now inside the run directory is not a trace.
    r = _cli("merge", str(run), "-v")
    assert r.returncode == 0, r.stderr
    assert "report.json" in r.stdout, r.stdout
    steps = [e for e in _events(run / "trace.json.gz") if e.get("name") == "step"]
    assert len(steps) == 5
    # Said only with -v.
    r = _cli("merge", str(run), "-o", str(tmp_path / "again.json.gz"))
    assert r.returncode == 0, r.stderr
    assert "report.json" not in r.stdout
    # The report of the run reads it as before (twice: its own output is no input).
    r = _cli("report", str(run), "-q")
    assert r.returncode == 0, r.stderr
    rep = json.loads((run / "reports" / "report.json").read_text())
    assert rep["speed"]["train"]["per_rank"][0]["steps"] == 5


def test_the_walker_names_what_it_skips(tmp_path: Path) -> None:
    run = _recorder_run(tmp_path)
    (run / "rank0" / "profiler.json").write_text('{"not": "a trace"}')
    (run / "reports").mkdir()
    (run / "reports" / "report.json").write_text('{"schema": "fastprof.report"}')
    (run / "rank0" / "ep0-ba1.memory.json").write_text("[[1, 2]]")
    (run / "rank0" / ".hidden.json").write_text("{")
    files, own, removed, warnings = fastprof._core.trace_inputs([str(run)])
    assert [Path(f).name for f in files] == ["fastprof.0.json.gz"]
    assert sorted(Path(f).name for f in own) == ["ep0-ba1.memory.json", "profiler.json", "report.json"]
    assert removed == [] and warnings == []
    # A foreign non-trace file named explicitly is still an error naming it.
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"a": 1}')
    r = _cli("merge", str(foreign), "-o", str(tmp_path / "x.json.gz"))
    assert r.returncode != 0
    assert "notes.json" in r.stderr and "not a trace" in r.stderr


def test_temporary_files_of_a_killed_export_are_never_inputs_and_are_cleaned(tmp_path: Path) -> None:
    run = _recorder_run(tmp_path)
    torch_dir = run / "rank0" / "torch"
    torch_dir.mkdir()
    dead = _dead_pid()
    half = b'{"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "du'
    # What a SIGKILL in the middle of a window's export leaves (the names
    # torch_windows.py and the core's window sink write).
    stale = [torch_dir / f".ep0-ba1.pt.trace.json.tmp-{dead}.json", torch_dir / f".ep0-ba1.pt.trace.json.gz.tmp-{dead}"]
    for p in stale:
        p.write_bytes(half)
    long_ago = time.time() - 3600
    for p in stale:
        os.utime(p, (long_ago, long_ago))
    # Kept (but never read): a live writer's file, and a dead pid's file
    # touched just now (its writer may be on another node of a shared disk).
    live = torch_dir / f".ep0-ba3.pt.trace.json.tmp-{os.getpid()}.json"
    live.write_bytes(half)
    os.utime(live, (long_ago, long_ago))
    fresh = torch_dir / f".ep0-ba5.pt.trace.json.tmp-{dead}.json"
    fresh.write_bytes(half)
    r = _cli("merge", str(run), "-o", str(tmp_path / "m.json.gz"))
    assert r.returncode == 0, r.stderr
    assert all(not p.exists() for p in stale)
    assert live.exists() and fresh.exists()
    assert str(stale[0].name) in r.stdout
    names = {e.get("name") for e in _events(tmp_path / "m.json.gz")}
    assert "step" in names and "aten::mm" not in names
    # The report cleans the same way.
    for p in stale:
        p.write_bytes(half)
        os.utime(p, (long_ago, long_ago))
    r = _cli("report", str(run), "-q")
    assert r.returncode == 0, r.stderr
    assert all(not p.exists() for p in stale)
    assert live.exists()


@pytest.mark.slow
def test_every_command_the_demo_prints_works_on_its_run(tmp_path: Path) -> None:
    r = _cli("demo", "--steps", "8", "-o", "runs", "--run-name", "d", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    redo = [line.split(":", 1)[1].strip() for line in r.stdout.splitlines() if line.startswith("redo it:")]
    assert len(redo) == 1, r.stdout
    argv = shlex.split(redo[0])
    assert argv[:2] == ["fastprof", "merge"]
    run = tmp_path / "runs" / "d"
    assert (run / "rank0" / "profiler.json").is_file()
    before = _events(run / "trace.json.gz")
    r2 = _cli(*argv[1:], cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    after = _events(run / "trace.json.gz")
    # The same timeline again (its previous output is no input).
    assert sorted(e.get("name", "") for e in after) == sorted(e.get("name", "") for e in before)
    # The report it prints: the command that says where a step's time goes.
    report = [line.split(":", 1)[1].strip() for line in r.stdout.splitlines() if line.startswith("report:")]
    assert len(report) == 1, r.stdout
    argv = shlex.split(report[0].split("   (", 1)[0])
    assert argv[:2] == ["fastprof", "report"] and (tmp_path / argv[2]).resolve() == run, report
    assert _cli(*argv[1:], cwd=tmp_path).returncode == 0
    # The README's form: nothing to do for an up-to-date trace, and said (exit 0),
    # also after the report wrote reports/report.json.
    r3 = _cli("merge", "runs/d", cwd=tmp_path)
    assert r3.returncode == 0 and r3.stdout.endswith(" is up to date: the merge of its 5 inputs, newer than each\n"), r3
    r3 = _cli("merge", "runs/d", "-o", "runs/d/trace.json.gz", "--force", cwd=tmp_path)
    assert r3.returncode == 0, r3.stderr
    assert len([e for e in _events(run / "trace.json.gz") if e.get("name") == "step"]) == 8


def test_a_closed_pipe_ends_the_cli_quietly(tmp_path: Path) -> None:
    # `fastprof merge run | head -1`: the reader leaves before the summary is
    # written; the merge is done, and no traceback follows (exit 141, SIGPIPE's).
    run = _recorder_run(tmp_path)
    p = subprocess.Popen(
        [sys.executable, "-m", "fastprof", "merge", str(run), "-o", str(tmp_path / "p.json.gz")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    with p.stderr:
        err = p.stderr.read().decode()
    assert p.wait(timeout=100) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert len([e for e in _events(tmp_path / "p.json.gz") if e.get("name") == "step"]) == 5
