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

import contextlib
import functools
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from fastprof import _core, _dist, _signals
from fastprof._core import ConfigError, FastprofWarning
from fastprof._loop_api import LoopHost
from fastprof._process import PROCESS
from fastprof.always_on.triggers import DEFAULT_FLIGHT_SECONDS, TriggerDriver, Triggers
from fastprof.memory import collector as _collect
from fastprof.memory import oom as _oom
from fastprof.memory.history import HistoryDriver, MemoryHistory
from fastprof.memory.history import driver as history_driver
from fastprof.memory.model_summary import model_summary
from fastprof.memory.oom import capture as capture_oom
from fastprof.memory.oom import is_oom
from fastprof.memory.step_stats import StepMemory
from fastprof.profiler import exits as _exits
from fastprof.profiler import outputs as _outputs
from fastprof.profiler import workers
from fastprof.profiler.anatomy import Anatomy
from fastprof.profiler.options import _BY_NAME, OPTIONS
from fastprof.profiler.plan import ActionPlan
from fastprof.profiler.schedule import Action, Schedule
from fastprof.profiler.torch_windows import TorchWindows, WindowDriver, WindowRecord
from fastprof.recording.options import _value
from fastprof.recording.recorder import Recorder, current, set_run_host

__all__ = ["OPTIONS", "Profiler"]

T = TypeVar("T")
_UNSET: Any = object()

#: Seconds the closing clock sync may wait for the other ranks (the start sync
#: alone is enough to merge; a rank that never arrives costs this, not 60 s).
END_SYNC_TIMEOUT_S = 5.0
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
#: The steps of a window (the allocator history records during them).
_RECORDING = frozenset((Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE))


