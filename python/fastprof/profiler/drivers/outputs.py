"""The run's end as a driver: ``profiler.json``, then (when this Profiler
ends the run) the rank's done marker, the merge and the upload
(:mod:`fastprof.profiler.outputs`)."""

from __future__ import annotations

import contextlib

from fastprof._loop_api import RunEndHost
from fastprof.profiler import outputs
from fastprof.profiler.driver import Closing, Driver

__all__ = ["OutputsDriver"]


class OutputsDriver(Driver):
    def __init__(self, prof: RunEndHost) -> None:
        self.prof = prof

    def stopped(self, closing: Closing) -> None:
        if not closing.handed_over:
            outputs.write_summary(self.prof)
        else:  # written while this recorder still recorded: what its disk cap deleted is known now
            outputs.update_rotation(self.prof)
        if not closing.hosted:  # under fastprof run, its Profiler says the rank is done, once recorded
            outputs.finish(self.prof, wait=closing.reason is None, merged=closing.reason != "SIGTERM")

    def release(self) -> None:
        prof = self.prof
        spool = prof.recorder.spool
        if prof.owns_recorder and spool is not None and spool.result is None and not prof.recorder.active:
            # The end above failed before its upload: the files still go, or are named.
            with contextlib.suppress(Exception):
                spool.finish()
