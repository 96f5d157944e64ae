"""report.json's layout (issue #38): indented lines down to the records, each
record (a container holding no container) one line written by Python's C
encoder, the document the same as ``json.dumps`` gives it, non-finite
numbers spelt as the trace spells them. Read back with Python's ``json``
(strict: no NaN literal)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from fastprof.reports import finite, jsonout


def _strict(text: str) -> Any:
    def reject(literal: str) -> Any:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=reject)


def _anomaly(rank: int, i: int) -> dict[str, Any]:
    return {
        "step": 10 + i,
        "duration_ms": 3.5 + i / 7,
        "median_ms": 0.7,
        "factor": (3.5 + i / 7) / 0.7,
        "cause": None if i % 2 else "host contention",
        # JSON's delimiters and a line break inside a string stay on the record's line.
        "said": f'rank {rank} step {10 + i}: "}}, {{\n" \u00e9\u2028',
    }


def _doc() -> dict[str, Any]:
    return {
        "schema": "fastprof.report",
        "schema_version": 4,
        "source": {"path": "run", "ranks": [0, 1, 2], "warnings": [], "inputs": [{"path": "a", "rank": 0}]},
        "speed": {
            "train": {
                "iterations_per_s": math.inf,
                "per_rank": [{"rank": 0, "mean_ms": 1.5}, {"rank": 1, "mean_ms": math.nan}],
            },
            "step_time": {"p50_ms": -math.inf, "trend": {"change_pct_over_run": 2.5}},
        },
        "system": {"gpu": {"available": False, "devices": []}},
        "breakdown": None,
        "by_number": {1: "one", 2.5: {"nested": [1]}, None: "none", False: "false"},
        "triggers": {
            "per_rank": [
                {
                    "rank": r,
                    "signal": "SIGUSR2",
                    "anomalies": [_anomaly(r, i) for i in range(6)],
                    "contention": {"steps": 3, "waited_ms": 12.5, "error": None},
                    "notes": [],
                }
                for r in range(3)
            ]
        },
        "growth": [[1, 2], [3, [4, 5]], (6, 7)],
        "recommendations": {"items": [], "checks": [{"name": "x", "passed": True}]},
    }


def _written(tmp_path: Path, doc: dict[str, Any]) -> str:
    return jsonout.write_json(doc, tmp_path).read_text()


def test_report_json_is_the_document_with_each_record_on_a_line_of_its_own(tmp_path: Path) -> None:
    doc = _doc()
    text = _written(tmp_path, doc)
    # The same document as json.dumps of the encoded report gives, read strictly.
    assert _strict(text) == json.loads(json.dumps(finite.encode(doc), allow_nan=False))
    assert _strict(text)["speed"]["train"]["per_rank"][1]["mean_ms"] == "NaN"
    assert text.endswith("}\n")
    lines = text.split("\n")
    # The top level: one member a line, in the document's order.
    top = [m.group(1) for line in lines if (m := re.match(r'^ "([^"]+)": ', line))]
    assert top == list(doc)
    # Each slow step is one line of its own, as the C encoder writes it.
    records = [finite.encode(a) for r in doc["triggers"]["per_rank"] for a in r["anomalies"]]
    one_line = [line.strip().rstrip(",") for line in lines]
    for rec in records:
        assert one_line.count(json.dumps(rec, allow_nan=False)) == 1, rec
    # So is every other container without a container: a rank's contention,
    # a list of numbers, an empty list.
    assert '    "contention": {"steps": 3, "waited_ms": 12.5, "error": null},' in lines
    assert '  "ranks": [0, 1, 2],' in lines
    assert "  [1, 2]," in lines and "  [6, 7]" in lines and "   [4, 5]" in lines
    assert '  "warnings": [],' in lines
    # Keys json converts (numbers, None, False) make their dict one line, as json writes it.
    assert ' "by_number": {"1": "one", "2.5": {"nested": [1]}, "null": "none", "false": "false"},' in lines
    # Indented one space a level, like indent=1 was.
    assert lines[0] == "{" and lines[1] == ' "schema": "fastprof.report",'
    assert '  "per_rank": [' in lines


def test_one_line_is_what_json_dumps_writes(tmp_path: Path) -> None:
    """The C encoder built once writes, value for value, what ``json.dumps``
    without ``indent`` writes, and refuses non-finite floats as it does."""
    values: list[Any] = [
        {"a": [1, 2.5, -0.0, 1e-300, 1e300, 2**70, -(2**63), None, True, False]},
        {"s": '\u00e9"\\\n\t\u2028\U0001f600 </script>', "": {}, "e": []},
        [[], {}, [[]], {"x": {"y": [1]}}],
        "just a string",
        0.1,
        {1: 2, None: 3, 2.5: 4, False: 5},
        (1, (2, 3)),
    ]
    for v in values:
        assert jsonout._ONE_LINE(v) == json.dumps(v, allow_nan=False)
    for bad in (math.nan, [math.inf], {"x": -math.inf}):
        with pytest.raises(ValueError):
            jsonout._ONE_LINE(bad)


def test_a_document_without_non_finite_numbers_is_written_as_it_is(tmp_path: Path) -> None:
    """Only a document holding a non-finite float is copied to spell them
    (``finite.encode``); a finite one comes out the same either way."""
    doc = _doc()
    del doc["speed"]
    assert finite.paths(doc) == []
    text = _written(tmp_path, doc)
    assert _strict(text) == json.loads(json.dumps(doc))
    assert text == jsonout.dumps(finite.encode(doc))


def test_spelt_copies_only_a_document_with_a_non_finite_float() -> None:
    """The tables and the page's data are written through ``finite.spelt``:
    the document itself when every float is finite (no copy of a 1,024-rank
    report's), the trace's spellings otherwise, nested or at the top."""
    plain: dict[str, Any] = {"a": [1, 2.5, {"b": -0.0}], "c": "NaN", "d": None}
    assert finite.spelt(plain) is plain
    for bad, want in ((math.inf, "Infinity"), (-math.inf, "-Infinity"), (math.nan, "NaN")):
        doc = {"a": [1, {"b": bad}], "c": 2.0}
        out = finite.spelt(doc)
        assert out == {"a": [1, {"b": want}], "c": 2.0} and doc["a"][1]["b"] is bad
        assert json.loads(json.dumps(out, allow_nan=False)) == out
        assert finite.spelt(bad) == want
