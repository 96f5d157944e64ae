"""A rank's own summary of its run (issue #38, item 2): ``python -m
fastprof.reports.rank_summary RUN_DIR RANK [RUN_NAME]`` writes
``RUN_DIR/rank{RANK}/summary.fastprof`` from that rank's segments, made by the
report's own code (:func:`fastprof.reports.report.build_from` on the rank
alone) with the columns the cross-rank sections read
(:mod:`fastprof.reports.summaries`).

The Profiler's summary driver (``profiler/drivers/summary.py``) runs it in a
process of its own at the end of the run, after the recorder stopped: the
job's memory never holds the report's, and a SIGTERM's budget bounds it by
killing that process (no summary then: the report reads the segments)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from fastprof._core import __version__
from fastprof.reports import data as _data
from fastprof.reports.breakdown import step_breakdown
from fastprof.reports.report import build_from
from fastprof.reports.summaries import (
    FORMAT,
    VERSION,
    account_kept,
    breakdown_kept,
    columns_kept,
    names_of,
    pack,
    page_counters,
    segments_of,
    write,
)

__all__ = ["main", "summarize"]


def summarize(run_dir: Path, rank: int, run_name: str | None) -> dict[str, Any]:
    """The summary of ``rank`` of the local run ``run_dir``, from its own
    segments: its report alone (the report's default options), the kept
    columns, the rank's part of breakdown.csv and of the page's breakdown
    bars, and the counters the page plots, with the segments (names and
    sizes) it was made from."""
    segments = segments_of(run_dir / f"rank{rank}")
    data = _data.load_rank(run_dir, rank)
    with tempfile.TemporaryDirectory(prefix="fastprof-summary-") as tmp:
        # The breakdown the report reads, its rows written as a report
        # writes breakdown.csv: the rank's part of the run's file.
        csv = Path(tmp) / "breakdown.csv"
        data.breakdown = step_breakdown(data.inputs, csv=csv, keep_rows=False)
        breakdown = breakdown_kept(data.breakdown, csv)
    doc = build_from(data)
    triggers = doc.get("triggers")
    if triggers:  # its own (the report of one rank reads every rank's triggers.json)
        triggers["per_rank"] = [t for t in triggers.get("per_rank") or [] if t.get("rank") == rank]
    c = data.cols
    span_names, counter_names = columns_kept(c.names)
    ids = [i for i, n in enumerate(c.names) if n in span_names]
    rows = np.flatnonzero(data.name_mask(ids)[c.spans["name"]]) if ids else np.zeros(0, np.intp)
    rows = rows[np.lexsort((c.spans["ts"][rows], c.spans["name"][rows]))]
    cids = [i for i, n in enumerate(c.names) if n in counter_names]
    crows = np.flatnonzero(data.name_mask(cids)[c.counters["name"]]) if cids else np.zeros(0, np.intp)
    crows = crows[np.lexsort((c.counters["ts"][crows], c.counters["name"][crows]))]
    return {
        "format": FORMAT,
        "version": VERSION,
        "fastprof_version": __version__,
        "run_name": run_name,
        "rank": rank,
        "segments": segments,
        "profiler": account_kept(data.profiler.get(rank)),
        "wall": list(data.wall()),
        "report": doc,
        "breakdown": breakdown,
        "page_counters": page_counters(data, rank),
        "spans": {
            "names": names_of(c, c.spans["name"][rows]),
            "ts": pack(c.spans["ts"][rows]),
            "dur": pack(c.spans["dur"][rows]),
        },
        "counters": {
            "names": names_of(c, c.counters["name"][crows]),
            "ts": pack(c.counters["ts"][crows]),
            "value": pack(c.counters["value"][crows]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m fastprof.reports.rank_summary RUN_DIR RANK [RUN_NAME]", file=sys.stderr)
        return 2
    run_dir, rank = Path(args[0]), int(args[1])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        doc = summarize(run_dir, rank, args[2] if len(args) == 3 else None)
    write(run_dir / f"rank{rank}", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
