"""Recording inside DataLoader worker processes.

A worker is a process of its own: the parent's recorder is inert there (a
forked child forgets it; a spawned one is told by ``FASTPROF_RECORDING_PID``).
:func:`instrument` makes each worker start a recorder of its own, writing
into ``<run>/rank{R}/workers/<loader>-w<id>-pid<pid>/`` with the rank of the
process that owns the loader, so that ``fastprof merge`` shows the workers as
tracks of that rank. In every worker each batch fetch (``__getitem__`` for
every index, or ``next()`` of an iterable dataset, then collate) is a span
``loader.<name>.fetch`` with args ``{"worker": id, "n": fetches so far}``.

How it gets there: :func:`instrument` sets the loader's ``worker_init_fn`` to
a :class:`_WorkerInit`, a module-level picklable object (so it crosses spawn
and forkserver as well as fork), which calls the user's own function after
recording has started. Inside the worker only, the fetchers' ``fetch`` methods
of ``torch.utils.data._utils.fetch`` are wrapped: the worker loop calls
``fetcher.fetch(index)`` once per batch whatever the dataset kind, and the
patch lives in that process's memory alone, so the parent and the
single-process loader are untouched.

Workers leave through ``os._exit`` after ``multiprocessing``'s own exit
handlers, never through ``atexit``: the recorder is stopped by a
``multiprocessing.util.Finalize``, which ``BaseProcess._bootstrap`` runs on the
way out (persistent workers too, when their loader shuts them down). A worker
killed outright loses at most one flush interval; its open segment is
salvaged by the reader and the merge.

**Its stack on request** (issue #37): a recorded worker has ``faulthandler``
write every thread's Python stack into ``.stacks.txt`` in its folder on
:data:`WORKER_STACK_SIGNAL` (CPython's dumper, from the signal handler: it
answers while the worker sleeps, blocks in C or holds the GIL). The rank's
hang evidence sends that signal to each live worker and reads the stack back
(:func:`fastprof.profiler.drivers.hang.evidence.workers`). A worker whose
disposition for that signal is not the default (the job's own) is not asked.

Nothing here may take training down: a worker that cannot record says so in
one stderr line and goes on loading.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastprof import _core, _warning_display
from fastprof.recording.names import loader_fetch, loader_worker_init
from fastprof.recording.recorder import Recorder

#: Seconds between a worker's flushes: what a killed worker loses at most.
WORKER_FLUSH_INTERVAL = 0.2
#: Events per recording thread of a worker: fetch spans are few (a worker's
#: main thread records about one per batch), 64 Ki slots is 1.5 MiB.
WORKER_BUFFER_SIZE = 1 << 16
#: The signal a recorded worker dumps its threads' stacks on (a real-time
#: signal, unused by torch and the standard library), and the file, in its
#: folder, they go to (appended to: the reader takes what a request added).
WORKER_STACK_SIGNAL = signal.SIGRTMIN + 7
STACKS_FILE = ".stacks.txt"
#: The open stacks file of this worker (faulthandler writes to its descriptor).
_stacks_file: list[Any] = []
#: Runs before ``multiprocessing``'s own finalizers of priority 0 and below
#: (queue feeder threads), so the trace is closed while the process is whole.
_EXIT_PRIORITY = 100


def instrument(
    loader: Any,
    *,
    name: str,
    rank_dir: str | os.PathLike[str],
    run_name: str,
    rank: int,
    world_size: int,
    disk: tuple[int, int, int] = (0, 0, 0),
) -> bool:
    """Make the worker processes of ``loader`` record their own traces.

    ``disk``: the parent recorder's ``(segment_size, max_disk,
    keep_segments)``, each worker's recording held to the same disk cap (0:
    its own options, from ``FASTPROF_*`` or the defaults).

    Returns False, and changes nothing, unless ``loader`` is a
    ``torch.utils.data.DataLoader`` with ``num_workers > 0``. Otherwise sets
    its ``worker_init_fn`` (keeping the user's, which still runs in each
    worker after recording starts) and returns True; a loader already
    instrumented is left as it is. Call it before iterating: persistent
    workers already running keep the ``worker_init_fn`` they started with.
    """
    # A DataLoader is the job's: without torch.utils.data imported, ``loader`` is none.
    data = sys.modules.get("torch.utils.data")
    if data is None or not isinstance(loader, data.DataLoader) or not loader.num_workers > 0:
        return False
    if isinstance(loader.worker_init_fn, _WorkerInit):
        return True
    loader.worker_init_fn = _WorkerInit(
        loader.worker_init_fn,
        name=name,
        rank_dir=os.fspath(rank_dir),
        run_name=run_name,
        rank=rank,
        world_size=world_size,
        disk=disk,
    )
    return True


class _WorkerInit:
    """A DataLoader ``worker_init_fn``: start recording in this worker, then
    call the user's own function. Pickled into spawned workers, so it holds
    only plain values and the user's function."""

    def __init__(
        self,
        user_fn: Callable[[int], object] | None,
        *,
        name: str,
        rank_dir: str,
        run_name: str,
        rank: int,
        world_size: int,
        disk: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        self.user_fn = user_fn
        self.disk = disk
        self.name = name
        self.rank_dir = rank_dir
        self.run_name = run_name
        self.rank = rank
        self.world_size = world_size

    def __call__(self, worker_id: int) -> None:
        started = False
        try:
            started = self._start(worker_id)
        except BaseException as e:  # noqa: BLE001 - a worker never fails because of fastprof
            _say(f"DataLoader worker {worker_id} of loader {self.name!r} (pid {os.getpid()}) is not recorded: {e}")
        if self.user_fn is None:
            return
        if not started:
            self.user_fn(worker_id)
            return
        with _core.span(loader_worker_init(self.name), worker=worker_id):
            self.user_fn(worker_id)

    def _start(self, worker_id: int) -> bool:
        pid = os.getpid()
        parent = multiprocessing.parent_process()
        # The process that made the worker, whatever the start method (under
        # forkserver, getppid() is the fork server).
        parent_pid = parent.pid if parent is not None and parent.pid is not None else os.getppid()
        rank_dir = Path(self.rank_dir)
        # The parent's disk cap, not only what FASTPROF_* says: a persistent
        # worker records for as long as the job runs. 0: the worker's own option.
        segment_size, max_disk, keep = (v or None for v in self.disk)
        rec = Recorder(
            # Resolved already: braces are the names' own, not format variables.
            out_dir=_literal(str(rank_dir.parent.parent)),
            run_name=_literal(self.run_name),
            rank=self.rank,
            sample_hz=0,
            flush_interval=WORKER_FLUSH_INTERVAL,
            buffer_size=WORKER_BUFFER_SIZE,
            window_seconds=0,
            segment_size=segment_size,
            max_disk=max_disk,
            keep_segments=keep,
        )
        rec.options = dataclasses.replace(rec.options, world_size=max(self.world_size, self.rank + 1))
        rec.trace_dir = rank_dir / "workers" / f"{_safe(self.name)}-w{worker_id}-pid{pid}"
        rec.metadata["worker"] = {"loader": self.name, "id": worker_id, "parent_pid": parent_pid}
        with warnings.catch_warnings(record=True) as caught:
            # A forked worker inherits the parent's warning filters (pytest's
            # "error" among them): notices are printed, never raised here.
            warnings.simplefilter("always")
            rec.start()
        for w in caught:
            _say(str(w.message))
        multiprocessing.util.Finalize(None, _stop, args=(rec,), exitpriority=_EXIT_PRIORITY)
        _patch_fetchers(self.name, worker_id)
        _stacks_on_signal(rec.trace_dir)
        return True


def _stacks_on_signal(folder: Path) -> None:
    """Have ``faulthandler`` dump this worker's stacks into ``folder /
    STACKS_FILE`` on :data:`WORKER_STACK_SIGNAL` (the job's own handler of
    that signal, if any, is left in place and the worker is not asked)."""
    if signal.getsignal(WORKER_STACK_SIGNAL) not in (signal.SIG_DFL, None):
        return
    path = folder / STACKS_FILE
    try:
        f = open(path, "a")  # open for the worker's life: faulthandler writes to its descriptor
    except OSError as e:
        _say(f"DataLoader worker {os.getpid()} cannot give its stack on request: {e}")
        return
    try:
        faulthandler.register(WORKER_STACK_SIGNAL, file=f, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError) as e:
        # No file, no signal: the evidence never sends it to a worker that did not register it.
        f.close()
        path.unlink(missing_ok=True)
        _say(f"DataLoader worker {os.getpid()} cannot give its stack on request: {e}")
        return
    _stacks_file[:] = [f]


def _stop(rec: Any) -> None:
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if rec.active or rec.paused:
                rec.stop()
        for w in caught:
            _say(str(w.message))
    except BaseException as e:  # noqa: BLE001 - the worker's exit must go on
        _say(f"could not finalize DataLoader worker {os.getpid()}'s trace: {e}")


def _patch_fetchers(name: str, worker_id: int) -> None:
    """Wrap ``fetch`` of torch's dataset fetchers, in this process only."""
    # A worker runs torch's worker loop, so its fetchers are imported already.
    torch_fetch = sys.modules.get("torch.utils.data._utils.fetch")
    if torch_fetch is None:
        raise ImportError("torch.utils.data._utils.fetch is not imported in this worker")

    span_name = _core.name_id(loader_fetch(name))
    count = [0]

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(original, "_fastprof_wrapped", False):
            return original

        def fetch(self: Any, possibly_batched_index: Any) -> Any:
            if getattr(self, "ended", False):
                # An iterable dataset already found its end: nothing is fetched.
                return original(self, possibly_batched_index)
            count[0] += 1
            with _core.span(span_name, worker=worker_id, n=count[0]):
                return original(self, possibly_batched_index)

        fetch._fastprof_wrapped = True  # type: ignore[attr-defined]
        fetch.__wrapped__ = original  # type: ignore[attr-defined]
        return fetch

    patched = 0
    for cls_name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
        cls = getattr(torch_fetch, cls_name, None)
        original = getattr(cls, "fetch", None)
        if cls is not None and callable(original):
            cls.fetch = wrap(original)
            patched += 1
    if patched == 0:
        _say(
            f"DataLoader worker {worker_id} of loader {name!r}: this torch has no dataset fetchers "
            "to time; its trace holds no loader.*.fetch spans"
        )


def _literal(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _safe(name: str) -> str:
    """A loader name as a directory name component."""
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return out.strip(".") or "loader"


def _say(message: str) -> None:
    # One write: workers share the parent's stderr and would interleave mid-line.
    # The line a FastprofWarning shows as: a recorder's notice already says "fastprof: ".
    try:
        sys.stderr.write(_warning_display.line(message))
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr is no reason to fail
        pass
