"""Memory as a driver: the allocator's statistics at each step's end
(:mod:`fastprof.memory.step_stats`), the allocator history of the windows and
its state-only snapshots (:mod:`fastprof.memory.history`), out-of-memory
capture (:mod:`fastprof.memory.oom`), ``memory.collect`` (its files) and the
model summary."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from fastprof._core import FastprofWarning
from fastprof._loop_api import TriggerHost
from fastprof.memory import collector as _collect
from fastprof.memory import oom as _oom
from fastprof.memory.history import HistoryDriver, MemoryHistory
from fastprof.memory.history import driver as history_driver
from fastprof.memory.model_summary import model_summary
from fastprof.memory.step_stats import StepMemory
from fastprof.profiler.driver import Closing, Driver, first_of
from fastprof.profiler.schedule import RECORDING, Action, Schedule

__all__ = ["MemoryDriver"]


def _warn_first(what: str, errors: list[str]) -> None:
    """One warning for a part's failures: the first, and how many more
    (all in profiler.json)."""
    if errors:
        warnings.warn(f"fastprof: {what}: {first_of(errors)}; training went on", FastprofWarning, stacklevel=5)


class MemoryDriver(Driver):
    key = "memory"

    def __init__(
        self,
        prof: TriggerHost,
        schedule: Schedule,
        stats: bool,
        history: MemoryHistory | None,
        model: Any,
        model_depth: int,
    ) -> None:
        self.prof = prof
        self.schedule = schedule
        self.config = history
        self.model = model
        self.model_depth = model_depth
        self.stats = StepMemory(stats)
        self.history: HistoryDriver | None = None
        self.history_due: tuple[int, int, int] | None = None
        self.oom_pending = False
        self.dir_error: str | None = None
        self.model_summary_path: Path | None = None

    # ------------------------------------------------------------- start

    def start(self, steps: Any) -> None:
        prof = self.prof
        self.stats.start(steps)
        if self.config is not None:
            self.history = history_driver(self.config)
        h = self.history
        if self.model is not None or (h is not None and h.available):
            self.dir_error = self._check_folders()
        if h is not None:
            if self.dir_error is not None and h.available:
                h.reason = f"the memory folder cannot be written: {self.dir_error}"
            if h.state_every and h.available:
                steps.memory_hook(True)  # the state-only snapshots are taken at step ends
        self.oom_pending = _oom.watch(prof)
        if self.oom_pending:
            steps.memory_hook(True)  # torch's OOM observer is attached at a step's end
        _collect.reset(prof.rank_dir / "memory", unwritable=self.dir_error)
        if self.model is not None and self.dir_error is None:
            self._write_model_summary()
        self.model = None  # the Profiler keeps no reference to the model

    def _check_folders(self) -> str | None:
        """Before training: the folders memory files go to can be written
        (``rank{R}/memory`` and the history's folder, at epoch and batch 0).
        None when they can; else what failed, said in one warning, and the
        allocator history, model summary and collection files are skipped."""
        folders = {self.prof.rank_dir / "memory"}
        if self.config is not None:
            v = {**self.prof.format_variables(), "epoch": 0, "batch": 0, "batch_in_epoch": 0}
            folders.add(self.prof.run_dir / str(self.config.folder).format(**v))
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
                    stacklevel=5,
                )
                return why
        return None

    def _write_model_summary(self) -> None:
        """``Profiler(model=...)``: the model's summary to ``model_depth``
        levels, ``rank{R}/memory/model_summary.json`` and ``.txt`` (the
        report copies them into ``reports/``). A failure is a warning."""
        try:
            summary = model_summary(self.model, depth=self.model_depth)
            self.model_summary_path, _ = summary.write(self.prof.rank_dir / "memory")
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            warnings.warn(f"fastprof: no model summary ({type(e).__name__}: {e})", FastprofWarning, stacklevel=5)
        finally:
            self.model = None

    def path(self, epoch: int, batch: int, batch_in_epoch: int, state: bool = False) -> Path:
        """Where the allocator history of the window ending at this step goes
        (``state``: the state-only snapshot taken at this step's end)."""
        cfg = self.config
        assert cfg is not None
        v = {**self.prof.format_variables(), "epoch": epoch, "batch": batch, "batch_in_epoch": batch_in_epoch}
        name = cfg.state_filename if state else cfg.filename
        return self.prof.run_dir / str(cfg.folder).format(**v) / str(name).format(**v)

    # ------------------------------------------------------------- steps

    def idle(self) -> frozenset[str]:
        # Without an allocator history, a step's begin and end have nothing to do.
        return frozenset(("begin", "fetch", "end")) if self.config is None else frozenset()

    def begin(self, action: Action, batch: int, epoch: int, fetched: bool) -> bool:
        if self.history is None or action not in RECORDING:
            return False
        sch = self.schedule
        window = int(getattr(sch, "warmup", 1)) + int(getattr(sch, "active", 4))
        if fetched:
            self.history.begin(True, window, batch, epoch)
            return False
        # As torch's step: only once a batch came (the loader may be
        # exhausted, and then this step is no step).
        self.history_due = (window, batch, epoch)
        return True

    def fetch(self, action: Action, batch: int, epoch: int) -> bool:
        h, self.history_due = self.history_due, None
        if h is not None and self.history is not None:
            self.history.begin(True, *h)
        return False

    def end(
        self, action: Action, epoch: int, batch: int, batch_in_epoch: int, closed: bool, with_schedule: bool
    ) -> None:
        if self.history is not None:
            self.history.end(action.saves, self.path(epoch, batch, batch_in_epoch), batch)

    def step_done(self, epoch: int, batch: int, batch_in_epoch: int) -> None:
        """At step ``batch``'s end (quiet steps too): the CUDA allocator's
        statistics, and a state-only allocator snapshot when one is due."""
        if self.stats.hooked:
            self.stats.on_step_end()
        if self.oom_pending:
            self.oom_pending = _oom.poll()
        h = self.history
        if h is not None and not self.prof.stopped and h.state_due(batch):
            h.state(self.path(epoch, batch, batch_in_epoch, state=True), batch, epoch)

    def on_exception(self, exc: BaseException) -> None:
        if _oom.is_oom(exc):
            _oom.capture(self.prof, exc)

    # ------------------------------------------------------------- close

    def finish(self, closing: Closing) -> None:
        if self.history is not None:
            # Before the recorder stops: the last dumps' writes are on the timeline.
            p = self.prof
            self.history.close(self.path(p.epoch, p.batch, p.batch_in_epoch), p.batch, 5.0 if closing.abrupt else 60.0)
            _warn_first("allocator history", self.history.errors())

    def stopped(self, closing: Closing) -> None:
        _collect.wait(5.0 if closing.abrupt else 60.0)
        _warn_first(
            "allocator snapshots of collected calls",
            [f"{e['path']}: {e['error']}" for e in _collect.summary()["snapshots"] if e.get("error")],
        )
        if closing.handed_over or self.dir_error is not None:
            return  # the script's Profiler wrote them
        folder = self.prof.rank_dir / "memory"
        try:
            _collect.write(folder)
        except OSError as e:  # the rest of the run (summary, merge) is written all the same
            _warn_first("memory collection", [f"{folder}: {type(e).__name__}: {e}"])

    def step_aside(self) -> None:
        if self.history is not None:
            p = self.prof
            self.history.close(self.path(p.epoch, p.batch, p.batch_in_epoch), p.batch, 60.0)
            self.history = None
        _oom.unwatch(self.prof)

    def release(self) -> None:
        _oom.unwatch(self.prof)

    def account(self) -> Any:
        return {
            **self.stats.summary(),
            "history": None if self.history is None else self.history.summary(),
            "collect": _collect.summary(),
            "oom": _oom.summary(self.prof),
        }
