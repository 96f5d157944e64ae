"""Exits as a driver: while the Profiler runs, the interpreter's exit and
SIGTERM close it first (:mod:`fastprof.profiler.exits`)."""

from __future__ import annotations

from typing import Any

from fastprof._loop_api import ExitHost
from fastprof.profiler import exits
from fastprof.profiler.driver import Driver

__all__ = ["ExitsDriver"]


class ExitsDriver(Driver):
    def __init__(self, prof: ExitHost) -> None:
        self.prof = prof

    def start(self, steps: Any) -> None:
        exits.register(self.prof)

    def release(self) -> None:
        exits.unregister(self.prof)
