"""``torch.profiler`` windows driven by a fastprof schedule, exported off the
training thread.

One ``torch.profiler.profile`` object per window: it is made at the window's
first step (WARMUP, or ACTIVE when there is no warmup), stepped through the
window with torch's own state machine (warmup traced and discarded, active
steps recorded, ``ProfilerStep#N`` named by fastprof's global step), and
stopped after the window's last step. Stopping is the only part the training
thread waits for (torch's own stop and post-processing); writing the trace
(torch's export, gzip, the rename, retention, the memory timeline) runs on an
exporter thread, and never involves a collective, so a rank that is saving
never holds up one that is not.

A failure of torch.profiler (another profiler already active, a Kineto error)
is said once as a :class:`fastprof.FastprofWarning` and training goes on
without windows.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import os
import queue
import stat
import string
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastprof import _core, _signals
from fastprof._core import ConfigError, FastprofWarning
from fastprof.profiler.schedule import Action, to_torch
from fastprof.recording.names import TORCH_WINDOW_EXPORT, TORCH_WINDOW_START, TORCH_WINDOW_STOP
from fastprof.recording.options import FORMAT_VARIABLES, Option, _bool, _int, _str, _value, check_format, prefixed

__all__ = ["FORMAT_VARIABLES", "TorchWindows"]

#: Test-only: seconds each export sleeps first (a slow disk). Never set it outside tests.
EXPORT_DELAY_ENV = "FASTPROF_TEST_EXPORT_DELAY_S"
#: The variables that change from window to window.
_STEP_VARIABLES = frozenset({"epoch", "batch", "batch_in_epoch"})
_RECORDS = (Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE)
#: The steps a live profiler object takes after each: warm-up, then recorded
#: steps, then the one that saves, after which the object is stopped (see
#: fastprof.profiler.plan, which hands out no other order).
_GOES_TO = {
    Action.WARMUP: frozenset(_RECORDS),
    Action.ACTIVE: frozenset((Action.ACTIVE, Action.ACTIVE_AND_SAVE)),
}
_MEMORY_TIMELINE = ("html", "json")


def _activities(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        items = [x.strip().lower() for x in v.split(",") if x.strip()]
    elif isinstance(v, (list, tuple)):
        items = [str(getattr(x, "name", x)).strip().lower() for x in v]
    else:
        raise TypeError(v)
    if items == ["auto"]:
        return ("auto",)
    if not items or any(x not in ("cpu", "cuda", "xpu", "mtia") for x in items):
        raise ValueError(v)
    return tuple(dict.fromkeys(items))


def _timeline(v: object) -> str:
    text = _str(v).strip().lower()
    if text in ("", "none", "off", "0"):
        return ""
    if text not in _MEMORY_TIMELINE:
        raise ValueError(v)
    return text


_opt = prefixed("TORCH")

#: TorchWindows' options; each has a FASTPROF_TORCH_<NAME> variable.
OPTIONS: tuple[Option, ...] = (
    _opt("activities", "str", ("auto",), "auto, or a comma list of cpu, cuda", "What torch traces.", _activities),
    _opt("record_shapes", "bool", False, "a boolean", "Input shapes of every op.", _bool),
    _opt("profile_memory", "bool", False, "a boolean", "Tensor allocations and frees.", _bool),
    _opt("with_stack", "bool", False, "a boolean", "Python stacks (python_function events).", _bool),
    _opt("with_flops", "bool", False, "a boolean", "FLOP estimates of matmul/conv.", _bool),
    _opt("with_modules", "bool", False, "a boolean", "nn.Module hierarchy of ops.", _bool),
    _opt("use_gzip", "bool", True, "a boolean", "Write .pt.trace.json.gz.", _bool),
    _opt("folder", "str", "rank{rank}/torch", "a folder (format variables allowed)", "Under the run dir.", _str),
    _opt("filename", "str", "", "a file name (format variables allowed)", "ep{epoch}-ba{batch}.pt.trace.json", _str),
    _opt("num_traces_to_keep", "int", -1, "-1 (all) or an integer >= 1", "Oldest deleted first.", _int),
    _opt("overwrite", "bool", False, "a boolean", "Allow writing into a folder with traces.", _bool),
    _opt("memory_timeline", "str", "", "none, html or json", "Per window (needs memory+shapes+stack).", _timeline),
)
_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class TorchWindows:
    """What the ``torch.profiler`` windows record and where they go.

    Options not given (None) come from ``FASTPROF_TORCH_<NAME>`` variables,
    then defaults. ``folder`` (relative to the run directory) and
    ``filename`` are format strings over :data:`FORMAT_VARIABLES`; the
    default is ``rank{rank}/torch/ep{epoch}-ba{batch}.pt.trace.json.gz``
    (epoch and batch of the window's last step). ``num_traces_to_keep``
    deletes this run's oldest traces beyond that count. ``overwrite=False``
    refuses a run whose trace folder already holds traces (a
    :class:`fastprof.ConfigError` naming it, before training). ``activities``
    ``"auto"`` is CPU, plus CUDA when ``torch.cuda.is_available()``.
    ``memory_timeline`` ("html" or "json") writes torch's memory timeline of
    each window beside it; it needs ``profile_memory``, ``record_shapes`` and
    ``with_stack``.
    """

    activities: Sequence[str] | str | None = None
    record_shapes: bool | None = None
    profile_memory: bool | None = None
    with_stack: bool | None = None
    with_flops: bool | None = None
    with_modules: bool | None = None
    use_gzip: bool | None = None
    folder: str | os.PathLike[str] | None = None
    filename: str | None = None
    num_traces_to_keep: int | None = None
    overwrite: bool | None = None
    memory_timeline: str | None = None
    env: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        env = os.environ if self.env is None else self.env
        for opt in OPTIONS:
            object.__setattr__(self, opt.name, _value(opt, getattr(self, opt.name), env))
        if self.num_traces_to_keep == 0 or self.num_traces_to_keep < -1:  # type: ignore[operator]
            raise ConfigError(
                f"TorchWindows: invalid num_traces_to_keep {self.num_traces_to_keep!r}: expected -1 (all) or >= 1"
            )
        name = self.filename or "ep{epoch}-ba{batch}.pt.trace.json"
        if self.use_gzip and not name.endswith(".gz"):
            name += ".gz"
        if not self.use_gzip and name.endswith(".gz"):
            raise ConfigError(f"TorchWindows: invalid filename {name!r}: ends in .gz but use_gzip is False")
        if "/" in name or name in (".", ".."):
            raise ConfigError(f"TorchWindows: invalid filename {name!r}: a file name, not a path (use folder)")
        object.__setattr__(self, "filename", name)
        check_format("folder", str(self.folder), "TorchWindows")
        check_format("filename", name, "TorchWindows")
        if self.memory_timeline and not (self.profile_memory and self.record_shapes and self.with_stack):
            raise ConfigError(
                "TorchWindows: memory_timeline needs profile_memory=True, record_shapes=True and with_stack=True"
            )
        if self.memory_timeline == "html":
            if importlib.util.find_spec("matplotlib") is None:
                raise ConfigError(
                    "TorchWindows: memory_timeline='html' needs matplotlib (pip install matplotlib); "
                    "'json' needs nothing more"
                )

    def path_for(self, run_dir: Path, variables: Mapping[str, Any]) -> Path:
        """The trace file of a window whose last step has these variables."""
        return run_dir / str(self.folder).format(**variables) / str(self.filename).format(**variables)

    def static_folder(self, run_dir: Path, variables: Mapping[str, Any]) -> Path:
        """The deepest folder every window of this rank writes under (the folder
        up to its first component that names a step variable)."""
        out = run_dir
        for part in Path(str(self.folder)).parts:
            fields = {f for _, f, _, _ in string.Formatter().parse(part) if f}
            if fields & _STEP_VARIABLES:
                break
            out = out / part.format(**variables)
        return out


def _torch() -> Any:
    """torch, with ``torch.profiler`` (and the memory profiler it loads): a
    window starts torch's profiler, so this module imports torch itself,
    here only, when the first window starts (``import fastprof`` never does)."""
    import torch.profiler

    return torch


def _gzip(src: Path, dst: Path, level: int) -> None:
    """``src`` as one gzip member at ``dst``, in 1 MiB chunks."""
    with (
        open(src, "rb") as fin,
        open(dst, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=level) as out,
    ):
        while chunk := fin.read(1 << 20):
            out.write(chunk)


#: What :meth:`WindowDriver._export_piped` returns when the recorder could
#: not take the pipe (compared by identity).
_UNPIPED = "unpiped"


def _unwritten(folder: Path, partial: Path) -> str:
    """Why torch wrote no trace file (it logs the failure, and returns)."""
    why = "torch could not write the trace"
    try:
        size = partial.stat().st_size if partial.exists() else None
        free = os.statvfs(folder)
        why += f" into {folder} ({free.f_bavail * free.f_frsize} bytes free"
        why += f"; it stopped after {size} bytes)" if size is not None else ")"
    except OSError:
        pass
    return why + ": is the disk full, or a file size limit (ulimit -f) reached?"


def _memory_timeline(tp: Any, path: Path) -> None:
    """torch's memory timeline of a finished window (JSON points or an HTML
    plot), built from the window's own results on the exporter thread.
    ``profile.export_memory_timeline`` does the same but is deprecated (it
    warns on every call); its building blocks are not."""
    torch = _torch()
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    timeline = torch.profiler._memory_profiler.MemoryProfileTimeline(tp._memory_profile())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        if path.suffix == ".html":
            timeline.export_memory_timeline_html(str(tmp), device)
        else:
            timeline.export_memory_timeline(str(tmp), device)
        if not tmp.exists():
            raise RuntimeError("torch wrote no file (for html: is matplotlib installed?)")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _kineto_quiet(on: bool) -> Iterator[None]:
    """Kineto's log level at its warnings-off setting while a window starts:
    Kineto reads ``KINETO_LOG_LEVEL`` once, when the process's first
    profiler starts, and keeps it; the variable is gone again once started,
    so the job's environment (and its children's) stays its own. A level
    the user set wins."""
    if not on or "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = "6"
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


def _another_profiler_active() -> bool:
    torch = _torch()
    try:
        return bool(torch.autograd.profiler._is_profiler_enabled)
    except AttributeError:  # older torch: ask the C++ side
        return bool(torch._C._autograd._profiler_enabled())


@dataclass
class WindowRecord:
    """One window, as the profiler's summary lists it."""

    first_step: int
    last_step: int
    epoch: int
    path: str | None = None
    bytes: int = 0
    #: Training-thread time in torch's start (prepare/start trace) and stop.
    start_stall_s: float = 0.0
    stop_stall_s: float = 0.0
    export_s: float = 0.0
    #: Steps traced and kept (not warmup).
    active_steps: int = 0
    saved: bool = False
    error: str | None = None
    deleted: bool = False
    memory_timeline: str | None = None
    #: Bytes the recorder's disk cap held for the file while it was written,
    #: given back when it is counted (not in the summary).
    held: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("held", None)
        return d


