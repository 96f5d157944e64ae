"""Profiling for long jobs, left on (issue #17): triggers (signals, trigger
files, slow steps, exceptions, OOM, SIGTERM) for flight-recorder dumps and
torch.profiler captures agreed across ranks (:mod:`.triggers`). ``fastprof
run``'s machinery, a script profiled with no change to it, is
:mod:`fastprof.run`."""

from fastprof.always_on.triggers import Triggers

__all__ = ["Triggers"]
