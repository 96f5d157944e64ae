"""The clock syncs across ranks: one at start (enough to merge), one at a
normal end (the drift), each an instant on the timeline and an entry of
``profiler.json``'s ``clock_sync``."""

from __future__ import annotations

import warnings
from typing import Any

from fastprof import _core, _dist
from fastprof._core import FastprofWarning
from fastprof.profiler.driver import Closing, Driver
from fastprof.recording.names import CLOCK_SYNC
from fastprof.recording.recorder import Recorder

__all__ = ["END_SYNC_TIMEOUT_S", "ClockDriver"]

#: Seconds the closing clock sync may wait for the other ranks (the start sync
#: alone is enough to merge; a rank that never arrives costs this, not 60 s).
END_SYNC_TIMEOUT_S = 5.0


class ClockDriver(Driver):
    key = "clock_sync"

    def __init__(self, recorder: Recorder, enabled: bool) -> None:
        self.recorder = recorder
        self.enabled = enabled
        self.syncs: dict[str, Any] = {}
        self.first: _dist.ClockSync | None = None

    def start(self, steps: Any) -> None:
        if self.enabled:
            self.sync("start")

    def once(self, phase: str) -> None:
        """The sync of ``phase``, unless syncs are off or it is done."""
        if self.enabled and phase not in self.syncs:
            self.sync(phase)

    def close(self, closing: Closing) -> None:
        if not self.enabled:
            return
        if closing.reason is None:
            self.sync("end", timeout=END_SYNC_TIMEOUT_S)
        elif _dist.process_group() is not None:
            # A way out runs no collective: the start sync is enough to merge.
            self.syncs["end"] = {"skipped": closing.reason}

    def sync(self, phase: str, timeout: float = 60.0) -> None:
        dist = _dist.process_group()
        if dist is None or dist.get_world_size() < 2:
            return
        try:
            sync = _dist.sync_clocks(timeout=timeout)
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            warnings.warn(
                f"fastprof: Profiler clock sync ({phase}) failed: {type(e).__name__}: {e}",
                FastprofWarning,
                stacklevel=4,
            )
            return
        entry = sync.to_dict()
        if phase == "start":
            self.first = sync
        elif self.first is not None and sync.taken_ns > self.first.taken_ns:
            entry["drift_ppm"] = _dist.drift_ppm(self.first, sync)
        self.syncs[phase] = entry
        if self.recorder.active:
            _dist.apply_to_recorder(self.recorder, sync)
            _core.instant(CLOCK_SYNC, phase=phase, **entry)

    def account(self) -> Any:
        return self.syncs
