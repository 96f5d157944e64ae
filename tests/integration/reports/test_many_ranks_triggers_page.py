"""report.html of many ranks whose triggers recorded many slow steps (issue
#38, item 3): the page embeds a bounded view of report.json
(``reports/html_embed.py``), says so and links report.json, which keeps
every list.

The run is the 64-rank run of ``test_many_ranks_readable.py`` (real ranks
recorded by the Profiler on CPU, made into 64 by the bench's builder, three
planted slow), each rank's trigger record (``profiler.json``'s ``triggers``
and ``triggers.json``, as the job writes them) then holding the job's
maximum of 200 slow steps, as a rank beside a CPU hog records them (host
contention, another rank, the job), with captures, flight dumps and notes.
report.json is read with Python's ``json``, the page in headless Chromium."""

from __future__ import annotations

import collections
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_many_ranks_readable import build, check_page, templates  # noqa: F401 (a fixture)

from fastprof.reports.html_embed import EMBED_PER_RANK, EMBED_TOP
from fastprof.reports.many import MANY_RANKS

N_RANKS = 64
#: Per rank and list: the job keeps at most 200 (``MAX_RECORDS``).
PER_RANK = 200
_CAUSES = ("host contention", "another rank", "the job", None)
_EMBEDDED = re.compile(r'<script type="application/json" id="fastprof-report">(.*?)</script>', re.S)


def _anomaly(rank: int, i: int, rng: random.Random) -> dict[str, Any]:
    """A slow step as the job's trigger records it (``captures.on_anomaly``)."""
    cause = _CAUSES[(rank + i) % len(_CAUSES)]
    median = 0.7
    dur = round(median * rng.uniform(3.1, 80.0), 3)
    rec: dict[str, Any] = {
        "step": 10 + i,
        "duration_ms": dur,
        "median_ms": median,
        "mad_ms": 0.002,
        "factor": round(dur / median, 2),
        "phase": None if cause == "host contention" else "backward",
    }
    if cause is not None:
        rec.update({"cause": cause, "waited_ms": round(dur * 0.9, 3), "usual_wait_ms": 0.02, "rank_wait_ms": 0.0})
    if cause == "host contention":
        rec["said"] = f"step {10 + i}: {dur:.1f} ms, of which {dur * 0.9:.1f} ms waiting for a CPU: host contention"
        rec["action"] = "recorded only (host contention)"
    elif cause == "another rank":
        rec["said"] = f"step {10 + i}: {dur:.1f} ms, of which 0.0 ms waiting for another rank"
        rec["action"] = "recorded only (waited for another rank)"
    else:
        rec["action"] = "recorded only (anomaly_max=3 reached)"
    rec["time"] = 1_795_910_403.0 + i
    return rec


def _capture(d: Path, i: int) -> dict[str, Any]:
    """A capture as the job records it (its trace not there: named, not linked)."""
    w = {"path": str(d / "torch" / f"gone{i}.pt.trace.json.gz")}
    return {"source": "anomaly", "first_step": 5 + i, "steps": 1, "status": "written", "late_by_steps": 0, "window": w}


def _plant(run: Path, rank: int) -> None:
    """Rank ``rank``'s trigger record: 200 slow steps, 60 captures, 60 flight
    dumps and 60 notes, in profiler.json and triggers.json alike."""
    rng = random.Random(rank)
    d = run / f"rank{rank}"
    prof = json.loads((d / "profiler.json").read_text())
    t = dict(prof.get("triggers") or {})
    t.update(
        {
            "signal": "SIGUSR2",
            "requests": [],
            "anomalies": [_anomaly(rank, i, rng) for i in range(PER_RANK)],
            "contention": {"rule": "the planted rule", "steps": 50, "waited_ms": 123.0, "watch_ms": 20.0},
            "captures": [_capture(d, i) for i in range(60)],
            "flight_dumps": [
                {"reason": "anomaly", "step": 5 + i, "path": str(d / "flight" / f"gone{i}.json.gz")} for i in range(60)
            ],
            "coalesced": 1,
            "notes": [f"note {i} of rank {rank}" for i in range(60)],
        }
    )
    prof["triggers"] = t
    (d / "profiler.json").write_text(json.dumps(prof))
    (d / "triggers.json").write_text(json.dumps(t))


@pytest.fixture(scope="module")
def triggered_wide(
    templates: tuple[Any, Any],  # noqa: F811 (the fixture imported above)
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, set[int]]:
    """The 64-rank run, each rank's triggers full, reported by the CLI:
    (the report folder, the slow ranks)."""
    tmp = tmp_path_factory.mktemp("triggered_wide")
    slow = set(random.Random(38).sample(range(N_RANKS), 3))
    build(tmp / "run", N_RANKS, *templates, slow)
    for rank in range(N_RANKS):
        _plant(tmp / "run", rank)
    _cli("report", str(tmp / "run"), "-q", "-o", str(tmp / "report"))
    return tmp / "report", slow


