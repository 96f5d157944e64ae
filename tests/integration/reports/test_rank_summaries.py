"""Each rank summarises itself (issue #38, item 2): at its end every rank of
a real job writes ``rank{R}/summary.fastprof``, and the report of the run is
made from those summaries without reading a trace, with the figures the
report of its segments gives. A rank cut short (SIGKILL) writes none, and
the run is reported from its segments as before; a SIGTERM'd rank writes
its summary within the budget.

The jobs are real: torch on CPU, the real Profiler, ``torchrun`` with gloo,
real signals. The two reports are compared as JSON (Python's parser); what
may differ is documented in ``fastprof/reports/summaries.py``:
``source.inputs`` names the summaries rather than the traces."""

from __future__ import annotations

import gzip
import importlib
import json
import math
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import torchrun
from fastprof.cli.main import main
from fastprof.recording.names import RANK_SUMMARY_JSON
from fastprof.reports import data as report_data
from fastprof.reports import rank_summary
from fastprof.reports import summaries as summaries_module
from fastprof.reports.breakdown import step_breakdown
from fastprof.reports.report import report

pytestmark = pytest.mark.slow

#: The module (``fastprof.reports.report`` is also the function's name there).
report_module = importlib.import_module("fastprof.reports.report")

WORKER = textwrap.dedent(
    """
    import os, signal, sys
    import torch, torch.distributed as dist
    import fastprof

    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(160, 16), batch_size=4)
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
            prof.step()
    dist.destroy_process_group()
    """
)

