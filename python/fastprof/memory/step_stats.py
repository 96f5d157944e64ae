"""Per-step memory statistics, cheap enough to leave on (issue #16).

At every step's end (quiet steps of the schedule included):

- the process's resident memory, ``mem.rss [B]``, read by the core's step
  loop from ``/proc/self/statm`` (a file kept open: one ``pread``, no psutil,
  no Python);
- once the job has initialised CUDA, the caching allocator's statistics
  (``torch.cuda.memory_stats`` of the current device) as ``mem.cuda.*``
  counters: allocated, reserved and active bytes now and their peaks since
  the previous step (the peaks are reset at each step's end), and the
  cumulative ``num_ooms`` and ``num_alloc_retries``.

Where CUDA is not used the reason is said once (``profiler.json``'s
``memory.cuda``); nothing per step is spent on it.
"""

from __future__ import annotations

import sys
from typing import Any

from fastprof import _core

#: The host counter, recorded by the core at each step's end.
RSS_COUNTER = "mem.rss [B]"

#: ``torch.cuda.memory_stats()`` key -> counter name.
CUDA_COUNTERS: tuple[tuple[str, str], ...] = (
    ("allocated_bytes.all.current", "mem.cuda.allocated [B]"),
    ("allocated_bytes.all.peak", "mem.cuda.allocated_peak [B]"),
    ("reserved_bytes.all.current", "mem.cuda.reserved [B]"),
    ("reserved_bytes.all.peak", "mem.cuda.reserved_peak [B]"),
    ("active_bytes.all.current", "mem.cuda.active [B]"),
    ("active_bytes.all.peak", "mem.cuda.active_peak [B]"),
    ("num_ooms", "mem.cuda.num_ooms"),
    ("num_alloc_retries", "mem.cuda.num_alloc_retries"),
)


class StepMemory:
    """The Profiler's per-step memory statistics (``memory_stats=True``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.host: str = "off (memory_stats=False)"
        self.cuda: str = "off (memory_stats=False)"
        self.cuda_steps = 0
        #: The step loop calls on_step_end (CUDA is there to read).
        self.hooked = False
        self._torch: Any = None
        self._names = [_core.name_id(name) for _, name in CUDA_COUNTERS] if enabled else []

    def start(self, steps: Any) -> None:
        """Turn the statistics on in the step loop ``steps`` (a
        ``_core._StepLoop``). Never raises."""
        if not self.enabled:
            return
        why = steps.record_rss(RSS_COUNTER)
        self.host = "per step" if why is None else f"unavailable: {why}"
        torch = sys.modules.get("torch")
        if torch is None:
            self.cuda = "unavailable: torch is not imported"
            return
        try:
            available = bool(torch.cuda.is_available())
        except Exception as e:  # noqa: BLE001 - a broken CUDA setup is a reason, not a crash
            self.cuda = f"unavailable: torch.cuda.is_available() raised {type(e).__name__}: {e}"
            return
        if not available:
            self.cuda = "unavailable: no CUDA device (torch.cuda.is_available() is False)"
            return
        self._torch = torch
        self.hooked = True
        self.cuda = "waiting for the job to initialise CUDA"
        steps.memory_hook(True)

    def on_step_end(self) -> None:
        """Record the CUDA allocator's statistics and reset its peaks (the
        core calls this at every step's end once CUDA is available)."""
        cuda = self._torch.cuda
        if not cuda.is_initialized():
            return
        stats = cuda.memory_stats()
        for (key, _), name in zip(CUDA_COUNTERS, self._names, strict=True):
            _core.counter(name, float(stats.get(key, 0)))
        cuda.reset_peak_memory_stats()
        self.cuda_steps += 1
        self.cuda = "per step"

    def summary(self) -> dict[str, Any]:
        """``profiler.json``'s ``memory``: what was recorded, or why not."""
        return {
            "per_step": self.enabled,
            "host": self.host,
            "cuda": self.cuda,
            "cuda_steps": self.cuda_steps,
            "counters": [RSS_COUNTER, *(name for _, name in CUDA_COUNTERS)],
        }
