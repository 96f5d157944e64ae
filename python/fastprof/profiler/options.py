"""The Profiler's own options (the recorder's are in :mod:`fastprof.recording.options`):
one row each (name, type, default, ``FASTPROF_*`` variable, check, doc)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastprof._core import ConfigError
from fastprof._process import PROCESS
from fastprof.memory.history import MemoryHistory
from fastprof.profiler import schedule as _schedule
from fastprof.profiler.drivers.hang.config import TIMEOUT_EXPECT, parse_action, parse_timeout
from fastprof.profiler.drivers.triggers import DEFAULT_FLIGHT_SECONDS, Triggers
from fastprof.profiler.schedule import Schedule
from fastprof.profiler.torch_windows import TorchWindows
from fastprof.recording.options import Option, _bool, _float, _int, _value
from fastprof.recording.recorder import Recorder, current

__all__ = ["OPTIONS", "UNSET", "Resolved", "attach_recorder", "framework_out_dir", "resolve"]

T = TypeVar("T")


def _schedule_value(v: object) -> Schedule:
    if isinstance(v, str):
        return _schedule.parse(v)
    return _schedule.as_schedule(v)  # type: ignore[arg-type]


#: The Profiler's own options (the recorder's are in fastprof.recording.options).
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
        "anatomy",
        "bool",
        True,
        ("FASTPROF_ANATOMY",),
        "a boolean",
        "Time every step's forward (the outermost module call), backward, optimizer (step and zero_grad) and "
        "torch.distributed collectives on the training thread, as phase.* spans: the report's step anatomy.",
        "True",
        _bool,
    ),
    Option(
        "memory_stats",
        "bool",
        True,
        ("FASTPROF_MEMORY_STATS",),
        "a boolean",
        "At every step's end, record the process's resident memory (mem.rss [B], read by the core; steps "
        "shorter than 20 reads share one) and, once "
        "the job uses CUDA, the allocator's statistics (mem.cuda.*: allocated, reserved, active, their peaks "
        "since the previous step, num_ooms, num_alloc_retries).",
        "True",
        _bool,
    ),
    Option(
        "memory_history",
        "bool",
        False,
        ("FASTPROF_MEMORY_HISTORY",),
        "a boolean, or a MemoryHistory",
        "The CUDA allocator's history during the schedule's windows, bounded, dumped per window to "
        "rank{R}/memory/ (a MemoryHistory; its options have FASTPROF_MEMORY_HISTORY_<NAME> variables).",
        "False",
        _bool,
    ),
    Option(
        "model_depth",
        "int",
        2,
        ("FASTPROF_MODEL_DEPTH",),
        "an integer from 0 to 100",
        "Levels of the model summary written for Profiler(model=...) (rank{R}/memory/model_summary.json, .txt).",
        "2",
        _int,
        lambda v: 0 <= v <= 100,
    ),
    Option(
        "triggers",
        "bool",
        True,
        ("FASTPROF_TRIGGERS",),
        "a boolean, or a Triggers",
        "Captures and flight dumps asked for while the job runs: a signal (SIGUSR2), a trigger file "
        "(fastprof trigger), a slow step, an exception, an OOM, SIGTERM (a Triggers; its options have "
        "FASTPROF_TRIGGERS_<NAME> variables). On, the recorder keeps a 30 s flight window unless "
        "window_seconds is set.",
        "True",
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
        "hang_timeout",
        "float",
        None,
        ("FASTPROF_HANG_TIMEOUT",),
        TIMEOUT_EXPECT,
        "Seconds without a step ending before every rank writes its hang evidence (rank{R}/hang-<n>.json) "
        "and one rank prints the verdict across ranks on stderr (docs/hangs.md). auto: 300 s before two steps "
        "ended, then the larger of 60 s and 20 times the median recent step; off: no watchdog.",
        "`auto`",
        parse_timeout,
    ),
    Option(
        "hang_action",
        "choice",
        "report",
        ("FASTPROF_HANG_ACTION",),
        "report or abort",
        "What a hang does once its evidence is written: report (the job waits on), or abort (each hung rank "
        "ends with exit status 124, so that the scheduler restarts the job).",
        "`report`",
        parse_action,
    ),
    Option(
        "rank_summary",
        "bool",
        True,
        ("FASTPROF_RANK_SUMMARY",),
        "a boolean",
        "At the run's end each rank writes rank{R}/summary.fastprof from its own segments, in a process of its "
        "own (up to 300 s at a normal end, 5 s at SIGTERM or exit), so that a report of many ranks reads no "
        "trace. Off: the close does not wait for it, and a report reads the segments.",
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


def framework_out_dir(
    given: str | os.PathLike[str] | None, fallback: Callable[[], str | os.PathLike[str] | Path]
) -> str | os.PathLike[str] | Path | None:
    """The ``out_dir`` a framework's integration (Lightning, Transformers)
    gives its Profiler: the user's; else None (the Profiler's own rule) when
    a recording already runs (``fastprof run``, the job's Recorder: the
    Profiler joins it, and an out_dir it did not choose would be refused or
    said unused) or ``FASTPROF_OUT_DIR`` is set; else the framework's folder
    (``fallback()``: Lightning's log_dir, the Trainer's output_dir)."""
    if given is not None:
        return given
    running = current()
    if (running is not None and running.active) or os.environ.get("FASTPROF_OUT_DIR", "").strip():
        return None
    return fallback()


#: An option not given (``torch=`` distinguishes it from None, which means none).
UNSET: Any = object()


@dataclass(frozen=True)
class Resolved:
    """The Profiler's options, resolved (given, else ``FASTPROF_*``, else
    the default) and checked: what its drivers are built from."""

    schedule: Schedule
    torch: TorchWindows | None
    gate_spans: bool
    memory_stats: bool
    memory_history: MemoryHistory | None
    model: Any
    model_depth: int
    anatomy: bool
    triggers: Triggers | None
    merge: bool
    merge_timeout: float
    sync_clocks: bool
    #: None: auto; 0: off.
    hang_timeout: float | None = None
    hang_action: str = "report"
    #: Each rank writes its summary.fastprof at the end.
    rank_summary: bool = True

    def metadata(self, dist: Any) -> dict[str, Any]:
        """The trace's ``profiler`` metadata."""
        return {
            "schedule": repr(self.schedule),
            "torch": None if self.torch is None else repr(self.torch),
            "gate_spans": self.gate_spans,
            "dist": dist.__dict__ if hasattr(dist, "__dict__") else str(dist),
        }


