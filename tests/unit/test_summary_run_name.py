"""A rank summary stands for its rank only when the rank's profiler.json names
its run (issue #38, item 2). The run's name is read member by member, up to
it: a rank's profiler.json beside a CPU hog holds ~100 KB of trigger records
after it, which the check parsed whole for 1,024 ranks (1.3 s of the report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import summarised_rank
from fastprof.recording.names import RANK_SUMMARY_JSON
from fastprof.reports import summaries


@pytest.mark.parametrize(
    "doc",
    [
        {"version": "0.2.0", "run_name": "job", "triggers": {"anomalies": [{"step": 1}]}},
        {"a": {"run_name": "nested, not this"}, "b": [1, "run_name"], "run_name": 'j\u00e9b "q"'},
        {"run_name": None},
        {"version": "0.2.0"},
        {},
    ],
)
@pytest.mark.parametrize("indent", [None, 1])
def test_the_member_read_up_to_it_is_what_json_reads(doc: dict[str, Any], indent: int | None) -> None:
    text = json.dumps(doc, indent=indent)
    assert summaries._member(text, "run_name") == (json.loads(text).get("run_name"),)


def test_the_member_is_read_without_what_follows_it_and_malformed_json_before_it_raises() -> None:
    # What follows the member is not read: a tail that is not JSON does not matter.
    assert summaries._member('{"version": "0.2.0", "run_name": "job", "triggers": {"anomal', "run_name") == ("job",)
    assert summaries._member(' \n{ \n"run_name" :\t"job" ,', "run_name") == ("job",)
    # Not an object: no member at all.
    for text in ("[1, 2]", '"run_name"', "", "  "):
        assert summaries._member(text, "run_name") is None
    # Malformed before the member (or with no such member): ValueError, as json.loads.
    for text in (
        '{"a" 1, "run_name": "x"}',
        '{"a": 1,}',
        '{"a": 1 "run_name": "x"}',
        '{"a": [1, "run_name": "x"}',
        "{",
    ):
        with pytest.raises(ValueError):
            summaries._member(text, "run_name")
        with pytest.raises(ValueError):
            json.loads(text)


_rank = summarised_rank


def test_a_summary_is_refused_when_profiler_json_names_another_run_before_anything_unreadable(tmp_path: Path) -> None:
    big = {"version": "0.2.0", "run_name": "job", "triggers": {"anomalies": [{"step": i} for i in range(2000)]}}
    run = tmp_path / "run"
    _rank(run, 0, json.dumps(big, indent=1))
    _rank(run, 1, json.dumps({**big, "run_name": "job"}))
    got, why = summaries.read_all(run)
    assert got is not None and [s["rank"] for s in got] == [0, 1], why
    # profiler.json of another run: refused, whatever follows its name
    # (here cut short, as a rank killed while rewriting it would leave it).
    other = tmp_path / "other"
    _rank(other, 0, json.dumps(big))
    cut = json.dumps({**big, "run_name": "another job"})
    _rank(other, 1, cut[: len(cut) // 2])
    got, why = summaries.read_all(other)
    assert got is None and "of run 'job', not 'another job'" in why and f"rank1/{RANK_SUMMARY_JSON}" in why
    # One that cannot be read up to its name is no evidence either way, as before.
    unreadable = tmp_path / "unreadable"
    _rank(unreadable, 0, '{"version": "0.2.0" "run_name": "another job"}')
    got, why = summaries.read_all(unreadable)
    assert got is not None, why
