"""``fastprof.Profiler``: the training-loop profiler.

One object for any loop::

    prof = fastprof.Profiler(schedule=fastprof.schedule.epoch(skip_first=1, wait=1, warmup=1, active=2))
    with prof:
        for epoch in range(2):
            for batch in prof.loader(train_loader):
                ...
                prof.step()
            for batch in prof.loader(val_loader, name="val"):
                ...

What it records, always (about a microsecond per step on the training thread):

* a ``step`` span per training step, args ``epoch``, ``batch`` (global),
  ``batch_in_epoch`` and ``action`` (the schedule's state); a
  ``fastprof.step`` counter (the recorder's step marker) and a
  ``profiler.action`` counter track that changes with the schedule state;
* ``loader.<name>.next``: the time blocked in the loader's ``next()``, and a
  ``loader.<name>.wait_ms`` counter (and ``loader.<name>.batch_size`` once
  per pass when the loader has one); with a DataLoader with workers, each
  worker's fetch of a batch in the worker's own process
  (:mod:`fastprof.profiler.workers`).

What the schedule governs: ``torch.profiler`` windows
(:class:`~fastprof.profiler.torch_windows.TorchWindows`); with
``gate_spans=True`` also the recorder (paused outside warmup and active steps,
as Composer's profiler records).

Steps: each :meth:`Profiler.step` call ends a step. A step begins at the
train loader's next ``next()`` (so a step holds its wait for data, and
validation between epochs falls outside steps), or at once when no train
loader is iterating. When :meth:`step` is never called, every
``optimizer.step()`` (torch's global optimizer step hooks) ends a step; the
first explicit :meth:`step` call switches that off.

Epochs: each new pass over the train loader (``name="train"``, or
``epoch=True``) starts an epoch; the batch in epoch restarts at 0 and, when
the loader has a length, the epoch schedule knows the epoch's last batch.

Loops a framework runs (Lightning: :mod:`fastprof.integrations.lightning`)
say the same without :meth:`Profiler.loader`: ``start(defer_step=True)``
(no step until the first batch), :meth:`Profiler.begin_epoch` /
:meth:`Profiler.end_epoch` around each pass over the training data,
:meth:`Profiler.begin_step` where a batch is fetched, :meth:`Profiler.step`
where it ends.

At exit: the recorder stops (when the profiler started it), the exports
finish, ``rank{R}/profiler.json`` says what happened (windows, stalls, clock
syncs), and the unified trace ``<run>/trace.json.gz`` is merged by the Rust
merger: by rank 0 once every rank has finished (coordinated through the
process group's store, else marker files, with a bounded wait).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from fastprof import _core, _dist
from fastprof._core import ConfigError, FastprofWarning
from fastprof._options import Option, _bool, _float, _value
from fastprof._recorder import Recorder, current
from fastprof.profiler import schedule as _schedule
from fastprof.profiler.schedule import Action, Schedule
from fastprof.profiler.torch_windows import TorchWindows, WindowDriver

__all__ = ["OPTIONS", "Profiler"]

T = TypeVar("T")
_UNSET: Any = object()
_DONE_MARKER = ".fastprof-done"
#: Numeric levels of the profiler.action counter track.
_ACTION_LEVEL = {
    Action.SKIP_FIRST: 0,
    Action.WAIT: 1,
    Action.DISABLED: 1,
    Action.WARMUP: 2,
    Action.ACTIVE: 3,
    Action.ACTIVE_AND_SAVE: 4,
}
#: Actions of steps that need nothing from Python while they last.
_QUIET = frozenset((Action.SKIP_FIRST, Action.WAIT, Action.DISABLED))


def _schedule_value(v: object) -> Schedule:
    if isinstance(v, str):
        return _schedule.parse(v)
    return _schedule.as_schedule(v)  # type: ignore[arg-type]


#: The Profiler's own options (the recorder's are in fastprof._options).
OPTIONS: tuple[Option, ...] = (
    Option(
        "schedule",
        "schedule",
        _schedule.epoch(),
        ("FASTPROF_SCHEDULE",),
        "a fastprof schedule, a callable, or text such as epoch:wait=1,warmup=1,active=2",
        "Which steps get torch.profiler windows.",
        "`epoch(warmup=1, active=4, repeat=1)`",
        _schedule_value,
    ),
    Option(
        "gate_spans",
        "bool",
        False,
        ("FASTPROF_GATE_SPANS",),
        "a boolean",
        "Record fastprof spans only in warmup and active steps (Composer's behaviour).",
        "False",
        _bool,
    ),
    Option(
        "merge",
        "bool",
        True,
        ("FASTPROF_MERGE",),
        "a boolean",
        "Write the unified trace <run>/trace.json.gz at exit.",
        "True",
        _bool,
    ),
    Option(
        "merge_timeout",
        "float",
        300.0,
        ("FASTPROF_MERGE_TIMEOUT",),
        "seconds > 0",
        "How long rank 0 waits for the other ranks (and each rank for its exports) at exit.",
        "300",
        _float,
        lambda v: 0 < v < 1e9,
    ),
    Option(
        "sync_clocks",
        "bool",
        True,
        ("FASTPROF_SYNC_CLOCKS",),
        "a boolean",
        "Measure every rank's clock offset at start and end (a collective).",
        "True",
        _bool,
    ),
    Option(
        "torch",
        "bool",
        True,
        ("FASTPROF_TORCH",),
        "a boolean, or a TorchWindows",
        "torch.profiler windows (a TorchWindows), or False for none.",
        "`TorchWindows()` when torch is installed",
        _bool,
    ),
)
_BY_NAME = {o.name: o for o in OPTIONS}


class _LoaderNames:
    __slots__ = ("next", "wait")

    def __init__(self, name: str) -> None:
        self.next = f"loader.{name}.next"
        self.wait = f"loader.{name}.wait_ms"


class Profiler:
    """The training-loop profiler (see the module documentation).

    ``schedule``: a :mod:`fastprof.schedule` schedule (default
    ``schedule.epoch()``). ``torch``: a :class:`TorchWindows` (default one
    when torch is installed), or None/False for no torch.profiler.
    ``sample_hz`` and ``**recorder_options`` go to the :class:`fastprof.Recorder`
    it starts; when a recorder is already running, it is used (and left
    running) instead. Options not given come from ``FASTPROF_*`` variables,
    then defaults; a bad value raises :class:`fastprof.ConfigError` here,
    before training.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        *,
        schedule: Schedule | Callable[[int], Any] | str | None = None,
        torch: TorchWindows | bool | None = _UNSET,
        sample_hz: float | None = None,
        gate_spans: bool | None = None,
        merge: bool | None = None,
        merge_timeout: float | None = None,
        sync_clocks: bool | None = None,
        recorder: Recorder | None = None,
        **recorder_options: Any,
    ) -> None:
        env = os.environ
        self.schedule: Schedule = _value(_BY_NAME["schedule"], schedule, env)
        self.gate_spans: bool = _value(_BY_NAME["gate_spans"], gate_spans, env)
        self.merge_enabled: bool = _value(_BY_NAME["merge"], merge, env)
        self.merge_timeout: float = _value(_BY_NAME["merge_timeout"], merge_timeout, env)
        self.sync_clocks_enabled: bool = _value(_BY_NAME["sync_clocks"], sync_clocks, env)
        if torch is _UNSET:
            torch = _value(_BY_NAME["torch"], None, env)
        if torch is True:
            torch = TorchWindows() if _torch_importable() else None
        elif torch is False or torch is None:
            torch = None
        elif not isinstance(torch, TorchWindows):
            raise ConfigError(
                f"invalid option torch: expected a fastprof.TorchWindows, True, False or None, got {torch!r}"
            )
        elif not _torch_importable():
            raise ConfigError("invalid option torch: torch.profiler windows need torch, which is not installed")
        self.torch_windows: TorchWindows | None = torch

        running = current() if recorder is None else recorder
        if running is not None and running.active:
            given = {k: v for k, v in recorder_options.items() if v is not None}
            if out_dir is not None or run_name is not None or sample_hz is not None or given:
                raise ConfigError(
                    f"a fastprof Recorder is already running ({running.run_dir}); "
                    "drop out_dir/run_name/recorder options, or stop it first"
                )
            self.recorder = running
            self._owns_recorder = False
        else:
            self.recorder = recorder or Recorder(out_dir, run_name, sample_hz=sample_hz, **recorder_options)
            self._owns_recorder = True
        self.dist: _dist.DistInfo = _dist.dist_info()
        self._state = "new"
        self._thread_id: int | None = None
        # The step lifecycle and loop position live in the core (one C call
        # per loader fetch or step; see rust/fastprof-py/src/steps.rs); it
        # calls back the _on_* methods below when a step needs the schedule,
        # a torch window or the recorder's gate.
        self._steps: Any = None
        self._action = Action.WAIT
        self._opt_handle: Any = None
        self._paused_by_gate = False
        self._loader_names: dict[str, _LoaderNames] = {}
        self._persistent: weakref.WeakSet[Any] = weakref.WeakSet()
        self._driver: WindowDriver | None = None
        self._syncs: dict[str, Any] = {}
        self._sync_start: _dist.ClockSync | None = None
        self.trace_path: Path | None = None
        self.merge_summary: dict[str, Any] | None = None
        self.steps_by_optimizer = 0

    # ----------------------------------------------------------- properties

    @property
    def run_dir(self) -> Path:
        return self.recorder.run_dir

    @property
    def rank_dir(self) -> Path:
        return self.recorder.trace_dir

    @property
    def rank(self) -> int:
        return int(self.recorder.options.rank)

    @property
    def batch(self) -> int:
        """The global step of the current step (steps ended so far)."""
        return 0 if self._steps is None else int(self._steps.batch)

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return 0 if self._steps is None else int(self._steps.epoch)

    @property
    def batch_in_epoch(self) -> int:
        """The current step's batch within its epoch."""
        return 0 if self._steps is None else int(self._steps.batch_in_epoch)

    @property
    def action(self) -> Action:
        """The schedule's action for the current step."""
        return self._action

    @property
    def windows(self) -> list[dict[str, Any]]:
        """The torch.profiler windows so far (paths, steps, stalls, export time)."""
        return [] if self._driver is None else [w.to_dict() for w in self._driver.windows]

    def _variables(self) -> dict[str, Any]:
        o = self.recorder.options
        return {
            "run_name": o.run_name,
            "rank": o.rank,
            "local_rank": o.local_rank,
            "world_size": o.world_size,
            "local_world_size": o.local_world_size,
            "node_rank": o.node_rank,
            "epoch": self.epoch,
            "batch": self.batch,
            "batch_in_epoch": self.batch_in_epoch,
        }

    # ------------------------------------------------------------ lifecycle

    def start(self, *, defer_step: bool = False) -> Profiler:
        """Start profiling: checks, the recorder, a clock sync across ranks, the
        optimizer hook, and step 0. Raises :class:`fastprof.ConfigError` (and
        the recorder's errors) before anything is recorded.

        ``defer_step``: step 0 begins at the first :meth:`begin_step` (or train
        loader ``next()``) instead of now, for a loop a framework runs whose
        setup and sanity checks are no step; with none, the run has no steps."""
        if self._state != "new":
            raise ConfigError("a Profiler runs once; make a new one for another run")
        variables = self._variables()
        if self.torch_windows is not None:
            level = int(self.recorder.options.compression_level)
            self._driver = WindowDriver(self.torch_windows, self.run_dir, variables, compression_level=level)
            self._driver.check_folder()
        d = self.dist
        info: dict[str, Any] = {"rank": self.rank, "world_size": int(self.recorder.options.world_size)}
        if d.backend:
            info["backend"] = d.backend
        if self._owns_recorder:
            self.recorder.metadata.setdefault("distributedInfo", info)
            self.recorder.metadata["profiler"] = self._config()
            self.recorder.start()
        self._state = "running"
        self._thread_id = threading.get_ident()
        if self.sync_clocks_enabled:
            self._sync("start")
        self._install_optimizer_hook()
        self._steps = _core._StepLoop(self, self.recorder._session, "step", "profiler.action")
        self._steps.start(defer_step)
        return self

    def _config(self) -> dict[str, Any]:
        return {
            "schedule": repr(self.schedule),
            "torch": None if self.torch_windows is None else repr(self.torch_windows),
            "gate_spans": self.gate_spans,
            "dist": self.dist.__dict__ if hasattr(self.dist, "__dict__") else str(self.dist),
        }

    def stop(self) -> Path | None:
        """End profiling: close the step, stop the window, sync clocks, wait for
        exports, stop the recorder (if the profiler started it), write
        ``profiler.json`` and the unified trace. Returns the unified trace's
        path (None when not written). Never raises for a profiling failure."""
        if self._state != "running":
            return self.trace_path
        self._state = "stopping"
        try:
            if self._opt_handle is not None:
                self._opt_handle.remove()
                self._opt_handle = None
            # The last step, if anything was fetched into it: one that a
            # boundary opened and nothing fetched into is the time after the
            # loop, and a run of no iterations has no step.
            self._steps.stop()
            if self._driver is not None:
                self._driver.close()
            if self._paused_by_gate and self.recorder.active:
                self.recorder.resume()
            if self.sync_clocks_enabled:
                self._sync("end")
            exports_done = self._driver is None or self._driver.wait(self.merge_timeout)
            for message in [] if self._driver is None else self._driver.errors:
                warnings.warn(f"fastprof: {message}", FastprofWarning, stacklevel=2)
            if not exports_done:
                warnings.warn(
                    f"fastprof: torch window exports still running after {self.merge_timeout:g} s; "
                    "the unified trace may miss them",
                    FastprofWarning,
                    stacklevel=2,
                )
            self._stop_persistent_workers()
            if self._owns_recorder and self.recorder.active:
                self.recorder.stop()
            self._write_summary()
            self._finish()
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            warnings.warn(f"fastprof: Profiler.stop failed: {type(e).__name__}: {e}", FastprofWarning, stacklevel=2)
        finally:
            self._state = "stopped"
        return self.trace_path

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<fastprof.Profiler {self._state} run_dir={str(self.run_dir)!r} step={self.batch}>"

    # ---------------------------------------------------------------- steps
    # The core's step loop calls these when a step needs Python: never on a
    # quiet stretch of the schedule (see Schedule.quiet_steps).

    def _on_begin(
        self, batch: int, epoch: int, batch_in_epoch: int, epoch_len: int | None, driver: bool
    ) -> tuple[int, str, int, bool]:
        """Step ``batch`` begins: its action, the gate, torch's step (now, or
        once its batch came when ``driver`` is False). Returns (action level,
        action, quiet steps after this one, torch step due at the fetch)."""
        action = self.schedule.at(batch, epoch, batch_in_epoch, epoch_len)
        self._action = action
        if self.gate_spans:
            gate = action not in (Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE)
            if gate != self._paused_by_gate and self.recorder.active:
                (self.recorder.pause if gate else self.recorder.resume)()
                self._paused_by_gate = gate
        due = False
        d = self._driver
        if d is not None:
            if driver:
                # torch's ProfilerStep#N begins last, right before fastprof's step N.
                d.begin(action, batch, epoch)
            else:
                due = True
        quiet = 0
        if action in _QUIET and (d is None or not d.live):
            quiet = self.schedule.quiet_steps(batch, epoch, batch_in_epoch, epoch_len)
        return _ACTION_LEVEL[action], action.value, quiet, due

    def _on_end_annotation(self) -> None:
        # fastprof's step N was just recorded: torch's ProfilerStep#N, which
        # began before it, ends right after it (so the step nests inside).
        if self._driver is not None:
            self._driver.end_annotation()

    def _on_end(self, epoch: int, batch: int, batch_in_epoch: int) -> None:
        if self._driver is not None:
            self._driver.end(self._action, epoch, batch, batch_in_epoch)

    def _on_fetched(self) -> bool:
        """A batch came for a step whose torch step was held back: step torch
        now. True when a window is live (the step then begins here, after
        torch's ProfilerStep boundary, so the two still nest)."""
        d = self._driver
        if d is None:
            return False
        d.begin(self._action, self.batch, self.epoch)
        return bool(d.live)

    def _on_explicit(self) -> None:
        """The loop says where steps end (the first step() or begin_step()):
        optimizer steps no longer do."""
        if self._opt_handle is not None:
            self._opt_handle.remove()
            self._opt_handle = None

    def step(self) -> None:
        """End the current training step (the next begins at the train loader's
        next ``next()``, or now when no train loader is iterating). Never raises."""
        steps = self._steps
        if steps is not None and self._state == "running":
            steps.step()

    def _install_optimizer_hook(self) -> None:
        if "torch" not in sys.modules:
            return
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:
            return
        self._opt_handle = register_optimizer_step_post_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self._state != "running" or threading.get_ident() != self._thread_id or self._steps.explicit:
            return
        self.steps_by_optimizer += 1
        self._steps.optimizer_step()

    # ------------------------------------------------------ framework loops

    def begin_epoch(self, epoch_len: int | None = None) -> None:
        """A pass over the training data starts, in a loop that does not go
        through :meth:`loader` (a framework's): what a train loader's pass
        does, with ``epoch_len`` its number of batches when known. Until
        :meth:`end_epoch`, each step begins at :meth:`begin_step`. Never raises."""
        if self._state != "running":
            return
        n = epoch_len if isinstance(epoch_len, int) and not isinstance(epoch_len, bool) and epoch_len > 0 else None
        self._steps.start_epoch(n, True)

    def end_epoch(self) -> None:
        """The pass :meth:`begin_epoch` started is over: its last step ends
        here, and a step a fetch began without a :meth:`step` after it (the
        fetch that found the data exhausted) is no step."""
        if self._steps is not None:
            self._steps.end_epoch()

    def begin_step(self) -> None:
        """The next step begins now, if none is open (where a framework's loop
        fetches its batch, or starts the batch). A loop that says where its
        steps begin ends them with :meth:`step`: the first call switches the
        optimizer-step boundaries off. Never raises."""
        if self._state == "running":
            self._steps.begin_step()

    def mark(self, name: str, **args: Any) -> None:
        """An instant event ``name`` with ``args`` at this moment."""
        _core.instant(name, **args)

    def _internal_error(self, where: str, e: BaseException) -> None:
        warnings.warn(f"fastprof: Profiler {where} failed: {type(e).__name__}: {e}", FastprofWarning, stacklevel=3)

    # --------------------------------------------------------------- loaders

    def loader(self, iterable: Iterable[T], name: str = "train", *, epoch: bool | None = None) -> Iterator[T]:
        """Iterate ``iterable`` and time each ``next()`` as ``loader.<name>.next``.

        A pass over the train loader (``name="train"``, or ``epoch=True``)
        starts an epoch and begins each step at its ``next()``. Any iterable
        works (DataLoader, generator, list); loaders may nest (validation
        inside training). A DataLoader with workers also records each
        worker's fetches in the worker (see :mod:`fastprof.profiler.workers`)."""
        if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"Profiler.loader: invalid name {name!r}: expected letters, digits, _ or -")
        train = (name == "train") if epoch is None else bool(epoch)
        return self._iterate(iterable, name, train)

    def _iterate(self, iterable: Iterable[T], name: str, train: bool) -> Iterator[T]:
        names = self._loader_names.get(name)
        if names is None:
            names = self._loader_names[name] = _LoaderNames(name)

        def setup(it: Iterable[T]) -> Iterator[T]:
            # At the first next(), as a generator would: a loader made but
            # never iterated starts no epoch.
            self._instrument_workers(it, name)
            bs = getattr(it, "batch_size", None)
            if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0 and self._state == "running":
                # Samples per batch, for the reports' samples/s.
                _core.counter(f"loader.{name}.batch_size", bs)
            if train and self._state == "running":
                self._new_epoch(it)
            with _core.span(f"loader.{name}.iter"):
                iterator = iter(it)
            return iterator

        steps = self._steps if train and self._state == "running" else None
        return _core._LoaderIter(iterable, setup, steps, names.next, names.wait)

    def _new_epoch(self, iterable: Iterable[Any]) -> None:
        try:
            n = len(iterable)  # type: ignore[arg-type]
            epoch_len = n if isinstance(n, int) and n > 0 else None
        except Exception:  # noqa: BLE001 - not every iterable has a length
            epoch_len = None
        self._steps.start_epoch(epoch_len, False)

    def _stop_persistent_workers(self) -> None:
        """Persistent DataLoader workers outlive the loop, and their recordings
        with them: shut them down so that their traces are complete before the
        merge. A later pass over the loader starts new workers (torch does when
        the loader has no live iterator)."""
        for loader in list(self._persistent):
            it = getattr(loader, "_iterator", None)
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is None:
                continue
            try:
                shutdown()
                loader._iterator = None
            except Exception as e:  # noqa: BLE001
                self._internal_error("stopping persistent DataLoader workers", e)
        self._persistent.clear()

    def _instrument_workers(self, iterable: Any, name: str) -> None:
        if getattr(iterable, "num_workers", 0) in (0, None) or self._state != "running":
            return
        try:
            from fastprof.profiler import workers  # type: ignore[attr-defined,unused-ignore]
        except ImportError:
            return
        try:
            o = self.recorder.options
            workers.instrument(
                iterable, name=name, rank_dir=self.rank_dir, run_name=o.run_name, rank=o.rank, world_size=o.world_size
            )
            if getattr(iterable, "persistent_workers", False):
                self._persistent.add(iterable)
        except Exception as e:  # noqa: BLE001
            self._internal_error("loader worker instrumentation", e)

    # ---------------------------------------------------------------- clocks

    def _sync(self, phase: str) -> None:
        dist = _dist._initialized()
        if dist is None or dist.get_world_size() < 2:
            return
        try:
            sync = _dist.sync_clocks()
        except Exception as e:  # noqa: BLE001
            self._internal_error(f"clock sync ({phase})", e)
            return
        entry = sync.to_dict()
        if phase == "start":
            self._sync_start = sync
        elif self._sync_start is not None and sync.taken_ns > self._sync_start.taken_ns:
            entry["drift_ppm"] = _dist.drift_ppm(self._sync_start, sync)
        self._syncs[phase] = entry
        if self.recorder.active:
            _dist.apply_to_recorder(self.recorder, sync)
            _core.instant("fastprof.clock_sync", phase=phase, **entry)

    # ------------------------------------------------------------------ exit

    def _write_summary(self) -> None:
        summary = {
            "version": _core.__version__,
            "run_name": self.recorder.options.run_name,
            "rank": self.rank,
            "world_size": int(self.recorder.options.world_size),
            "dist": dict(self.dist.__dict__),
            "steps": self.batch,
            "epochs": self.epoch + (1 if self._steps is not None and self._steps.train_passes else 0),
            "steps_by_optimizer": self.steps_by_optimizer,
            "schedule": repr(self.schedule),
            "gate_spans": self.gate_spans,
            "torch": None
            if self._driver is None
            else {"config": repr(self.torch_windows), "failed": self._driver.failed, "windows": self.windows},
            "clock_sync": self._syncs,
        }
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.rank_dir / f".profiler.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(summary, indent=1, default=str))
        os.replace(tmp, self.rank_dir / "profiler.json")

    def _finish(self) -> None:
        """Say this rank is done; rank 0 waits for the others and merges."""
        (self.rank_dir / _DONE_MARKER).write_text(str(os.getpid()))
        world = int(self.recorder.options.world_size)
        store = _store()
        key = f"fastprof/{self.recorder.options.run_name}/done/"
        if store is not None:
            try:
                store.set(key + str(self.rank), "1")
            except Exception:  # noqa: BLE001 - the store may already be gone; marker files remain
                store = None
        if not self.merge_enabled or not self._owns_recorder or self.rank != 0:
            return
        missing = self._wait_for_ranks(world, store, key)
        if missing:
            warnings.warn(
                f"fastprof: rank(s) {', '.join(map(str, missing))} did not finish within "
                f"{self.merge_timeout:g} s (merge_timeout); the unified trace holds the others. "
                f"Redo it later with: fastprof merge {self.run_dir} -o {self.run_dir / 'trace.json.gz'} --force",
                FastprofWarning,
                stacklevel=3,
            )
        inputs = _merge_inputs(self.run_dir)
        if not inputs:
            return
        out = self.run_dir / "trace.json.gz"
        from fastprof._merge import merge

        self.merge_summary = merge(inputs, out, force=True)
        self.trace_path = out

    def _wait_for_ranks(self, world: int, store: Any, key: str) -> list[int]:
        deadline = time.monotonic() + self.merge_timeout
        pending = set(range(world)) - {self.rank}
        while pending:
            for r in sorted(pending):
                done = (self.run_dir / f"rank{r}" / _DONE_MARKER).exists()
                if not done and store is not None:
                    try:
                        done = bool(store.check([key + str(r)]))
                    except Exception:  # noqa: BLE001
                        store = None
                if done:
                    pending.discard(r)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return sorted(pending)


def _store() -> Any:
    dist = _dist._initialized()
    if dist is None:
        return None
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store: marker files do
        return None


def _merge_inputs(run_dir: Path) -> list[str]:
    """Every trace under the run's rank directories, as the core's input
    walker finds them (the CLI merge, the columns and the reports use the
    same): fastprof segments (also a crashed rank's open ``.part``), torch
    windows, DataLoader workers; never ``profiler.json``, memory timelines,
    hidden or temporary files."""
    ranks = [str(d) for d in sorted(run_dir.glob("rank*")) if d.is_dir()]
    if not ranks:
        return []
    files, _own, _removed, _warnings = _core.trace_inputs(ranks)
    return list(files)


def _torch_importable() -> bool:
    if "torch" in sys.modules:
        return True
    import importlib.util

    return importlib.util.find_spec("torch") is not None
