"""fastprof's process-wide state, in one object: :data:`PROCESS`.

A recording, a Profiler, a signal handler or an out-of-memory observer
belongs to one process, not to a module: what the process has running, and
what it has installed, is here, named by concern, rather than in module
globals spread over the package. Constants stay constants in their modules.

Who holds what:

* ``recorders``: the recorder that records now (``fastprof.current()``,
  what ``fastprof.span`` writes into), ``fastprof run``'s recorder and the
  script's Recorders that joined it (:mod:`fastprof.recording.recorder`);
* ``run_host``: ``fastprof run``'s Profiler while it runs
  (:meth:`fastprof.Profiler.host_run`): a Profiler the script starts on its
  recorder takes the loop from it;
* ``exits``: the Profilers to close at interpreter exit or SIGTERM, and
  fastprof's SIGTERM handler now installed (:mod:`fastprof.profiler.exits`);
* ``signals``: the signals fastprof made harmless and fastprof's own
  handlers (:mod:`fastprof._signals`);
* ``oom``: torch's OOM observer, the Profilers it reports to, their capture
  state and the listeners (:mod:`fastprof.memory.oom`);
* ``collect``: the entries and allocator snapshots of
  ``@fastprof.memory.collect`` (:mod:`fastprof.memory.collector`);
* ``run_dirs_chosen``: run directories chosen by this process so far
  (:mod:`fastprof.recording.rundir`: the job's n-th run);
* ``spool_said``: whether this process named its upload spool on stderr
  (:mod:`fastprof.storage.spool`: once per process);
* ``async_spans``: one key per asyncio task for the decorator's async spans
  (:mod:`fastprof.recording.decorate`).

**Fork.** The Rust core resets its own state in a ``pthread_atfork``
handler. Here, in a forked child, every lock is made anew (one may be held
by a thread that does not exist in the child) and the current recorder is
forgotten (it belongs to the parent; its handle is inert in the child). The
rest is kept, as the child inherits it: the signal dispositions fastprof
installed, the ``atexit`` hooks and the Profilers they close, the collected
entries.

This module imports nothing of fastprof (every part of it may use it), so the
objects it holds are typed here by what they are for, not by their classes.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PROCESS", "Process"]


@dataclass
class Recorders:
    """:mod:`fastprof.recording.recorder`'s state."""

    #: Held while a recorder starts or stops (one recording at a time).
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The ``Recorder`` recording now (``fastprof.current()``), or None.
    current: Any = None
    #: The ``atexit`` hook that stops a forgotten recorder is registered.
    atexit_registered: bool = False
    #: ``fastprof run``'s ``Recorder`` while it records: a Recorder the script
    #: starts joins it instead of failing.
    run_host: Any = None
    #: The script's Recorders that joined it and still run, newest last.
    joined: list[Any] = field(default_factory=list)


@dataclass
class Exits:
    """:mod:`fastprof.profiler.exits`' state."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The Profilers still running, closed at exit or SIGTERM (oldest first).
    live: list[Any] = field(default_factory=list)
    atexit_registered: bool = False
    #: fastprof's SIGTERM handler now installed (None while none is): each
    #: installation is a new handler that remembers the disposition it replaced.
    sigterm_handler: Any = None


@dataclass
class Signals:
    """:mod:`fastprof._signals`' state."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Signals fastprof made harmless (read as the default when asked what the job has).
    harmless: set[int] = field(default_factory=set)
    #: fastprof's own handlers (functions), never deferred nor taken for the job's.
    own: set[Any] = field(default_factory=set)
    #: Depth of the main thread's critical sections (:class:`fastprof._signals.Critical`).
    critical: int = 0
    #: fastprof's own handler held by a critical section, with its arguments.
    held: tuple[Any, int, Any] | None = None


@dataclass
class Oom:
    """:mod:`fastprof.memory.oom`'s state."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: torch's OOM observer: attached once per process, and what it is doing.
    observer: dict[str, Any] = field(default_factory=lambda: {"status": "not attached", "attached": False})
    #: The Profilers the observer reports to.
    watched: list[Any] = field(default_factory=list)
    #: Each Profiler's capture state (one per run), as long as the Profiler lives.
    captures: weakref.WeakKeyDictionary[Any, dict[str, Any]] = field(default_factory=weakref.WeakKeyDictionary)
    #: ``fn(profiler, exc_or_None)`` called after each capture.
    listeners: list[Callable[[Any, BaseException | None], Any]] = field(default_factory=list)


@dataclass
class Collect:
    """:mod:`fastprof.memory.collector`'s state."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The entries by key (``"{rank}.{function}.{iteration}.{start|end}"``).
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The running Profiler's memory folder (where snapshots go by default).
    directory: Path | None = None
    #: Why that folder cannot be written, when it cannot.
    unwritable: str | None = None
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    #: Why no snapshot was taken where one was asked for (each reason once).
    snapshot_reason: list[str] = field(default_factory=list)
    #: The threads pickling snapshots.
    writers: list[threading.Thread] = field(default_factory=list)


@dataclass
class AsyncSpans:
    """:mod:`fastprof.recording.decorate`'s state: one key per asyncio task for its
    lifetime (``id(task)`` is reused once a task is freed, which would join
    two tasks' spans on one track)."""

    task_keys: weakref.WeakKeyDictionary[object, int] = field(default_factory=weakref.WeakKeyDictionary)
    next_key: Callable[[], int] = field(default_factory=lambda: itertools.count(1).__next__)


class Process:
    """The state of fastprof in this process (see the module documentation)."""

    def __init__(self) -> None:
        self.recorders = Recorders()
        #: ``fastprof run``'s Profiler while it runs (a ``fastprof._loop_api.RunHost``).
        self.run_host: Any = None
        self.exits = Exits()
        self.signals = Signals()
        self.oom = Oom()
        self.collect = Collect()
        self.run_dirs_chosen = 0
        self.spool_said = False
        self.async_spans = AsyncSpans()

    def after_fork_in_child(self) -> None:
        """In a forked child: new locks, and no current recorder (see the
        module documentation for what the child keeps)."""
        self.recorders.lock = threading.Lock()
        self.recorders.current = None
        self.exits.lock = threading.Lock()
        self.signals.lock = threading.Lock()
        self.oom.lock = threading.Lock()
        self.collect.lock = threading.Lock()


#: This process's state.
PROCESS = Process()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=PROCESS.after_fork_in_child)
