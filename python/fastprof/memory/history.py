"""The CUDA caching allocator's history, bounded, per schedule window (issue #16).

``Profiler(memory_history=fastprof.MemoryHistory(...))`` (or
``FASTPROF_MEMORY_HISTORY=1``): during each window of the Profiler's schedule
(its warm-up and active steps, as the torch.profiler windows) the allocator
records its history (``torch.cuda.memory._record_memory_history``) with a
bounded ``max_entries``; at the window's last step the snapshot is taken
(``torch.cuda.memory._snapshot()``, on the training thread: the stall is
measured and on the timeline as a ``memory.history.dump`` span), history is
turned off, and the snapshot is pickled by a thread of its own to
``rank{R}/memory/ep{epoch}-ba{batch}.history.pickle`` (format strings as
TorchWindows'), the file torch's ``memory_viz`` loads; ``html=True`` also
writes its offline HTML beside it. Each window (steps, file, bytes, entries
kept, whether the bound was reached, stall and write times) is listed in
``profiler.json``'s ``memory.history``.

Costs designed against (torch's own issues): a dump of 100k entries took
~0.7 s, of 1k 4 ms; C++ stacks (``stacks="all"``) made one dump ~461 s
against ~4 s with Python stacks; 100k entries held only 2-3 steps of a 16B
MoE. Hence Python stacks by default and a bound of
:data:`ENTRIES_PER_STEP` entries per window step, at most
:data:`MAX_DEFAULT_ENTRIES` (each entry holds a few hundred bytes plus its
frames: about 100-200 MB of host memory per 100k entries with Python stacks).

Between windows, ``state_every=N`` takes a state-only snapshot (history
off: segments and live blocks, ~0.2 ms in torch's issues) at every N-th
step's end, pickled off the training thread to ``state_filename``. On the
timeline: the ``memory.history.on`` counter (1 while history records), the
dump span with the window's steps, entries kept and dropped (an estimate
from the allocator's own event counts), and each write as a span on the
writer's thread.

Without CUDA the history is unavailable, said once (``profiler.json``), and
nothing per step is spent on it.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastprof import _core
from fastprof._core import ConfigError
from fastprof.memory._files import atomic, write_atomic
from fastprof.recording.options import Option, _bool, _int, _str, _value, check_format, prefixed

#: Default bound: entries per step of a window...
ENTRIES_PER_STEP = 20_000
#: ... and never more than this per window.
MAX_DEFAULT_ENTRIES = 200_000
_STACKS = ("python", "all")
_CONTEXTS = ("all", "alloc", "state")


_opt = prefixed("MEMORY_HISTORY")

#: MemoryHistory's options; each has a FASTPROF_MEMORY_HISTORY_<NAME> variable.
OPTIONS: tuple[Option, ...] = (
    _opt(
        "max_entries",
        "int",
        0,
        "an integer >= 0 (0: derived from the window)",
        f"Allocator events kept per window (0: {ENTRIES_PER_STEP} per window step, at most {MAX_DEFAULT_ENTRIES}).",
        _int,
        lambda v: 0 <= v <= 100_000_000,
    ),
    _opt("stacks", "str", "python", "python or all", "Stacks kept per event (all: C++ too, slow dumps).", _str),
    _opt("context", "str", "all", "all, alloc or state", "Which events carry stacks.", _str),
    _opt("folder", "str", "rank{rank}/memory", "a folder (format variables allowed)", "Under the run dir.", _str),
    _opt(
        "filename",
        "str",
        "ep{epoch}-ba{batch}.history.pickle",
        "a file name (format variables allowed)",
        "One per window.",
        _str,
    ),
    _opt("html", "bool", False, "a boolean", "Also torch's offline HTML of each dump.", _bool),
    _opt(
        "state_every",
        "int",
        0,
        "an integer >= 0 (0: none)",
        "A state-only allocator snapshot (segments and live blocks, no history) every N steps between windows.",
        _int,
        lambda v: 0 <= v <= 100_000_000,
    ),
    _opt(
        "state_filename",
        "str",
        "ep{epoch}-ba{batch}.state.pickle",
        "a file name (format variables allowed)",
        "One per state-only snapshot, in folder.",
        _str,
    ),
)
_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class MemoryHistory:
    """What the allocator history windows record and where they go (see
    the module documentation). Options not given (None) come from
    ``FASTPROF_MEMORY_HISTORY_<NAME>`` variables, then defaults; a bad value
    is a :class:`fastprof.ConfigError` here, before training."""

    max_entries: int | None = None
    stacks: str | None = None
    context: str | None = None
    folder: str | os.PathLike[str] | None = None
    filename: str | None = None
    html: bool | None = None
    state_every: int | None = None
    state_filename: str | None = None
    env: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        env = os.environ if self.env is None else self.env
        for opt in OPTIONS:
            object.__setattr__(self, opt.name, _value(opt, getattr(self, opt.name), env))
        if self.stacks not in _STACKS:
            raise ConfigError(f"MemoryHistory: invalid stacks {self.stacks!r}: expected one of {', '.join(_STACKS)}")
        if self.context not in _CONTEXTS:
            raise ConfigError(
                f"MemoryHistory: invalid context {self.context!r}: expected one of {', '.join(_CONTEXTS)}"
            )
        check_format("folder", str(self.folder), "MemoryHistory")
        for key in ("filename", "state_filename"):
            name = str(getattr(self, key))
            if "/" in name or name in (".", ".."):
                raise ConfigError(f"MemoryHistory: invalid {key} {name!r}: a file name, not a path (use folder)")
            check_format(key, name, "MemoryHistory")

    def entries_for(self, window_steps: int) -> int:
        """The bound for a window of ``window_steps`` steps."""
        if self.max_entries:
            return int(self.max_entries)
        return min(MAX_DEFAULT_ENTRIES, ENTRIES_PER_STEP * max(1, window_steps))


class CudaAllocator:
    """The allocator calls the driver makes (torch's private API): one place
    for them, so the window logic can be exercised without a GPU."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def available(self) -> str | None:
        """None when history can be recorded here, else why not."""
        t = self.torch
        if t is None:
            return "torch is not imported"
        if not t.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
        if not hasattr(t.cuda.memory, "_record_memory_history"):
            return f"torch {t.__version__} has no torch.cuda.memory._record_memory_history"
        return None

    def initialized(self) -> bool:
        """Whether the job has used CUDA (a snapshot before would start a context)."""
        return bool(self.torch.cuda.is_initialized())

    def start(self, max_entries: int, stacks: str, context: str) -> None:
        self.torch.cuda.memory._record_memory_history(
            enabled="all", context=context, stacks=stacks, max_entries=max_entries
        )

    def snapshot(self) -> dict[str, Any]:
        """The allocator's state and, while history is on, its history."""
        return dict(self.torch.cuda.memory._snapshot())

    def events(self) -> int:
        """Allocator events so far by its own counts: an allocation is one
        history entry, a free two (requested, completed), a segment's
        allocation or release one each."""
        st = self.torch.cuda.memory_stats()
        return int(
            st.get("allocation.all.allocated", 0)
            + 2 * st.get("allocation.all.freed", 0)
            + st.get("segment.all.allocated", 0)
            + st.get("segment.all.freed", 0)
        )

    def stop(self) -> None:
        self.torch.cuda.memory._record_memory_history(enabled=None)

    def html(self, snapshot: dict[str, Any]) -> str:
        # torch.cuda.memory loads _memory_viz with torch (it draws its summaries).
        return str(self.torch.cuda._memory_viz.trace_plot(snapshot))


def _entries(snapshot: Mapping[str, Any]) -> int:
    return sum(len(t) for t in snapshot.get("device_traces") or [])


def _state(snapshot: Mapping[str, Any]) -> tuple[int, int, int]:
    """(segments, reserved bytes, allocated bytes) of a snapshot's state."""
    segs = snapshot.get("segments") or []
    reserved = sum(int(g.get("total_size", 0)) for g in segs)
    allocated = sum(int(g.get("allocated_size", 0)) for g in segs)
    return len(segs), reserved, allocated


def mark_since(name: str, ticks: int, **args: Any) -> None:
    """A span ``name`` from ``ticks`` (:func:`now_ticks`) to now on this
    thread's track (nothing when no recorder runs)."""
    try:
        _core._complete(name, ticks, **args)
    except Exception:  # noqa: BLE001 - no recorder: nothing to mark
        pass


def now_ticks() -> int:
    """The recorder's clock now, where a :func:`mark_since` span begins."""
    return int(_core._ticks())


#: profiler.json keeps this many state-only snapshots in its list (all are counted).
MAX_STATE_LISTED = 1000


class HistoryDriver:
    """Turns the history on and off at the Profiler's window edges, and takes
    the state-only snapshots between windows."""

    def __init__(self, config: MemoryHistory, allocator: Any) -> None:
        self.config = config
        self.allocator = allocator
        self.reason: str | None = allocator.available()
        self.windows: list[dict[str, Any]] = []
        self.states: list[dict[str, Any]] = []
        self.state_stats = {"count": 0, "stall_s_total": 0.0, "stall_s_max": 0.0, "bytes_total": 0, "busy": 0}
        self.state_every = int(config.state_every or 0)
        self._open: dict[str, Any] | None = None
        self._writers: list[threading.Thread] = []
        self._state_writer: threading.Thread | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    @property
    def available(self) -> bool:
        return self.reason is None

    def _events(self) -> int | None:
        try:
            return int(self.allocator.events())
        except Exception:  # noqa: BLE001 - the estimate is a figure less, not a failure
            return None

    def begin(self, recording: bool, window_steps: int, batch: int, epoch: int) -> None:
        """A step begins; ``recording``: it is in a window (warm-up or active)."""
        if not self.available or not recording or self._open is not None:
            return
        bound = self.config.entries_for(window_steps)
        try:
            self.allocator.start(bound, str(self.config.stacks), str(self.config.context))
        except Exception as e:  # noqa: BLE001 - the job goes on, the reason is kept
            self.reason = f"could not start the allocator history: {type(e).__name__}: {e}"
            return
        self._open = {"first_step": batch, "epoch": epoch, "max_entries": bound, "_events0": self._events()}
        _counter(1.0)

    def end(self, saves: bool, path: Path, batch: int) -> None:
        """A step ends; ``saves``: the window's last. Snapshot (measured), off,
        and pickle ``path`` off the training thread."""
        if self._open is None or not saves:
            return
        w, self._open = self._open, None
        events0 = w.pop("_events0", None)
        t0 = time.perf_counter()
        ticks = now_ticks()
        try:
            snap = self.allocator.snapshot()
        except Exception as e:  # noqa: BLE001
            snap = None
            w["error"] = f"snapshot failed: {type(e).__name__}: {e}"
        finally:
            events1 = self._events()
            try:
                self.allocator.stop()
            except Exception as e:  # noqa: BLE001
                w.setdefault("error", f"could not stop the history: {type(e).__name__}: {e}")
        w["snapshot_s"] = time.perf_counter() - t0
        w.update(last_step=batch, path=str(path), entries=None, at_bound=None, bytes=None, write_s=None)
        w["events"] = None if events0 is None or events1 is None else max(0, events1 - events0)
        w["dropped"] = None
        if snap is not None:
            n = _entries(snap)
            w["entries"] = n
            w["at_bound"] = n >= int(w["max_entries"])
            if w["events"] is not None:
                w["dropped"] = max(0, int(w["events"]) - n) if w["at_bound"] else 0
        # The stall, on the timeline, with what the window kept.
        mark_since(
            "memory.history.dump",
            ticks,
            first_step=w["first_step"],
            last_step=batch,
            entries=w["entries"],
            max_entries=w["max_entries"],
            dropped=w["dropped"],
        )
        _counter(0.0)
        if snap is not None:
            t = threading.Thread(target=self._write, args=(snap, path, w), name="fastprof-history", daemon=True)
            t.start()
            self._writers.append(t)
        with self._lock:
            self.windows.append(w)

    def _write(self, snap: dict[str, Any], path: Path, w: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        ticks = now_ticks()
        try:
            with atomic(path) as f:
                pickle.dump(snap, f, protocol=pickle.HIGHEST_PROTOCOL)
            with self._lock:
                w["bytes"] = path.stat().st_size
            if self.config.html:
                html = write_atomic(path.with_suffix(".html"), self.allocator.html(snap))
                with self._lock:
                    w["html"] = str(html)
        except Exception as e:  # noqa: BLE001 - one warning at the end, kept in profiler.json
            with self._lock:
                w["error"] = f"dump failed: {type(e).__name__}: {e}"
        finally:
            with self._lock:
                w["write_s"] = time.perf_counter() - t0
            mark_since("memory.history.write", ticks, path=str(path), bytes=w.get("bytes"), entries=w.get("entries"))

    # ------------------------------------------------ state-only snapshots

    def state_due(self, batch: int) -> bool:
        """Whether step ``batch``'s end takes a state-only snapshot: every
        ``state_every`` steps, outside the history windows, once the job
        has used CUDA."""
        if not self.state_every or not self.available or self._open is not None:
            return False
        if (batch + 1) % self.state_every:
            return False
        try:
            return bool(self.allocator.initialized())
        except Exception:  # noqa: BLE001
            return False

    def state(self, path: Path, batch: int, epoch: int) -> None:
        """Take a state-only snapshot at step ``batch``'s end (on the training
        thread: the stall is measured and on the timeline) and pickle it to
        ``path`` off the training thread. While the previous one is still
        being written this one is skipped and counted (``busy``): a slow
        disk never piles snapshots up in memory."""
        prev = self._state_writer
        if prev is not None and prev.is_alive():
            self.state_stats["busy"] += 1
            return
        t0 = time.perf_counter()
        ticks = now_ticks()
        entry: dict[str, Any] = {"step": batch, "epoch": epoch, "path": str(path), "bytes": None, "write_s": None}
        try:
            snap = self.allocator.snapshot()
        except Exception as e:  # noqa: BLE001
            snap = None
            entry["error"] = f"state snapshot failed: {type(e).__name__}: {e}"
        stall = time.perf_counter() - t0
        entry["snapshot_s"] = stall
        if snap is not None:
            entry["segments"], entry["reserved_b"], entry["allocated_b"] = _state(snap)
        mark_since("memory.state.snapshot", ticks, step=batch, segments=entry.get("segments"))
        st = self.state_stats
        st["count"] += 1
        st["stall_s_total"] += stall
        st["stall_s_max"] = max(float(st["stall_s_max"]), stall)
        with self._lock:
            self.states.append(entry)
            del self.states[:-MAX_STATE_LISTED]
        if snap is not None:
            t = threading.Thread(
                target=self._write_state, args=(snap, path, entry), name="fastprof-memory-state", daemon=True
            )
            t.start()
            self._state_writer = t

    def _write_state(self, snap: dict[str, Any], path: Path, entry: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        ticks = now_ticks()
        try:
            with atomic(path) as f:
                pickle.dump(snap, f, protocol=pickle.HIGHEST_PROTOCOL)
            size = path.stat().st_size
            with self._lock:
                entry["bytes"] = size
                self.state_stats["bytes_total"] += size
        except Exception as e:  # noqa: BLE001 - one warning at the end, kept in profiler.json
            with self._lock:
                entry["error"] = f"write failed: {type(e).__name__}: {e}"
        finally:
            with self._lock:
                entry["write_s"] = time.perf_counter() - t0
            mark_since("memory.state.write", ticks, path=str(path), bytes=entry.get("bytes"))

    # ---------------------------------------------------------------- end

    def close(self, path: Path | None, batch: int, wait_s: float = 60.0) -> None:
        """The run ends: a window still open is dumped as it stands (to
        ``path``), then the writers get ``wait_s`` to finish."""
        if self._open is not None and path is not None:
            self.end(True, path, batch)
        deadline = time.monotonic() + wait_s
        writers = [*self._writers, *([self._state_writer] if self._state_writer is not None else [])]
        for t in writers:
            t.join(max(0.0, deadline - time.monotonic()))

    def errors(self) -> list[str]:
        """Every failure so far (windows' and state snapshots'), with where."""
        with self._lock:
            items = [*self.windows, *self.states]
        return [f"{w.get('path')}: {w['error']}" for w in items if w.get("error")]

    def summary(self) -> dict[str, Any]:
        """``profiler.json``'s ``memory.history``."""
        with self._lock:
            windows = [dict(w) for w in self.windows]
            states = [dict(s) for s in self.states]
            stats = dict(self.state_stats)
        return {
            "config": repr(self.config),
            "available": self.available,
            "reason": self.reason,
            "windows": windows,
            "state": {"every": self.state_every, **stats, "snapshots": states},
        }


def _counter(value: float) -> None:
    """The history on (1) or off (0): the windows on the timeline as a track."""
    try:
        _core.counter(HISTORY_COUNTER, value)
    except Exception:  # noqa: BLE001 - no recorder: nothing to mark
        pass


#: The counter track that is 1 while the allocator history records.
HISTORY_COUNTER = "memory.history.on"


def driver(config: MemoryHistory) -> HistoryDriver:
    """A driver on this process's CUDA allocator."""
    return HistoryDriver(config, CudaAllocator(sys.modules.get("torch")))
