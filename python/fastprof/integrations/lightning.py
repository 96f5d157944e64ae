"""``FastprofProfiler``: fastprof as a Lightning profiler.

::

    from fastprof.integrations.lightning import FastprofProfiler

    trainer = lightning.pytorch.Trainer(
        profiler=FastprofProfiler(schedule=fastprof.schedule.epoch(wait=1, warmup=1, active=2)),
    )
    trainer.fit(model, train_loader, val_loader)

What it records, per ``Trainer`` stage (``fit``, ``validate``, ``test``,
``predict``), in a run directory of its own:

* every action Lightning profiles (each hook of the module, callbacks,
  strategy and data module, ``[_TrainingEpochLoop].train_dataloader_next``,
  ``run_training_epoch``, ``run_training_batch``, ``optimizer_step``,
  validation's fetches, ``save_checkpoint``...) as a span of that name, and
  the whole stage as ``lightning.<stage>``. Lightning calls the profiler's
  ``start``/``stop``/``profile`` around every hook of every batch, so these
  are C methods of a ``fastprof._core._ActionClock`` bound on the instance:
  one C call each way, an action recorded whole at its stop (starts and stops
  need not nest; an action started again before its stop keeps a stack);
* through a :class:`fastprof.Profiler` (which owns the recorder, the
  schedule, the ``torch.profiler`` windows and the unified trace), for the
  fit stage: an epoch per ``run_training_epoch``, and a ``step`` per training
  batch, from its fetch (``train_dataloader_next``, or the start of
  ``run_training_batch`` when the batch was prefetched) to the end of
  ``run_training_batch``. Validation, sanity checks, test and predict batches
  are spans only, never steps; a ``validate``/``test``/``predict`` stage has
  no steps (hence no torch windows).

At the end of each stage (Lightning's ``describe``/``teardown``) the
profiler stops, the unified trace ``<run>/trace.json.gz`` is written, and a
table of the stage's actions (calls, mean, total, share of the stage), read
back from this rank's trace segments, is logged as Lightning's profilers do,
returned by :meth:`FastprofProfiler.summary`, and written to
``<run>/fastprof_summary.txt`` (``fastprof_summary.rank{R}.txt`` on other
ranks).

The run directory: ``<out_dir>/<run_name>``, ``out_dir`` defaulting to
``FASTPROF_OUT_DIR``, else the trainer's ``log_dir``/fastprof, else
``fastprof_runs``; a second stage of the same profiler with an explicit
``run_name`` goes to ``<run_name>-2`` (and so on).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastprof._package import pip_install

try:
    from lightning.pytorch.callbacks import Callback as _Callback
    from lightning.pytorch.profilers import Profiler as _LightningProfiler
except ImportError as _e:  # pragma: no cover - exercised without lightning installed
    raise ImportError(
        "fastprof.integrations.lightning needs Lightning (the `lightning` package, >= 2.2): "
        f"{pip_install('lightning')} or pip install 'lightning>=2.2'"
    ) from _e

import numpy as np

from fastprof import _core
from fastprof._core import FastprofError, FastprofWarning
from fastprof.profiler.args import ProfilerArgs
from fastprof.profiler.loop import Profiler
from fastprof.profiler.options import UNSET
from fastprof.profiler.schedule import Schedule
from fastprof.profiler.torch_windows import TorchWindows
from fastprof.readers.columns import read_columns
from fastprof.recording.names import SEGMENT_PREFIX, SEGMENT_SUFFIX, STEP_SPAN

__all__ = ["FastprofProfiler"]

#: Lightning's action names that drive the fit stage's epochs and steps
#: (lightning/pytorch/loops/fit_loop.py and training_epoch_loop.py).
EPOCH_ACTION = "run_training_epoch"
BATCH_ACTION = "run_training_batch"
FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"


class FastprofProfiler(_LightningProfiler):
    """A Lightning profiler recording through fastprof (see the module docs).

    ``out_dir``, ``run_name``, ``schedule``, ``torch`` (a
    :class:`fastprof.TorchWindows`, or False for no torch.profiler),
    ``sample_hz``, ``gate_spans``, ``merge``, ``merge_timeout``,
    ``sync_clocks`` and ``**recorder_options`` go to the
    :class:`fastprof.Profiler` made for each stage; they are checked here
    (:class:`fastprof.ConfigError` before any training). ``summary_file``:
    write the summary table into the run directory.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        *,
        schedule: Schedule | Callable[[int], Any] | str | None = None,
        torch: TorchWindows | bool | None = UNSET,
        sample_hz: float | None = None,
        gate_spans: bool | None = None,
        merge: bool | None = None,
        merge_timeout: float | None = None,
        sync_clocks: bool | None = None,
        summary_file: bool = True,
        **recorder_options: Any,
    ) -> None:
        super().__init__(dirpath=None, filename=None)
        self.out_dir = out_dir
        self.run_name = run_name
        self.summary_file = summary_file
        options = {
            "schedule": schedule,
            "torch": torch,
            "sample_hz": sample_hz,
            "gate_spans": gate_spans,
            "merge": merge,
            "merge_timeout": merge_timeout,
            "sync_clocks": sync_clocks,
            **recorder_options,
        }
        # Every option checked now, before training.
        self._args = ProfilerArgs.checked(out_dir, run_name, options)
        #: The fastprof.Profiler of the stage running now (None between stages).
        self.profiler: Profiler | None = None
        #: The fastprof.Profiler of the last finished stage.
        self.last: Profiler | None = None
        self._runs = 0
        self._stage_name: _core.Name | None = None
        self._stage_t0 = 0
        self._summary = ""
        self._bind_clock()

    def _bind_clock(self) -> None:
        clock = _core._ActionClock()
        self._clock = clock
        # Lightning calls start/stop/profile for every hook of every batch:
        # the clock's C methods bound on the instance are what it calls,
        # without a Python frame in between (the methods below are the same
        # thing, for callers that go through the class).
        self.__dict__.update(start=clock.start, stop=clock.stop, profile=clock.profile)

    # Lightning's Profiler interface (the instance's bindings take precedence).

    def start(self, action_name: str) -> None:
        self._clock.start(action_name)

    def stop(self, action_name: str) -> None:
        self._clock.stop(action_name)

    def profile(self, action_name: str) -> Any:
        return self._clock.profile(action_name)

    def summary(self) -> str:
        """The last finished stage's table ("" before one finished)."""
        return self._summary

    # ------------------------------------------------------------ lifecycle

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        self._finish()
        stage = str(getattr(stage, "value", stage))  # Lightning passes a TrainerFn (a str enum)
        self._runs += 1
        prof = self._args.make(self._runs, lambda: Path(log_dir) / "fastprof" if log_dir else "fastprof_runs")
        self._clock.clear()
        self._set_hooks(stage == "fit", prof)
        # A bad option or a refused run directory raises here, before training
        # (as fastprof.Profiler.start does); anything else warns and the stage
        # runs unprofiled.
        try:
            prof.start(defer_step=True)
        except FastprofError:
            self._set_hooks(False, None)
            raise
        except Exception as e:  # noqa: BLE001 - profiling never takes training down
            self._set_hooks(False, None)
            warnings.warn(f"fastprof: Lightning profiler failed to start: {e}", FastprofWarning, stacklevel=2)
            return
        self.profiler = prof
        self._stage_name = _core.name_id(f"lightning.{stage}")
        self._stage_t0 = _core._ticks()
        self._watch_exceptions()

    def _watch_exceptions(self) -> None:
        """An exception out of a stage reaches no profiler method (Lightning
        calls ``on_exception`` on callbacks and the strategy, then tears the
        strategy down, and re-raises): a callback of ours closes the run there,
        with the open torch window, before the exception leaves ``fit``."""
        try:
            trainer = self._lightning_module.trainer  # type: ignore[attr-defined]
            callbacks = trainer.callbacks
            if not any(isinstance(c, _CloseOnException) and c.owner is self for c in callbacks):
                callbacks.append(_CloseOnException(self, self._finish))
        except Exception:  # noqa: BLE001 - no trainer attached: the exit hook closes the run at exit instead
            pass

    def describe(self) -> None:
        # Lightning calls this at the end of a stage; it logs summary() and
        # calls teardown(), so the run must be finished first.
        self._finish()
        super().describe()

    def teardown(self, stage: str | None) -> None:
        self._finish()
        super().teardown(stage)

    def _set_hooks(self, fit: bool, prof: Profiler | None) -> None:
        clock = self._clock
        if fit and prof is not None:
            clock.hook(EPOCH_ACTION, self._on_epoch_start, prof.end_epoch)
            clock.hook(FETCH_ACTION, prof.begin_step, None)
            clock.hook(BATCH_ACTION, prof.begin_step, prof.step)
        else:
            for action in (EPOCH_ACTION, FETCH_ACTION, BATCH_ACTION):
                clock.hook(action, None, None)

    def _on_epoch_start(self) -> None:
        prof = self.profiler
        if prof is None:
            return
        n: Any = None
        try:
            n = self._lightning_module.trainer.num_training_batches  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - no trainer attached: the epoch's length is unknown
            pass
        prof.begin_epoch(n if isinstance(n, int) else None)

    def _finish(self, exception: BaseException | None = None) -> None:
        prof = getattr(self, "profiler", None)  # also from __del__ of a half-made one
        if prof is None:
            return
        self.profiler = None
        self._set_hooks(False, None)
        try:
            if self._stage_name is not None and prof.recorder.active:
                _core._complete(self._stage_name, self._stage_t0)
            prof.close_after(exception)
            self._clock.clear()
            self.last = prof
            self._summary = self._table(prof)
            if self.summary_file and self._summary:
                name = "fastprof_summary.txt" if prof.rank == 0 else f"fastprof_summary.rank{prof.rank}.txt"
                prof.run_dir.mkdir(parents=True, exist_ok=True)
                (prof.run_dir / name).write_text(self._summary + "\n")
        except Exception as e:  # noqa: BLE001 - profiling never takes training down
            warnings.warn(f"fastprof: Lightning profiler failed to finish: {e}", FastprofWarning, stacklevel=2)

    # -------------------------------------------------------------- summary

    def _table(self, prof: Profiler) -> str:
        """The stage's actions, read back from this rank's segments."""
        stage = self._stage_name.name if self._stage_name is not None else "lightning"
        segments = sorted(str(p) for p in prof.rank_dir.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}*"))
        if not segments:
            return ""
        actions = [str(n) for n in self._clock.names()]
        cols = read_columns(segments, names=[stage, STEP_SPAN, *actions], kinds=("spans",))
        spans = cols.spans
        names = cols.names_of(spans["name"])
        is_stage = names == stage
        if not is_stage.any():
            return ""
        # The stage of this run: the last one recorded (a shared recorder holds earlier ones).
        last = int(np.flatnonzero(is_stage)[-1])
        t0, total = int(spans["ts"][last]), int(spans["dur"][last])
        inside = (spans["ts"] >= t0) & (spans["ts"] + spans["dur"] <= t0 + total) & ~is_stage
        rows = []
        for name in np.unique(names[inside]):
            durs = spans["dur"][inside & (names == name)]
            rows.append((str(name), len(durs), float(durs.mean()) / 1e9, float(durs.sum()) / 1e9))
        rows.sort(key=lambda r: -r[3])
        kind = stage.removeprefix("lightning.")
        title = f"{kind.upper()} Profiler Report (fastprof)"
        head = ("Action", "Calls", "Mean (s)", "Total (s)", f"% of {kind}")
        body = [(stage, "1", f"{total / 1e9:.5f}", f"{total / 1e9:.5f}", "100.0")]
        body += [
            (n, str(c), f"{m:.6f}", f"{t:.5f}", f"{100 * t * 1e9 / total:.1f}" if total else "-") for n, c, m, t in rows
        ]
        width = max(len(head[0]), *(len(r[0]) for r in body))
        cw = [max(len(head[i]), *(len(r[i]) for r in body)) for i in range(1, 5)]

        def line(r: tuple[str, ...]) -> str:
            return "|  " + r[0].ljust(width) + "".join(f"  |  {r[i].rjust(cw[i - 1])}" for i in range(1, 5)) + "  |"

        rule = "-" * len(line(head))
        out = [title, f"run: {prof.run_dir}", rule, line(head), rule, *map(line, body), rule]
        if prof.trace_path is not None:
            out.append(f"unified trace: {prof.trace_path}")
        return "\n".join(out)

    # ------------------------------------------------------------- pickling

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the trainer (and its profiler) before any stage.
        state = dict(self.__dict__)
        for key in ("start", "stop", "profile", "_clock", "profiler", "last", "_stage_name"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.profiler = self.last = None
        self._stage_name = None
        self._bind_clock()


class _CloseOnException(_Callback):
    """Closes a :class:`FastprofProfiler`'s run when a stage raises (the only
    public hook Lightning calls on that path): ``finish``, the owner's way
    to end its stage, with the exception."""

    def __init__(self, owner: FastprofProfiler, finish: Callable[[BaseException | None], None]) -> None:
        self.owner = owner
        self.finish = finish

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.finish(exception)
