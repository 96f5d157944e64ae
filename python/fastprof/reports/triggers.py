"""The report's ``triggers`` section (issue #17): per rank, what the job's
triggers did (``profiler.json``'s ``triggers``, written by
:mod:`fastprof.profiler.drivers.triggers`): each anomaly with its step and numbers,
each capture with its steps and file, each flight dump, and what was
coalesced. Bounded: the job keeps at most 200 of each per rank."""

from __future__ import annotations

import json
from typing import Any

from fastprof.recording.names import TRIGGERS_JSON
from fastprof.reports import data as _data

__all__ = ["triggers_report"]


def _file(data: _data.RunData, path: Any) -> Any:
    return _data.where_now(data, str(path)) if path else path


def _capture(data: _data.RunData, c: dict[str, Any]) -> dict[str, Any]:
    w = c.get("window") or {}
    return {
        "source": str(c.get("source")),
        "first_step": int(c.get("first_step", 0)),
        "steps": int(c.get("steps", 0)),
        "status": str(c.get("status")),
        "late_by_steps": int(c.get("late_by_steps", 0)),
        "file": _file(data, w.get("path")),
        "error": w.get("error"),
    }


def _records(data: _data.RunData) -> dict[int, dict[str, Any]]:
    """rank -> its triggers' record: profiler.json's, else (a rank killed
    before it wrote one) the ``triggers.json`` the job kept up to date."""
    out: dict[int, dict[str, Any]] = {}
    for rank, summary in data.profiler.items():
        t = (summary or {}).get("triggers")
        if isinstance(t, dict):
            out[int(rank)] = t
    if data.run_dir is not None:
        for f in sorted(data.run_dir.glob(f"rank*/{TRIGGERS_JSON}")):
            try:
                rank = int(f.parent.name[4:])
            except ValueError:
                continue
            if rank in out:
                continue
            try:
                t = json.loads(f.read_text())
            except (OSError, ValueError):
                data.cols.warnings.append(f"{f}: not valid JSON; its triggers are left out")
                continue
            if isinstance(t, dict):
                out[rank] = t
    return out


def triggers_report(data: _data.RunData) -> dict[str, Any] | None:
    """None when no rank ran with triggers."""
    per_rank = []
    for rank, t in sorted(_records(data).items()):
        per_rank.append(
            {
                "rank": int(rank),
                "signal": t.get("signal"),
                "anomalies": [
                    {
                        "step": int(a.get("step", 0)),
                        "duration_ms": float(a.get("duration_ms") or 0.0),
                        "median_ms": float(a.get("median_ms") or 0.0),
                        "factor": None if a.get("factor") is None else float(a["factor"]),
                        "action": str(a.get("action")),
                        "phase": None if a.get("phase") is None else str(a["phase"]),
                    }
                    for a in t.get("anomalies", [])
                ],
                "captures": [_capture(data, c) for c in t.get("captures", [])],
                "flight_dumps": [
                    {
                        "reason": str(d.get("reason")),
                        "step": int(d.get("step", 0)),
                        "file": _file(data, d.get("path")),
                        "error": d.get("error"),
                    }
                    for d in t.get("flight_dumps", [])
                ],
                "requests": len(t.get("requests", [])),
                "coalesced": int(t.get("coalesced", 0)),
                "notes": [str(n) for n in t.get("notes", [])],
            }
        )
    return {"per_rank": per_rank} if per_rank else None
