"""DataLoader workers as a driver: each pass over a loader with workers
records the workers' fetches in their own processes
(:mod:`fastprof.profiler.workers`); persistent workers, which outlive the
loop, are shut down at the close so that their traces are complete before
the merge."""

from __future__ import annotations

import warnings
import weakref
from typing import Any

from fastprof._core import FastprofWarning
from fastprof._loop_api import LoopHost
from fastprof.profiler import workers
from fastprof.profiler.driver import Closing, Driver

__all__ = ["WorkersDriver"]


def _failed(where: str, e: BaseException) -> None:
    warnings.warn(f"fastprof: Profiler {where} failed: {type(e).__name__}: {e}", FastprofWarning, stacklevel=4)


class WorkersDriver(Driver):
    def __init__(self, prof: LoopHost) -> None:
        self.prof = prof
        self.persistent: weakref.WeakSet[Any] = weakref.WeakSet()

    def instrument(self, iterable: Any, name: str) -> None:
        """A pass over ``iterable`` begins: its workers record (when it has any)."""
        if getattr(iterable, "num_workers", 0) in (0, None) or not self.prof.running:
            return
        try:
            o = self.prof.recorder.options
            workers.instrument(
                iterable,
                name=name,
                rank_dir=self.prof.rank_dir,
                run_name=o.run_name,
                rank=o.rank,
                world_size=o.world_size,
                disk=(int(o.segment_size), int(o.max_disk), int(o.keep_segments)),
            )
            if getattr(iterable, "persistent_workers", False):
                self.persistent.add(iterable)
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            _failed("loader worker instrumentation", e)

    def finish(self, closing: Closing) -> None:
        # A later pass over the loader starts new workers (torch does when
        # the loader has no live iterator).
        for loader in list(self.persistent):
            it = getattr(loader, "_iterator", None)
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is None:
                continue
            try:
                shutdown()
                loader._iterator = None
            except Exception as e:  # noqa: BLE001
                _failed("stopping persistent DataLoader workers", e)
        self.persistent.clear()
