"""Idle time of a resumed run: ``source.resumed`` of report.json, one entry
per stretch a rank recorded nothing between two recordings appended into
one run directory (``resume=True``, ``FASTPROF_RESUME=1``), and the line the
terminal and the page print for each.

A resumed recording says it at its start with one sample of the counter
``fastprof.resume_gap [s]`` (:data:`fastprof.recording.names.RESUME_GAP`): the
seconds since its rank's earlier recording last wrote. The stretch is idle
time, not the run's: it is in no step (the steps are spans, and none is open
across it), and the time report's ``% wall`` leaves it out of the wall."""

from __future__ import annotations

from typing import Any

from fastprof.recording.names import RESUME_GAP
from fastprof.reports import data as _data


def idle_stretches(data: _data.RunData, rank: int) -> list[tuple[int, int]]:
    """The rank's idle stretches (start, end epoch ns), by start: each gap
    sample ends one that began that many seconds earlier, and none begins
    before the rank's first event (an earlier recording deleted since)."""
    ts, seconds = data.counter(RESUME_GAP, rank)
    if not len(ts):
        return []
    first = data.wall(rank)[0]
    out = []
    for t, s in zip(ts.tolist(), seconds.tolist(), strict=True):
        if not s > 0:  # NaN, a negative or zero value: nothing idle to show
            continue
        start = max(first, t - round(s * 1e9))
        if start < t:
            out.append((start, t))
    return sorted(out)


def idle_ns(data: _data.RunData, rank: int, within: tuple[int, int]) -> int:
    """Nanoseconds of the rank's idle stretches inside ``within`` (start, end)."""
    lo, hi = within
    total, reach = 0, lo
    for start, end in idle_stretches(data, rank):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def resumed_report(data: _data.RunData) -> list[dict[str, Any]]:
    """Per rank and stretch: its start and end as epoch ns and as seconds
    from the report's wall start, and its length; empty for a run recorded
    in one go."""
    w0 = data.wall()[0]
    out = []
    for rank in data.ranks:
        for start, end in idle_stretches(data, rank):
            out.append(
                {
                    "rank": rank,
                    "start_ns": start,
                    "end_ns": end,
                    "seconds": (end - start) / 1e9,
                    "start_s": (start - w0) / 1e9,
                    "end_s": (end - w0) / 1e9,
                }
            )
    return out


def describe(e: dict[str, Any]) -> str:
    """One line for an entry of :func:`resumed_report`."""
    return (
        f"rank {e['rank']} recorded nothing for {e['seconds']:.1f} s "
        f"(+{e['start_s']:.1f} s to +{e['end_s']:.1f} s of the report wall time) before a resumed recording: "
        "idle time, in no step and left out of % wall"
    )
