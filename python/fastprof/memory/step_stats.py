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

The CUDA statistics have a budget, as the RSS reading has in the core: they
are read at a step's end only when the time since the previous reading is at
least :data:`CUDA_BUDGET_FACTOR` times what a reading costs (a moving average
of measured readings, in the training thread's own CPU time: a reading the
scheduler preempted did not cost the preemption, and on a loaded machine one
such reading stretched the gap past the next steps), so they take at most
~1% of the training thread.
Measured on an H200 with torch 2.11: ``torch.cuda.memory_stats()`` cost
193 us (it flattens and sorts ~150 keys in Python), 1.3% of a 15 ms step;
the nested dictionary it is built from is read here instead. A step longer
than the gap gets its own reading; shorter steps share one, and the peaks
are then those since the previous reading.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from fastprof import _core
from fastprof.recording.budget import moving_cost
from fastprof.recording.names import CUDA_COUNTERS, RSS_COUNTER

#: A CUDA reading is taken only when this many readings' cost has passed
#: since the previous one (1%).
CUDA_BUDGET_FACTOR = 100


def _path(key: str) -> tuple[str, ...]:
    """``allocated_bytes.all.current`` -> its path in the nested statistics."""
    return tuple(key.split("."))


def _pick(nested: dict[str, Any], path: tuple[str, ...]) -> float:
    v: Any = nested
    for k in path:
        if not isinstance(v, dict):
            return 0.0
        v = v.get(k, 0)
    return float(v) if isinstance(v, (int, float)) else 0.0


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
        self._paths = [_path(key) for key, _ in CUDA_COUNTERS]
        #: perf_counter_ns at the previous reading's end, its average CPU cost, the gap.
        self._last_ns = 0
        self._cost_ns = 0.0
        self._gap_ns = 0.0
        self.cuda_readings_skipped = 0

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
        core calls this at every step's end once CUDA is available), within
        the budget (see the module's doc)."""
        t0 = time.perf_counter_ns()
        if t0 - self._last_ns < self._gap_ns:
            self.cuda_readings_skipped += 1
            return
        cuda = self._torch.cuda
        if not cuda.is_initialized():
            return
        c0 = time.thread_time_ns()
        nested = cuda.memory_stats_as_nested_dict()
        for path, name in zip(self._paths, self._names, strict=True):
            _core.counter(name, _pick(nested, path))
        cuda.reset_peak_memory_stats()
        self._last_ns = time.perf_counter_ns()
        self._cost_ns = moving_cost(self._cost_ns, float(time.thread_time_ns() - c0), self.cuda_steps)
        self._gap_ns = CUDA_BUDGET_FACTOR * self._cost_ns
        self.cuda_steps += 1
        self.cuda = "per step (within a 1% budget: short steps share a reading)"

    def summary(self) -> dict[str, Any]:
        """``profiler.json``'s ``memory``: what was recorded, or why not."""
        return {
            "per_step": self.enabled,
            "host": self.host,
            "cuda": self.cuda,
            "cuda_steps": self.cuda_steps,
            "cuda_readings_skipped": self.cuda_readings_skipped,
            "cuda_reading_us": round(self._cost_ns / 1e3, 2),
            "counters": [RSS_COUNTER, *(name for _, name in CUDA_COUNTERS)],
        }
