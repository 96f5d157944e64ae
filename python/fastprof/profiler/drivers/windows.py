"""The torch.profiler windows as a driver: each step's action (the
schedule's, merged with a triggered capture by the Profiler's plan) goes to
the window mechanics (:class:`fastprof.profiler.torch_windows.WindowDriver`),
whose exports count under the recorder's disk cap as they end."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from fastprof._core import FastprofWarning
from fastprof._loop_api import TriggerHost
from fastprof.profiler.driver import Closing, Driver, first_of
from fastprof.profiler.exits import SIGNAL_EXPORT_WAIT_S
from fastprof.profiler.schedule import Action
from fastprof.profiler.torch_windows import TorchWindows, WindowDriver, WindowRecord

__all__ = ["WindowsDriver"]


class WindowsDriver(Driver):
    """``Profiler(torch=TorchWindows(...))``: a torch.profiler window over the
    steps the plan records."""

    key = "torch"

    def __init__(
        self, prof: TriggerHost, cfg: TorchWindows, merge_timeout: float, on_saved: Callable[[], None]
    ) -> None:
        self.prof = prof
        self.cfg = cfg
        self.merge_timeout = merge_timeout
        #: Told once a window's export ended (the triggers answer with it).
        self.on_saved = on_saved
        self.windows: WindowDriver | None = None

    def prepare(self) -> None:
        rec = self.prof.recorder
        self.windows = WindowDriver(
            self.cfg,
            self.prof.run_dir,
            self.prof.format_variables(),
            compression_level=int(rec.options.compression_level),
            on_saved=self._saved,
            gzip_from=rec.gzip_from,
        )
        if not rec.options.resume:
            # A resumed run appends: its windows take new names beside the
            # earlier run's (the export never overwrites).
            self.windows.check_folder()

    @property
    def live(self) -> bool:
        return self.windows is not None and bool(self.windows.live)

    def begin(self, action: Action, batch: int, epoch: int, fetched: bool) -> bool:
        if self.windows is None:
            return False
        if not fetched:
            return True
        # torch's ProfilerStep#N begins last, right before fastprof's step N.
        self.windows.begin(action, batch, epoch)
        return False

    def fetch(self, action: Action, batch: int, epoch: int) -> bool:
        if self.windows is None:
            return False
        self.windows.begin(action, batch, epoch)
        return bool(self.windows.live)

    def end_annotation(self) -> None:
        # fastprof's step N was just recorded: torch's ProfilerStep#N, which
        # began before it, ends right after it (so the step nests inside).
        if self.windows is not None:
            self.windows.end_annotation()

    def end(
        self, action: Action, epoch: int, batch: int, batch_in_epoch: int, closed: bool, with_schedule: bool
    ) -> None:
        if self.windows is not None:
            self.windows.end(action, epoch, batch, batch_in_epoch)

    def close(self, closing: Closing) -> None:
        if self.windows is not None:
            self.windows.close()

    def finish(self, closing: Closing) -> None:
        w = self.windows
        if w is None:
            return
        wait_s = min(self.merge_timeout, SIGNAL_EXPORT_WAIT_S) if closing.abrupt else self.merge_timeout
        done = w.wait(wait_s)
        if w.errors:
            warnings.warn(f"fastprof: {first_of(w.errors)}", FastprofWarning, stacklevel=5)
        if not done:
            warnings.warn(
                f"fastprof: torch window exports still running after {wait_s:g} s; the unified trace may miss them",
                FastprofWarning,
                stacklevel=5,
            )

    def step_aside(self) -> None:
        if self.windows is not None:
            self.windows.close()

    def _saved(self, window: WindowRecord) -> None:
        """On the exporter thread, a window's export ended: its files count
        under the recorder's disk cap (max_disk), and the triggers say at
        once that it is there (``fastprof trigger`` waits for it)."""
        # The trace's gzip was written within disk the cap held for it,
        # given back as the file counts (or, not written, only given back).
        held, window.held = window.held, 0
        rec = self.prof.recorder
        if window.saved:
            for p, release in ((window.path, held), (window.memory_timeline, 0)):
                if p and rec.count_file(p, "torch", release):
                    window.deleted = True  # larger than the cap leaves room for (its ledger says so)
        elif held and window.path:
            rec.count_file(window.path, "torch", held)
        self.on_saved()

    def records(self) -> list[WindowRecord]:
        return [] if self.windows is None else self.windows.windows

    def account(self) -> Any:
        w = self.windows
        if w is None:
            return None
        return {"config": repr(self.cfg), "failed": w.failed, "windows": [r.to_dict() for r in w.windows]}
