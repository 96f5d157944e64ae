"""A rank whose segments outgrow a summary writes none (issue #38): a
rank's summary is made by the report of its segments, which at 10^7 steps
took 310-409 s and 3.8 GB: at the job's end it would be killed at the 300 s
budget with nothing to show.
Past ``SUMMARY_MAX_BYTES`` of segments the close says why, starts no
summary process, and the report reads the segments; under it the summary
is written as before.

The runs are real: the Profiler records in this process (no torch), ends
normally, and the report is read back with Python's ``json``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import fastprof
from fastprof.profiler.drivers import summary as summary_driver
from fastprof.recording.names import RANK_SUMMARY_JSON
from fastprof.reports.report import report

STEPS = 300


def _record(out: Path) -> tuple[Path, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = fastprof.Profiler(out_dir=out, run_name="job", torch=False, sample_hz=0)
        with prof:
            for _ in prof.loader(range(STEPS)):
                with fastprof.span("work"):
                    sum(range(2_000))
                prof.step()
    return out / "job", [str(w.message) for w in caught]


def _inputs(run: Path, out: Path) -> list[dict[str, object]]:
    report(run, out, formats=["json"])
    doc = json.loads((out / "report.json").read_text())
    assert doc["speed"]["train"]["per_rank"][0]["steps"] == STEPS
    return list(doc["source"]["inputs"])


def test_a_rank_past_the_limit_writes_no_summary_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(summary_driver, "SUMMARY_MAX_BYTES", 1024)
    run, said = _record(tmp_path / "rec")
    size = summary_driver.segments_size(run / "rank0")
    assert size > 1024
    assert not (run / "rank0" / RANK_SUMMARY_JSON).exists()
    line = [m for m in said if "summary was left out" in m]
    assert len(line) == 1, said
    assert f"{size / 2**20:,.0f} MiB" in line[0] and "a report reads its segments" in line[0]
    # The report reads the rank's segments, not a summary.
    kinds = {str(i.get("kind")) for i in _inputs(run, tmp_path / "rep")}
    assert "summary" not in kinds and kinds


def test_a_rank_under_the_limit_summarises_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(summary_driver, "SUMMARY_MAX_BYTES", 64 << 20)
    run, said = _record(tmp_path / "rec")
    assert (run / "rank0" / RANK_SUMMARY_JSON).is_file(), said
    assert not [m for m in said if "summary was left out" in m]
    assert {str(i.get("kind")) for i in _inputs(run, tmp_path / "rep")} == {"summary"}
