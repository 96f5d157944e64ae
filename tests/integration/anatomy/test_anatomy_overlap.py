"""Phases that add up (issue #36, item 4): overlapping phases (a forward
recomputed inside backward by torch.utils.checkpoint, a collective called
from a gradient hook inside backward) are resolved by one written rule, so
that the phases never add up to more than the step, nothing is rescaled, and
the report says where the rule split time. Real torch on CPU with the real
Profiler and a one-rank gloo group; the trace is read back with Python's
json to check the report's figures against the spans themselves."""

from __future__ import annotations

import gzip
import html
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fastprof

torch = pytest.importorskip("torch")

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
        self.a = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
        self.b = torch.nn.Linear(256, 4)
    def forward(self, x):
        # Gradient checkpointing: backward runs self.a's forward again.
        h = checkpoint(self.a, x, use_reentrant=False)
        # A collective inside backward: the gradient of h summed over the ranks.
        h.register_hook(lambda g: dist.all_reduce(g) or g)
        return self.b(h)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
prof = fastprof.Profiler(sys.argv[1], "run", torch=False, sample_hz=0, sync_clocks=False)
with prof:
    for x in prof.loader([torch.randn(64, 256)] * 24):
        model(x).sum().backward()
        opt.step(); opt.zero_grad()
        prof.step()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spans(trace: Path) -> dict[str, list[tuple[float, float]]]:
    """name -> (begin, end) µs of the main thread's complete events."""
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    out: dict[str, list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            out.setdefault(e["name"], []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return {k: sorted(v) for k, v in out.items()}


def _inside(inner: list[tuple[float, float]], outer: list[tuple[float, float]]) -> float:
    """Time (µs) of ``inner`` spans covered by ``outer`` spans (each set disjoint)."""
    return sum(max(0.0, min(e, oe) - max(b, ob)) for b, e in inner for ob, oe in outer)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("overlap")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp), str(_free_port())], capture_output=True, text=True, timeout=240, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp / "run"


def test_phases_never_add_up_to_more_than_the_step_and_nothing_is_rescaled(run: Path, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    rep = fastprof.report(run, out_dir=tmp_path / "rep", formats=("json", "html"))
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    an = doc["anatomy"]
    (r,) = an["per_rank"]
    step = int(r["step_total_ns"])
    totals = {p: int(r["phases"][p]["total_ns"]) for p in PHASES}
    # The phases tile the step: their sum is the step time, not more (today 115% of it).
    assert sum(totals.values()) == step, (totals, step)
    assert all(0 <= t <= step for t in totals.values())
    # No secret rescale: each share is the phase's time over the step time.
    for p in PHASES:
        assert r["phases"][p]["share"] == pytest.approx(totals[p] / step, rel=1e-12)

    # The spans themselves: the recomputed forward lies inside backward, the
    # collective inside backward; the report's split matches them.
    spans = _spans(run / "trace.json.gz")
    steps = spans["step"][r["warmup_steps_excluded"] :]
    lo = steps[0][0]
    fw = [s for s in spans["phase.forward"] if s[0] >= lo]
    bw = [s for s in spans["phase.backward"] if s[0] >= lo]
    comm = [s for s in spans["phase.communication"] if s[0] >= lo]
    recomputed_us = _inside(fw, bw)
    comm_in_bw_us = _inside(comm, bw)
    assert recomputed_us > 0 and comm_in_bw_us > 0  # the job overlaps phases, as meant
    o = r["overlap"]
    assert o["recomputed_forward_ns"] / 1e3 == pytest.approx(recomputed_us - _inside(comm, fw), rel=0.02, abs=5)
    pairs = {(x["phase"], x["counted_as"]): x["ns"] for x in o["pairs"]}
    assert pairs[("backward", "communication")] / 1e3 == pytest.approx(comm_in_bw_us, rel=0.02, abs=5)
    assert o["split_ns"] == sum(pairs.values())
    # Forward keeps only the forward outside backward; communication all of its spans.
    fw_us = sum(e - b for b, e in fw)
    assert totals["forward"] / 1e3 == pytest.approx(fw_us - recomputed_us, rel=0.02, abs=5)
    assert totals["communication"] / 1e3 == pytest.approx(sum(e - b for b, e in comm), rel=0.02, abs=5)
    assert o["recomputed_forward_share_of_backward"] == pytest.approx(o["recomputed_forward_ns"] / totals["backward"])

    # The report states the rule, and says where it split time: report.json, terminal, page.
    assert "innermost" in an["overlap_rule"] and "no share is rescaled" in an["overlap_rule"]
    buf = io.StringIO()
    rep.print(file=buf)
    out = " ".join(buf.getvalue().split())
    share = round(100 * o["recomputed_forward_share_of_backward"])
    assert f"backward, of which {share}% recomputed forward" in out
    assert "of backward was also communication and counts as communication" in out
    assert an["overlap_rule"] in out
    page = " ".join(html.unescape((tmp_path / "rep" / "report.html").read_text()).split())
    assert f"backward, of which {share}% recomputed forward" in page and an["overlap_rule"] in page


def test_a_step_without_overlap_says_nothing_of_a_split(tmp_path: Path) -> None:
    """The plain job of the anatomy tests: no phase inside another, no line."""
    job = JOB.replace("checkpoint(self.a, x, use_reentrant=False)", "self.a(x)").replace(
        "h.register_hook(lambda g: dist.all_reduce(g) or g)", "pass"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", job, str(tmp_path), str(_free_port())],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rep = fastprof.report(tmp_path / "run", formats=())
    (r,) = rep["anatomy"]["per_rank"]
    o: dict[str, Any] = r["overlap"]
    assert o["split_ns"] == 0 and o["pairs"] == [] and o["recomputed_forward_ns"] == 0
    assert sum(int(r["phases"][p]["total_ns"]) for p in PHASES) == int(r["step_total_ns"])
    buf = io.StringIO()
    rep.print(file=buf)
    assert "phases overlapped" not in buf.getvalue()
