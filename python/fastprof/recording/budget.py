"""The moving cost behind fastprof's per-step budgets: a reading (CUDA
allocator statistics, the anatomy's CUDA events) is taken only when the time
since the previous one is a set multiple of what one costs."""

from __future__ import annotations

#: A higher measurement counts at most this many times the average.
CLAMP = 4.0


def moving_cost(avg: float, cost: float, seen: int) -> float:
    """The moving average after measurement number ``seen`` (0-based) of
    ``cost``. The first pays first-call costs (a lazily made pool, cold code:
    1.2 ms against 20-40 us after, measured for the anatomy's events) and is
    left out (0: the next reading is taken at once). A higher one counts at
    most :data:`CLAMP` times the average (a preempted one must not stop the
    readings for long); a lower one pulls the average halfway down."""
    if seen == 0:
        return 0.0
    if seen == 1 or avg <= 0:
        return cost
    if cost < avg:
        return 0.5 * (avg + cost)
    return 0.8 * avg + 0.2 * min(cost, CLAMP * avg)
