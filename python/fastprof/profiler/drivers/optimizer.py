"""Steps inferred from ``optimizer.step()``: while the loop never says where
its steps end (no :meth:`Profiler.step` nor ``begin_step``), each optimizer
step on the training thread ends one (torch's global step post hook)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from fastprof._loop_api import RunHost
from fastprof.profiler.driver import Driver

__all__ = ["OptimizerStepsDriver"]


class OptimizerStepsDriver(Driver):
    def __init__(self, prof: RunHost) -> None:
        self.prof = prof
        self.handle: Any = None
        self.steps: Any = None
        self.thread_id: int | None = None

    def start(self, steps: Any) -> None:
        self.steps = steps
        self.thread_id = threading.get_ident()
        # torch imports torch.optim.optimizer with itself (its package
        # attribute is deleted); without torch, no optimizer steps.
        optim = sys.modules.get("torch.optim.optimizer")
        register = getattr(optim, "register_optimizer_step_post_hook", None)
        if register is not None:
            self.handle = register(self._on_step)

    def _on_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not self.prof.running or threading.get_ident() != self.thread_id or self.steps.explicit:
            return
        self.prof.steps_by_optimizer += 1
        self.steps.optimizer_step()

    def unhook(self) -> None:
        """The hook goes (``fastprof run`` installs its own in its place, so
        each optimizer step counts once; the loop said where its steps end)."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
