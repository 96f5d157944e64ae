"""The operator row both readers of operator figures build (profiler object, trace file)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The name torch gives allocator records (and, in key_averages, the records no operator encloses).
MEMORY_EVENT = "[memory]"
# Distinct input shapes listed per operator, most frequent first.
SHAPES_PER_ROW = 5


@dataclass
class OperatorRow:
    """One operator (one ``key_averages()`` entry); memory in bytes, times in µs.

    ``self_*_memory`` is the net change of memory owned by the operator itself
    (allocated minus freed, children excluded); ``*_memory`` includes its
    children. ``*_allocated`` / ``*_freed`` split the self figure (both >= 0;
    ``None`` when torch did not expose the records). ``input_shapes``: with
    ``group_by_input_shape`` the row's one shape list; otherwise the most
    frequent distinct shape lists with their counts, when shapes were recorded.
    """

    name: str
    count: int
    self_cpu_memory: int
    cpu_memory: int
    self_device_memory: int
    device_memory: int
    cpu_allocated: int | None
    cpu_freed: int | None
    device_allocated: int | None
    device_freed: int | None
    self_cpu_time_us: float
    cpu_time_us: float
    self_device_time_us: float
    device_time_us: float
    input_shapes: Any = None
