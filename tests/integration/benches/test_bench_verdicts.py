"""benches/bench_verdicts.py (issue #36, item 6) runs in a tiny mode: one run
of two classes, a one-process job whose batch sleeps 0.2 s at its middle step
and a 2-rank torchrun job (gloo) with no slow rank. The matrix it writes is
read back with Python's json: both classes scored, and their verdicts read
from the runs' own triggers.json and report.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benches" / "bench_verdicts.py"

pytestmark = pytest.mark.slow
pytest.importorskip("torch")


@pytest.mark.timeout(400)
def test_one_run_of_two_classes_prints_and_writes_the_matrix(tmp_path: Path) -> None:
    out = tmp_path / "matrix.json"
    args = ["--runs", "1", "--classes", "slow_batch,no_slow", "--steps-scale", "0.3", "--out", str(out)]
    p = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--keep", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    rows = {r["class"]: r for r in doc["classes"]}
    assert list(rows) == ["slow_batch", "no_slow"] and doc["runs"] == 1
    batch, even = rows["slow_batch"], rows["no_slow"]
    assert (batch["ranks"], even["ranks"]) == (1, 2)
    for r in (batch, even):
        assert r["runs"] == 1 and len(r["per_run"]) == 1, r
        assert 0 <= r["false_capture_runs"] <= 1 and 0 <= r["false_dump_runs"] <= 1, r
    # The one-process class has no stragglers to judge; the 2-rank class
    # nothing to find.
    assert batch["false_straggler_runs"] is None and even["found_runs"] is None
    assert even["false_straggler_runs"] in (0, 1) and batch["found_runs"] in (0, 1)
    # The sleep is not runnable: the middle step is the job's anomaly
    # (--steps-scale 0.3: 90 of its 300 steps; the middle one is step 45).
    (run,) = batch["per_run"]
    assert 45 in [step for rank, step, _ in run["job_anomalies"] if rank == 0], run
    # The 2-rank verdict came from report.json: the ranks' jitter at their sync points.
    (run,) = even["per_run"]
    pace = run["ranks_in_pace"]
    assert pace is not None and pace["sync_points"] >= 8 and pace["jitter_ns"] >= 0, run
    assert run["stragglers"] == [] or even["false_straggler_runs"] == 1
    # Both runs' own files were read.
    runs = tmp_path / "runs"
    assert (runs / "slow_batch-0" / "job" / "rank0" / "triggers.json").is_file()
    assert (runs / "no_slow-0" / "report" / "report.json").is_file()
    for line in ("goal: no false anomaly capture", "slow_batch", "no_slow", "false stragglers"):
        assert line in p.stdout, p.stdout