def _warn_first(what: str, errors: list[str]) -> None:
    """One warning for a part's failures: the first, and how many more
    (all in profiler.json)."""
    if errors:
        more = f" (and {len(errors) - 1} more: see profiler.json)" if len(errors) > 1 else ""
        warnings.warn(f"fastprof: {what}: {errors[0]}{more}; training went on", FastprofWarning, stacklevel=5)


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

    #: The recorder it records into (its own, or one already running).
    recorder: Recorder

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        *,
        schedule: Schedule | Callable[[int], Any] | str | None = None,
        torch: TorchWindows | bool | None = _UNSET,
        sample_hz: float | None = None,
        gate_spans: bool | None = None,
        memory_stats: bool | None = None,
        anatomy: bool | None = None,
        memory_history: MemoryHistory | bool | None = None,
        triggers: Triggers | bool | None = None,
        model: Any = None,
        model_depth: int | None = None,
        merge: bool | None = None,
        merge_timeout: float | None = None,
        sync_clocks: bool | None = None,
        recorder: Recorder | None = None,
        **recorder_options: Any,
    ) -> None:
        env = os.environ
        self.schedule: Schedule = _value(_BY_NAME["schedule"], schedule, env)
        self.gate_spans: bool = _value(_BY_NAME["gate_spans"], gate_spans, env)
        self.memory_stats: bool = _value(_BY_NAME["memory_stats"], memory_stats, env)
        self.anatomy: bool = _value(_BY_NAME["anatomy"], anatomy, env)
        self._anatomy = Anatomy() if self.anatomy else None
        self.model_depth: int = _value(_BY_NAME["model_depth"], model_depth, env)
        self.memory_history: MemoryHistory | None = _config_object("memory_history", memory_history, MemoryHistory)
        self.triggers: Triggers | None = _config_object("triggers", triggers, Triggers)
        triggers = self.triggers
        self._triggers: TriggerDriver | None = None
        self._history: HistoryDriver | None = None
        self._history_due: tuple[int, int, int] | None = None
        self._oom_pending = False
        self._memory_dir_error: str | None = None
        self._model = model
        self.model_summary_path: Path | None = None
        self._memory = StepMemory(self.memory_stats)
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
            named = {"out_dir": out_dir, "run_name": run_name, "sample_hz": sample_hz, **given}
            unused = [k for k, v in named.items() if v is not None]
            host = PROCESS.run_host
            if unused and recorder is None and host is not None and host.recorder is running:
                # The script's own Profiler under fastprof run: the command
                # line chose where the run records; the script still runs
                # (a line, not a warning: -W error must not end the job).
                print(
                    f"fastprof run: this Profiler's options {', '.join(unused)} are not used: the run records in "
                    f"{running.run_dir} (fastprof run's options decide)",
                    file=sys.stderr,
                    flush=True,
                )
            elif unused:
                raise ConfigError(
                    f"a fastprof Recorder is already running ({running.run_dir}); "
                    "drop out_dir/run_name/recorder options, or stop it first"
                )
            self.recorder = running
            self._owns_recorder = False
        else:
            if (
                recorder is None
                and triggers is not None
                and triggers.flight_events
                and recorder_options.get("window_seconds") is None
                and not env.get("FASTPROF_WINDOW_SECONDS", "").strip()
            ):
                # Flight dumps need the recorder's window: a bounded one (window_bytes).
                recorder_options["window_seconds"] = DEFAULT_FLIGHT_SECONDS
            self.recorder = recorder or Recorder(out_dir, run_name, sample_hz=sample_hz, **recorder_options)
            self._owns_recorder = True
            # Its upload ends once profiler.json and the memory files are written (outputs.finish).
            self.recorder.hold_upload = True
        self.dist: _dist.DistInfo = _dist.dist_info()
        self._state = "new"
        self._thread_id: int | None = None
        # The step lifecycle and loop position live in the core (one C call
        # per loader fetch or step; see rust/fastprof-py/src/steps.rs); it
        # calls back the _on_* methods below when a step needs the schedule,
        # a torch window or the recorder's gate.
        self._steps: Any = None
        self._action = Action.WAIT
        self._plan = ActionPlan()
        self._opt_handle: Any = None
        self._paused_by_gate = False
        self._loader_names: dict[str, _LoaderNames] = {}
        self._persistent: weakref.WeakSet[Any] = weakref.WeakSet()
        self._driver: WindowDriver | None = None
        self._syncs: dict[str, Any] = {}
        self._sync_start: _dist.ClockSync | None = None
        self._exit_reason: str | None = None
        self._begun: dict[str, int] = {}
        self._passes = 0  # train passes begun (the loop's own count stands in for it)
        self.trace_path: Path | None = None
        self.trace_url: str | None = None
        self.merge_summary: dict[str, Any] | None = None
        self.steps_by_optimizer = 0
        #: fastprof run's Profiler: what to undo when a script's own Profiler
        #: takes the loop, and the Profilers that took it.
        self._on_step_aside: Callable[[], None] | None = None
        self._successors: list[Profiler] = []

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
        return int(self._loop("batch"))

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return int(self._loop("epoch"))

    @property
    def batch_in_epoch(self) -> int:
        """The current step's batch within its epoch."""
        return int(self._loop("batch_in_epoch"))

    def _loop(self, name: str) -> int:
        """A position of the core's step loop; while the loop is inside one of
        its callbacks (a signal handler closing the Profiler there) it cannot
        be read, and the position of the step that began last stands in."""
        if self._steps is None:
            return 0
        try:
            return int(getattr(self._steps, name))
        except RuntimeError:  # already mutably borrowed
            return self._begun.get(name, 0)

    @property
    def action(self) -> Action:
        """The current step's action: the schedule's, merged with a
        triggered capture's (see :mod:`fastprof.profiler.plan`)."""
        return self._action

    @property
    def windows(self) -> list[dict[str, Any]]:
        """The torch.profiler windows so far (paths, steps, stalls, export time)."""
        return [] if self._driver is None else [w.to_dict() for w in self._driver.windows]

    # ------------------------------------- what the parts around the loop use
    # The protocols of fastprof._loop_api: the triggers, exits, outputs,
    # memory and fastprof run use these, never an attribute with a "_".

    @property
    def running(self) -> bool:
        """Started and not yet closing."""
        return self._state == "running"

    @property
    def stopped(self) -> bool:
        """Closed (``stop()`` is over)."""
        return self._state == "stopped"

    def on_training_thread(self) -> bool:
        """Whether the caller runs on the thread that started this Profiler."""
        return threading.get_ident() == self._thread_id

    @property
    def owns_recorder(self) -> bool:
        """Whether this Profiler started its recorder (else it borrows one,
        which it neither stops nor merges)."""
        return self._owns_recorder

    @property
    def exit_reason(self) -> str | None:
        """How the run ended: None for a normal ``stop()``, else the reason
        :meth:`close` was given."""
        return self._exit_reason

    @property
    def has_torch_windows(self) -> bool:
        """Whether this Profiler drives torch.profiler windows."""
        return self._driver is not None

    def last_window(self) -> WindowRecord | None:
        """The latest torch.profiler window begun (None before the first)."""
        d = self._driver
        return d.windows[-1] if d is not None and d.windows else None

    def quiet_torch_windows(self) -> None:
        """Keep Kineto's own log lines of this Profiler's windows out of the
        job's stderr (``fastprof run``, whose script asked for no window)."""
        if self._driver is not None:
            self._driver.quiet_kineto = True

    def watch_step_times(self, window: int, factor: float, mads: float, min_excess_ns: int) -> None:
        """The core's step-time anomaly detector on this Profiler's step loop
        (see :class:`fastprof.Triggers`)."""
        if self._steps is not None:
            self._steps.anomaly_detector(window, factor, mads, min_excess_ns)

    def dump_flight_recorder(self, reason: str) -> None:
        """An event ending the run (``"sigterm"``, ``"exception"``, ``"oom"``):
        the triggers dump the flight recorder's last seconds now (nothing
        without triggers)."""
        if self._triggers is not None:
            self._triggers.on_exit_event(reason)

    def account(self) -> dict[str, Any]:
        """``profiler.json``'s account of the run (the disk cap and the exit
        are added by :mod:`fastprof.profiler.outputs`)."""
        return {
            "run_name": self.recorder.options.run_name,
            "rank": self.rank,
            "world_size": int(self.recorder.options.world_size),
            "dist": dict(self.dist.__dict__),
            "steps": self.batch,
            "epochs": self.epoch + (1 if self._loop("train_passes") else 0),
            "steps_by_optimizer": self.steps_by_optimizer,
            "schedule": repr(self.schedule),
            "gate_spans": self.gate_spans,
            "anatomy": "off (anatomy=False)" if self._anatomy is None else self._anatomy.status,
            "memory": {
                **self._memory.summary(),
                "history": None if self._history is None else self._history.summary(),
                "collect": _collect.summary(),
                "oom": _oom.summary(self),
            },
            "torch": None
            if self._driver is None
            else {"config": repr(self.torch_windows), "failed": self._driver.failed, "windows": self.windows},
            "triggers": None if self._triggers is None else self._triggers.summary(),
            "clock_sync": self._syncs,
        }

    def format_variables(self) -> dict[str, Any]:
        """The variables a folder or file name may use, now."""
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
        if self._owns_recorder:
            # First: the run directory (a suffixed one when an earlier run
            # holds the name) is what the windows and memory files go under.
            self.recorder.choose_run_dir()
        variables = self.format_variables()
        try:
            if self.torch_windows is not None:
                level = int(self.recorder.options.compression_level)
                self._driver = WindowDriver(
                    self.torch_windows,
                    self.run_dir,
                    variables,
                    compression_level=level,
                    on_saved=self._on_window_saved,
                    gzip_from=self.recorder.gzip_from,
                )
                if not self.recorder.options.resume:
                    # A resumed run appends: its windows take new names
                    # beside the earlier run's (the export never overwrites).
                    self._driver.check_folder()
            d = self.dist
            info: dict[str, Any] = {"rank": self.rank, "world_size": int(self.recorder.options.world_size)}
            if d.backend:
                info["backend"] = d.backend
            if self._owns_recorder:
                self.recorder.metadata.setdefault("distributedInfo", info)
                self.recorder.metadata["profiler"] = self._config()
                self.recorder.start()
        except OSError as e:
            # The run directory cannot be written (read-only, a file in the
            # way, no space): profiling never takes the job down. Training
            # goes on unrecorded; every method of this Profiler passes through.
            self._driver = None
            self._state = "disabled"
            warnings.warn(
                f"fastprof: cannot write the run directory {self.run_dir} ({type(e).__name__}: {e}); "
                "training goes on without profiling",
                FastprofWarning,
                stacklevel=2,
            )
            return self
        self._state = "running"
        self._thread_id = threading.get_ident()
        host = self._running_host()
        if host is not None:
            host.step_aside(self)  # before this one's hooks and signal handlers go in
        _exits.register(self)
        if self.sync_clocks_enabled:
            self._sync("start")
        self._install_optimizer_hook()
        self.hook_torch_phases()
        self._steps = _core._StepLoop(self, self.recorder.core_session, "step", "profiler.action")
        if self._anatomy is not None:
            # The step's number straight from the loop (no Python frame per phase).
            self._anatomy.step_of = functools.partial(getattr, self._steps, "batch")
        self._memory.start(self._steps)
        if self.memory_history is not None:
            self._history = history_driver(self.memory_history)
        self._memory_dir_error = None
        if self._model is not None or (self._history is not None and self._history.available):
            self._memory_dir_error = self._check_memory_folders()
        if self._history is not None:
            if self._memory_dir_error is not None and self._history.available:
                self._history.reason = f"the memory folder cannot be written: {self._memory_dir_error}"
            if self._history.state_every and self._history.available:
                self._steps.memory_hook(True)  # the state-only snapshots are taken at step ends
        self._oom_pending = _oom.watch(self)
        if self._oom_pending:
            self._steps.memory_hook(True)  # torch's OOM observer is attached at a step's end
        _collect.reset(self.rank_dir / "memory", unwritable=self._memory_dir_error)
        if self._model is not None and self._memory_dir_error is None:
            self._write_model_summary()
        self._model = None  # the Profiler keeps no reference to the model
        if self.triggers is not None:
            try:
                self._triggers = TriggerDriver(self.triggers, self)
                self._triggers.start()
            except Exception as e:  # noqa: BLE001 - profiling never takes the job down
                self._triggers = None
                warnings.warn(f"fastprof: triggers off ({type(e).__name__}: {e})", FastprofWarning, stacklevel=2)
        self._steps.start(defer_step)
        # While running, prof.step() is the core's own method: one C call per
        # step, no Python frame (the method below stands in before and after).
        self.__dict__["step"] = self._steps.step
        return self

    def _on_window_saved(self, window: WindowRecord) -> None:
        """On the exporter thread, a torch window's export ended: its files
        count under the recorder's disk cap (max_disk), and the triggers say
        at once that it is there (``fastprof trigger`` waits for it)."""
        # The trace's gzip was written within disk the cap held for it,
        # given back as the file counts (or, not written, only given back).
        held, window.held = window.held, 0
        if window.saved:
            for p, release in ((window.path, held), (window.memory_timeline, 0)):
                if p and self.recorder.count_file(p, "torch", release):
                    window.deleted = True  # larger than the cap leaves room for (its ledger says so)
        elif held and window.path:
            self.recorder.count_file(window.path, "torch", held)
        t = self._triggers
        if t is not None:
            t.on_window_saved()

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
        return self.close(None)

    def close(self, reason: str | None = None) -> Path | None:
        """:meth:`stop`, for a normal end (``reason`` None) or a way out that
        is not one: ``"exception: <type>"`` (an exception leaves the ``with``
        block or Lightning's fit), ``"exit"`` (interpreter exit with the
        Profiler still running), ``"SIGTERM"``. Leaving by any of those runs
        no collective (the closing clock sync is skipped: the start sync is
        enough to merge) and waits for no other rank; at exit and on SIGTERM
        the exports get a bounded wait, and on SIGTERM nothing is merged.

        The job's signal handlers wait while it closes (``_signals.deferred``)
        and run once it is done; an exception a handler of the job's raises
        in it anyway (through SIGTERM's chain) goes on as the job's."""
        if self._state != "running":
            return self.trace_path
        with _signals.deferred():
            return self._close_now(reason)

    def _close_now(self, reason: str | None) -> Path | None:
        for other in self._successors:
            # A script's Profiler still open when the script ended: it closes
            # first, as the script's own ``with`` would have.
            other.close(reason)
        self._state = "stopping"
        self.__dict__.pop("step", None)  # step() checks the state again (see start)
        self._exit_reason = reason
        abrupt = reason in ("exit", "SIGTERM")
        hosted = self._running_host() is not None
        try:
            self._end_steps()
            if self._driver is not None:
                self._driver.close()
            if self._paused_by_gate and self.recorder.active:
                self.recorder.resume()
            if self.sync_clocks_enabled and reason is None:
                self._sync("end", timeout=END_SYNC_TIMEOUT_S)
            elif self.sync_clocks_enabled and _dist.process_group() is not None:
                self._syncs["end"] = {"skipped": reason}
            wait_s = min(self.merge_timeout, _exits.SIGNAL_EXPORT_WAIT_S) if abrupt else self.merge_timeout
            exports_done = self._driver is None or self._driver.wait(wait_s)
            if self._driver is not None and self._driver.errors:
                errors = self._driver.errors
                more = f" (and {len(errors) - 1} more: see profiler.json)" if len(errors) > 1 else ""
                warnings.warn(f"fastprof: {errors[0]}{more}", FastprofWarning, stacklevel=4)
            if not exports_done:
                warnings.warn(
                    f"fastprof: torch window exports still running after {wait_s:g} s; the unified trace may miss them",
                    FastprofWarning,
                    stacklevel=4,
                )
            if self._history is not None:
                # Before the recorder stops: the last dumps' writes are on the timeline.
                self._history.close(
                    self._history_path(self.epoch, self.batch, self.batch_in_epoch), self.batch, 5.0 if abrupt else 60.0
                )
                _warn_first("allocator history", self._history.errors())
            self._stop_persistent_workers()
            if self._triggers is not None:
                self._triggers.stop()
            if self._owns_recorder and self.recorder.active:
                self.recorder.stop()
            _collect.wait(5.0 if abrupt else 60.0)
            _warn_first(
                "allocator snapshots of collected calls",
                [f"{e['path']}: {e['error']}" for e in _collect.summary()["snapshots"] if e.get("error")],
            )
            if not self._successors:  # else the script's Profiler wrote the summary of the loop
                _outputs.write_summary(self)
                try:
                    if self._memory_dir_error is None:
                        _collect.write(self.rank_dir / "memory")
                except OSError as e:  # the rest of the run (summary, merge) is written all the same
                    _warn_first("memory collection", [f"{self.rank_dir / 'memory'}: {type(e).__name__}: {e}"])
            else:  # written while this recorder still recorded: what its disk cap deleted is known now
                _outputs.update_rotation(self)
            if not hosted:  # under fastprof run, its Profiler says the rank is done, once recorded
                _outputs.finish(self, wait=reason is None, merged=reason != "SIGTERM")
        except Exception as e:  # profiling never takes the job down (the job's own exception goes on)
            if _signals.is_job(e):
                raise
            warnings.warn(f"fastprof: Profiler.stop failed: {type(e).__name__}: {e}", FastprofWarning, stacklevel=4)
        finally:
            spool = self.recorder.spool
            if self._owns_recorder and spool is not None and spool.result is None and not self.recorder.active:
                # The end above failed before its upload: the files still go, or are named.
                with contextlib.suppress(Exception):
                    spool.finish()
            self._state = "stopped"
            _exits.unregister(self)
            _oom.unwatch(self)
            if PROCESS.run_host is self:
                PROCESS.run_host = None
                set_run_host(None)
        return self.trace_path

    def _end_steps(self) -> None:
        """No more steps: the optimizer hook goes, and the step loop closes
        the last step, if anything was fetched into it (one that a boundary
        opened and nothing fetched into is the time after the loop, and a
        run of no iterations has no step)."""
        self.remove_optimizer_hook()
        if self._anatomy is not None:
            self._anatomy.stop()
        try:
            self._steps.stop()
        except RuntimeError:
            # Already borrowed: a signal landed in a callback of the step
            # loop (in the job's schedule function, or torch's step). The
            # step in progress goes unrecorded; the rest is saved, and the
            # callbacks pass through from now on (state "stopped").
            pass

    # ----------------------------------------------------- under fastprof run

    def host_run(self, on_step_aside: Callable[[], None]) -> None:
        """Make this (started) Profiler ``fastprof run``'s: a Profiler the
        script itself starts on the same recorder takes the loop from it
        (:meth:`step_aside`, which calls ``on_step_aside`` to unhook the
        inferred steps); this one keeps the recorder, and at its close
        finishes the run (the rank's done marker, the merge)."""
        self._on_step_aside = on_step_aside
        PROCESS.run_host = self
        set_run_host(self.recorder)  # a Recorder the script starts joins this one

    def _running_host(self) -> Profiler | None:
        """fastprof run's Profiler, when this is a script's Profiler on its
        recorder and it still runs."""
        host: Profiler | None = PROCESS.run_host
        if host is not None and host is not self and host.recorder is self.recorder and host.running:
            return host
        return None

    @property
    def successor(self) -> LoopHost | None:
        """Under ``fastprof run``: the script's own Profiler that took the
        loop from this one (the latest), None when none did."""
        return self._successors[-1] if self._successors else None

    def step_aside(self, other: Profiler) -> None:
        """The script started its own Profiler ``other``: its steps are the
        run's. The inferred steps, torch windows, history and triggers of
        this one end here (once), so that nothing is recorded twice and the
        script's signal handlers are the ones in place."""
        self._successors.append(other)
        if len(self._successors) > 1:
            return
        inferred = self.batch
        try:
            if self._on_step_aside is not None:
                self._on_step_aside()
            self._end_steps()
            if self._driver is not None:
                self._driver.close()
            if self._history is not None:
                self._history.close(self._history_path(self.epoch, self.batch, self.batch_in_epoch), self.batch, 60.0)
                self._history = None
            if self._triggers is not None:
                self._triggers.stop()
                self._triggers = None
            _oom.unwatch(self)
            if self._paused_by_gate and self.recorder.active:
                self.recorder.resume()
                self._paused_by_gate = False
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            print(f"fastprof run: handing the loop to the script's Profiler: {type(e).__name__}: {e}", file=sys.stderr)
        print(
            "fastprof run: the script starts its own fastprof.Profiler: its steps are the run's "
            f"({inferred} inferred before it)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.close_after(exc)

    def close_after(self, exc: BaseException | None) -> None:
        """Close as ``with prof:`` does when its block ends with ``exc`` (None:
        normally): an out-of-memory error is captured and the flight
        recorder dumped first, and the reason is recorded (a framework's
        end of training, ``fastprof run``'s end of the script)."""
        if self._state != "running":
            return
        # The capture and the dump are part of the way out: the job's signal
        # handlers wait for them as for the close. A DataLoader worker that
        # died is torch's SIGCHLD handler raising "DataLoader worker ...
        # exited unexpectedly" wherever the main thread is; in a flight dump
        # it was taken for the dump's failure and the job ended on the error
        # that came before it (#34).
        with _signals.deferred():
            self._on_exception(exc)
            self._close_now(_exception_reason(exc))

    def _on_exception(self, exc: BaseException | None) -> None:
        """An exception is leaving the profiled code: an out-of-memory error
        is captured (``fastprof.memory.oom``) before the Profiler closes;
        the exception itself is the job's and goes on unchanged."""
        if self._state != "running" or exc is None or isinstance(exc, (SystemExit, GeneratorExit)):
            return
        oom = is_oom(exc)
        if oom:
            capture_oom(self, exc)
        if self._triggers is not None:
            self._triggers.on_exit_event("oom" if oom else "exception")

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
        if self._state == "stopped":  # closed from inside the step loop (see close)
            return _ACTION_LEVEL[self._action], self._action.value, 0, False
        self._begun = {"batch": batch, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "train_passes": self._passes}
        scheduled = self.schedule.at(batch, epoch, batch_in_epoch, epoch_len)
        t = self._triggers
        capture = None
        if t is not None:
            if _core._attention_take():
                t.on_boundary(batch, epoch)
            capture = t.capture_steps()
        # The schedule's action merged with a capture's, in the one order a
        # torch.profiler window takes (see fastprof.profiler.plan).
        action = self._plan.action(batch, scheduled, capture)
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
        if self._history is not None and action in _RECORDING:
            sch = self.schedule
            window = int(getattr(sch, "warmup", 1)) + int(getattr(sch, "active", 4))
            if driver:
                self._history.begin(True, window, batch, epoch)
            else:
                # As torch's step: only once a batch came (the loader may be
                # exhausted, and then this step is no step).
                self._history_due = (window, batch, epoch)
                due = True
        quiet = 0
        if action in _QUIET and (d is None or not d.live):
            quiet = self._plan.quiet(batch, self.schedule.quiet_steps(batch, epoch, batch_in_epoch, epoch_len), capture)
        return _ACTION_LEVEL[action], action.value, quiet, due

    def _on_end_annotation(self) -> None:
        # fastprof's step N was just recorded: torch's ProfilerStep#N, which
        # began before it, ends right after it (so the step nests inside).
        if self._driver is not None and self._state != "stopped":
            self._driver.end_annotation()

    def _on_end(self, epoch: int, batch: int, batch_in_epoch: int) -> None:
        closed = self._plan.end(batch, self._action)
        if self._driver is not None and self._state != "stopped":
            self._driver.end(self._action, epoch, batch, batch_in_epoch)
        if self._triggers is not None and self._state != "stopped":
            self._triggers.on_step_end(batch, closed, self._plan.with_schedule)
        if self._history is not None and self._state != "stopped":
            self._history.end(self._action.saves, self._history_path(epoch, batch, batch_in_epoch), batch)

    def _history_path(self, epoch: int, batch: int, batch_in_epoch: int, state: bool = False) -> Path:
        """Where the allocator history of the window ending at this step goes
        (``state``: the state-only snapshot taken at this step's end)."""
        cfg = self.memory_history
        assert cfg is not None
        v = {**self.format_variables(), "epoch": epoch, "batch": batch, "batch_in_epoch": batch_in_epoch}
        name = cfg.state_filename if state else cfg.filename
        return self.run_dir / str(cfg.folder).format(**v) / str(name).format(**v)

    def _check_memory_folders(self) -> str | None:
        """Before training: the folders memory files go to can be written
        (``rank{R}/memory`` and the history's folder, at epoch and batch 0).
        None when they can; else what failed, said in one warning, and the
        allocator history, model summary and collection files are skipped."""
        folders = {self.rank_dir / "memory"}
        if self.memory_history is not None:
            v = {**self.format_variables(), "epoch": 0, "batch": 0, "batch_in_epoch": 0}
            folders.add(self.run_dir / str(self.memory_history.folder).format(**v))
        for d in sorted(folders):
            try:
                d.mkdir(parents=True, exist_ok=True)
                probe = d / f".fastprof-probe.tmp-{os.getpid()}"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as e:
                why = f"{d}: {type(e).__name__}: {e.strerror or e}"
                warnings.warn(
                    f"fastprof: cannot write the memory folder {why}; no allocator history, model summary or "
                    "memory collection files this run; training goes on",
                    FastprofWarning,
                    stacklevel=3,
                )
                return why
        return None

    def _write_model_summary(self) -> None:
        """``Profiler(model=...)``: the model's summary to ``model_depth``
        levels, ``rank{R}/memory/model_summary.json`` and ``.txt`` (the
        report copies them into ``reports/``). A failure is a warning."""
        try:
            summary = model_summary(self._model, depth=self.model_depth)
            self.model_summary_path, _ = summary.write(self.rank_dir / "memory")
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            warnings.warn(f"fastprof: no model summary ({type(e).__name__}: {e})", FastprofWarning, stacklevel=3)
        finally:
            self._model = None  # the Profiler keeps no reference to the model

    def _on_memory(self, epoch: int, batch: int, batch_in_epoch: int) -> None:
        """The step loop, at step ``batch``'s end (quiet steps too): the CUDA
        allocator's statistics, and a state-only allocator snapshot when one
        is due."""
        if self._memory.hooked:
            self._memory.on_step_end()
        if self._oom_pending:
            self._oom_pending = _oom.poll()
        h = self._history
        if h is not None and self._state != "stopped" and h.state_due(batch):
            h.state(self._history_path(epoch, batch, batch_in_epoch, state=True), batch, epoch)

    def _on_fetched(self) -> bool:
        """A batch came for a step whose torch step was held back: step torch
        now. True when a window is live (the step then begins here, after
        torch's ProfilerStep boundary, so the two still nest)."""
        h, self._history_due = self._history_due, None
        if h is not None and self._history is not None and self._state != "stopped":
            self._history.begin(True, *h)
        d = self._driver
        if d is None or self._state == "stopped":
            return False
        d.begin(self._action, self.batch, self.epoch)
        return bool(d.live)

    def _on_explicit(self) -> None:
        """The loop says where steps end (the first step() or begin_step()):
        optimizer steps no longer do."""
        self.remove_optimizer_hook()

    def remove_optimizer_hook(self) -> None:
        """The ``optimizer.step()`` hook that ends steps goes (``fastprof run``
        installs its own in its place, so each optimizer step counts once)."""
        if self._opt_handle is not None:
            self._opt_handle.remove()
            self._opt_handle = None

    def hook_torch_phases(self) -> None:
        """Time each step's forward, backward, optimizer and communication
        phases (:mod:`fastprof.profiler.anatomy`) once torch is imported: at
        start, or when ``fastprof run`` sees torch imported later. Never raises."""
        if self._anatomy is not None and self._state == "running":
            self._anatomy.start()

    def explain_step(self, step: int) -> str | None:
        """Which phase made step ``step`` slow, from the anatomy of the recent
        steps (None without one)."""
        return None if self._anatomy is None else self._anatomy.explain(step)

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

    def begin_epoch(self, epoch_len: int | None = None, *, tile: bool = True) -> None:
        """A pass over the training data starts, in a loop that does not go
        through :meth:`loader` (a framework's): what a train loader's pass
        does, with ``epoch_len`` its number of steps when known. Until
        :meth:`end_epoch`, each step begins at :meth:`begin_step`.

        ``tile``: steps tile the epoch, each ending where the next begins (what
        runs between a :meth:`step` and the next fetch is the ending step's).
        False: a step ends at :meth:`step`, and what runs until the next
        :meth:`begin_step` (a framework's evaluation, logging, checkpoint) is
        in no step. Never raises."""
        if self._state != "running":
            return
        n = epoch_len if isinstance(epoch_len, int) and not isinstance(epoch_len, bool) and epoch_len > 0 else None
        self._passes += 1
        self._steps.start_epoch(n, bool(tile))

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
            return self.open_pass(it, name, train)

        steps = self._steps if train and self._state == "running" else None
        return _core._LoaderIter(iterable, setup, steps, names.next, names.wait)

    def open_pass(
        self, it: Iterable[T], name: str, train: bool, opener: Callable[[Iterable[T]], Iterator[T]] = iter
    ) -> Iterator[T]:
        """A pass over ``it`` begins: its workers record, its batch size is
        counted, a train pass starts an epoch, and ``opener(it)`` (``iter``,
        or ``fastprof run``'s unpatched ``DataLoader.__iter__``) is timed as
        ``loader.<name>.iter``. Returns the pass's iterator."""
        self._instrument_workers(it, name)
        bs = getattr(it, "batch_size", None)
        if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0 and self._state == "running":
            # Samples per batch, for the reports' samples/s.
            _core.counter(f"loader.{name}.batch_size", bs)
        if train and self._state == "running":
            self._new_epoch(it)
        with _core.span(f"loader.{name}.iter"):
            iterator = opener(it)
        return iterator

    def timed(self, iterator: Iterator[T], name: str) -> Iterator[T]:
        """Time each ``next()`` of an iterator already opened (by
        :meth:`open_pass`) as ``loader.<name>.next`` (no step bookkeeping:
        the caller says where steps begin)."""
        names = self._loader_names.get(name)
        if names is None:
            names = self._loader_names[name] = _LoaderNames(name)
        return _core._LoaderIter(iterator, _same, None, names.next, names.wait)

    def _new_epoch(self, iterable: Iterable[Any]) -> None:
        try:
            n = len(iterable)  # type: ignore[arg-type]
            epoch_len = n if isinstance(n, int) and n > 0 else None
        except Exception:  # noqa: BLE001 - not every iterable has a length
            epoch_len = None
        self._passes += 1
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
            o = self.recorder.options
            workers.instrument(
                iterable,
                name=name,
                rank_dir=self.rank_dir,
                run_name=o.run_name,
                rank=o.rank,
                world_size=o.world_size,
                disk=(int(o.segment_size), int(o.max_disk), int(o.keep_segments)),
            )
            if getattr(iterable, "persistent_workers", False):
                self._persistent.add(iterable)
        except Exception as e:  # noqa: BLE001
            self._internal_error("loader worker instrumentation", e)

    # ---------------------------------------------------------------- clocks

    def sync_clocks_once(self, phase: str) -> None:
        """The clock sync of ``phase`` across ranks, unless clock syncs are
        off or that phase's is done (``fastprof run`` runs the start sync
        once the script made its process group)."""
        if self.sync_clocks_enabled and phase not in self._syncs:
            self._sync(phase)

    def _sync(self, phase: str, timeout: float = 60.0) -> None:
        dist = _dist.process_group()
        if dist is None or dist.get_world_size() < 2:
            return
        try:
            sync = _dist.sync_clocks(timeout=timeout)
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


def _same(it: T) -> T:
    return it


def _config_object(name: str, value: Any, cls: type[T]) -> T | None:
    """An option that is a config object or a switch (``memory_history``,
    ``triggers``): None takes its variable, True the defaults, False none."""
    if value is None:
        value = _value(_BY_NAME[name], None, os.environ)
    if value is True:
        return cls()
    if value is False:
        return None
    if not isinstance(value, cls):
        raise ConfigError(f"invalid option {name}: expected a fastprof.{cls.__name__}, True or False, got {value!r}")
    return value


def _exception_reason(exc: BaseException | None) -> str | None:
    """None for a normal end (no exception, or ``sys.exit(0)``), else the
    reason :meth:`Profiler.close` records."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return None
    return f"exception: {type(exc).__name__}"


def _torch_importable() -> bool:
    if "torch" in sys.modules:
        return True
    import importlib.util

    return importlib.util.find_spec("torch") is not None
