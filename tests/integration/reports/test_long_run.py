"""A long run's report in bounded memory (issue #38, item 1): past
``long_run.LONG_BYTES`` of traces a rank is read in chunks and the spans
every step records go through the step pass, not into rows. What the report
says must not change: the same jobs reported whole and through the pass
(the limit lowered to 0) give the same report.json, except the time table's
p50 and p95 of the names the pass reads, which come from its sketch (within
1%), and the time table's note, which says so.

The jobs are real: a Python loop under the Profiler (two epochs, a slow
step, a validation loader, a span of the user's own at every step, two
segments and no merged trace: the report reads the segments), and a
``torchrun`` job of 2 ranks (gloo, DDP, the Profiler's own
phase spans, a straggler). Read back with Python's ``json``; the chunked
reader's rows are compared with the whole read's."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from conftest import torchrun
from fastprof import _core
from fastprof.readers.columns import read_columns
from fastprof.reports import long_run
from fastprof.reports.anatomy import epoch_starts
from fastprof.reports.data import load

LOOP = textwrap.dedent(
    """
    import sys, time
    import fastprof

    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", torch=False, sample_hz=0,
                             rank_summary=False, segment_size=int(sys.argv[2]), merge=False)
    with prof:
        for epoch in range(2):
            for i, _ in enumerate(prof.loader(range(400))):
                with fastprof.span("forward"):
                    sum(range(300))
                with fastprof.span("backward"):
                    sum(range(600))
                    if epoch == 1 and i == 150:
                        time.sleep(0.05)  # one slow step, in backward
                with fastprof.span("optimizer"):
                    pass
                with fastprof.span("zero_grad"):  # the user's own: kept as rows
                    pass
                prof.step()
            for _ in prof.loader(range(20), name="val"):  # a validation pass
                pass
    """
)

DDP = textwrap.dedent(
    """
    import sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class Data(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            if rank == 1:
                time.sleep(0.004)  # rank 1 is slow to load
            return torch.randn(16), i % 2

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", rank_summary=False)
    with prof:
        for epoch in range(2):
            for x, y in prof.loader(DataLoader(Data(), batch_size=4)):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    dist.destroy_process_group()
    """
)


def _reports(job: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, Any]]:
    """report.json of ``job`` read whole, then through the step pass."""
    monkeypatch.setattr(long_run, "LONG_BYTES", 1 << 62)
    fastprof.report(job, out_dir=out / "whole", formats=("json", "html"), from_segments=True)
    monkeypatch.setattr(long_run, "LONG_BYTES", 0)
    fastprof.report(job, out_dir=out / "long", formats=("json", "html"), from_segments=True)
    return (json.loads((out / d / "report.json").read_text()) for d in ("whole", "long"))  # type: ignore[return-value]


def _differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [(path, sorted(a), sorted(b))]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [(path, len(a), len(b))]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        same = a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
        return [] if same else [(path, a, b)]
    return [] if a == b else [(path, a, b)]


def _same_but_the_sketches(whole: dict[str, Any], long: dict[str, Any]) -> list[str]:
    """Every difference is a sketched p50/p95 of a name the pass reads
    (within the sketch's error) or the time table's note; the names sketched."""
    sketched = []
    for path, a, b in _differences(whole, long):
        if path == "/time/note":
            assert b.startswith(a) and "sketch" in b, (a, b)
            continue
        assert path.startswith("/time/rows[") and path.endswith(("/p50_s", "/p95_s")), (path, a, b)
        row = whole["time"]["rows"][int(path.split("[")[1].split("]")[0])]
        assert row["name"] in long_run.PASS_SPAN_SET, row
        assert abs(a - b) <= long_run.SKETCH_ERROR * abs(a) + 1e-12, (path, a, b)
        sketched.append(row["name"])
    return sketched


@pytest.fixture(scope="module")
def loop_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("long-loop")
    # Segments of 64 KiB: the rank's rows cross segment ends, and the reader's chunks cut segments.
    subprocess.run([sys.executable, "-c", LOOP, str(root), str(64 << 10)], check=True, timeout=120)
    job = root / "job"
    # No merged trace: the report reads the segments, one rank's state carried from one to the next.
    assert len(list((job / "rank0").glob("fastprof.*.json.gz"))) >= 2 and not (job / "trace.json.gz").exists()
    return job


def test_a_loop_reported_through_the_step_pass_says_what_the_whole_read_says(
    loop_job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(long_run, "CHUNK_ROWS", 1000)  # many chunks, cut anywhere in a segment
    whole, long = _reports(loop_job, tmp_path, monkeypatch)
    assert whole["anatomy"]["per_rank"][0]["slow_step_count"] >= 1  # the slow step is in what is compared
    assert [s["phase"] for s in whole["anatomy"]["per_rank"][0]["slow_steps"]][:1] == ["backward"]
    assert {r["loader"] for r in whole["speed"]["validation"]} == {"val"}
    sketched = _same_but_the_sketches(whole, long)
    # Read through the pass (its note), and the sketch within its error, not exact.
    assert "sketch" in long["time"]["note"] and "sketch" not in whole["time"]["note"]
    assert sketched and set(sketched) <= {"step", "forward", "backward", "optimizer", "loader.train.next"}, sketched
    # The user's own span is a row in both.
    assert [r["count"] for r in long["time"]["rows"] if r["name"] == "zero_grad"] == [800]


def test_the_step_pass_keeps_no_row_of_what_it_reads(loop_job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(long_run, "LONG_BYTES", 0)
    monkeypatch.setattr(long_run, "CHUNK_ROWS", 1000)
    data = load(loop_job)
    assert data.long is not None and set(data.long) == {0}
    kept = {data.cols.names[int(i)] for i in np.unique(data.cols.spans["name"])}
    assert "zero_grad" in kept and not kept & long_run.PASS_SPAN_SET, kept
    got = data.long[0]
    assert len(got.ts) == 800 and got.phases is not None
    # Its figures are 4 bytes a step where they fit.
    assert {v.dtype for v in got.phases.values()} == {np.dtype(np.uint32)}
    with pytest.raises(fastprof.reports.data.LongRunError):
        data.spans("forward", 0)
    # The epochs came with the rows: the same starts as the args' second pass gives.
    monkeypatch.setattr(long_run, "LONG_BYTES", 1 << 62)
    whole = epoch_starts(load(loop_job))
    assert np.flatnonzero(whole[0]).tolist() == [0, 400]
    assert np.array_equal(long_run.epoch_starts(data.long)[0], whole[0])


def test_chunks_are_the_whole_read(loop_job: Path) -> None:
    whole = read_columns(loop_job, step_column=False, kinds=("spans", "counters"))
    parts: list[dict[str, Any]] = []
    rest = read_columns(loop_job, step_column=False, kinds=("spans", "counters"), chunk_rows=500, on_chunk=parts.append)
    assert not len(rest.spans["ts"]) and rest.files == whole.files
    assert len(parts) > 2 * len(whole.files)
    for kind in ("spans", "counters"):
        got = {k: np.concatenate([p[kind][k] for p in parts]) for k in whole.__dict__[kind]}
        for k, v in whole.__dict__[kind].items():
            if k in ("name", "series"):
                # The whole read keeps only used names; compare the strings.
                assert [rest.names[i] for i in got[k]] == [whole.names[i] for i in v], (kind, k)
            else:
                assert np.array_equal(got[k], v), (kind, k)
    # The step spans' epochs, with the rows, as their args say.
    epochs: list[int] = []
    read_columns(loop_job, step_column=False, kinds=("spans",), names="step", chunk_rows=300,
                 on_chunk=lambda c: epochs.extend(c["spans"]["epoch"].tolist()), step_epochs=True)  # fmt: skip
    args = [_core._read_step_args(str(f["path"])) for f in whole.files if not f.get("skipped")]
    assert epochs == np.concatenate([a["epoch"] for a in args]).tolist()
    assert sorted(set(epochs)) == [0, 1]
    with pytest.raises(fastprof.ConfigError, match="chunk_rows"):
        read_columns(loop_job, chunk_rows=10, on_chunk=parts.append)


@pytest.mark.slow
def test_ranks_reported_through_the_step_pass_say_what_the_whole_read_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "worker.py").write_text(DDP)
    torchrun(tmp_path / "worker.py", str(tmp_path / "out"), cwd=tmp_path, timeout=150)
    job = tmp_path / "out" / "job"
    monkeypatch.setattr(long_run, "CHUNK_ROWS", 2000)
    whole, long = _reports(job, tmp_path, monkeypatch)
    an = whole["anatomy"]
    assert [r["rank"] for r in an["per_rank"]] == [0, 1]
    assert an["stragglers"] and an["stragglers"][0]["rank"] == 1, an.get("stragglers")
    assert "sketch" in long["time"]["note"]
    _same_but_the_sketches(whole, long)
    # Its ranks' segments too (no merged trace): each rank's clock offset given at its segment's end.
    (job / "trace.json.gz").unlink()
    whole, long = _reports(job, tmp_path / "segments", monkeypatch)
    assert {Path(i["path"]).parent.name for i in long["source"]["inputs"]} == {"rank0", "rank1"}
    assert long["anatomy"]["stragglers"][0]["rank"] == 1
    _same_but_the_sketches(whole, long)


def test_the_pass_keeps_steps_open_three_flush_intervals_of_the_recording(loop_job: Path, tmp_path: Path) -> None:
    """A span of another thread is written within a flush of its end: a
    recording flushing every 2.5 s keeps its steps open 7.5 s, one at the
    default (1 s) the pass's own 5 s."""
    script = "import sys, fastprof\n" + (
        "p = fastprof.Profiler(out_dir=sys.argv[1], run_name='job', torch=False, sample_hz=0, "
        "rank_summary=False, merge=False, flush_interval=2.5)\n"
        "with p:\n    for _ in p.loader(range(3)):\n        p.step()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
    assert long_run.lag_ns(tmp_path / "job") == 7_500_000_000
    assert long_run.lag_ns(loop_job) == long_run.LAG_NS == 5_000_000_000
