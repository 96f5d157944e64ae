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
        self.next = _core.name_id(f"loader.{name}.next")
        self.wait = _core.name_id(f"loader.{name}.wait_ms")


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
        # Loop position.
        self.epoch = 0
        self.batch = 0
        self.batch_in_epoch = 0
        self._epoch_len: int | None = None
        self._train_passes = 0
        self._in_train_pass = 0
        self._framework_pass = False
        self._action = Action.WAIT
        self._last_level = -1
        self._open = False
        self._fresh = False
        self._t0 = 0
        self._step_args: tuple[int, int, int, str] = (0, 0, 0, "")
        self._pending = False
        self._end_due = False
        self._driver_due = False
        self._opt_pending = False
        self._depth = 0
        self._explicit = False
        self._opt_ended = False
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
        self._step_name = _core.name_id("step")

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
        if defer_step:
            self._pending = True
        else:
            self._begin_step()
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
            if self._opt_pending:
                self._opt_pending = False
                self._boundary()
            self._take_due_end()
            if self._open and (not self._fresh or self.batch == 0):
                # The last step, if it did anything: one that a boundary
                # opened and nothing fetched into is the time after the loop.
                self._end_step()
            self._open = self._pending = False
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

    def _begin_step(self, driver: bool = True) -> None:
        self._pending = False
        self._fresh = True
        action = self.schedule.at(self.batch, self.epoch, self.batch_in_epoch, self._epoch_len)
        self._action = action
        if self.gate_spans:
            gate = action not in (Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE)
            if gate != self._paused_by_gate and self.recorder.active:
                (self.recorder.pause if gate else self.recorder.resume)()
                self._paused_by_gate = gate
        if self.recorder.active:
            self.recorder.mark_step(self.batch)
        level = _ACTION_LEVEL[action]
        if level != self._last_level:
            _core.counter("profiler.action", level)
            self._last_level = level
        self._step_args = (self.epoch, self.batch, self.batch_in_epoch, action.value)
        self._open = True
        self._depth = _core._span_depth()
        if self._driver is not None:
            if driver:
                # torch's ProfilerStep#N begins last, right before fastprof's step N.
                self._driver.begin(action, self.batch, self.epoch)
            else:
                self._driver_due = True
        self._t0 = _core._ticks()

    def _end_step(self) -> None:
        epoch, batch, batch_in_epoch, action = self._step_args
        if self._driver is not None:
            # torch's ProfilerStep#N ends first, then fastprof's step N, with
            # nothing between them that allocates (a garbage collection there
            # would part the two ends).
            self._driver.end_annotation()
        # Recorded whole at its end (begin and end at once): a step may end
        # while spans the user opened inside it are still open.
        _core._complete(
            self._step_name, self._t0, epoch=epoch, batch=batch, batch_in_epoch=batch_in_epoch, action=action
        )
        self._open = False
        if self._driver is not None:
            self._driver.end(self._action, epoch, batch, batch_in_epoch)
        self.batch += 1
        self.batch_in_epoch += 1

    def _on_fetch(self) -> bool:
        """A train loader's next() is about to block: the step begins here.
        True when this call began it (see :meth:`_unbegin`)."""
        if self._opt_pending:
            self._opt_pending = False
            self._boundary()
        self._take_due_end()
        began = self._pending
        if began:
            # Past the loader's known length the fetch may find it exhausted
            # (an unsized loader, always): torch is stepped only once a batch
            # came (see _fetched), so a step that is no step never moves a window.
            n = self._epoch_len
            self._begin_step(driver=n is not None and self.batch_in_epoch < n)
        elif self._fresh and self._open:
            # Opened at start (or by a boundary outside a train pass) and
            # nothing fetched yet: the step starts with its first fetch.
            self._t0 = _core._ticks()
        self._fresh = False
        self._opt_ended = False
        return began

    def _fetched(self) -> None:
        """A batch came for a step whose torch step was held back: step torch
        now; inside a window the step then begins here, after torch's
        ProfilerStep boundary (so the two still nest)."""
        self._driver_due = False
        if self._driver is not None:
            self._driver.begin(self._action, self.batch, self.epoch)
            if self._driver.live:
                self._t0 = _core._ticks()

    def _unbegin(self) -> None:
        """The fetch that began a step found the loader exhausted: that step
        is not one (nothing of it is recorded until its end). It begins again
        at the next train fetch; a torch window stays open across the gap
        (as torch's own loop would trace validation between epochs)."""
        self._open = False
        self._pending = True
        self._driver_due = False

    def step(self) -> None:
        """End the current training step (the next begins at the train loader's
        next ``next()``, or now when no train loader is iterating). Never raises."""
        if self._state != "running":
            return
        try:
            if self._go_explicit():
                if self._opt_pending:
                    # The optimizer's step asked for this boundary; it is taken here, once.
                    self._opt_pending = False
                elif self._opt_ended:
                    # The optimizer's step already ended this step.
                    self._opt_ended = False
                    return
            self._boundary()
        except Exception as e:  # noqa: BLE001
            self._internal_error("step", e)

    def _go_explicit(self) -> bool:
        """The loop says where steps end: optimizer steps no longer do. True
        on the first call."""
        if self._explicit:
            return False
        self._explicit = True
        if self._opt_handle is not None:
            self._opt_handle.remove()
            self._opt_handle = None
        return True

    def _boundary(self) -> None:
        self._take_due_end()
        if self._pending:
            # A step whose begin never came (no train loader next() since the
            # last boundary): it still counts, as an empty span.
            self._begin_step()
        if self._in_train_pass:
            # Inside a train pass the step ends where the next begins, at the
            # next fetch (or where the pass ends): steps tile the epoch, and
            # torch's ProfilerStep boundary is taken at the same place.
            self._end_due = self._open
            self._pending = True
            return
        if self._open:
            self._end_step()
        self._begin_step()

    def _take_due_end(self) -> None:
        if self._end_due:
            self._end_due = False
            self._end_step()

    def _install_optimizer_hook(self) -> None:
        if "torch" not in sys.modules:
            return
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:
            return
        self._opt_handle = register_optimizer_step_post_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self._explicit or self._state != "running" or threading.get_ident() != self._thread_id:
            return
        try:
            self.steps_by_optimizer += 1
            if self._opt_pending or _core._span_depth() <= self._depth:
                self._opt_pending = False
                self._boundary()
                self._opt_ended = True
            else:
                # Inside a span the user opened within the step (e.g. around
                # optimizer.step()): ending the step here would cut across
                # it. The boundary waits for the next train fetch, step()
                # call or optimizer step.
                self._opt_pending = True
        except Exception as e:  # noqa: BLE001
            self._internal_error("optimizer step hook", e)

    # ------------------------------------------------------ framework loops

    def begin_epoch(self, epoch_len: int | None = None) -> None:
        """A pass over the training data starts, in a loop that does not go
        through :meth:`loader` (a framework's): what a train loader's pass
        does, with ``epoch_len`` its number of batches when known. Until
        :meth:`end_epoch`, each step begins at :meth:`begin_step`. Never raises."""
        if self._state != "running":
            return
        try:
            if self._framework_pass:
                self._in_train_pass -= 1
            n = epoch_len if isinstance(epoch_len, int) and epoch_len > 0 else None
            self._start_epoch(n)
            self._in_train_pass += 1
            self._framework_pass = True
        except Exception as e:  # noqa: BLE001
            self._internal_error("begin_epoch", e)

    def end_epoch(self) -> None:
        """The pass :meth:`begin_epoch` started is over: its last step ends
        here, and a step a fetch began without a :meth:`step` after it (the
        fetch that found the data exhausted) is no step."""
        if self._framework_pass:
            self._in_train_pass -= 1
            self._framework_pass = False
            if self._state == "running":
                try:
                    self._take_due_end()
                    if self._open and not self._in_train_pass:
                        self._unbegin()
                except Exception as e:  # noqa: BLE001
                    self._internal_error("end_epoch", e)

    def begin_step(self) -> None:
        """The next step begins now, if none is open (where a framework's loop
        fetches its batch, or starts the batch). A loop that says where its
        steps begin ends them with :meth:`step`: the first call switches the
        optimizer-step boundaries off. Never raises."""
        if self._state != "running":
            return
        try:
            self._go_explicit()
            self._on_fetch()
        except Exception as e:  # noqa: BLE001
            self._internal_error("begin_step", e)

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
        self._instrument_workers(iterable, name)
        bs = getattr(iterable, "batch_size", None)
        if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0 and self._state == "running":
            # Samples per batch, for the reports' samples/s.
            _core.counter(f"loader.{name}.batch_size", bs)
        if train and self._state == "running":
            self._new_epoch(iterable)
        with _core.span(f"loader.{name}.iter"):
            it = iter(iterable)
        if train:
            self._in_train_pass += 1
        wait, begin, end, counter, clock = names.wait, names.next.begin, _core.end, _core.counter, time.perf_counter_ns
        try:
            while True:
                began = train and self._state == "running" and self._on_fetch()
                t0 = clock()
                begin()
                try:
                    item = next(it)
                except StopIteration:
                    end()
                    if began:
                        self._unbegin()
                    return
                except BaseException:
                    end()
                    raise
                end()
                counter(wait, (clock() - t0) * 1e-6)
                if began and self._driver_due:
                    self._fetched()
                yield item
        finally:
            if train:
                self._in_train_pass -= 1
                if not self._in_train_pass and self._state == "running":
                    self._take_due_end()  # the loop left the pass early (break)

    def _new_epoch(self, iterable: Iterable[Any]) -> None:
        try:
            n = len(iterable)  # type: ignore[arg-type]
            epoch_len = n if isinstance(n, int) and n > 0 else None
        except Exception:  # noqa: BLE001 - not every iterable has a length
            epoch_len = None
        self._start_epoch(epoch_len)

    def _start_epoch(self, epoch_len: int | None) -> None:
        self._epoch_len = epoch_len
        self._train_passes += 1
        self._take_due_end()
        if self._train_passes == 1:
            return  # epoch 0: step 0 (open since start) begins at the first fetch
        if self._open and self._fresh:
            # Begun outside a train pass and nothing fetched: it is this
            # epoch's first step; begin it again at the new position.
            self._open = False
            self._pending = True
        elif self._open:
            self._end_step()
        self.epoch += 1
        self.batch_in_epoch = 0
        self._pending = True

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
            "epochs": self.epoch + (1 if self._train_passes else 0),
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
    """Every trace under the run's rank directories: fastprof segments (also a
    crashed rank's open ``.part``), torch windows, DataLoader workers; not the
    profiler summaries or memory timelines."""
    out: list[str] = []
    for rank_dir in sorted(run_dir.glob("rank*")):
        for root, _dirs, files in os.walk(rank_dir):
            for f in sorted(files):
                if f.startswith(".") or f == "profiler.json" or ".memory." in f:
                    continue
                if f.endswith((".json", ".json.gz")) or (f.startswith("fastprof.") and f.endswith(".json.gz.part")):
                    out.append(os.path.join(root, f))
    return out


def _torch_importable() -> bool:
    if "torch" in sys.modules:
        return True
    import importlib.util

    return importlib.util.find_spec("torch") is not None
