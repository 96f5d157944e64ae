"""What the parts of the triggers share: the run's place, the records that
``triggers.json`` lists (requests, notes, what was coalesced), the queue of
requests waiting for the next step boundary, and the writing of
``triggers.json`` itself. The signal handler and the poller thread only
queue and set the core's flag; the training thread takes the queue."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastprof import _core
from fastprof.memory._files import write_atomic
from fastprof.profiler.drivers.triggers.config import STATE_FILE, Triggers

__all__ = ["Board"]


class Board:
    def __init__(self, cfg: Triggers, rank: int, world: int, rank_dir: Path, run_dir: Path) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world = world
        self.rank_dir = rank_dir
        self.run_dir = run_dir
        self.notes: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.coalesced = 0
        #: The Profiler is closing: no more requests are taken.
        self.stopping = False
        self.lock = threading.Lock()
        #: Wakes the poller before its next look (a proposal to post, an export to say).
        self.wake = threading.Event()
        self._queue: list[dict[str, Any]] = []  # requests from the handler, the poller
        self._state_lock = threading.RLock()  # a signal may land while the thread writes
        #: triggers.json's content (the driver's summary).
        self.summary: Callable[[], dict[str, Any]] = dict

    def queue_request(self, req: dict[str, Any], flag: bool = True) -> None:
        """A request for the next step boundary (``flag``: set the core's flag for it)."""
        with self.lock:
            if len(self._queue) < 16:
                self._queue.append(req)
            else:
                self.coalesced += 1
        if flag and not self.stopping:
            _core._attention_set()

    def take_queue(self) -> list[dict[str, Any]]:
        with self.lock:
            queued, self._queue = self._queue, []
        return queued

    def warn_once(self, text: str) -> None:
        if text in self.notes:
            return
        if len(self.notes) < 50:
            self.notes.append(text)
        print(f"fastprof: {text}", file=sys.stderr, flush=True)

    def under_state_lock(self) -> Any:
        """The lock triggers.json is written under (a flight dump's thread
        updates its record under it, never while it is being written)."""
        return self._state_lock

    def write_state(self) -> None:
        """Rewrite triggers.json (from the training thread, the poller and a
        flight dump's thread: the newest summary is taken under the lock)."""
        try:
            with self._state_lock:
                for _ in range(3):
                    try:
                        text = json.dumps(self.summary(), indent=1, default=str)
                        break
                    except RuntimeError:  # a record grew under the encoder (another thread): again
                        continue
                else:
                    return
                write_atomic(self.rank_dir / STATE_FILE, text)
        except OSError as e:
            if not any("could not write" in n for n in self.notes):
                self.notes.append(f"could not write {self.rank_dir / STATE_FILE}: {e}")
