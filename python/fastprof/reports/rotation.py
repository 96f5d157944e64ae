"""What the recordings' disk caps (``max_disk``, ``keep_segments``) deleted
before the report read the run: ``source.rotated`` of report.json, one entry
per rank, and the line the terminal prints for each.

A merged trace says it per rank (its ``otherData.rotated``, epoch ns); a run
directory read segment by segment says it in each segment's
``otherData.rotated`` (the ledger of its recording as it stood when the
segment closed, in that recording's trace time), of which the newest of each
recording counts every deletion."""

from __future__ import annotations

from typing import Any

from fastprof.reports import data as _data

#: What a ledger counts: the segments deleted (and their events), the other files (flight dumps, torch windows).
_COUNTS = ("segments", "bytes", "events", "files", "files_bytes")


def _seen(led: dict[str, Any]) -> int:
    """Deletions a ledger counts: a later one of the same recording counts more."""
    return int(led.get("segments", 0)) + int(led.get("files", 0))


def _from_segments(files: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    latest: dict[tuple[int, int], dict[str, Any]] = {}
    for f in files:
        led = f.get("rotated")
        if f["kind"] != "fastprof" or not isinstance(led, dict):
            continue
        key = (int(f["rank"] or 0), int(f["base_ns"] or 0))
        if key not in latest or _seen(led) > _seen(latest[key]["rotated"]):
            latest[key] = f
    out: dict[int, dict[str, Any]] = {}
    for (rank, base), f in sorted(latest.items()):
        led = f["rotated"]
        e = out.setdefault(rank, {"rank": rank, **dict.fromkeys(_COUNTS, 0), "start_ns": None, "end_ns": None})
        for k in _COUNTS:
            e[k] += int(led.get(k, 0))
        if led.get("ts_start") is not None and led.get("ts_end") is not None:
            shift = base + int(f["offset_ns"] or 0)
            s, t = shift + round(led["ts_start"] * 1000), shift + round(led["ts_end"] * 1000)
            e["start_ns"] = s if e["start_ns"] is None else min(e["start_ns"], s)
            e["end_ns"] = t if e["end_ns"] is None else max(e["end_ns"], t)
    return out


def rotation_report(data: _data.RunData) -> list[dict[str, Any]]:
    """Per rank: segments, bytes and events deleted, and the time range they
    held as epoch ns and as seconds from the report's wall start (negative
    when before it), and the flight dumps and torch windows deleted (files,
    files_bytes); empty when nothing was deleted."""
    files = [f for f in data.cols.files if not f.get("skipped")]
    by_rank: dict[int, dict[str, Any]] = {}
    for f in files:
        if f["kind"] == "merged" and isinstance(f.get("rotated"), list):
            for r in f["rotated"]:
                keys = ("rank", *_COUNTS, "start_ns", "end_ns")
                by_rank[int(r["rank"])] = {k: r.get(k, 0 if k in _COUNTS else None) for k in keys}
    for rank, e in _from_segments(files).items():
        by_rank.setdefault(rank, e)
    w0 = data.wall()[0]
    out = []
    for rank in sorted(by_rank):
        e = by_rank[rank]
        e["start_s"] = None if e["start_ns"] is None else (e["start_ns"] - w0) / 1e9
        e["end_s"] = None if e["end_ns"] is None else (e["end_ns"] - w0) / 1e9
        out.append(e)
    return out
