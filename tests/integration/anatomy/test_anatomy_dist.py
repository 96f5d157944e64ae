"""Straggler root cause across ranks (issue #25, item 4) under a real
``torchrun --nproc-per-node 2`` job (gloo, CPU, DDP): rank 1's dataset sleeps,
so rank 1 reaches backward (where DDP's gradient all-reduce holds the ranks
together) last at every step. Comparing step times cannot find it: with DDP
both ranks' steps take the same time. The report names rank 1 and its
dataloader phase, read with Python's json and checked against the schema."""

from __future__ import annotations

import io
import json
import textwrap
from typing import Any

import numpy as np
import pytest

import fastprof
from conftest import torchrun
from fastprof.recording.names import BACKWARD_GRADS_SPAN, PHASE_SPANS
from fastprof.reports.data import load

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

WORKER = textwrap.dedent(
    """
    import sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class Data(Dataset):
        def __len__(self):
            return 96
        def __getitem__(self, i):
            if rank == 1:
                time.sleep(0.006)  # a slow disk on rank 1 only
            return torch.randn(32), i % 4

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=60)
    with prof:
        for x, y in prof.loader(DataLoader(Data(), batch_size=4)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            # A logged loss: a collective from Python each step, after the ranks are in step.
            dist.all_reduce(loss.detach())
            prof.step()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("straggler")
    (root / "worker.py").write_text(WORKER)
    out = root / "out"
    torchrun(root / "worker.py", str(out), cwd=root, timeout=150)
    jsonschema = pytest.importorskip("jsonschema")
    fastprof.report(out / "job", out_dir=root / "rep", formats=("json", "html"))
    doc: dict[str, Any] = json.loads((root / "rep" / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    return {"doc": doc, "html": (root / "rep" / "report.html").read_text(), "job": out / "job"}


def test_each_rank_marks_its_own_gradients_ready_inside_each_backward(report: dict[str, Any]) -> None:
    """DDP: one mark a backward once the anatomy settled and learnt the
    parameter accumulated last (the first two backwards), begun with
    backward and ended inside it, before the all-reduce's wait; its end is
    the rank's arrival at backward."""
    data = load(report["job"])
    for r in (0, 1):
        bw = data.spans(PHASE_SPANS["backward"], r)
        g = data.spans(BACKWARD_GRADS_SPAN, r)
        # The first backward comes before the modules settle, the second learns
        # which parameter is accumulated last.
        assert len(bw.ts) - 3 <= len(g.ts) <= len(bw.ts) - 2, (r, len(bw.ts), len(g.ts))
        assert set(g.ts.tolist()) <= set(bw.ts.tolist()), r  # each begins with a backward
        i = np.searchsorted(bw.ts, g.ts)
        assert (g.end <= bw.end[i]).all() and (g.end > g.ts).all(), r
    # Both stand in for the arrival at backward in the straggler analysis.
    assert "own gradients ready" in report["doc"]["anatomy"]["straggler_method"]


def test_the_rank_whose_dataloader_is_slow_is_named_with_its_phase(report: dict[str, Any]) -> None:
    an = report["doc"]["anatomy"]
    assert [r["rank"] for r in an["per_rank"]] == [0, 1]
    # Both ranks' steps take about the same time (DDP holds them together):
    # the step times alone do not say which rank is slow.
    totals = [r["step_total_ns"] for r in an["per_rank"]]
    assert max(totals) / min(totals) < 1.25, totals
    assert "own gradients ready" in an["straggler_method"], an["straggler_method"]
    first = an["stragglers"][0]
    assert first["rank"] == 1 and first["phase"] == "dataloader", an["stragglers"]
    assert first["phase_factor"] is None or first["phase_factor"] > 3, first
    # Last at every backward entry; the logged loss's all-reduce after the
    # ranks are in step may fall either way.
    assert first["last_arrival_share"] >= 0.45, first
    # rank 0 waited ~4 x 6 ms per step for rank 1, most of its step time;
    # rank 0 is no straggler (its share of the waiting is jitter).
    assert len(an["stragglers"]) == 1, an["stragglers"]
    steps = an["per_rank"][1]["steps"]
    assert first["wait_caused_ns"] > steps * 10e6 and first["wait_caused_share"] > 0.3, (first, steps)


def test_the_terminal_and_the_page_say_it_in_one_line(report: dict[str, Any]) -> None:
    from fastprof.reports.terminal import render

    buf = io.StringIO()
    render(report["doc"], file=buf)
    text = " ".join(buf.getvalue().split())
    assert "Straggler: rank 1, dataloader:" in text and "a step over the others" in text, text
    assert "Straggler: rank 1, dataloader:" in report["html"]