class WindowDriver:
    """Drives one rank's windows from the profiler's step boundaries."""

    def __init__(
        self,
        cfg: TorchWindows,
        run_dir: Path,
        variables: Mapping[str, Any],
        compression_level: int = 1,
        on_saved: Callable[[WindowRecord], None] | None = None,
        gzip_from: Callable[[int, str, int], Any] | None = None,
    ) -> None:
        self.cfg = cfg
        #: Called on the exporter thread once a window's export ended (saved or failed).
        self.on_saved = on_saved
        #: The recorder's gzip under its disk cap (``Recorder.gzip_from``):
        #: torch's JSON is piped through it, never written whole first.
        self.gzip_from = gzip_from
        self.compression_level = max(1, min(9, compression_level))
        self.run_dir = run_dir
        self.variables = dict(variables)
        self.windows: list[WindowRecord] = []
        self.failed: str | None = None
        #: Export failures (on the exporter thread), for the profiler to warn about at stop().
        self.errors: list[str] = []
        self._tp: Any = None
        self._window: WindowRecord | None = None
        self._action = Action.WAIT  # the live window's action at its last step
        self._stopping: Any = None  # the profiler object being stopped (its trace may be taken)
        self._next: Any = None
        self._step = -1
        self._save_vars: dict[str, Any] = dict(variables)
        self._jobs: queue.Queue[tuple[Any, WindowRecord, Path] | None] = queue.Queue()
        self._saved: list[WindowRecord] = []
        self._exporter: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Keep Kineto's own log lines (each window's start and stop, and on
        #: a machine without a GPU an ERROR "gpuGetDeviceCount failed") out
        #: of the job's stderr: ``fastprof run``'s windows, in a script that
        #: asked for none. See :func:`_kineto_quiet`.
        self.quiet_kineto = False

    # -------------------------------------------------------------- setup

    def check_folder(self) -> None:
        """Overwrite protection, before training: a folder of this rank that
        already holds torch traces is refused unless ``overwrite``."""
        if self.cfg.overwrite:
            return
        folder = self.cfg.static_folder(self.run_dir, self.variables)
        if folder.is_dir():
            found = [p for p in folder.rglob("*") if p.is_file() and ".pt.trace.json" in p.name]
            if found:
                raise ConfigError(
                    f"TorchWindows: folder {folder} already holds {len(found)} torch trace(s) from an earlier run "
                    f"(e.g. {found[0].name}); pass overwrite=True (FASTPROF_TORCH_OVERWRITE=1), or a new run_name"
                )

    def _activities(self) -> list[Any]:
        torch = _torch()
        names = list(self.cfg.activities or ("auto",))
        if names == ["auto"]:
            names = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        return [getattr(torch.profiler.ProfilerActivity, n.upper()) for n in names]

    def _fail(self, what: str, e: BaseException) -> None:
        if self.failed is None:
            self.failed = f"{what}: {type(e).__name__}: {e}"
            warnings.warn(
                f"fastprof: torch.profiler failed ({self.failed}); training goes on without torch windows",
                FastprofWarning,
                stacklevel=4,
            )
        tp, window, self._tp, self._window = self._tp, self._window, None, None
        if window is not None:
            window.error = self.failed
            self.windows.append(window)
        if tp is not None:
            try:
                tp.stop()
            except Exception:  # noqa: BLE001 - already failing; the warning said so
                pass

    # ----------------------------------------------------------- stepping

    @property
    def live(self) -> bool:
        return self._tp is not None

    def begin(self, action: Action, step: int, epoch: int) -> None:
        """A step begins: start a window at its first step, step torch through
        it, or stop it when the schedule left it (a window cut short) or the
        step is not one torch takes next in it (then another begins here)."""
        with _signals.CRITICAL:
            self._begin(action, step, epoch)

    def _begin(self, action: Action, step: int, epoch: int) -> None:
        if self.failed is not None and self._tp is None:
            return  # no new window after a failure (a window still open runs to its end)
        if self._tp is not None:
            if step == self._step and action in _RECORDS:
                return  # this step was begun already
            if action in _GOES_TO.get(self._action, ()):
                self._step = step
                self._action = action
                if self._window is not None and action is not Action.WARMUP:
                    self._window.active_steps += 1
                self._next = to_torch(action)
                try:
                    self._tp.step()
                except Exception as e:  # noqa: BLE001 - torch.profiler must never take training down
                    self._fail("step", e)
                return
            # Left by the schedule, or a step this profiler object must not
            # take (torch rejects RECORD followed by WARMUP, and would hand
            # out a saved trace while the same object records on): the
            # window ends here, and another may begin at this step.
            self._stop()
            if self.failed is not None:
                return
        if action not in _RECORDS:
            return
        tprof = _torch().profiler
        cfg = self.cfg
        t0 = time.perf_counter()
        try:
            if _another_profiler_active():
                # torch would cancel the user's own trace to start ours.
                raise RuntimeError("another torch profiler is already active in this process")
            with _core.span(TORCH_WINDOW_START, step=step):
                tp = tprof.profile(
                    activities=self._activities(),
                    schedule=self._schedule,
                    on_trace_ready=self._ready,
                    record_shapes=bool(cfg.record_shapes),
                    profile_memory=bool(cfg.profile_memory),
                    with_stack=bool(cfg.with_stack),
                    with_flops=bool(cfg.with_flops),
                    with_modules=bool(cfg.with_modules),
                )
                # ProfilerStep#N carries fastprof's global step, and torch
                # starts in the state the schedule gives this step.
                tp.step_num = step
                tp.current_action = to_torch(action)
                tp._prev_schedule_action = tp.current_action
                self._next = tp.current_action
                self._window = WindowRecord(
                    first_step=step, last_step=step, epoch=epoch, active_steps=int(action is not Action.WARMUP)
                )
                self._step = step
                self._action = action
                with _kineto_quiet(self.quiet_kineto):
                    tp.start()
                self._tp = tp
        except Exception as e:  # noqa: BLE001 - torch.profiler must never take training down
            self._fail("start", e)
            return
        if self._window is not None:
            self._window.start_stall_s = time.perf_counter() - t0

    def _schedule(self, _step: int) -> Any:
        return self._next

    def end_annotation(self) -> None:
        """End torch's ``ProfilerStep#N`` annotation now (torch's own ``step()``
        and ``stop()`` skip an annotation already ended), so that the profiler
        can end its own step right after it."""
        with _signals.CRITICAL:
            self._end_annotation()

    def _end_annotation(self) -> None:
        tp = self._tp
        rec = None if tp is None else getattr(tp, "step_rec_fn", None)
        if rec is None:
            return
        try:
            rec.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001
            self._fail("step", e)
        finally:
            if tp is not None:
                tp.step_rec_fn = None

    def end(self, action: Action, epoch: int, batch: int, batch_in_epoch: int) -> None:
        """A step ended (``action`` its action, at that position): a window's
        last step stops it. Outside a window this does nothing."""
        with _signals.CRITICAL:
            self._end(action, epoch, batch, batch_in_epoch)

    def _end(self, action: Action, epoch: int, batch: int, batch_in_epoch: int) -> None:
        if self._window is not None:
            self._window.last_step = batch
            self._save_vars = {"epoch": epoch, "batch": batch, "batch_in_epoch": batch_in_epoch}
        if self._tp is not None and action is Action.ACTIVE_AND_SAVE:
            self._stop()

    def _stop(self) -> None:
        tp, window = self._tp, self._window
        if tp is None or window is None:
            return
        t0 = time.perf_counter()
        self._stopping = tp
        try:
            with _core.span(TORCH_WINDOW_STOP, step=window.last_step):
                tp.stop()
        except Exception as e:  # noqa: BLE001
            self._fail("stop", e)
            return
        finally:
            self._tp = self._window = self._stopping = None
        window.stop_stall_s = time.perf_counter() - t0
        if window.path is None:
            window.error = "ended before its active steps (torch discards a warmup)"
        self.windows.append(window)

    def close(self) -> None:
        """At the profiler's stop: a window still open is stopped (torch saves
        an active window cut short; a warmup is discarded)."""
        with _signals.CRITICAL:
            self._stop()

    # ------------------------------------------------------------- export

    def _ready(self, tp: Any) -> None:
        # On the training thread, inside tp.stop(): hand the finished profile
        # to the exporter thread and return. Only there: a trace torch hands
        # out at any other moment (inside step()) belongs to an object that
        # records on, and exporting it meanwhile crashes the process.
        window = self._window
        if tp is not self._stopping or window is None or window.active_steps == 0:
            return  # a warmup cut short: torch's trace holds nothing of ours
        path = self.cfg.path_for(self.run_dir, {**self.variables, **self._save_vars})
        window.path = str(path)
        with self._lock:
            if self._exporter is None:
                self._exporter = threading.Thread(target=self._export_loop, name="fastprof-torch-export", daemon=True)
                self._exporter.start()
        self._jobs.put((tp, window, path))

    def _export_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self._jobs.task_done()
                return
            tp, window, path = job
            try:
                self._export(tp, window, path)
            except Exception as e:  # noqa: BLE001 - reported at stop() on the caller's thread, never raised here
                window.error = f"{type(e).__name__}: {e}"
                self.errors.append(f"writing torch window {path} failed: {window.error}")
                if isinstance(e, OSError) and self.failed is None:
                    # The disk refuses (full, a size limit, read-only): the
                    # next windows would fail alike, each a stall for nothing.
                    self.failed = f"export: {window.error}"
            finally:
                if self.on_saved is not None:
                    try:
                        self.on_saved(window)
                    except Exception as e:  # noqa: BLE001 - never raised on the exporter thread
                        self.errors.append(f"after writing torch window {path}: {type(e).__name__}: {e}")
                self._jobs.task_done()

    def _export(self, tp: Any, window: WindowRecord, path: Path) -> None:
        t0 = time.perf_counter()
        delay = os.environ.get(EXPORT_DELAY_ENV, "").strip()
        if delay:
            # Test-only: a slow disk, to show that no other rank waits on it.
            time.sleep(float(delay))
        with _core.span(TORCH_WINDOW_EXPORT, step=window.last_step):
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and not self.cfg.overwrite:
                stem = path.name
                n = 1
                while path.exists():
                    n += 1
                    path = path.with_name(f"{stem.split('.', 1)[0]}-{n}.{stem.split('.', 1)[1]}")
                window.path = str(path)
            # torch writes the JSON (kineto's save holds the GIL: the part of
            # the export the training thread still feels); the compression is
            # ours, without the GIL (torch's own .gz export recompresses line
            # by line at level 9): through a pipe by the recorder's core, under
            # its disk cap (_export_piped), else in 1 MiB chunks here. The
            # rename publishes the complete file.
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.json")
            tmp_gz = tmp.with_name(tmp.name + ".gz")
            # Kineto writes to "<name>.tmp" and renames it; when the write
            # fails (a full disk) it logs, leaves that file and returns.
            kineto_tmp = tmp.with_name(tmp.name + ".tmp")
            try:
                why: str | None = _UNPIPED
                if path.name.endswith(".gz") and self.gzip_from is not None and hasattr(os, "mkfifo"):
                    why = self._export_piped(tp, window, tmp, tmp_gz, kineto_tmp)
                if why is None:
                    os.replace(tmp_gz, path)
                elif why is not _UNPIPED:
                    window.error = why
                    self.errors.append(f"torch window {path}: {why}")
                    return
                else:
                    tp.export_chrome_trace(str(tmp))
                    if not tmp.exists():
                        raise OSError(_unwritten(path.parent, kineto_tmp))
                    if path.name.endswith(".gz"):
                        _gzip(tmp, tmp_gz, self.compression_level)
                        os.replace(tmp_gz, path)
                    else:
                        os.replace(tmp, path)
            finally:
                for leftover in (tmp, tmp_gz, kineto_tmp):
                    leftover.unlink(missing_ok=True)
            window.bytes = path.stat().st_size
            window.saved = True
            if self.cfg.memory_timeline:
                mt = path.with_name(path.name.split(".pt.trace")[0] + f".memory.{self.cfg.memory_timeline}")
                try:
                    _memory_timeline(tp, mt)
                    window.memory_timeline = str(mt)
                except Exception as e:  # noqa: BLE001 - reported at stop(), never raised here
                    self.errors.append(f"memory timeline {mt} failed: {type(e).__name__}: {e}")
            self._saved.append(window)
            keep = int(self.cfg.num_traces_to_keep or -1)
            while keep > 0 and len([w for w in self._saved if not w.deleted]) > keep:
                oldest = next(w for w in self._saved if not w.deleted)
                for p in (oldest.path, oldest.memory_timeline):
                    if p:
                        Path(p).unlink(missing_ok=True)
                oldest.deleted = True
        window.export_s = time.perf_counter() - t0

    def _export_piped(self, tp: Any, window: WindowRecord, tmp: Path, tmp_gz: Path, kineto_tmp: Path) -> str | None:
        """torch's JSON into ``tmp_gz``, gzipped by the recorder's core as
        Kineto writes it: Kineto writes ``<tmp>.tmp`` and renames it, so a
        pipe there carries the JSON to a core thread that holds disk under
        ``max_disk`` as the gzip grows (the JSON, many times the gzip, is
        never on disk). Kineto's save holds the GIL while it writes: the
        reader never needs it. A Kineto that writes ``tmp`` in place leaves
        the pipe unused; that file is then gzipped the same way. Returns why
        nothing was written (the cap refused it), else None; the bytes held
        go on ``window.held``; :data:`_UNPIPED` when the recorder could not
        take the pipe (the caller exports as without one)."""
        assert self.gzip_from is not None
        try:
            os.mkfifo(kineto_tmp, 0o600)
            rfd = os.open(kineto_tmp, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # a filesystem without FIFOs
            kineto_tmp.unlink(missing_ok=True)
            return _UNPIPED
        try:
            # A writer end of our own, closed after the export: the reader
            # sees no end before Kineto opened, wrote and closed the pipe,
            # and Kineto's open never waits for a reader.
            wfd = os.open(kineto_tmp, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            os.close(rfd)
            raise
        os.set_blocking(rfd, True)
        try:
            job = self.gzip_from(rfd, str(tmp_gz), self.compression_level)  # owns rfd from here
        except _core.FastprofError:
            # The recording stopped (an export that outlived the Profiler's
            # wait): torch writes the JSON, gzipped here, as without a cap.
            os.close(wfd)
            kineto_tmp.unlink(missing_ok=True)
            return _UNPIPED
        except BaseException:
            os.close(wfd)
            raise
        try:
            tp.export_chrome_trace(str(tmp))
        finally:
            os.close(wfd)
            done = job.join()
        window.held += int(done["held"])
        try:
            piped = stat.S_ISFIFO(os.lstat(tmp).st_mode)
        except FileNotFoundError:
            raise OSError(_unwritten(tmp.parent, kineto_tmp)) from None
        if not piped:
            # Written in place (not through the pipe): gzip that file alike.
            job = self.gzip_from(os.open(tmp, os.O_RDONLY | os.O_CLOEXEC), str(tmp_gz), self.compression_level)
            done = job.join()
            window.held += int(done["held"])
        if done["error"] is None:
            return None
        if done["refused"]:
            return str(done["error"])
        # The disk refused (full, a size limit): as when torch's own write fails.
        raise OSError(f"{done['error']}: is the disk full, or a file size limit (ulimit -f) reached?")

    def wait(self, timeout: float) -> bool:
        """Wait for the exports still running (at the profiler's stop); True
        when all finished within ``timeout`` seconds."""
        with self._lock:
            exporter = self._exporter
        if exporter is None:
            return True
        self._jobs.put(None)
        exporter.join(timeout)
        return not exporter.is_alive()
