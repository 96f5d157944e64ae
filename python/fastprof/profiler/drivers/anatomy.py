"""The step anatomy as a driver: where each step's time goes on the training
thread (:mod:`fastprof.profiler.anatomy` does the timing)."""

from __future__ import annotations

from typing import Any

from fastprof.profiler.anatomy import Anatomy
from fastprof.profiler.driver import Driver

__all__ = ["AnatomyDriver"]


class AnatomyDriver(Driver):
    key = "anatomy"

    def __init__(self) -> None:
        self.anatomy = Anatomy()
        self.running = False

    def start(self, steps: Any) -> None:
        # The step's number straight from the loop (no Python frame per phase).
        self.anatomy.follow(steps)
        self.running = True
        self.hook()

    def hook(self) -> None:
        """Hook torch's phases once torch is imported: at start, or when
        ``fastprof run`` sees torch imported later. Never raises."""
        if self.running:
            self.anatomy.start()

    def unhook(self) -> None:
        self.running = False
        self.anatomy.stop()

    def explain(self, step: int, excess: float | None = None) -> str | None:
        return self.anatomy.explain(step, excess)

    def account(self) -> Any:
        return self.anatomy.status
