"""``fastprof run``'s Profiler as a host: it infers the steps of a script
that does not say them, until the script starts a Profiler of its own on the
same recorder; that one takes the loop (its steps are the run's) and the
host only ends the run (the rank's done marker, the merge) at its close."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fastprof._process import PROCESS
from fastprof.profiler.drivers import summary
from fastprof.recording.recorder import set_run_host

__all__ = ["Hosting"]


class Hosting:
    """One Profiler's side of it: as the host, the Profilers that took its
    loop; as a script's Profiler, the host it takes the loop from."""

    def __init__(self, prof: Any) -> None:
        self.prof = prof
        #: What undoes the host's inferred steps when a script's Profiler takes the loop.
        self.on_step_aside: Callable[[], None] | None = None
        #: The script's Profilers that took the loop (the host's).
        self.successors: list[Any] = []

    def host(self, on_step_aside: Callable[[], None]) -> None:
        self.on_step_aside = on_step_aside
        PROCESS.run_host = self.prof
        set_run_host(self.prof.recorder)  # a Recorder the script starts joins this one

    def running_host(self) -> Any:
        """fastprof run's Profiler, when this is a script's Profiler on its
        recorder and it still runs."""
        host = PROCESS.run_host
        if host is not None and host is not self.prof and host.recorder is self.prof.recorder and host.running:
            return host
        return None

    def step_aside(self, other: Any, stand_down: Callable[[], None]) -> None:
        """The script started its own Profiler ``other``: ``stand_down()``
        ends what the host records (once)."""
        self.successors.append(other)
        # The host writes the rank's summary as the script's Profiler says (#38).
        summary.follow(self.prof, other._options.rank_summary)
        if len(self.successors) > 1:
            return
        inferred = self.prof.batch
        try:
            if self.on_step_aside is not None:
                self.on_step_aside()
            stand_down()
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            print(f"fastprof run: handing the loop to the script's Profiler: {type(e).__name__}: {e}", file=sys.stderr)
        print(
            "fastprof run: the script starts its own fastprof.Profiler: its steps are the run's "
            f"({inferred} inferred before it)",
            file=sys.stderr,
            flush=True,
        )

    def release(self) -> None:
        if PROCESS.run_host is self.prof:
            PROCESS.run_host = None
            set_run_host(None)
