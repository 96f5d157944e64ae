"""The report's ``triggers`` section (issue #17): per rank, what the job's
triggers did (``profiler.json``'s ``triggers``, written by
:mod:`fastprof.profiler.drivers.triggers`): each anomaly with its step, numbers and cause (the
host's contention for the CPU, or the job), the slow steps the host caused,
each capture with its steps and file, each flight dump, and what was
coalesced. Bounded: the job keeps at most 200 of each per rank."""

from __future__ import annotations

import json
from typing import Any

from fastprof.recording.names import TRIGGERS_JSON
from fastprof.reports import data as _data

__all__ = ["CONTENTION", "triggers_report"]

#: An anomaly's ``cause`` when the host slowed the step.
CONTENTION = "host contention"


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
        # The ranks read, each its own file: a rank's own report (its
        # summary) reads its own, not every rank's (N ranks' summaries read
        # N^2 files: 12 s a rank at 1,024 ranks of 105 KB each).
        for rank in data.ranks:
            f = data.run_dir / f"rank{rank}" / TRIGGERS_JSON
            if rank in out or not f.is_file():
                continue
            try:
                t = json.loads(f.read_text())
            except (OSError, ValueError):
                data.cols.warnings.append(f"{f}: not valid JSON; its triggers are left out")
                continue
            if isinstance(t, dict):
                out[rank] = t
    return out


def _anomaly(a: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "step": int(a.get("step", 0)),
        "duration_ms": float(a.get("duration_ms") or 0.0),
        "median_ms": float(a.get("median_ms") or 0.0),
        "factor": None if a.get("factor") is None else float(a["factor"]),
        "action": str(a.get("action")),
        "phase": None if a.get("phase") is None else str(a["phase"]),
        # Who slowed the step (fastprof.profiler.contention): "host contention",
        # "the job", or None when the wait for a CPU was not read.
        "cause": None if a.get("cause") is None else str(a["cause"]),
        "waited_ms": None if a.get("waited_ms") is None else float(a["waited_ms"]),
    }
    # The job's own words for a step the host slowed (fastprof.profiler.contention.text).
    out["said"] = str(a["said"]) if out["cause"] == CONTENTION and a.get("said") else None
    return out


def _contention(t: dict[str, Any]) -> dict[str, Any] | None:
    """The rank's slow steps the host caused: how many, their summed wait,
    and the rule (None: the trigger did not judge them)."""
    c = t.get("contention")
    if not isinstance(c, dict):
        return None
    return {
        "steps": int(c.get("steps", 0)),
        "waited_ms": float(c.get("waited_ms") or 0.0),
        "rule": str(c.get("rule", "")),
        "error": None if c.get("error") is None else str(c["error"]),
    }


def triggers_report(data: _data.RunData) -> dict[str, Any] | None:
    """None when no rank ran with triggers."""
    per_rank = []
    for rank, t in sorted(_records(data).items()):
        per_rank.append(
            {
                "rank": int(rank),
                "signal": t.get("signal"),
                "anomalies": [_anomaly(a) for a in t.get("anomalies", [])],
                "contention": _contention(t),
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
