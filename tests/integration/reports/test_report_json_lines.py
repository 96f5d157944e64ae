"""report.json and the page's trigger tables of a run of many ranks whose
triggers recorded many slow steps (issue #38): report.json is indented down
to its records, each slow step one line of its own, and reads back the same
with Python's ``json`` and with Node's ``JSON.parse`` (a parser we did not
write); the page's tables list the worst slow steps first and the first
captures, as the rows report.json holds.

The run is ``test_many_ranks_triggers_page.py``'s: 64 real ranks (recorded
by the Profiler on CPU, made into 64 by the bench's builder), each rank's
trigger record holding 200 slow steps, 60 captures, flight dumps and notes,
reported by the CLI."""

from __future__ import annotations

import collections
import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_many_ranks_readable import templates  # noqa: F401 (a fixture)
from test_many_ranks_triggers_page import N_RANKS, PER_RANK, triggered_wide  # noqa: F401 (a fixture)

from fastprof.reports.html_triggers import MAX_ROWS_MANY


def _strict(text: str) -> Any:
    def reject(literal: str) -> Any:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=reject)


#: Node reads the file with JSON.parse and writes it back with JSON.stringify.
_NODE_READ = (
    "const fs = require('fs');"
    "process.stdout.write(JSON.stringify(JSON.parse(fs.readFileSync(process.argv[1], 'utf8'))))"
)


def _as_doubles(x: Any) -> Any:
    """``x`` with every integer beyond 2**53 as the double JavaScript holds."""
    if isinstance(x, dict):
        return {k: _as_doubles(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_as_doubles(v) for v in x]
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) > 2**53:
        return float(x)
    return x


def _rows(page: str, cls: str) -> list[list[str]]:
    """The cells (text) of the page's table of class ``cls``."""
    m = re.search(rf'<table class="{cls}">.*?<tbody>(.*?)</tbody></table>', page, re.S)
    assert m is not None, cls
    return [
        [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)
    ]


@pytest.mark.slow
def test_report_json_of_many_ranks_is_a_line_a_slow_step_and_reads_back_the_same(
    triggered_wide: tuple[Path, set[int]],  # noqa: F811 (the fixture imported above)
) -> None:
    out, _slow = triggered_wide
    text = (out / "report.json").read_text()
    doc = _strict(text)
    lines = text.split("\n")
    # The top level one member a line, in the document's order.
    assert [m.group(1) for line in lines if (m := re.match(r'^ "([^"]+)": ', line))] == list(doc)
    # Each slow step of each rank one line of its own, the record json reads.
    per_rank = doc["triggers"]["per_rank"]
    assert len(per_rank) == N_RANKS and all(len(r["anomalies"]) == PER_RANK for r in per_rank)
    records = collections.Counter(json.dumps(a, allow_nan=False) for r in per_rank for a in r["anomalies"])
    on_lines = collections.Counter(line.strip().rstrip(",") for line in lines)
    assert sum(records.values()) == N_RANKS * PER_RANK
    assert all(on_lines[rec] == k for rec, k in records.items())
    # Far fewer lines than indent=1 wrote (a line a field).
    indented = json.dumps(doc, indent=1).count("\n") + 1
    assert len(lines) * 4 < indented, (len(lines), indented)


@pytest.mark.slow
def test_report_json_of_many_ranks_reads_the_same_with_node(
    triggered_wide: tuple[Path, set[int]],  # noqa: F811 (the fixture imported above)
) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on this machine: JSON.parse not checked")
    out, _slow = triggered_wide
    path = out / "report.json"
    p = subprocess.run([node, "-e", _NODE_READ, str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    # JavaScript's numbers are doubles: the ns integers above 2**53 read as the nearest.
    assert _as_doubles(json.loads(p.stdout)) == _as_doubles(_strict(path.read_text()))


@pytest.mark.slow
def test_the_pages_trigger_tables_of_many_ranks_list_the_worst_slow_steps_and_the_first_captures(
    triggered_wide: tuple[Path, set[int]],  # noqa: F811 (the fixture imported above)
) -> None:
    out, _slow = triggered_wide
    doc = json.loads((out / "report.json").read_text())
    page = (out / "report.html").read_text(encoding="utf-8")
    per_rank = doc["triggers"]["per_rank"]
    every = sorted(
        ((-float(a["factor"] or 0.0), int(r["rank"]), i, a) for r in per_rank for i, a in enumerate(r["anomalies"])),
        key=lambda fria: fria[:3],
    )
    want = [
        [str(rank), str(a["step"]), f"{a['duration_ms']:.1f}", f"{a['median_ms']:.1f}", f"{a['factor']:.1f}x"]
        for _f, rank, _i, a in every[:MAX_ROWS_MANY]
    ]
    slow = _rows(page, "slow-steps")
    assert [row[:5] for row in slow] == want
    assert all(row[6] == a["action"] for row, (_f, _r, _i, a) in zip(slow, every, strict=False))
    n = N_RANKS * PER_RANK
    assert f"{n - MAX_ROWS_MANY:,} more in report.json; the table lists the worst first." in page
    captures = _rows(page, "captures")
    first = [(int(r["rank"]), c) for r in per_rank for c in r["captures"]][:MAX_ROWS_MANY]
    assert [(int(row[0]), row[2]) for row in captures] == [
        (rank, f"{c['first_step']}..{int(c['first_step']) + max(int(c['steps']), 1) - 1}") for rank, c in first
    ]
    assert all(row[4].endswith("(not there now)") for row in captures)
    dumps = _rows(page, "flight-dumps")
    assert len(dumps) == MAX_ROWS_MANY and [int(row[0]) for row in dumps] == [0] * MAX_ROWS_MANY
