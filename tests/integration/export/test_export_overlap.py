"""The step table's phases follow the report's overlap rule (issue #38,
item 3): under gradient checkpointing (backward runs the forward again) and
with a collective called inside backward, each row's ``<phase>_ns`` are
disjoint and add up to its ``duration_ns``, and they are the report's
anatomy figures. Real torch on CPU, the real Profiler, a one-rank gloo
group; the table read back with pyarrow, the report with Python's json."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastprof
from fastprof.cli.main import main

pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("torch")

PHASES = ["dataloader", "forward", "backward", "optimizer", "communication", "other"]

JOB = """
import os, sys, torch, torch.distributed as dist, fastprof
from torch.utils.checkpoint import checkpoint
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 128))
        self.b = torch.nn.Linear(128, 4)
    def forward(self, x):
        h = checkpoint(self.a, x, use_reentrant=False)  # backward recomputes self.a's forward
        h.register_hook(lambda g: dist.all_reduce(g) or g)  # a collective inside backward
        return self.b(h)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
# Small segments: the table is read across several, steps carried between them.
prof = fastprof.Profiler(sys.argv[1], "run", torch=False, sample_hz=0, sync_clocks=False, segment_size=65536)
with prof:
    for x in prof.loader([torch.randn(32, 128)] * 800):
        model(x).sum().backward()
        opt.step(); opt.zero_grad()
        prof.step()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("export_overlap")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp), str(_free_port())], capture_output=True, text=True, timeout=240, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp / "run"


def _raw_sums(run: Path) -> list[int]:
    """Per step, the phase spans' durations that start inside it, summed
    with no overlap rule (Python's json): more than the step where phases nest."""
    steps: list[tuple[int, int]] = []
    spans: list[tuple[int, int]] = []
    names = {"loader.train.next", "phase.forward", "phase.backward", "phase.optimizer", "phase.communication"}
    for seg in sorted((run / "rank0").glob("fastprof.*.json.gz")):
        with gzip.open(seg, "rt") as f:
            doc = json.load(f)
        base = int(doc["baseTimeNanoseconds"])
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and e["name"] == "step":
                steps.append((base + round(float(e["ts"]) * 1e3), round(float(e["dur"]) * 1e3)))
            elif e.get("ph") == "X" and e["name"] in names:
                spans.append((base + round(float(e["ts"]) * 1e3), round(float(e["dur"]) * 1e3)))
    steps.sort()
    return [sum(d for t, d in spans if a <= t < a + dur) - dur for a, dur in steps]


def test_each_rows_phases_add_up_to_its_step_and_are_the_reports(run: Path, tmp_path: Path) -> None:
    assert len(list((run / "rank0").glob("fastprof.*.json.gz"))) >= 2
    # The job nests phases: summed as spans, some steps' phases exceed the step.
    assert max(_raw_sums(run)) > 0
    out = tmp_path / "steps.parquet"
    assert main(["export", str(run), "-o", str(out), "-q"]) == 0
    t = pq.read_table(out).to_pydict()
    dur = np.array(t["duration_ns"], np.int64)
    ph = {p: np.array(t[f"{p}_ns"], np.int64) for p in PHASES}
    assert len(dur) == 800
    assert all((v >= 0).all() and (v <= dur).all() for v in ph.values())
    # Disjoint phases, other the rest: each row's phases are its step exactly.
    assert (np.sum(list(ph.values()), axis=0) == dur).all()
    assert (ph["forward"] > 0).all() and (ph["communication"] > 0).all() and (ph["backward"] > 0).all()

    fastprof.report(run, out_dir=tmp_path / "rep", formats=("json",))
    (r,) = json.loads((tmp_path / "rep" / "report.json").read_text())["anatomy"]["per_rank"]
    skip = int(r["warmup_steps_excluded"])
    assert int(r["steps"]) == len(dur) - skip
    assert int(r["step_total_ns"]) == int(dur[skip:].sum())
    for p in PHASES:
        got = r["phases"][p]
        assert int(got["total_ns"]) == int(ph[p][skip:].sum()), p
        assert float(got["p50_ns"]) == pytest.approx(float(np.median(ph[p][skip:])), abs=1), p
