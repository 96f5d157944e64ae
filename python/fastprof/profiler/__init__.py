"""The training-loop profiler's building blocks (issue #10).

``fastprof.profiler.schedule`` (also ``fastprof.schedule``): which state each
step is in. The ``Profiler`` that drives recording, ``torch.profiler``
windows and memory snapshots from a schedule comes later.
"""

from fastprof.profiler import schedule

__all__ = ["schedule"]
