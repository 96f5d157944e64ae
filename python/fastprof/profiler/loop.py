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

The Profiler is a coordinator (see :mod:`fastprof.profiler.driver`): it
keeps this API, its state (new, running, stopping, stopped) and the core's
step loop, whose callbacks :mod:`fastprof.profiler.seam` answers (what a
step records, where steps and epochs begin and end, framework loops are
explained there); each feature is a driver in :mod:`fastprof.profiler.drivers`.

At exit: the recorder stops (when the profiler started it), the exports
finish, ``rank{R}/profiler.json`` says what happened (windows, stalls, clock
syncs), and the unified trace ``<run>/trace.json.gz`` is merged by the Rust
merger: by rank 0 once every rank has finished (coordinated through the
process group's store, else marker files, with a bounded wait).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fastprof import _core, _dist, _signals
from fastprof._core import ConfigError, FastprofWarning
from fastprof._loop_api import LoopHost
from fastprof.memory.history import MemoryHistory
from fastprof.profiler.driver import Closing, Driver, overrides
from fastprof.profiler.drivers.anatomy import AnatomyDriver
from fastprof.profiler.drivers.build import Absent, build
from fastprof.profiler.drivers.clocks import ClockDriver
from fastprof.profiler.drivers.memory import MemoryDriver
from fastprof.profiler.drivers.optimizer import OptimizerStepsDriver
from fastprof.profiler.drivers.triggers.config import Triggers
from fastprof.profiler.drivers.windows import WindowsDriver
from fastprof.profiler.drivers.workers import WorkersDriver
from fastprof.profiler.front import LoopFront
from fastprof.profiler.hosting import Hosting
from fastprof.profiler.loaders import Loaders
from fastprof.profiler.options import OPTIONS, UNSET, Resolved, attach_recorder, resolve
from fastprof.profiler.schedule import Schedule
from fastprof.profiler.seam import StepSeam
from fastprof.profiler.torch_windows import TorchWindows
from fastprof.recording.names import ACTION_COUNTER, STEP_SPAN
from fastprof.recording.recorder import Recorder

__all__ = ["OPTIONS", "Profiler"]

T = TypeVar("T")
D = TypeVar("D", bound=Driver)

#: The drivers' hooks the coordinator calls, each on the drivers that have it.
_HOOKS = (
    "prepare", "start", "capture", "begin", "fetch", "end_annotation", "end", "step_done", "window_saved",
    "on_exception", "on_exit_event", "unhook", "close", "finish", "stopped", "release", "step_aside", "live",
)  # fmt: skip


class Profiler(LoopFront):
    """The training-loop profiler (see the module documentation).

    ``schedule``: a :mod:`fastprof.schedule` schedule (default
    ``schedule.epoch()``). ``torch``: a :class:`TorchWindows` (default one
    when torch is installed), or None/False for no torch.profiler.
    ``sample_hz`` and ``**recorder_options`` go to the :class:`fastprof.Recorder`
    it starts; when a recorder is already running, it is used (and left
    running) instead. Options not given come from ``FASTPROF_*`` variables,
    then defaults; a bad value raises :class:`fastprof.ConfigError` here,
    before training. ``hang_timeout`` (seconds, ``"auto"``, ``"off"``) and
    ``hang_action`` (``"report"``, ``"abort"``): the hang watchdog (docs/hangs.md).
    ``rank_summary`` (default True): ``rank{R}/summary.fastprof`` at the end.
    """

    #: The recorder it records into (its own, or one already running).
    recorder: Recorder

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        *,
        schedule: Schedule | Callable[[int], Any] | str | None = None,
        torch: TorchWindows | bool | None = UNSET,
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
        hang_timeout: float | str | None = None,
        hang_action: str | None = None,
        rank_summary: bool | None = None,
        recorder: Recorder | None = None,
        **recorder_options: Any,
    ) -> None:
        self._options = opts = resolve({k: v for k, v in locals().items() if k in Resolved.__dataclass_fields__})
        self.schedule: Schedule = opts.schedule
        self.torch_windows: TorchWindows | None = opts.torch
        self.gate_spans: bool = opts.gate_spans
        self.memory_stats: bool = opts.memory_stats
        self.memory_history: MemoryHistory | None = opts.memory_history
        self.model_depth: int = opts.model_depth
        self.anatomy: bool = opts.anatomy
        self.triggers: Triggers | None = opts.triggers
        self.merge_enabled: bool = opts.merge
        self.merge_timeout: float = opts.merge_timeout
        self.sync_clocks_enabled: bool = opts.sync_clocks
        where = {"out_dir": out_dir, "run_name": run_name, "sample_hz": sample_hz}
        self.recorder, self._owns_recorder = attach_recorder(recorder, where, recorder_options, self.triggers)
        self.dist: _dist.DistInfo = _dist.dist_info()
        self._state = "new"
        self._thread_id: int | None = None
        # The step lifecycle and loop position live in the core (one C call
        # per loader fetch or step); it calls back the seam.
        self._steps: Any = None
        self._seam = StepSeam(self, self.schedule)
        self._exit_reason: str | None = None
        self.trace_path: Path | None = None
        self.trace_url: str | None = None
        self.merge_summary: dict[str, Any] | None = None
        self.steps_by_optimizer = 0
        self._hosting = Hosting(self)
        self._use(build(self, opts))
        workers = self._driver(WorkersDriver)
        self._loaders = Loaders(self, workers.instrument if workers is not None else lambda _it, _name: None)

    def _use(self, drivers: list[Driver]) -> None:
        """The drivers, and for each hook the drivers that implement it."""
        self._drivers = drivers
        self._hooks = {name: [d for d in drivers if overrides(d, name)] for name in _HOOKS}
        self._seam.use(self._hooks)

    def _driver(self, cls: type[D]) -> D | None:
        return next((d for d in self._drivers if isinstance(d, cls)), None)

    def _each(self, hook: str, *args: Any) -> None:
        for d in self._hooks[hook]:
            getattr(d, hook)(*args)

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
    def windows(self) -> list[dict[str, Any]]:
        """The torch.profiler windows so far (paths, steps, stalls, export time)."""
        d = self._driver(WindowsDriver)
        return [] if d is None else [w.to_dict() for w in d.records()]

    @property
    def model_summary_path(self) -> Path | None:
        """``Profiler(model=...)``: the model summary written at start."""
        d = self._driver(MemoryDriver)
        return None if d is None else d.model_summary_path

    # ------------------------------------- what the parts around the loop use
    # The protocols of fastprof._loop_api: the drivers, exits, outputs,
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

    def quiet_torch_windows(self) -> None:
        """Keep Kineto's own log lines of this Profiler's windows out of the
        job's stderr (``fastprof run``, whose script asked for no window)."""
        d = self._driver(WindowsDriver)
        if d is not None and d.windows is not None:
            d.windows.quiet_kineto = True

    def dump_flight_recorder(self, reason: str) -> None:
        """An event ending the run (``"sigterm"``, ``"exception"``, ``"oom"``):
        the triggers dump the flight recorder's last seconds now (nothing
        without triggers)."""
        self._each("on_exit_event", reason)

    def window_saved(self) -> None:
        """A torch window's export ended (on the exporter thread)."""
        self._each("window_saved")

    def account(self) -> dict[str, Any]:
        """``profiler.json``'s account of the run (the disk cap and the exit
        are added by :mod:`fastprof.profiler.outputs`)."""
        out = {
            "run_name": self.recorder.options.run_name,
            "rank": self.rank,
            "world_size": int(self.recorder.options.world_size),
            "dist": dict(self.dist.__dict__),
            "steps": self.batch,
            "epochs": self.epoch + (1 if self._loop("train_passes") else 0),
            "steps_by_optimizer": self.steps_by_optimizer,
            "schedule": repr(self.schedule),
            "gate_spans": self.gate_spans,
        }
        for d in self._drivers:
            if d.key is not None:
                out[d.key] = d.account()
        return out

    # ------------------------------------------------------------ lifecycle

    def start(self, *, defer_step: bool = False) -> Profiler:
        """Start profiling: checks, the recorder, the drivers (a clock sync
        across ranks, the optimizer hook...), and step 0. Raises
        :class:`fastprof.ConfigError` (and the recorder's errors) before
        anything is recorded.

        ``defer_step``: step 0 begins at the first :meth:`begin_step` (or train
        loader ``next()``) instead of now, for a loop a framework runs whose
        setup and sanity checks are no step; with none, the run has no steps."""
        if self._state != "new":
            raise ConfigError("a Profiler runs once; make a new one for another run")
        if self._owns_recorder:
            # First: the run directory (a suffixed one when an earlier run
            # holds the name) is what the windows and memory files go under.
            self.recorder.choose_run_dir()
        try:
            self._each("prepare")
            info: dict[str, Any] = {"rank": self.rank, "world_size": int(self.recorder.options.world_size)}
            if self.dist.backend:
                info["backend"] = self.dist.backend
            if self._owns_recorder:
                self.recorder.metadata.setdefault("distributedInfo", info)
                self.recorder.metadata["profiler"] = self._options.metadata(self.dist)
                self.recorder.start()
        except OSError as e:
            # The run directory cannot be written (read-only, a file in the
            # way, no space): profiling never takes the job down. Training
            # goes on unrecorded; every method of this Profiler passes through.
            self._use([])
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
        host = self._hosting.running_host()
        if host is not None:
            host.step_aside(self)  # before this one's hooks and signal handlers go in
        self._steps = _core._StepLoop(self._seam, self.recorder.core_session, STEP_SPAN, ACTION_COUNTER)
        for d in list(self._hooks["start"]):
            try:
                d.start(self._steps)
            except Exception as e:  # profiling never takes the job down (a job's own exception goes on)
                if _signals.is_job(e):
                    raise
                name = d.key or type(d).__name__
                warnings.warn(f"fastprof: {name} off ({type(e).__name__}: {e})", FastprofWarning, stacklevel=2)
                off: Driver = Absent(d.key, None) if d.key is not None else Driver()
                self._use([off if x is d else x for x in self._drivers])
        self._steps.start(defer_step)
        # While running, prof.step() is the core's own method: one C call per
        # step, no Python frame (the method below stands in before and after).
        self.__dict__["step"] = self._steps.step
        return self

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
        for other in self._hosting.successors:
            # A script's Profiler still open when the script ended: it closes
            # first, as the script's own ``with`` would have.
            other.close(reason)
        self._state = "stopping"
        self.__dict__.pop("step", None)  # step() checks the state again (see start)
        self._exit_reason = reason
        closing = Closing(
            reason,
            reason in ("exit", "SIGTERM"),
            bool(self._hosting.successors),
            self._hosting.running_host() is not None,
        )
        hooks = self._hooks
        try:
            self._end_steps()
            # The phases of the protocol (fastprof.profiler.driver), each
            # over every driver before the next.
            for d in hooks["close"]:
                d.close(closing)
            for d in hooks["finish"]:
                d.finish(closing)
            if self._owns_recorder and self.recorder.active:
                self.recorder.stop()
            for d in hooks["stopped"]:
                d.stopped(closing)
        except Exception as e:  # profiling never takes the job down (the job's own exception goes on)
            if _signals.is_job(e):
                raise
            warnings.warn(f"fastprof: Profiler.stop failed: {type(e).__name__}: {e}", FastprofWarning, stacklevel=4)
        finally:
            self._state = "stopped"
            self._seam.stopped = True
            for d in reversed(hooks["release"]):
                d.release()
            self._hosting.release()
        return self.trace_path

    def _end_steps(self) -> None:
        """No more steps: the drivers' hooks into the job go, and the step
        loop closes the last step, if anything was fetched into it (one that
        a boundary opened and nothing fetched into is the time after the
        loop, and a run of no iterations has no step)."""
        self._each("unhook")
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
        finishes the run (see :mod:`fastprof.profiler.hosting`)."""
        self._hosting.host(on_step_aside)

    @property
    def successor(self) -> LoopHost | None:
        """Under ``fastprof run``: the script's own Profiler that took the
        loop from this one (the latest), None when none did."""
        s = self._hosting.successors
        return s[-1] if s else None

    def step_aside(self, other: Profiler) -> None:
        """The script started its own Profiler ``other``: its steps are the
        run's. The inferred steps and what the drivers record for this one
        end here, so that nothing is recorded twice and the script's signal
        handlers are the ones in place."""
        self._hosting.step_aside(other, self._stand_down)

    def _stand_down(self) -> None:
        self._end_steps()
        self._each("step_aside")

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.close_after(exc)

    def close_after(self, exc: BaseException | None) -> None:
        """Close as ``with prof:`` does when its block ends with ``exc`` (None:
        normally): the drivers see the exception first (an out-of-memory
        error is captured, the flight recorder dumped), and the reason is
        recorded (a framework's end of training, ``fastprof run``'s end of
        the script)."""
        if self._state != "running":
            return
        # The capture and the dump are part of the way out: the job's signal
        # handlers wait for them as for the close. A DataLoader worker that
        # died is torch's SIGCHLD handler raising "DataLoader worker ...
        # exited unexpectedly" wherever the main thread is; in a flight dump
        # it was taken for the dump's failure and the job ended on the error
        # that came before it (#34).
        with _signals.deferred():
            if exc is not None and not isinstance(exc, (SystemExit, GeneratorExit)):
                # The exception itself is the job's and goes on unchanged.
                self._each("on_exception", exc)
            self._close_now(_exception_reason(exc))

    def __repr__(self) -> str:
        return f"<fastprof.Profiler {self._state} run_dir={str(self.run_dir)!r} step={self.batch}>"

    # ---------------------------------------------------------------- steps

    def remove_optimizer_hook(self) -> None:
        """The ``optimizer.step()`` hook that ends steps goes (``fastprof run``
        installs its own in its place, so each optimizer step counts once)."""
        d = self._driver(OptimizerStepsDriver)
        if d is not None:
            d.unhook()

    def hook_torch_phases(self) -> None:
        """Time each step's forward, backward, optimizer and communication
        phases (:mod:`fastprof.profiler.anatomy`) once torch is imported: at
        start, or when ``fastprof run`` sees torch imported later. Never raises."""
        d = self._driver(AnatomyDriver)
        if d is not None and self._state == "running":
            d.hook()

    # ---------------------------------------------------------------- clocks

    def sync_clocks_once(self, phase: str) -> None:
        """The clock sync of ``phase`` across ranks, unless clock syncs are
        off or that phase's is done (``fastprof run`` runs the start sync
        once the script made its process group)."""
        d = self._driver(ClockDriver)
        if d is not None:
            d.once(phase)


def _exception_reason(exc: BaseException | None) -> str | None:
    """None for a normal end (no exception, or ``sys.exit(0)``), else the
    reason :meth:`Profiler.close` records."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return None
    return f"exception: {type(exc).__name__}"
