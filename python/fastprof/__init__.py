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
from fastprof._report import report
from fastprof.always_on.triggers import Triggers
from fastprof.memory import ModelSummary, model_summary
from fastprof.memory.history import MemoryHistory
from fastprof.profiler import schedule
from fastprof.profiler.loop import Profiler
from fastprof.profiler.torch_windows import TorchWindows
from fastprof.readers.columns import Columns, read_columns
from fastprof.readers.merge import merge
from fastprof.readers.trace import read_trace
from fastprof.recording.recorder import Recorder, RunStats, current, start, stop
from fastprof.reports import Report
from fastprof.storage import backend as _backend  # noqa: F401  (registers the backend URL inputs are read through)

# A FastprofWarning shows as one `fastprof: ...` line (filters and recorders see it as ever).
_warning_display.install()

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
