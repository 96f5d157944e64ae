"""``gate_spans=True``: the recorder is paused outside the steps a window
records (warm-up and active), as Composer's profiler records."""

from __future__ import annotations

from fastprof.profiler.driver import Closing, Driver
from fastprof.profiler.schedule import RECORDING, Action
from fastprof.recording.recorder import Recorder

__all__ = ["GateDriver"]


class GateDriver(Driver):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.paused = False

    def begin(self, action: Action, batch: int, epoch: int, fetched: bool) -> bool:
        gate = action not in RECORDING
        if gate != self.paused and self.recorder.active:
            (self.recorder.pause if gate else self.recorder.resume)()
            self.paused = gate
        return False

    def close(self, closing: Closing) -> None:
        self._open()

    def step_aside(self) -> None:
        self._open()

    def _open(self) -> None:
        if self.paused and self.recorder.active:
            self.recorder.resume()
            self.paused = False
