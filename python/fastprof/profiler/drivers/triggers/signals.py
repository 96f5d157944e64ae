"""The trigger signal (SIGUSR2 by default): installed beside the job's own
handler, which is still called after fastprof's; given back at the end (a
signal the job left at its default stays harmless: ``fastprof._signals``).
The handler only counts and sets the core's flag: the step boundary does
the work."""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from typing import Any

from fastprof import _core, _signals
from fastprof._core import FastprofWarning
from fastprof.profiler.drivers.triggers.state import Board

__all__ = ["SignalTrigger"]


class SignalTrigger:
    def __init__(self, board: Board) -> None:
        self.board = board
        self.count = 0  # signals seen (coalesced into one request per boundary)
        self.name: str | None = None
        self._previous: Any = None
        self._installed: int | None = None

    @property
    def installed(self) -> int | None:
        return self._installed

    def take(self) -> int:
        """The signals seen since the last boundary."""
        n, self.count = self.count, 0
        return n

    def install(self) -> None:
        notes = self.board.notes
        num = self.board.cfg.signal_number
        if num is None:
            return
        if threading.current_thread() is not threading.main_thread():
            notes.append(f"{signal.Signals(num).name} not handled: the Profiler started off the main thread")
            return
        try:
            current = _signals.job_disposition(num)
        except (ValueError, OSError) as e:
            notes.append(f"{signal.Signals(num).name} not handled: {e}")
            return
        name = signal.Signals(num).name
        if current is None or current is signal.SIG_IGN:
            why = "is handled outside Python" if current is None else "is ignored by the job (SIG_IGN)"
            notes.append(f"{name} {why}: left alone; use the trigger file (fastprof trigger)")
            warnings.warn(f"fastprof: {name} {why}; triggers use the trigger file only", FastprofWarning, stacklevel=4)
            return
        try:
            signal.signal(num, self._on_signal)
        except (ValueError, OSError) as e:
            notes.append(f"{name} not handled: {e}")
            return
        self._previous, self._installed = current, num
        self.name = name
        if callable(current) and current is not signal.default_int_handler:
            notes.append(f"{name} had a handler; it is still called after fastprof's")

    def uninstall(self) -> None:
        num = self._installed
        if num is None or threading.current_thread() is not threading.main_thread():
            return
        # The job's handler goes back as it was; the default does not (a
        # trigger sent while the job finishes would kill it): the signal
        # stays harmless for the rest of the process (fastprof._signals).
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(num) == self._on_signal:
                _signals.give_back(num, self._previous)
        self._installed = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only record and flag: the step boundary does the work.
        self.count += 1
        if not self.board.stopping:
            _core._attention_set()
        previous = self._previous
        if callable(previous) and previous is not signal.default_int_handler:
            _signals.call_job(previous, signum, frame)


# fastprof's own handler: never deferred nor taken for the job's (fastprof._signals).
_signals.own(SignalTrigger._on_signal)
