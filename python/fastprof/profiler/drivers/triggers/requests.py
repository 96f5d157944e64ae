"""Trigger files and objects: ``<run>/TRIGGER`` and ``<run>/rank{R}/TRIGGER``
(``fastprof trigger`` writes them), and a URL run's trigger objects in the
store. Each is taken once (removed) and queued as a request. Read by the
poller thread (and at a signalled boundary, for ``fastprof trigger
--signal``), never blocking: only a regular file is opened."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastprof.profiler.drivers.triggers.config import REMOTE_POLL_S, TRIGGER_FILE, parse_request
from fastprof.profiler.drivers.triggers.state import Board

__all__ = ["TriggerFiles"]


class TriggerFiles:
    """``remote``: the store of a URL run (None for a local run);
    ``reads_run_file()``: whether this rank reads the run's own file (rank 0
    when the ranks agree through the process group's store, else each)."""

    def __init__(self, board: Board, remote: Any, run_name: str, reads_run_file: Callable[[], bool]) -> None:
        self.board = board
        self.remote = remote
        self.remote_run = run_name
        self.reads_run_file = reads_run_file
        self._lock = threading.Lock()  # the poller and a signalled boundary both read the files
        self._remote_next = 0.0

    def paths(self) -> list[str]:
        b = self.board
        paths = [str(b.rank_dir / TRIGGER_FILE)]
        if self.reads_run_file():
            paths.insert(0, str(b.run_dir / TRIGGER_FILE))
        return paths

    def poll(self) -> None:
        """The poller's look: the files, and the store's objects every
        REMOTE_POLL_S (not every poll_s: 512 ranks would be 512 requests a
        second)."""
        self.read(flag=True)
        if self.remote is not None and time.monotonic() >= self._remote_next:
            self._remote_next = time.monotonic() + REMOTE_POLL_S
            self.read_remote()

    def read(self, flag: bool = True) -> None:
        """Queue the request of each trigger file there is, and consume it
        (``flag``: set the core's flag for the next boundary)."""
        b = self.board
        with self._lock:
            for p in self.paths():
                path = Path(p)
                text = self._read(path)
                if text is None:
                    continue
                with contextlib.suppress(OSError):
                    path.unlink()  # consumed: one request per file written
                scope = "run" if path.parent == b.run_dir else "rank"
                try:
                    req = parse_request(text, str(path))
                except ValueError as e:
                    b.warn_once(f"{e}; ignored (write {{}} or use: fastprof trigger {b.run_dir})")
                    b.requests.append({"source": "file", "file": str(path), "error": str(e), "time": time.time()})
                    continue
                b.queue_request({**req, "source": "file", "scope": scope, "file": str(path)}, flag)

    def read_remote(self) -> None:
        """The trigger objects of a URL run: ``<url>/<run>/TRIGGER`` (read
        by the ranks that read the run's file) and ``.../rank{R}/TRIGGER``;
        each taken once (deleted), as a trigger file is. A store that fails
        is a note, never an error of the job."""
        store, b = self.remote, self.board
        if store is None:
            return
        keys = ([f"{self.remote_run}/{TRIGGER_FILE}"] if self.reads_run_file() else []) + [
            f"{self.remote_run}/rank{b.rank}/{TRIGGER_FILE}"
        ]
        for key in keys:
            if store.info(key) is None:
                continue
            with store.open(key) as f:
                text = f.read(1 << 16).decode(errors="replace")
            with contextlib.suppress(Exception):
                store.fs.rm_file(store.path(key))  # consumed: one request per object put
            url = store.url_of(key)
            scope = "rank" if "/rank" in key[len(self.remote_run) :] else "run"
            try:
                req = parse_request(text, url)
            except ValueError as e:
                b.warn_once(f"{e}; ignored (write {{}} or use: fastprof trigger {store.url_of(self.remote_run)})")
                b.requests.append({"source": "file", "file": url, "error": str(e), "time": time.time()})
                continue
            b.queue_request({**req, "source": "file", "scope": scope, "file": url})

    def _read(self, path: Path) -> str | None:
        """A trigger file's text (its first 64 KiB), or None when there is
        none to take. Only a regular file is opened: a FIFO would block this
        thread in open() until something writes into it (and every later
        trigger with it), a device may be anything. Opened non-blocking and
        checked again once open, for one swapped in meanwhile."""
        try:
            mode = os.stat(path).st_mode
            if stat.S_ISREG(mode):
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    mode = os.fstat(fd).st_mode
                    if stat.S_ISREG(mode):
                        return f.read(1 << 16).decode(errors="replace")
        except FileNotFoundError:
            return None
        except OSError as e:
            self.board.warn_once(f"trigger file {path}: {e}")
            return None
        what = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a file"
        self.board.warn_once(
            f"trigger file {path}: not a regular file ({what}); never opened, so it asks for nothing "
            "(remove it: fastprof trigger writes a regular file there)"
        )
        return None
