"""Profiling for long jobs, left on: :mod:`fastprof.always_on.run` is
``fastprof run``'s machinery (a script profiled with no change to it)."""
