"""Hang diagnosis (issue #37): a watchdog off the training thread, evidence
per rank, one verdict across ranks. See :mod:`.driver` and
:mod:`.verdict`."""

from fastprof.profiler.drivers.hang.config import HANG_EXIT_STATUS, HangConfig
from fastprof.profiler.drivers.hang.driver import HangDriver

__all__ = ["HANG_EXIT_STATUS", "HangConfig", "HangDriver"]
