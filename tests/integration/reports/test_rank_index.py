"""Reports linear in ranks (issue #38, item 1): one rank's rows are a slice of
an index built once per table, never a scan of the whole column.

Runs are real: one rank recorded by the real Profiler on CPU (and a second
whose backward is slower), made into a run of many ranks by the bench's
builder (``benches/bench_report.py``: every place the rank appears
rewritten, each rank's clock off by its own jitter), and a ``torchrun``
gloo job of two ranks. What the report says of each rank is checked
against the traces read with Python's ``json``."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from conftest import torchrun
from fastprof.reports import time as time_report_module
from fastprof.reports.data import RunData, load, step_spans

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benches"))

from bench_report import RECORD_RANK, RankTemplate, build_ranks, record_rank

STEPS = 40


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> tuple[RankTemplate, RankTemplate]:
    """Two real ranks: the second's backward takes 3x as long."""
    assert "busy(0.0004 * slow)" in RECORD_RANK
    tmp = tmp_path_factory.mktemp("templates")
    return record_rank(tmp, "normal", STEPS, 1.0), record_rank(tmp, "slow", STEPS, 3.0)


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def _from_json(rank_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """name -> [(start ns, dur ns)] of the rank's spans, its segments read with json."""
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for seg in sorted(rank_dir.glob("fastprof.*.json.gz")):
        with gzip.open(seg, "rt") as f:
            doc = json.load(f)
        base = int(doc["baseTimeNanoseconds"]) + int(doc["otherData"].get("clock", {}).get("offset_ns", 0))
        for e in doc["traceEvents"]:
            if e.get("ph") == "X":
                spans[e["name"]].append((base + _ns(e["ts"]), _ns(e["dur"])))
    return spans


def _check_report_against_traces(run: Path, doc: dict[str, Any], ranks: list[int], names: list[str]) -> None:
    """Per rank: the step count, and each phase span's count and total, as
    the traces say them."""
    rows = {(r["rank"], r["name"]): r for r in doc["time"]["rows"]}
    speed = {r["rank"]: r for r in doc["speed"]["train"]["per_rank"]}
    anatomy = {r["rank"]: r for r in doc["anatomy"]["per_rank"]}
    assert sorted(speed) == ranks
    for rank in ranks:
        spans = _from_json(run / f"rank{rank}")
        steps = sorted(spans["step"])
        assert speed[rank]["steps"] == len(steps)
        for name in names:
            row = rows[(rank, name)]
            assert row["count"] == len(spans[name]), (rank, name)
            assert row["total_s"] == pytest.approx(sum(d for _, d in spans[name]) / 1e9, rel=1e-9, abs=1e-9)
        # The anatomy's step total: the steps after the warm-up one.
        measured = steps[anatomy[rank]["warmup_steps_excluded"] :]
        assert anatomy[rank]["steps"] == len(measured)
        assert anatomy[rank]["step_total_ns"] == sum(d for _, d in measured)


def test_a_built_run_of_8_ranks_reports_each_rank_as_its_trace_says(
    templates: tuple[RankTemplate, RankTemplate], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    slow = build_ranks(run, 8, *templates)
    rep = fastprof.report(run, out_dir=tmp_path / "out", formats=("json",))
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep.files
    _check_report_against_traces(run, doc, list(range(8)), ["step", "forward", "backward", "optimizer"])
    # The slow rank's backward is the longest (the builder's planted rank).
    backward = {r["rank"]: r["total_s"] for r in doc["time"]["rows"] if r["name"] == "backward"}
    assert max(backward, key=lambda r: backward[r]) in slow


class _Untouchable:
    """Stands for a whole column: any use of it fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a whole column was read ({name})")

    def __eq__(self, other: object) -> bool:
        raise AssertionError("a whole column was compared")

    def __getitem__(self, key: Any) -> Any:
        raise AssertionError("a whole column was indexed")

    def __len__(self) -> int:
        raise AssertionError("a whole column was measured")

    __hash__ = None  # type: ignore[assignment]


def _mask_scan(data: RunData, table: str, name: str, rank: int | None, value: str) -> tuple[Any, Any]:
    """The lookup as it was before the index: a mask over the whole column."""
    t = getattr(data.cols, table)
    nid = data.cols.names.index(name)
    m = t["name"] == nid
    if rank is not None:
        m &= t["rank"] == rank
    order = np.argsort(t["ts"][m], kind="stable")
    return t["ts"][m][order], t[value][m][order]


def test_64_ranks_each_lookup_touches_only_its_ranks_rows(
    templates: tuple[RankTemplate, RankTemplate], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    build_ranks(run, 64, *templates)
    data = load(run)
    assert data.ranks == list(range(64))
    names = ["step", "forward", "backward", "optimizer", "loader.train.next"]
    counters = data.counter_names()
    assert counters
    # The index gives what a scan of the whole column gave, rank by rank and for all ranks.
    for name in names:
        for rank in [*range(64), None]:
            ts, dur = _mask_scan(data, "spans", name, rank, "dur")
            got = data.spans(name, rank)
            assert np.array_equal(got.ts, ts) and np.array_equal(got.dur, dur), (name, rank)
    for name in counters:
        for rank in range(64):
            ts, v = _mask_scan(data, "counters", name, rank, "value")
            got_ts, got_v = data.counter(name, rank)
            assert np.array_equal(got_ts, ts) and np.array_equal(got_v, v), (name, rank)
    walls = {r: data.wall(r) for r in range(64)}

    # Once indexed, the per-rank lookups never read the name or rank columns
    # (every row of them: a scan per rank made the reports quadratic) ...
    fresh = load(run)
    fresh.spans("step", 0), fresh.counter(counters[0], 0), fresh.wall(0)
    for table in (fresh.cols.spans, fresh.cols.counters):
        table["name"] = _Untouchable()  # type: ignore[assignment]
        table["rank"] = _Untouchable()  # type: ignore[assignment]
    for rank in range(64):
        for name in names:
            fresh.spans(name, rank)
        for name in counters:
            fresh.counter(name, rank)
        assert step_spans(fresh, rank)[0].ts.size == STEPS
        assert fresh.wall(rank) == walls[rank]
    # ... and touch each row of the names asked once: the rows of the run, not 64 times them.
    index, counter_index = fresh._span_groups(), fresh._counter_groups()
    before, counters_before = index.rows_touched, counter_index.rows_touched
    for rank in range(64):
        for name in names:
            fresh.spans(name, rank)
        for name in counters:
            fresh.counter(name, rank)
        fresh.spans("step", rank)
    steps = sum(len(data.spans("step", r).ts) for r in range(64))
    assert steps == 64 * STEPS
    assert index.rows_touched - before == sum(len(data.spans(n).ts) for n in names) + steps
    every = sum(len(_mask_scan(data, "counters", n, None, "value")[0]) for n in counters)
    assert counter_index.rows_touched - counters_before == every


WORKER = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    import fastprof

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(120, 8), batch_size=4)
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=60)
    with prof:
        for x in prof.loader(loader):
            with fastprof.span("forward"):
                loss = model(x).sum()
            with fastprof.span("backward"):
                loss.backward()
            with fastprof.span("optimizer"):
                opt.step()
                opt.zero_grad()
            dist.all_reduce(torch.ones(1))
            prof.step()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_ranks_of_a_torchrun_job_are_reported_as_their_traces_say(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "worker.py").write_text(WORKER)
    torchrun(tmp_path / "worker.py", str(tmp_path / "out"), cwd=tmp_path, timeout=150)
    run = tmp_path / "out" / "job"
    out = tmp_path / "report"
    r = subprocess.run(
        [sys.executable, "-m", "fastprof", "report", str(run), "-q", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    _check_report_against_traces(run, doc, [0, 1], ["step", "forward", "backward", "optimizer"])
    assert all(r["steps"] == 30 for r in doc["speed"]["train"]["per_rank"])


def test_the_time_table_by_blocks_of_ranks_is_the_table_of_the_whole_run(
    templates: tuple[RankTemplate, RankTemplate], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The time table sorts a block of whole ranks at a time (its memory is a
    block's, not the run's): blocks of a few ranks give the same rows as one
    block of every rank, in verbose and concise form."""
    run = tmp_path / "run"
    build_ranks(run, 16, *templates)
    data = load(run)
    for verbose in (False, True):
        whole = time_report_module.time_report(data, verbose)
        per_rank_rows = max(np.bincount(data.cols.spans["rank"].astype(np.int64)))
        monkeypatch.setattr(time_report_module, "_BLOCK_ROWS", int(per_rank_rows) * 3)
        assert (
            len(time_report_module._rank_blocks(data.cols.spans["rank"], np.ones(len(data.cols.spans["rank"]), bool)))
            >= 5
        )
        blocks = time_report_module.time_report(data, verbose)
        monkeypatch.undo()
        assert blocks == whole and len(whole["rows"]) >= 16 * 4
