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
A run on object storage (its rank folder sent and gone) writes none, and
neither does a Profiler whose ``rank_summary`` option is off
(``rank_summary=False``, ``FASTPROF_RANK_SUMMARY=0``): ``drivers/build.py`` then
makes no such driver, the close waits for nothing, and a report reads the
segments."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

from fastprof._core import FastprofWarning
from fastprof._loop_api import RunEndHost
from fastprof.profiler.driver import Closing, Driver

__all__ = ["SUMMARY_SIGTERM_S", "SUMMARY_TIMEOUT_S", "SummaryDriver"]

#: The most a normal end waits for the rank's summary.
SUMMARY_TIMEOUT_S = 300.0
#: ... and an abrupt one (SIGTERM, exit).
SUMMARY_SIGTERM_S = 5.0
#: The module a rank's summary is made by (run with ``-m``).
SUMMARY_MODULE = "fastprof.reports.rank_summary"


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
