"""The training-loop profiler.

* :class:`~fastprof.profiler.loop.Profiler` (also ``fastprof.Profiler``): step
  and loader timing in any loop, a schedule driving ``torch.profiler``
  windows, one unified trace per run.
* :mod:`~fastprof.profiler.schedule` (also ``fastprof.schedule``): which state
  each step is in.
* :class:`~fastprof.profiler.torch_windows.TorchWindows` (also
  ``fastprof.TorchWindows``): what the torch.profiler windows record and where
  they are written.
"""

from fastprof.profiler import schedule
from fastprof.profiler.loop import Profiler
from fastprof.profiler.torch_windows import TorchWindows

__all__ = ["Profiler", "TorchWindows", "schedule"]
