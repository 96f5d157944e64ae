"""The Profiler's drivers, made from its resolved options, in the order it
calls them (see :mod:`fastprof.profiler.drivers`)."""

from __future__ import annotations

from typing import Any

from fastprof.profiler.driver import Driver
from fastprof.profiler.drivers.anatomy import AnatomyDriver
from fastprof.profiler.drivers.clocks import ClockDriver
from fastprof.profiler.drivers.exits import ExitsDriver
from fastprof.profiler.drivers.gate import GateDriver
from fastprof.profiler.drivers.hang import HangDriver
from fastprof.profiler.drivers.memory import MemoryDriver
from fastprof.profiler.drivers.optimizer import OptimizerStepsDriver
from fastprof.profiler.drivers.outputs import OutputsDriver
from fastprof.profiler.drivers.summary import SummaryDriver
from fastprof.profiler.drivers.triggers.driver import TriggerDriver
from fastprof.profiler.drivers.windows import WindowsDriver
from fastprof.profiler.drivers.workers import WorkersDriver
from fastprof.profiler.options import Resolved

__all__ = ["Absent", "build"]


class Absent(Driver):
    """A feature turned off: only its entry in ``profiler.json``."""

    def __init__(self, key: str, value: Any) -> None:
        self.key = key
        self.value = value

    def account(self) -> Any:
        return self.value


def build(prof: Any, f: Resolved) -> list[Driver]:
    """The drivers of ``prof`` (a :class:`fastprof.Profiler`), in order."""
    out: list[Driver] = [ExitsDriver(prof)]
    if f.gate_spans:
        out.append(GateDriver(prof.recorder))
    windows = WindowsDriver(prof, f.torch, f.merge_timeout, prof.window_saved) if f.torch is not None else None
    out.append(windows or Absent("torch", None))
    out.append(ClockDriver(prof.recorder, f.sync_clocks))
    out.append(OptimizerStepsDriver(prof))
    anatomy = AnatomyDriver() if f.anatomy else None
    out.append(anatomy or Absent("anatomy", "off (anatomy=False)"))
    out.append(MemoryDriver(prof, f.schedule, f.memory_stats, f.memory_history, f.model, f.model_depth))
    out.append(WorkersDriver(prof))
    triggers = f.triggers
    out.append(TriggerDriver(triggers, prof, windows, anatomy) if triggers is not None else Absent("triggers", None))
    out.append(HangDriver(prof, f.hang_timeout, f.hang_action))
    out.append(OutputsDriver(prof))
    if f.rank_summary:
        out.append(SummaryDriver(prof))  # after the merge: the rank's summary (#38, item 2)
    return out
