"""Hangs in a run whose ranks share no directory (a URL ``out_dir``, issue
#37): the evidence is joined through the store, never through a collective.

Each rank records into its own local spool, and the uploader sends closed
files after a pass or two and then removes them from the spool; its hidden
files (``.hang-watch.json``, ``.hang-closed.json``) are never sent. So the
rank's :class:`RankBridge` (a thread of the hang driver, off the training
thread) puts what the verdict needs into the store itself:

- ``rank{R}/hang-watch.json``: the watch file, at start (rewritable: the
  job's own run);
- ``rank{R}/hang-<n>.json``: the evidence, as soon as the interpreter wrote
  it (the uploader then finds it there and frees the spool's copy);
- ``rank{R}/hang-closed.json``: the closed file, when the loop ends;

and takes ``rank{R}/STACKS``, the object ``fastprof trigger URL --stacks``
puts, into the rank's spool folder, where the core's watchdog reads its
request file. It looks every :data:`POLL_S` (as the trigger objects are
looked at: 512 ranks must not ask the store every second).

:func:`mirror` lays those objects out as a run directory in a local
folder (the objects' names back to the files'), with the spool's own files
over them, and the verdict's :func:`~.verdict.join` reads it as it reads a
shared run directory.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fastprof.memory._files import write_atomic
from fastprof.profiler.drivers.hang.verdict import CLOSED_FILE, HANG_FILE, HANG_REQUEST_FILE, WATCH_FILE, join
from fastprof.profiler.drivers.triggers.config import REMOTE_POLL_S

__all__ = ["CLOSED_KEY", "POLL_S", "WATCH_KEY", "RankBridge", "StoreRun", "bridge_of", "mirror"]

#: A rank's watch and closed files in the store (hidden names are not uploaded).
WATCH_KEY = "hang-watch.json"
CLOSED_KEY = "hang-closed.json"
#: Seconds between two looks at the store for a ``--stacks`` request.
POLL_S = REMOTE_POLL_S
#: ``<run>/.hang-verdict-<step>``: which rank said the verdict of the stall at that step
#: (created once: one line per stall across ranks that share no directory).
VERDICT_KEY = ".hang-verdict-{step}"
#: Object name -> file name in a rank's folder.
_LOCAL_NAME = {WATCH_KEY: WATCH_FILE, CLOSED_KEY: CLOSED_FILE}
_RANK = re.compile(r"^rank(\d+)$")


class StoreRun:
    """A run's hang files in a store: ``store`` (a
    :class:`fastprof.storage.store.Store`) and the run's key prefix in it
    (``""`` when the store is rooted at the run)."""

    def __init__(self, store: Any, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        #: Evidence objects already copied (written once, never replaced).
        self._have: set[str] = set()

    def key(self, rank: int, name: str) -> str:
        return "/".join(p for p in (self.prefix, f"rank{rank}", name) if p)

    def _ls(self, key: str) -> list[str]:
        """The names one level under ``key`` (one listing, not the tree)."""
        fs, path = self.store.fs, self.store.path(key)
        fs.invalidate_cache(path)
        try:
            found = fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in found]

    def ranks(self) -> list[int]:
        """The ranks with a folder in the run."""
        return sorted(int(m.group(1)) for n in self._ls(self.prefix) if (m := _RANK.match(n)))

    def names(self, rank: int) -> list[str]:
        """The hang files of ``rank`` in the store: its evidence, watch and closed objects."""
        return [n for n in self._ls(self.key(rank, "")) if HANG_FILE.match(n) or n in _LOCAL_NAME]

    def read(self, rank: int, name: str) -> bytes | None:
        data: bytes | None = self.store.read(self.key(rank, name))
        return data

    def fetch(self, into: Path, ranks: Iterable[int]) -> None:
        """Copy each rank's hang files into ``into/rank{R}/`` under their
        files' names (evidence once; the watch and closed files again each
        time: a new Profiler of the rank replaces them)."""
        for r in ranks:
            d = into / f"rank{r}"
            for name in self.names(r):
                key = self.key(r, name)
                if key in self._have:
                    continue
                data = self.read(r, name)
                if data is None:
                    continue
                d.mkdir(parents=True, exist_ok=True)
                write_atomic(d / _LOCAL_NAME.get(name, name), data.decode("utf-8", errors="replace"))
                if HANG_FILE.match(name):
                    self._have.add(key)


def mirror(run: StoreRun, into: Path, ranks: Iterable[int], local_run_dir: Path | None = None) -> Path:
    """``into`` laid out as the run directory for :func:`~.verdict.join`:
    the store's hang files of ``ranks``, then the local spool's own
    (``local_run_dir``: this rank's, the freshest) over them."""
    run.fetch(into, ranks)
    if local_run_dir is not None:
        with contextlib.suppress(OSError):
            for d in local_run_dir.iterdir():
                if not (_RANK.match(d.name) and d.is_dir()):
                    continue
                for f in d.iterdir():
                    if HANG_FILE.match(f.name) or f.name in (WATCH_FILE, CLOSED_FILE):
                        (into / d.name).mkdir(parents=True, exist_ok=True)
                        with contextlib.suppress(OSError):
                            shutil.copyfile(f, into / d.name / f.name)
    return into


class RankBridge:
    """One rank's hang files to and from the store (see the module docs).
    Every call may block on the network: the driver's threads make them,
    never the training thread; a store that fails is noted, never raised."""

    def __init__(self, store: Any, run_name: str, rank: int, rank_dir: Path) -> None:
        self.run = StoreRun(store, run_name)
        self.rank = rank
        self.rank_dir = rank_dir
        self.error: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: The store's hang files, laid out as a run directory (kept: evidence is copied once).
        self._mirror: Path | None = None
        #: Files to put from the bridge's thread: (local, name, rewritable).
        self._outbox: list[tuple[Path, str, bool]] = []

    def put(self, local: Path, name: str, *, rewritable: bool = False) -> bool:
        """Put the file ``local`` as ``rank{R}/<name>``; False when it failed."""
        try:
            self.run.store.put(local, self.run.key(self.rank, name), rewritable=rewritable)
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            self.error = f"{type(e).__name__}: {e}"
            return False
        return True

    def take_request(self) -> bool:
        """A ``--stacks`` request object for this rank, taken (deleted) and
        written as the rank's request file, which the watchdog reads."""
        store, key = self.run.store, self.run.key(self.rank, HANG_REQUEST_FILE)
        data = store.read(key)
        if data is None:
            return False
        with contextlib.suppress(Exception):
            store.fs.rm_file(store.path(key))  # one request per object put
        write_atomic(self.rank_dir / HANG_REQUEST_FILE, data.decode("utf-8", errors="replace").strip())
        return True

    def send(self, local: Path, name: str, *, rewritable: bool = False) -> None:
        """Put ``local`` as ``rank{R}/<name>`` from the bridge's thread (the
        caller does not wait for the store)."""
        with self._lock:
            self._outbox.append((local, name, rewritable))
        self._wake.set()

    def join(self, near: float, window: float, world_size: int, local_run_dir: Path) -> dict[int, dict[str, Any]]:
        """:func:`~.verdict.join` over every rank's files in the store (and
        this rank's spool): each rank's state for the stall seen at ``near``."""
        if self._mirror is None:
            self._mirror = Path(tempfile.mkdtemp(prefix="fastprof-hang-"))
        into = mirror(self.run, self._mirror, range(world_size), local_run_dir)
        return join(into, near, window, world_size=world_size)

    def claim_verdict(self, step: Any, t: float, window: float) -> bool:
        """Whether this rank says the verdict of the stall at ``step`` (seen
        at ``t``): the first to create its object in the store. An object of
        a stall far from ``t`` is an earlier job's (a resumed run at the same
        step): this one is said too."""
        store = self.run.store
        key = "/".join(p for p in (self.run.prefix, VERDICT_KEY.format(step=step)) if p)
        doc = json.dumps({"time": t, "rank": self.rank, "step": step}).encode()
        try:
            if store.create(key, doc):
                return True
            other = json.loads(store.read(key) or b"{}")
            return abs(float(other.get("time", 0.0)) - t) > window
        except Exception as e:  # noqa: BLE001 - a store that fails: this rank says it (a line twice, not none)
            self.error = f"{type(e).__name__}: {e}"
            return True

    def start(self) -> None:
        """Put the watch file, then look for requests every :data:`POLL_S`
        and put what :meth:`send` was given."""
        self.send(self.rank_dir / WATCH_FILE, WATCH_KEY, rewritable=True)
        self._thread = threading.Thread(target=self._serve, name="fastprof-hang-store", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        next_look = time.monotonic() + POLL_S
        while True:
            self._wake.wait(max(0.0, next_look - time.monotonic()))
            self._wake.clear()
            self._flush()
            if self._stop.is_set():
                return
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + POLL_S
                try:
                    self.take_request()
                except Exception as e:  # noqa: BLE001
                    self.error = f"{type(e).__name__}: {e}"

    def _flush(self) -> None:
        with self._lock:
            out, self._outbox = self._outbox, []
        for local, name, rewritable in out:
            self.put(local, name, rewritable=rewritable)

    def stop(self, timeout: float = 5.0) -> None:
        """Put what is queued (bounded by ``timeout``), then stop."""
        self._stop.set()
        self._wake.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=timeout)
        m, self._mirror = self._mirror, None
        if m is not None:
            shutil.rmtree(m, ignore_errors=True)


def bridge_of(prof: Any, rank: int) -> RankBridge | None:
    """The bridge of a Profiler recording to a URL (its recorder's spool
    has a store), else None."""
    spool = getattr(prof.recorder, "spool", None)
    store = spool.open() if spool is not None else None
    if store is None:
        return None
    run_name = getattr(spool, "run_name", None) or str(prof.recorder.options.run_name)
    return RankBridge(store, run_name, rank, prof.rank_dir)
