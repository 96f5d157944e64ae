"""Each rank summarises itself (issue #38, item 2): at the run's end, after
``outputs`` (``profiler.json``, the done marker, rank 0's merge), the rank
writes ``rank{R}/summary.fastprof`` from its own segments, in a process of its
own (``python -m fastprof.reports.rank_summary``): the report's code runs
outside the job's memory, and the profiler never imports the reports.

Off the step path: only at the close. A normal end gives it
:data:`SUMMARY_TIMEOUT_S`; an abrupt one (SIGTERM, the interpreter's exit)
:data:`SUMMARY_SIGTERM_S`, within the seconds a launcher leaves between
SIGTERM and SIGKILL (torchrun: 30 s), the process killed past it (then no
summary, and a report reads the rank's segments, as for a rank cut short).
A rank whose segments hold more than :data:`SUMMARY_MAX_BYTES` of gzip
(a long run: ~2.7 M steps of a bare loop) writes none either: its summary,
made by the report of those segments, would hold the job's end for
minutes and take GBs of memory beside it (the report of 10^7 steps: 310-409
s and 3.8 GB on a 2-core machine, past :data:`SUMMARY_TIMEOUT_S`, so it
would be killed with nothing to show);
the close says so, and a report reads the rank's segments.
A run on object storage (its rank folder sent and gone) writes none, and
neither does a Profiler whose ``rank_summary`` option is off
(``rank_summary=False``, ``FASTPROF_RANK_SUMMARY=0``): ``drivers/build.py`` then
makes no such driver, the close waits for nothing, and a report reads the
segments. Under ``fastprof run`` the host's Profiler writes the summary at its
close, as the script's own Profiler's option says once one takes the loop
(:func:`follow`: the script's argument, else the variable, else on)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from fastprof._core import FastprofWarning
from fastprof._loop_api import RunEndHost
from fastprof.profiler.driver import Closing, Driver
from fastprof.recording.names import LONG_RANK_BYTES, OPEN_SUFFIX, SEGMENT

__all__ = ["SUMMARY_MAX_BYTES", "SUMMARY_SIGTERM_S", "SUMMARY_TIMEOUT_S", "SummaryDriver", "follow"]

#: The most a normal end waits for the rank's summary.
SUMMARY_TIMEOUT_S = 300.0
#: ... and an abrupt one (SIGTERM, exit).
SUMMARY_SIGTERM_S = 5.0
#: The module a rank's summary is made by (run with ``-m``).
SUMMARY_MODULE = "fastprof.reports.rank_summary"
#: The most gzip a rank's segments may hold for it to summarise itself.
SUMMARY_MAX_BYTES = LONG_RANK_BYTES


class SummaryDriver(Driver):
    def __init__(self, prof: RunEndHost) -> None:
        self.prof = prof

    def stopped(self, closing: Closing) -> None:
        prof = self.prof
        if closing.hosted or not prof.owns_recorder:
            return  # fastprof run's Profiler ends the run: it writes the summary
        rank_dir = prof.rank_dir
        if not rank_dir.is_dir() or prof.recorder.spool is not None:
            return
        size = segments_size(rank_dir)
        if size > SUMMARY_MAX_BYTES:
            warnings.warn(
                f"fastprof: rank {prof.rank}'s summary was left out: its segments hold {size / 2**20:,.0f} MiB, "
                f"more than the {SUMMARY_MAX_BYTES >> 20} MiB a summary is made from at the job's end (it would "
                "take minutes and GBs of memory); a report reads its segments",
                FastprofWarning,
                stacklevel=2,
            )
            return
        budget = SUMMARY_SIGTERM_S if closing.abrupt else SUMMARY_TIMEOUT_S
        cmd = [sys.executable, "-m", SUMMARY_MODULE, str(rank_dir.parent), str(prof.rank)]
        run_name = prof.recorder.options.run_name
        if run_name:
            cmd.append(str(run_name))
        env = dict(os.environ)
        # The package this process runs (a source checkout's path included).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*sys.path, env.get("PYTHONPATH", "")) if p)
        try:
            done = subprocess.run(cmd, env=env, timeout=budget, capture_output=True, check=False)
        except subprocess.TimeoutExpired:
            warnings.warn(
                f"fastprof: rank {prof.rank}'s summary took more than {budget:g} s and was left out "
                "(a report reads its segments)",
                FastprofWarning,
                stacklevel=2,
            )
            return
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            warnings.warn(
                f"fastprof: rank {prof.rank}'s summary failed ({tail[0]}); a report reads its segments",
                FastprofWarning,
                stacklevel=2,
            )


def segments_size(rank_dir: Path) -> int:
    """Bytes of the rank's closed segments (``fastprof.<n>.json.gz``)."""
    total = 0
    for p in rank_dir.iterdir():
        if SEGMENT.match(p.name) and not p.name.endswith(OPEN_SUFFIX):
            try:
                total += p.stat().st_size
            except OSError:
                continue  # gone since listed (a retention cap)
    return total


def follow(host: Any, wanted: bool) -> None:
    """Under ``fastprof run``, the script's own Profiler took the loop from
    ``host`` (fastprof run's Profiler, which ends the run and writes the
    rank's summary): the host writes one at its close when the script's
    Profiler's ``rank_summary`` (``wanted``: its argument, else the
    variable, else on) says so, as the script's other options are the
    run's. The host gets a summary driver, or loses its own."""
    drivers = [d for d in host._drivers if not isinstance(d, SummaryDriver)]
    host._use([*drivers, SummaryDriver(host)] if wanted else drivers)