def resolve(given: dict[str, Any], env: Mapping[str, str] = os.environ) -> Resolved:
    """The Profiler's options from the keywords it was ``given``; a bad value
    is a :class:`fastprof.ConfigError` naming it."""

    def value(name: str) -> Any:
        return _value(_BY_NAME[name], given.get(name), env)

    return Resolved(
        schedule=value("schedule"),
        torch=_torch_option(given.get("torch", UNSET), env),
        gate_spans=value("gate_spans"),
        memory_stats=value("memory_stats"),
        memory_history=_config_object("memory_history", given.get("memory_history"), MemoryHistory, env),
        model=given.get("model"),
        model_depth=value("model_depth"),
        anatomy=value("anatomy"),
        triggers=_config_object("triggers", given.get("triggers"), Triggers, env),
        merge=value("merge"),
        merge_timeout=value("merge_timeout"),
        sync_clocks=value("sync_clocks"),
        hang_timeout=value("hang_timeout"),
        hang_action=value("hang_action"),
        rank_summary=value("rank_summary"),
    )


def _config_object(name: str, value: Any, cls: type[T], env: Mapping[str, str]) -> T | None:
    """An option that is a config object or a switch (``memory_history``,
    ``triggers``): None takes its variable, True the defaults, False none."""
    if value is None:
        value = _value(_BY_NAME[name], None, env)
    if value is True:
        return cls()
    if value is False:
        return None
    if not isinstance(value, cls):
        raise ConfigError(f"invalid option {name}: expected a fastprof.{cls.__name__}, True or False, got {value!r}")
    return value


def _torch_option(torch: Any, env: Mapping[str, str]) -> TorchWindows | None:
    """``torch=``: a TorchWindows, True (the default one when torch is
    installed), False or None (none); not given, its variable."""
    if torch is UNSET:
        torch = _value(_BY_NAME["torch"], None, env)
    if torch is True:
        return TorchWindows() if _torch_importable() else None
    if torch is False or torch is None:
        return None
    if not isinstance(torch, TorchWindows):
        raise ConfigError(f"invalid option torch: expected a fastprof.TorchWindows, True, False or None, got {torch!r}")
    if not _torch_importable():
        raise ConfigError("invalid option torch: torch.profiler windows need torch, which is not installed")
    return torch


def _torch_importable() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def attach_recorder(
    recorder: Recorder | None,
    where: dict[str, Any],
    recorder_options: dict[str, Any],
    triggers: Triggers | None,
) -> tuple[Recorder, bool]:
    """The Profiler's recorder, and whether it is the Profiler's own: one
    already running (``recorder``, else the process's), whose options that
    choose where a run records (``where``: out_dir, run_name, sample_hz) are
    then refused, or under ``fastprof run`` said unused; else a new one."""
    running = current() if recorder is None else recorder
    if running is not None and running.active:
        given = {k: v for k, v in recorder_options.items() if v is not None}
        unused = [k for k, v in {**where, **given}.items() if v is not None]
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
        return running, False
    if (
        recorder is None
        and triggers is not None
        and triggers.flight_events
        and recorder_options.get("window_seconds") is None
        and not os.environ.get("FASTPROF_WINDOW_SECONDS", "").strip()
    ):
        # Flight dumps need the recorder's window: a bounded one (window_bytes).
        recorder_options["window_seconds"] = DEFAULT_FLIGHT_SECONDS
    own = recorder or Recorder(where["out_dir"], where["run_name"], sample_hz=where["sample_hz"], **recorder_options)
    # Its upload ends once profiler.json and the memory files are written (outputs.finish).
    own.hold_upload = True
    return own, True
