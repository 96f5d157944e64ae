"""The Profiler's own options (the recorder's are in :mod:`fastprof.recording.options`):
one row each (name, type, default, ``FASTPROF_*`` variable, check, doc)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fastprof.profiler import schedule as _schedule
from fastprof.profiler.schedule import Schedule
from fastprof.recording.options import Option, _bool, _float, _int
from fastprof.recording.recorder import current

__all__ = ["OPTIONS", "framework_out_dir"]


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
