"""fastprof: a low-overhead profiler for PyTorch training jobs.

Recording API::

    import fastprof

    with fastprof.Recorder(out_dir="fastprof_runs"):
        with fastprof.span("forward"):
            ...
        fastprof.instant("checkpoint", step=10)
        fastprof.counter("loss", 0.25)

Spans, instants and counters go into per-thread Rust ring buffers; a Rust
writer thread streams them as gzip Chrome traces that Perfetto UI opens.
"""

import os as _os

# First, as before the package root was split into folders: numpy (which this
# loads) imported here costs ~15 ms less CPU than imported halfway through the
# chain below (measured; why numpy's import depends on the order is not pinned).
from fastprof.readers.columns import Columns, read_columns  # isort: skip
from fastprof import _warning_display
from fastprof._core import (
    AlreadyRunningError,
    ConfigError,
    FastprofError,
    FastprofFileNotFoundError,
    FastprofOSError,
    FastprofPermissionError,
    FastprofWarning,
    Name,
    NoEventsError,
    NotRunningError,
    TraceError,
    __version__,
    counter,
    end,
    instant,
    is_active,
    name_id,
    span,
)
from fastprof.memory import ModelSummary, model_summary
from fastprof.memory.history import MemoryHistory
from fastprof.profiler import schedule
from fastprof.profiler.drivers.triggers import Triggers
from fastprof.profiler.loop import Profiler
from fastprof.profiler.torch_windows import TorchWindows
from fastprof.readers.merge import merge
from fastprof.readers.steps import load
from fastprof.readers.trace import read_trace
from fastprof.recording.recorder import Recorder, RunStats, current, start, stop
from fastprof.reports import Report
from fastprof.reports.report import FORMATS as _FORMATS
from fastprof.reports.report import report as _write
from fastprof.storage import backend as _backend  # noqa: F401  (registers the backend URL inputs are read through)

# A FastprofWarning shows as one `fastprof: ...` line (filters and recorders see it as ever).
_warning_display.install()


# ``fastprof.report`` writes a run's reports (:mod:`fastprof.reports`), then logs
# them to MLflow when asked: the caller decides to log, so that reports never
# import an integration (the dependency points one way, integrations -> reports).
def report(
    path: str | _os.PathLike[str],
    out_dir: str | _os.PathLike[str] | None = None,
    formats: tuple[str, ...] | list[str] = _FORMATS,
    verbose: bool = False,
    progress: bool = False,
    *,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
    from_segments: bool = False,
    mlflow: bool | None = None,
) -> Report:
    """Build the reports of a run directory or a single trace and write them
    (:func:`fastprof.reports.report`, whose arguments these are), then log
    them to MLflow.

    ``mlflow``: log the written files as artifacts and the headline numbers
    as metrics into the active MLflow run
    (:func:`fastprof.integrations.mlflow.log_report`): None (default) when
    mlflow is imported and a run is active, True always (a
    :class:`fastprof.ConfigError` when mlflow is not installed), False never;
    with None, ``FASTPROF_MLFLOW`` (auto, 1/0) decides. A failure to log is
    one :class:`fastprof.FastprofWarning`; the files are written.

    Raises :class:`fastprof.FastprofFileNotFoundError` for a missing path,
    :class:`fastprof.TraceError` for a file that is not a trace, and
    :class:`fastprof.ConfigError` for a bad option, and :class:`OSError`
    naming ``out_dir`` when the files cannot be written (then none is).
    """
    from fastprof.integrations import mlflow as _mlflow  # lazy: integrations load on demand (see their package)

    log_to_mlflow = _mlflow.check_option(mlflow)
    rep = _write(
        path,
        out_dir=out_dir,
        formats=formats,
        verbose=verbose,
        progress=progress,
        warmup_steps=warmup_steps,
        batch_size=batch_size,
        from_segments=from_segments,
    )
    _mlflow.auto_log(rep, log_to_mlflow)
    return rep


__all__ = [
    "AlreadyRunningError",
    "Columns",
    "ConfigError",
    "FastprofError",
    "FastprofFileNotFoundError",
    "FastprofOSError",
    "FastprofPermissionError",
    "FastprofWarning",
    "MemoryHistory",
    "ModelSummary",
    "Name",
    "NoEventsError",
    "NotRunningError",
    "Profiler",
    "Recorder",
    "Report",
    "RunStats",
    "TorchWindows",
    "TraceError",
    "Triggers",
    "__version__",
    "counter",
    "current",
    "end",
    "instant",
    "is_active",
    "load",
    "merge",
    "model_summary",
    "name_id",
    "read_columns",
    "read_trace",
    "report",
    "schedule",
    "span",
    "start",
    "stop",
]
