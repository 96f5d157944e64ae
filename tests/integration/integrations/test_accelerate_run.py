"""``fastprof run`` on an unmodified Accelerate loop (issue #25, item 5):
Accelerate's prepared DataLoader (``DataLoaderShard``) overrides
``__iter__``, so the DataLoader patch alone never saw its passes. Now each
batch's fetch is ``loader.train.next`` inside its step, the DataLoader it
wraps is not timed a second time, epochs are its passes, and training is
the same as without fastprof."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("accelerate")

SCRIPT = """
import json, sys, torch
from accelerate import Accelerator
torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(48, 16), torch.randint(0, 2, (48,)))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model, opt, loader = accelerator.prepare(model, opt, loader)
print("loader class", type(loader).__name__, file=sys.stderr)
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
print(json.dumps({"loss": loss.item()}), flush=True)
"""


def _run(tmp: Path, profiled: bool) -> subprocess.CompletedProcess[str]:
    (tmp / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPROF_", "ACCELERATE_"))}
    cmd = [sys.executable, "train.py"]
    if profiled:
        cmd = [sys.executable, "-m", "fastprof", "run", "-o", str(tmp), "--run-name", "acc", "--", "train.py"]
    return subprocess.run(
        cmd, cwd=tmp, capture_output=True, text=True, timeout=240, env={**env, "OMP_NUM_THREADS": "1"}
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = {}
    for profiled in (False, True):
        tmp = tmp_path_factory.mktemp("acc")
        p = _run(tmp, profiled)
        assert p.returncode == 0, p.stderr[-4000:]
        assert "loader class DataLoaderShard" in p.stderr
        out["fastprof" if profiled else "plain"] = {"result": json.loads(p.stdout.strip().splitlines()[-1]), "dir": tmp}
    return out


def test_training_is_the_same_with_and_without_fastprof(runs: dict[str, Any]) -> None:
    assert runs["fastprof"]["result"] == runs["plain"]["result"]


def test_each_fetch_of_the_prepared_loader_is_timed_once_inside_its_step(runs: dict[str, Any]) -> None:
    run = runs["fastprof"]["dir"] / "acc"
    with gzip.open(run / "trace.json.gz", "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"] == "step"), key=lambda e: e["ts"])
    assert [(e["args"]["epoch"], e["args"]["batch_in_epoch"]) for e in steps] == [
        (ep, b) for ep in range(2) for b in range(6)
    ]
    fetches = [e for e in events if e["name"] == "loader.train.next"]
    # 6 batches and the fetch that finds the loader exhausted, per epoch.
    assert len(fetches) == 14, len(fetches)
    for s in steps:
        inside = [f for f in fetches if s["ts"] <= f["ts"] and f["ts"] + f["dur"] <= s["ts"] + s["dur"]]
        assert len(inside) == 1, s
    # The DataLoader the shard wraps is not timed a second time.
    assert not [e for e in events if e["name"].startswith("loader.val")]
    summary = json.loads((run / "rank0" / "profiler.json").read_text())
    assert summary["steps"] == 12 and summary["epochs"] == 2, summary
