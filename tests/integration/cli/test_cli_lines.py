"""Exit codes and the lines of ``fastprof trigger --rank`` and ``fastprof
diff`` (#34, item 12), as a user meets them: real jobs and real runs, the
CLI in subprocesses.

* ``trigger --rank R`` for a rank the run does not have is bad input: one
  line, exit 2 (a rank that is there but no longer running stays exit 1);
* ``diff`` of a trace cut short compares what was kept and says which file
  was salvaged and what of it was kept, as ``fastprof report`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

FASTPROF = [sys.executable, "-m", "fastprof"]

# A one-rank job with triggers on, training until told to stop.
LIVE_JOB = """
import os, sys, time
import torch, fastprof

out, stop = sys.argv[1], sys.argv[2]
m = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
trig = fastprof.Triggers(poll_s=0.2, min_interval_s=0)
with fastprof.Profiler(out, "run", schedule="never", sample_hz=0, triggers=trig) as prof:
    while not os.path.exists(stop):
        m(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)
"""

# Two short runs, each leaving its unified trace.
RUNS = """
import sys
import torch, fastprof

for name in sys.argv[1:]:
    with fastprof.Profiler("runs", name, sample_hz=0, torch=None) as prof:
        m = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for x in prof.loader([torch.randn(4, 8) for _ in range(40)]):
            m(x).sum().backward()
            opt.step()
            opt.zero_grad()
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FASTPROF, *args], capture_output=True, text=True, timeout=180, cwd=cwd)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}


def test_trigger_a_rank_the_run_does_not_have(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(LIVE_JOB)
    stop = tmp_path / "stop"
    job = subprocess.Popen(
        [sys.executable, "job.py", "out", str(stop)],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = tmp_path / "out" / "run"
    try:
        deadline = time.monotonic() + 120
        while not (run / "rank0" / "live.json").is_file():
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the job never went live"
            time.sleep(0.05)
        bad = _cli("trigger", str(run), "--rank", "99", "--wait", "0", cwd=tmp_path)
        assert bad.returncode == 2, bad.stderr
        assert bad.stderr == f"fastprof trigger: error: --rank 99: {run} has no rank 99 (its ranks: 0)\n", bad.stderr
        assert bad.stdout == ""
        assert not (run / "rank99").exists() and not (run / "TRIGGER").exists()
        # The rank it has is asked as ever.
        good = _cli("trigger", str(run), "--rank", "0", "--flight", "--wait", "60", cwd=tmp_path)
        assert good.returncode == 0, good.stderr + good.stdout
        assert "asked rank(s) 0" in good.stdout
    finally:
        stop.write_text("")
        _out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err


def test_diff_says_what_it_salvaged(tmp_path: Path) -> None:
    (tmp_path / "runs.py").write_text(RUNS)
    made = subprocess.run(
        [sys.executable, "runs.py", "a", "b"], capture_output=True, text=True, timeout=180, cwd=tmp_path, env=_env()
    )
    assert made.returncode == 0, made.stderr
    whole = (tmp_path / "runs" / "b" / "trace.json.gz").read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) * 2 // 3])  # a writer killed mid-file
    base = "runs/a/trace.json.gz"

    d = _cli("diff", base, "cut.json.gz", "--max-slowdown", "1000000%", cwd=tmp_path)
    assert d.returncode == 0, d.stderr
    lines = d.stderr.splitlines()
    assert len(lines) == 1, d.stderr
    assert lines[0].startswith("fastprof diff: warning: cut.json.gz: salvaged a cut file: kept the "), lines
    assert " events before byte " in lines[0], lines
    # The same line `fastprof report` gives for the same file, but for the verb.
    r = _cli("report", "cut.json.gz", "-o", "rep", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.replace("fastprof report:", "fastprof diff:") == d.stderr
    # The report.json of a salvaged trace carries it too: said again when compared.
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["source"]["warnings"], rep["source"]
    d2 = _cli("diff", base, "rep/report.json", "--max-slowdown", "1000000%", cwd=tmp_path)
    assert d2.returncode == 0 and d2.stderr == d.stderr, d2.stderr
    # Whole inputs: nothing said.
    ok = _cli("diff", base, "runs/b/trace.json.gz", "--max-slowdown", "1000000%", cwd=tmp_path)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
