"""Stragglers named only beyond the run's own noise (issue #36, item 2) and
every slow rank named (issue #38, item 4), from real ``torchrun`` jobs (gloo,
CPU, DDP, one ``all_reduce`` of the loss a step): no slow rank; one rank whose
forward sleeps; two equally slow ranks among four; and ranks tied step for
step (a run directory of three ranks built from one real rank's recording).
Reports are read back with Python's json and checked against the schema."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fastprof
from conftest import torchrun
from fastprof.reports.stragglers import MIN_COST_SHARE, fmt_ns
from fastprof.reports.terminal import render

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

#: The slow ranks' forward sleeps this long a step: several times a step's
#: own work here, so the others wait for it most of their time.
DELAY_S = 0.006

WORKER = textwrap.dedent(
    """
    import sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow = {int(r) for r in sys.argv[2].split(",") if r}
    delay = float(sys.argv[3])
    where = sys.argv[4] if len(sys.argv) > 4 else "forward"

    class Data(Dataset):
        def __len__(self):
            return 4 * 60
        def __getitem__(self, i):
            return torch.randn(32), i % 4

    class Slow(torch.nn.Module):
        def forward(self, x):
            if rank in slow and where == "forward":
                time.sleep(delay)  # this rank's forward is slow
            return x

    class SlowGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)
        @staticmethod
        def backward(ctx, g):
            if rank in slow and where == "backward":
                time.sleep(delay)  # this rank's backward is slow, before DDP's all-reduce
            return g

    class SlowBackward(torch.nn.Module):
        def forward(self, x):
            return SlowGrad.apply(x)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(32, 64), SlowBackward(), torch.nn.ReLU(), Slow(), torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=60)
    with prof:
        for x, y in prof.loader(DataLoader(Data(), batch_size=4)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            dist.all_reduce(loss.detach())  # the logged loss: a collective from Python
            prof.step()
    dist.destroy_process_group()
    """
)


def _report(run: Path, rep: Path) -> dict[str, Any]:
    jsonschema = pytest.importorskip("jsonschema")
    fastprof.report(run, out_dir=rep, formats=("json", "html"))
    doc: dict[str, Any] = json.loads((rep / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    buf = io.StringIO()
    render(doc, file=buf)
    return {"doc": doc, "text": " ".join(buf.getvalue().split()), "html": (rep / "report.html").read_text()}


def _job(root: Path, slow: str, nproc: int = 2, where: str = "forward") -> Path:
    (root / "worker.py").write_text(WORKER)
    torchrun(root / "worker.py", str(root / "out"), slow, str(DELAY_S), where, cwd=root, timeout=200, nproc=nproc)
    return root / "out" / "job"


@pytest.fixture(scope="module")
def even(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _job(tmp_path_factory.mktemp("even"), "")


@pytest.fixture(scope="module")
def one_slow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("one")
    return _report(_job(root, "1"), root / "rep")


@pytest.fixture(scope="module")
def slow_backward(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("backward")
    return _report(_job(root, "1", where="backward"), root / "rep")


@pytest.fixture(scope="module")
def two_slow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("two")
    return _report(_job(root, "1,2", nproc=4), root / "rep")


@pytest.mark.timeout(300)
def test_ranks_that_keep_pace_name_no_straggler_and_say_within_how_much(even: Path, tmp_path: Path) -> None:
    got = _report(even, tmp_path / "rep")
    an = got["doc"]["anatomy"]
    assert an["stragglers"] == [], an["stragglers"]
    pace = an["ranks_in_pace"]
    assert pace is not None and pace["sync_points"] >= 100, pace
    # Whatever rank is most behind was not named for a reason the rule states:
    # it costs the others less than the rule's share, or its excess is not
    # beyond the run's own noise (beside a CPU hog a rank can cost the others
    # a few percent by chance, never beyond the noise).
    mb = pace["most_behind"]
    per_point = mb["excess_per_step_ns"] * pace["steps"] / pace["sync_points"]
    noise = (mb["z"] is not None and mb["z"] < pace["min_z"]) or per_point < pace["min_jitters"] * pace["jitter_ns"]
    assert mb["cost_share"] < MIN_COST_SHARE or noise, pace
    jitter = f"jitter between ranks {fmt_ns(pace['jitter_ns'])}"
    assert "No straggler: the ranks kept pace" in got["text"] and jitter in got["text"], got["text"]
    assert "No straggler: the ranks kept pace" in got["html"]


@pytest.mark.timeout(300)
def test_one_slow_rank_is_named_with_its_phase_its_cost_and_how_sure(one_slow: dict[str, Any]) -> None:
    an = one_slow["doc"]["anatomy"]
    assert [s["rank"] for s in an["stragglers"]] == [1], an["stragglers"]
    s = an["stragglers"][0]
    assert s["phase"] == "forward", s
    # The others waited about the sleep a step for it: its forward's own
    # excess over theirs, measured apart from the arrivals.
    assert 0.7 * s["phase_excess_ns"] < s["excess_per_step_ns"] < 1.5 * s["phase_excess_ns"], s
    assert s["phase_excess_ns"] > 0.8 * DELAY_S * 1e9, s
    assert s["excess_ci95_ns"] < 0.2 * s["excess_per_step_ns"], s
    assert s["wait_caused_share"] >= 0.3, s
    assert s["z"] is None or s["z"] > 10, s
    pace = an["ranks_in_pace"]
    assert s["excess_per_step_ns"] > 10 * pace["jitter_ns"], (s, pace)
    want = f"Straggler: rank 1, forward: {fmt_ns(s['excess_per_step_ns'])} a step over the others"
    assert want in one_slow["text"], one_slow["text"]
    assert f"{100 * s['wait_caused_share']:.0f}% of the job's time" in one_slow["text"]
    assert f"jitter between ranks {fmt_ns(pace['jitter_ns'])}" in one_slow["text"]
    assert want in one_slow["html"]
    # The step times (equal under DDP) blame no other rank.
    assert one_slow["doc"]["ranks"]["spread"]["most_often_slowest_rank"] in (None, 1), one_slow["doc"]["ranks"]


@pytest.mark.timeout(300)
def test_a_rank_slow_in_backward_is_named_though_ddp_ends_every_backward_together(
    slow_backward: dict[str, Any],
) -> None:
    """DDP's all-reduce holds both ranks to the end of backward: the spans
    are the same, begin and end. The arrival is each rank's own gradients
    ready (the anatomy's mark on the parameter accumulated last)."""
    an = slow_backward["doc"]["anatomy"]
    assert "own gradients ready" in an["straggler_method"], an["straggler_method"]
    assert [s["rank"] for s in an["stragglers"]] == [1], (an["stragglers"], an["ranks_in_pace"])
    s = an["stragglers"][0]
    assert s["phase"] == "backward", s
    # Its own backward's excess is about the sleep, and the others waited that long.
    assert s["phase_excess_ns"] > 0.8 * DELAY_S * 1e9, s
    assert 0.7 * s["phase_excess_ns"] < s["excess_per_step_ns"] < 1.5 * s["phase_excess_ns"], s
    assert "Straggler: rank 1, backward" in slow_backward["text"], slow_backward["text"]


@pytest.mark.timeout(300)
def test_ranks_even_in_backward_are_measured_there_and_name_no_straggler(even: Path, tmp_path: Path) -> None:
    """No slow rank: backward's sync point is read from the ranks' own
    gradients ready, and no rank is named for it."""
    an = _report(even, tmp_path / "rep")["doc"]["anatomy"]
    assert "own gradients ready" in an["straggler_method"], an["straggler_method"]
    assert an["stragglers"] == [], an["stragglers"]


@pytest.mark.timeout(400)
def test_two_equally_slow_ranks_among_four_are_both_named(two_slow: dict[str, Any]) -> None:
    an = two_slow["doc"]["anatomy"]
    named = an["stragglers"]
    assert sorted(s["rank"] for s in named) == [1, 2], named
    assert all(s["phase"] == "forward" for s in named), named
    a, b = (s["excess_per_step_ns"] for s in named)
    assert 0.7 < a / b < 1.4, named  # equally slow: equal costs
    # Neither is last alone at most sync points (they tie with each other),
    # which is why the last arrival cannot be the rule.
    assert "Straggler: rank 1, forward" in two_slow["text"] and "Straggler: rank 2, forward" in two_slow["text"]


def _copy_rank(src: Path, dst: Path, rank: int) -> None:
    """A copy of rank 0's recording as rank ``rank``: every place the rank is
    written (directory, trace metadata, process names) rewritten."""
    shutil.copytree(src, dst)
    for f in dst.rglob("*.json.gz"):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        other = doc.get("otherData") or {}
        if "rank" in other:
            other["rank"] = rank
        dist = doc.get("distributedInfo")
        if isinstance(dist, dict) and "rank" in dist:
            dist["rank"] = rank
        for ev in doc.get("traceEvents", []):
            args = ev.get("args")
            if ev.get("ph") == "M" and isinstance(args, dict) and isinstance(args.get("name"), str):
                args["name"] = args["name"].replace("rank 0", f"rank {rank}")
        f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for f in dst.rglob("*.json"):
        text = f.read_text()
        f.write_text(text.replace('"rank": 0', f'"rank": {rank}'))


@pytest.mark.timeout(300)
def test_ranks_tied_step_for_step_blame_no_rank(even: Path, tmp_path: Path) -> None:
    run = tmp_path / "tied"
    run.mkdir()
    shutil.copytree(even / "rank0", run / "rank0")
    for r in (1, 2):
        _copy_rank(even / "rank0", run / f"rank{r}", r)
    got = _report(run, tmp_path / "rep")
    doc = got["doc"]
    assert doc["source"]["ranks"] == [0, 1, 2], doc["source"]["ranks"]
    spread = doc["ranks"]["spread"]
    # Every step takes the same time on every rank: no rank is slowest.
    assert spread["max_s"] == 0.0, spread
    assert spread["most_often_slowest_rank"] is None and spread["clear_steps"] == 0, spread
    assert not any(s["clear"] for s in doc["ranks"]["slowest"])
    assert "no rank slowest more often than chance" in got["text"] and "slowest in 100%" not in got["text"], got["text"]
    assert doc["anatomy"]["stragglers"] == [], doc["anatomy"]["stragglers"]
