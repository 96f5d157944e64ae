"""Always-on profiling for long jobs (issue #17): triggers (signals, trigger
files, slow steps, exceptions, OOM, SIGTERM) for flight-recorder dumps and
torch.profiler captures agreed across ranks."""

from fastprof.always_on.triggers import Triggers

__all__ = ["Triggers"]