#: One process, ended by ``argv[2]`` (``SIGKILL``, ``SIGTERM``) at step 30.
ALONE = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    import fastprof

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="alone", schedule="never", flush_interval=0.05)
    with prof:
        for i, x in enumerate(prof.loader([torch.randn(4, 16) for _ in range(60)])):
            with fastprof.span("forward"):
                loss = model(x).sum()
            with fastprof.span("backward"):
                loss.backward()
            opt.step()
            prof.step()
            if i == 30:
                import time; time.sleep(0.3)  # the writer's flush
                os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    """
)


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON documents differ (floats to 1e-9 relative)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one" for k in set(a) ^ set(b)]
        return out + [d for k in sorted(set(a) & set(b)) for d in _diff(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _reports(run: Path, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """report.json from the summaries (as ``fastprof report`` makes it) and from the segments."""
    report(run, out / "summaries", formats=("json",))
    report(run, out / "segments", formats=("json",), from_segments=True)
    return tuple(json.loads((out / k / "report.json").read_text()) for k in ("summaries", "segments"))  # type: ignore[return-value]


def _kinds(doc: dict[str, Any]) -> set[str]:
    return {i["kind"] for i in doc["source"]["inputs"]}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torchrun gloo job of two ranks, each with the real Profiler."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("job")
    (tmp / "worker.py").write_text(WORKER)
    torchrun(tmp / "worker.py", str(tmp / "out"), cwd=tmp, timeout=200)
    return tmp / "out" / "job"


def test_each_rank_of_a_job_writes_its_summary_and_the_report_from_them_gives_the_segments_figures(
    job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for rank in (0, 1):
        doc = json.loads((job / f"rank{rank}" / RANK_SUMMARY_JSON).read_text())
        assert doc["rank"] == rank and doc["run_name"] == "job"
        assert doc["report"]["speed"]["train"]["per_rank"][0]["steps"] == 40
    summaries, segments = _reports(job, tmp_path)
    assert _kinds(summaries) == {"summary"} and "summary" not in _kinds(segments)
    # The figures: every section the same, each rank and across ranks (the
    # slowest rank of each step, the stragglers, the pooled step time).
    assert summaries["ranks"]["slowest"] and summaries["speed"]["step_time"]["count"] == 2 * 39
    summaries["source"]["inputs"] = segments["source"]["inputs"]
    assert _diff(summaries, segments) == []
    real = report_data.read_columns
    read: list[Any] = []

    def no_trace(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a trace was read")

    def recorded(target: Any, **kwargs: Any) -> Any:
        read.append(target)
        return real(target, **kwargs)

    # breakdown.csv, one row per step and rank, from the summaries: the
    # bytes the report of the segments writes (the core's pass over the
    # run), and no trace read for it.
    seg = report(job, tmp_path / "seg", formats=("csv",), from_segments=True)
    monkeypatch.setattr(report_data, "read_columns", no_trace)
    monkeypatch.setattr(report_module, "step_breakdown", no_trace)
    summ = report(job, tmp_path / "sum", formats=("csv",))
    csv_sum = (tmp_path / "sum" / "breakdown.csv").read_bytes()
    assert csv_sum == (tmp_path / "seg" / "breakdown.csv").read_bytes()
    assert csv_sum.count(b"\n") == 1 + 2 * 40
    assert sorted(p.name for p in summ.files) == sorted(p.name for p in seg.files)
    # The page's breakdown bars and counts: the traces' figures.
    whole = step_breakdown(job, keep_rows=False)
    kept = summaries_module.breakdown_of(summaries_module.read_all(job)[0] or [], None)
    assert len(kept) == len(whole) == 80
    assert json.dumps(kept.summaries) == json.dumps(whole.summaries)  # NaN (no GPU) as NaN
    assert [b["rank"] for b in kept.bars] == [b["rank"] for b in whole.bars] == [0, 1]
    for a, b in zip(kept.bars, whole.bars, strict=True):
        assert sorted(a) == sorted(b) and a["per"] == b["per"]
        for k in sorted(b):
            assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
    # No trace is read for report.json: the report stands without the
    # columns reader; the page reads the segments of the ranks it shows in
    # detail, and only those.
    again = report(job, tmp_path / "again", formats=("json",))
    assert _kinds(again.data) == {"summary"} and [p.name for p in again.files] == ["report.json"]
    with pytest.raises(AssertionError, match="a trace was read"):
        report(job, tmp_path / "segments2", formats=("json",), from_segments=True)
    monkeypatch.setattr(report_data, "read_columns", recorded)
    monkeypatch.setattr(summaries_module, "DETAIL_RANKS", 1)
    page = report(job, tmp_path / "page", formats=("html", "csv"))
    assert sorted(p.name for p in page.files) == sorted(["report.html", *(p.name for p in seg.files)])
    assert read == [job / "rank0"], read


def test_a_summary_of_other_segments_or_a_missing_one_sends_the_report_to_the_segments(
    job: Path, tmp_path: Path
) -> None:
    run = tmp_path / "job"
    shutil.copytree(job, run)
    (run / "rank1" / RANK_SUMMARY_JSON).unlink()
    doc = report(run, tmp_path / "r1", formats=("json",)).data
    assert "summary" not in _kinds(doc)
    shutil.copytree(job, run, dirs_exist_ok=True)
    assert _kinds(report(run, tmp_path / "r2", formats=("json",)).data) == {"summary"}
    # A segment rewritten since (the same events, other bytes): not what rank 0 summarised.
    seg = next((run / "rank0").glob("fastprof.*.json.gz"))
    seg.write_bytes(gzip.compress(gzip.decompress(seg.read_bytes()), compresslevel=1))
    doc = report(run, tmp_path / "r3", formats=("json",)).data
    assert "summary" not in _kinds(doc)


@pytest.mark.parametrize("verb", ["report", "summary"])
def test_from_segments_on_the_command_line_reads_the_traces_whatever_summaries_there_are(
    job: Path, tmp_path: Path, verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    read: list[Any] = []
    real = report_data.read_columns

    def recorded(target: Any, **kwargs: Any) -> Any:
        read.append(target)
        return real(target, **kwargs)

    monkeypatch.setattr(report_data, "read_columns", recorded)
    out = ["-q", "-o", str(tmp_path / "plain")] if verb == "report" else []
    assert main([verb, str(job), *out]) == 0
    # The summaries: no trace but, for the page, its detail ranks' segments.
    assert read == ([[str(job / "rank0"), str(job / "rank1")]] if verb == "report" else [])
    read.clear()
    out = ["-q", "-o", str(tmp_path / "segments")] if verb == "report" else []
    assert main([verb, str(job), "--from-segments", *out]) == 0
    assert read == [job / "trace.json.gz"]  # the run's unified trace
    capsys.readouterr()
    if verb == "report":
        plain = json.loads((tmp_path / "plain" / "report.json").read_text())
        segments = json.loads((tmp_path / "segments" / "report.json").read_text())
        assert _kinds(plain) == {"summary"} and _kinds(segments) and "summary" not in _kinds(segments)
        plain["source"]["inputs"] = segments["source"]["inputs"]
        assert _diff(plain, segments) == []
        both = [(tmp_path / k / "breakdown.csv").read_bytes() for k in ("plain", "segments")]
        assert both[0] == both[1] and len(both[0]) > 0


def test_a_ranks_summary_reads_its_own_side_documents_not_every_ranks(job: Path, tmp_path: Path) -> None:
    """A rank's own report reads its own triggers.json, not the other
    ranks' (N ranks' summaries reading every rank's file read N^2 files:
    ~7 s a rank at 1,024 ranks whose triggers.json were 105 KB)."""
    run = tmp_path / "job"
    shutil.copytree(job, run)
    (run / "rank1" / "triggers.json").write_text("{not json")
    (run / "rank1" / "profiler.json").unlink()  # rank 1's triggers: its triggers.json alone
    own = rank_summary.summarize(run, 0, "job")
    assert not [w for w in own["report"]["source"]["warnings"] if "triggers.json" in w]
    assert [t["rank"] for t in own["report"]["triggers"]["per_rank"]] == [0]
    # The report of the run reads it (and says it is not JSON).
    doc = report(run, tmp_path / "report", formats=("json",), from_segments=True).data
    assert [w for w in doc["source"]["warnings"] if "rank1/triggers.json: not valid JSON" in w]


def _alone(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("torch")
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out"), how], capture_output=True, text=True, timeout=120
    )
    return r, tmp_path / "out" / "alone"


def test_a_rank_killed_writes_no_summary_and_its_run_is_reported_from_its_segments(tmp_path: Path) -> None:
    r, run = _alone(tmp_path, "SIGKILL")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert not (run / "rank0" / RANK_SUMMARY_JSON).exists()
    doc = report(run, tmp_path / "report", formats=("json",)).data
    assert "summary" not in _kinds(doc)
    assert doc["speed"]["train"]["per_rank"][0]["steps"] >= 30


def test_a_sigterm_leaves_the_summary_of_what_was_recorded(tmp_path: Path) -> None:
    r, run = _alone(tmp_path, "SIGTERM")
    assert r.returncode == -signal.SIGTERM, r.stderr[-2000:]
    assert (run / "rank0" / RANK_SUMMARY_JSON).is_file(), r.stderr[-2000:]
    summaries, segments = _reports(run, tmp_path)
    assert _kinds(summaries) == {"summary"}
    assert summaries["speed"]["train"]["per_rank"][0]["steps"] == 31
    summaries["source"]["inputs"] = segments["source"]["inputs"]
    assert _diff(summaries, segments) == []


#: One process whose anomaly trigger records slow steps (40x at steps 70, 90, 110).
SLOW = textwrap.dedent(
    """
    import sys, time
    import torch
    import fastprof

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    triggers = fastprof.Triggers(anomaly_on_contention=True)
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="slow", schedule="never", triggers=triggers)
    with prof:
        for i, x in enumerate(prof.loader([torch.randn(4, 16) for _ in range(130)])):
            with fastprof.span("forward"):
                loss = model(x).sum()
            with fastprof.span("backward"):
                loss.backward()
            time.sleep(0.002 * (40 if i in (70, 90, 110) else 1))
            opt.step()
            prof.step()
    """
)


def test_a_summary_keeps_the_slow_steps_once_and_its_report_is_the_segments(tmp_path: Path) -> None:
    """The trigger's slow steps are in the summary's report section, not a
    second time in its copy of profiler.json (a third of a trigger-heavy
    summary), and the report from the summary lists them as the report of
    the segments does."""
    pytest.importorskip("torch")
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "out" / "slow"
    raw = json.loads((run / "rank0" / "profiler.json").read_text())["triggers"]
    slow = [a["step"] for a in raw["anomalies"]]
    assert {70, 90, 110} <= set(slow), raw["anomalies"]
    kept = json.loads((run / "rank0" / RANK_SUMMARY_JSON).read_text())
    assert "anomalies" not in kept["profiler"]["triggers"]
    assert kept["profiler"]["triggers"]["config"] == raw["config"]
    assert [a["step"] for a in kept["report"]["triggers"]["per_rank"][0]["anomalies"]] == slow
    summaries, segments = _reports(run, tmp_path)
    assert _kinds(summaries) == {"summary"}
    assert [a["step"] for a in summaries["triggers"]["per_rank"][0]["anomalies"]] == slow
    summaries["source"]["inputs"] = segments["source"]["inputs"]
    assert _diff(summaries, segments) == []