def _cli(*args: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "fastprof", *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert p.returncode == 0, p.stderr[-3000:]


def embedded_of(page: Path) -> Any:
    m = _EMBEDDED.search(page.read_text(encoding="utf-8"))
    assert m is not None
    return json.loads(m.group(1))


def _worst_first(rank: int, i: int, a: dict[str, Any]) -> tuple[float, int, int]:
    return (-float(a["factor"] or 0.0), rank, i)


@pytest.mark.slow
def test_the_page_of_64_ranks_embeds_the_triggers_bounded_and_report_json_keeps_them(
    triggered_wide: tuple[Path, set[int]], tmp_path: Path
) -> None:
    out, slow = triggered_wide
    doc = json.loads((out / "report.json").read_text())
    page = out / "report.html"
    # report.json keeps every list of every rank.
    per_rank = doc["triggers"]["per_rank"]
    assert [int(r["rank"]) for r in per_rank] == list(range(N_RANKS))
    assert all(len(r["anomalies"]) == PER_RANK and len(r["captures"]) == 60 for r in per_rank)
    view = embedded_of(page)
    # The sections that are not bounded are report.json's own.
    for key in doc:
        if key not in ("triggers", "anatomy"):
            assert view[key] == doc[key], key
    assert view["page_view"]["bounded"] == ["triggers", "anatomy"]
    assert view["page_view"]["full"] == "report.json"
    t = view["triggers"]
    # Per rank: counts only, by cause, and the worst; counts as report.json's.
    assert [r["rank"] for r in t["per_rank"]] == list(range(N_RANKS))
    for got, full in zip(t["per_rank"], per_rank, strict=True):
        assert "anomalies" not in got and "captures" not in got
        assert got["counts"] == {k: len(full[k]) for k in ("anomalies", "captures", "flight_dumps", "notes")}
        by_cause = collections.Counter(a["cause"] for a in full["anomalies"])
        assert {c["cause"]: c["count"] for c in got["anomalies_by_cause"]} == dict(by_cause)
        _i, worst = min(enumerate(full["anomalies"]), key=lambda ia: _worst_first(full["rank"], *ia))
        assert got["worst_anomaly"] == {k: worst[k] for k in got["worst_anomaly"]}
        assert got["worst_anomaly"]["factor"] == max(a["factor"] for a in full["anomalies"])
        assert got["contention"] == {k: full["contention"][k] for k in ("steps", "waited_ms", "error")}
        assert (got["signal"], got["requests"], got["coalesced"]) == (full["signal"], full["requests"], 1)
    assert t["counts"]["anomalies"] == N_RANKS * PER_RANK
    assert t["contention_rules"] == ["the planted rule"]
    # The run's worst slow steps, in the order of the page's table, each as report.json has it.
    every = sorted(
        ((int(r["rank"]), i, a) for r in per_rank for i, a in enumerate(r["anomalies"])),
        key=lambda ria: _worst_first(*ria),
    )
    assert t["worst_anomalies"] == [{"rank": rank, **a} for rank, _i, a in every[:EMBED_TOP]]
    for key in ("captures", "flight_dumps"):
        assert t[key] == [{"rank": 0, **c} for c in per_rank[0][key][:EMBED_TOP]]
    assert t["notes"] == [{"rank": 0, "note": n} for n in per_rank[0]["notes"][:EMBED_TOP]]
    # The anatomy's slow steps: each rank's slowest, all of them counted.
    for got, full in zip(view["anatomy"]["per_rank"], doc["anatomy"]["per_rank"], strict=True):
        assert got["slow_steps"] == full["slow_steps"][:EMBED_PER_RANK]
        assert got["slow_step_count"] == full["slow_step_count"]
        assert {k: v for k, v in got.items() if k != "slow_steps"} == {
            k: v for k, v in full.items() if k != "slow_steps"
        }
    # Bounded by ranks, not by what the triggers recorded: the whole lists
    # are 64 x 200 slow steps (~2.6 MB of JSON), the view's a few hundred bytes a rank.
    full_size = len(json.dumps(doc["triggers"], separators=(",", ":")))
    view_size = len(json.dumps(t, separators=(",", ":")))
    assert full_size > 2_000_000, full_size
    assert view_size < N_RANKS * 500 + 4 * EMBED_TOP * 600, view_size
    text = page.read_text(encoding="utf-8")
    assert len(text.encode()) < 15e6
    # The page says so and links report.json beside it.
    for note_id in ("triggers-bounded", "embedded-view"):
        note = re.search(rf'<p class="note" id="{note_id}">(.*?)</p>', text, re.S)
        assert note is not None, note_id
        assert '<a href="report.json">report.json</a>' in note.group(1)
    assert f"{N_RANKS * PER_RANK:,} slow step(s) on {N_RANKS} rank(s)" in text
    assert (page.parent / "report.json").is_file()
    # In headless Chromium: no error, every plot drawn, the rank table.
    check_page(page, tmp_path, N_RANKS, slow)


def test_up_to_16_ranks_the_page_embeds_report_json_whole(
    templates: tuple[Any, Any],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """At MANY_RANKS ranks, each with full triggers, the embedded report is
    report.json itself, and the page says nothing of a bounded view."""
    n = MANY_RANKS
    build(tmp_path / "run", n, *templates, {2})
    for rank in range(n):
        _plant(tmp_path / "run", rank)
    _cli("report", str(tmp_path / "run"), "-q", "-o", str(tmp_path / "out"))
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(doc["triggers"]["per_rank"]) == n
    assert all(len(r["anomalies"]) == PER_RANK for r in doc["triggers"]["per_rank"])
    text = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert embedded_of(tmp_path / "out" / "report.html") == doc
    assert "page_view" not in doc
    assert 'id="triggers-bounded"' not in text and 'id="embedded-view"' not in text
