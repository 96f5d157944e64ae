"""The per-step CUDA statistics' budget (fastprof.memory.step_stats). There
is no CUDA here, so a small stand-in for ``torch.cuda`` whose reading costs a
known time drives the real StepMemory; gpu_check's step_memory item runs it on
a GPU. Readings are taken only when 100 readings' cost has passed since the
previous one; longer steps each get one."""

from __future__ import annotations

import time
from types import SimpleNamespace

from fastprof.memory.step_stats import CUDA_BUDGET_FACTOR, StepMemory


class SlowCuda:
    """torch.cuda's part StepMemory uses; a reading busy-waits ``cost_s``."""

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s
        self.reads = 0
        self.resets = 0

    def is_initialized(self) -> bool:
        return True

    def memory_stats_as_nested_dict(self) -> dict:
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        self.reads += 1
        return {"allocated_bytes": {"all": {"current": 5, "peak": 7}}, "num_ooms": 0}

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1


def run(step_s: float, steps: int, cost_s: float = 0.0002) -> tuple[StepMemory, SlowCuda]:
    sm = StepMemory(True)
    cuda = SlowCuda(cost_s)
    sm._torch = SimpleNamespace(cuda=cuda)
    for _ in range(steps):
        end = time.perf_counter() + step_s
        while time.perf_counter() < end:
            pass
        sm.on_step_end()
    return sm, cuda


def test_steps_longer_than_the_gap_each_get_a_reading() -> None:
    # gap = 100 x 0.2 ms = 20 ms; steps of 30 ms. A reading's cost is the
    # thread's CPU time: a preempted one is not longer (beside a CPU hog, in
    # wall time, one stretched the gap past the next steps: 8 readings of 15).
    sm, cuda = run(step_s=0.03, steps=15)
    assert cuda.reads == cuda.resets == sm.cuda_steps
    assert cuda.reads >= 13 and sm.cuda_readings_skipped == 15 - cuda.reads


def test_short_steps_share_readings_within_the_budget() -> None:
    # The gap between readings is kept in wall time (perf_counter): the loop's
    # time is measured so too (in thread time a loaded machine shrinks it, not
    # the gap, and the readings looked over budget).
    t0 = time.perf_counter()
    sm, cuda = run(step_s=0.0002, steps=400)
    spent = time.perf_counter() - t0
    assert 1 <= cuda.reads < 400 and sm.cuda_readings_skipped == 400 - cuda.reads
    # The readings' own time against the loop's: about 1/CUDA_BUDGET_FACTOR
    # of it (x3 for the clamp and the first reading, which is always taken).
    assert cuda.reads * cuda.cost_s <= 3 * spent / CUDA_BUDGET_FACTOR + cuda.cost_s
    s = sm.summary()
    assert s["cuda_steps"] == cuda.reads and s["cuda_readings_skipped"] == 400 - cuda.reads
