"""The contract between fastprof's writers and its readers: the names the
recorder and the Profiler write (spans, counters, instants, files) and the
readers, the reports and the CLI look for, and the rule that tells a storage
URL from a path. Each is defined here once; nothing else in the package
spells one (tests/unit/test_names_contract.py checks).

The names the Rust core also needs (its readers find the steps, the
DataLoader waits and the segments; its input walker skips fastprof's own
JSON files; its storage reads take URLs) are defined in the core
(``fastprof_core::contract``) and taken from ``_core`` here, so both sides
read one definition.
"""

from __future__ import annotations

import os
import re

from fastprof import _core
from fastprof._core import (
    FIRST_INDEX_FILE,
    LIVE_JSON,
    LOADER_NEXT_SUFFIX,
    LOADER_PREFIX,
    MODEL_SUMMARY_JSON,
    OOM_JSON,
    OPEN_SUFFIX,
    OPERATORS_JSON,
    OWN_JSON_FILES,
    PROFILER_JSON,
    REPORT_JSON,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    STEP_COUNTER,
    STEP_SPAN,
    TRIGGERS_JSON,
    UNIFIED_TRACE,
)

__all__ = [
    "ACTION_COUNTER",
    "BACKWARD_GRADS_SPAN",
    "CLOCK_SYNC",
    "CUDA_ALLOCATED",
    "CUDA_ALLOCATED_PEAK",
    "CUDA_COUNTERS",
    "DONE_MARKER",
    "FIRST_INDEX_FILE",
    "GPU_PHASE_COUNTER",
    "GPU_PHASE_STEP_COUNTER",
    "LIVE_JSON",
    "LOADER_NEXT_SUFFIX",
    "LOADER_PREFIX",
    "LONG_RANK_BYTES",
    "MODEL_SUMMARY_JSON",
    "OOM_JSON",
    "OPEN_SUFFIX",
    "OPERATORS_JSON",
    "OWN_JSON_FILES",
    "PHASES",
    "PHASE_PREFIX",
    "PHASE_SPANS",
    "PROFILER_JSON",
    "RANK_DIR",
    "RANK_SUMMARY_JSON",
    "RECORD_PREFIX",
    "REPORT_JSON",
    "RESUME_GAP",
    "RSS_COUNTER",
    "RUN_CLAIM",
    "SEGMENT",
    "SEGMENT_PREFIX",
    "SEGMENT_SUFFIX",
    "STEP_COUNTER",
    "STEP_SPAN",
    "STORE_CLAIM",
    "TORCH_WINDOW_EXPORT",
    "TORCH_WINDOW_PREFIX",
    "TORCH_WINDOW_START",
    "TORCH_WINDOW_STOP",
    "TRAIN_LOADER",
    "TRAIN_NEXT",
    "TRIGGERS_JSON",
    "TRIGGER_FILE",
    "UNIFIED_TRACE",
    "VAL_LOADER",
    "is_open_segment_name",
    "is_url",
    "loader_batch_size",
    "loader_fetch",
    "loader_iter",
    "loader_next",
    "loader_of_next",
    "loader_wait",
    "loader_worker_init",
    "segment_name",
]

# ------------------------------------------------------------------ steps
# STEP_SPAN (the Profiler's span around each step) and STEP_COUNTER
# (``Recorder.mark_step``'s counter) come from the core.

#: fastprof's own records outside the steps' are ``fastprof.<what>``.
RECORD_PREFIX = "fastprof."
#: The Profiler's schedule state, a counter track whose level changes with it
#: (levels: ``fastprof.profiler.loop``).
ACTION_COUNTER = "profiler.action"
#: An instant per clock sync across ranks (its args: the phase and offsets).
CLOCK_SYNC = RECORD_PREFIX + "clock_sync"
#: Counter recorded at the start of a resumed recording: seconds this rank
#: recorded nothing before it (since its earlier recording's last write).
RESUME_GAP = RECORD_PREFIX + "resume_gap [s]"

# ------------------------------------------------------------ DataLoaders
# A loader's records are ``loader.<name>.<what>`` (LOADER_PREFIX and
# LOADER_NEXT_SUFFIX come from the core, whose step analysis finds the waits).

#: The training loop's loader, the one whose wait is the step's ``dataloader`` phase.
TRAIN_LOADER = "train"
#: The first loader iterated outside the steps (an evaluation's; then ``val2``, ...).
VAL_LOADER = "val"


def loader_next(loader: str) -> str:
    """``loader.<loader>.next``: the time the training thread waited in the
    loader's ``next()``."""
    return f"{LOADER_PREFIX}{loader}{LOADER_NEXT_SUFFIX}"


def loader_wait(loader: str) -> str:
    """``loader.<loader>.wait_ms``: a counter, each ``next()``'s wait in ms."""
    return f"{LOADER_PREFIX}{loader}.wait_ms"


def loader_batch_size(loader: str) -> str:
    """``loader.<loader>.batch_size``: a counter, the loader's batch size."""
    return f"{LOADER_PREFIX}{loader}.batch_size"


def loader_iter(loader: str) -> str:
    """``loader.<loader>.iter``: a span around the opening of a pass."""
    return f"{LOADER_PREFIX}{loader}.iter"


def loader_fetch(loader: str) -> str:
    """``loader.<loader>.fetch``: a worker process's span per batch fetched."""
    return f"{LOADER_PREFIX}{loader}.fetch"


def loader_worker_init(loader: str) -> str:
    """``loader.<loader>.worker_init``: a worker process's start."""
    return f"{LOADER_PREFIX}{loader}.worker_init"


def loader_of_next(name: str) -> str | None:
    """The loader a ``loader.<loader>.next`` span is of; None for any other name."""
    if name.startswith(LOADER_PREFIX) and name.endswith(LOADER_NEXT_SUFFIX):
        return name[len(LOADER_PREFIX) : -len(LOADER_NEXT_SUFFIX)]
    return None


#: The train loader's wait (the anatomy's ``dataloader`` phase).
TRAIN_NEXT = loader_next(TRAIN_LOADER)

# -------------------------------------------------------- the step anatomy

#: The phases of a step, in report order.
PHASES = ("dataloader", "forward", "backward", "optimizer", "communication", "other")
#: fastprof's phase spans are ``phase.<phase>``.
PHASE_PREFIX = "phase."
#: The phases fastprof records a span for, and the span's name.
PHASE_SPANS: dict[str, str] = {p: PHASE_PREFIX + p for p in ("forward", "backward", "optimizer", "communication")}
#: Each backward's begin to this rank's own gradients being ready (the
#: parameter accumulated last), before DDP's all-reduce holds the ranks: the
#: rank's arrival at backward's sync point (reports/stragglers.py).
BACKWARD_GRADS_SPAN = "anatomy.backward.grads_ready"
#: The counter each timed step's GPU phase times (CUDA events) are in, one
#: series per phase and ``span``.
GPU_PHASE_COUNTER = "phase.gpu [ms]"
#: The counter recorded just before each ``GPU_PHASE_COUNTER`` event, with
#: the number of the step whose GPU times it holds (not a series of the ms
#: counter: a viewer would plot it as milliseconds).
GPU_PHASE_STEP_COUNTER = "phase.gpu.step"

# -------------------------------------------------------- torch.profiler windows

#: fastprof's spans around a torch.profiler window's work are ``torch.window.<what>``.
TORCH_WINDOW_PREFIX = "torch.window."
TORCH_WINDOW_START = TORCH_WINDOW_PREFIX + "start"
TORCH_WINDOW_STOP = TORCH_WINDOW_PREFIX + "stop"
TORCH_WINDOW_EXPORT = TORCH_WINDOW_PREFIX + "export"

# ------------------------------------------------------------------ memory

#: The process's resident memory at each step's end.
RSS_COUNTER = "mem.rss [B]"
#: CUDA caching allocator statistics (``torch.cuda.memory_stats`` keys) ->
#: the counter each is recorded as at a step's end.
CUDA_COUNTERS: tuple[tuple[str, str], ...] = (
    ("allocated_bytes.all.current", "mem.cuda.allocated [B]"),
    ("allocated_bytes.all.peak", "mem.cuda.allocated_peak [B]"),
    ("reserved_bytes.all.current", "mem.cuda.reserved [B]"),
    ("reserved_bytes.all.peak", "mem.cuda.reserved_peak [B]"),
    ("active_bytes.all.current", "mem.cuda.active [B]"),
    ("active_bytes.all.peak", "mem.cuda.active_peak [B]"),
    ("num_ooms", "mem.cuda.num_ooms"),
    ("num_alloc_retries", "mem.cuda.num_alloc_retries"),
)
CUDA_ALLOCATED = CUDA_COUNTERS[0][1]
CUDA_ALLOCATED_PEAK = CUDA_COUNTERS[1][1]

# ------------------------------------------------------------------- files
# The segment name's parts, the unified trace, the rank's own JSON files and
# the first segment index file come from the core.

#: A segment's name, closed or open; group 1 its number.
SEGMENT = re.compile(rf"^{re.escape(SEGMENT_PREFIX)}(\d+){re.escape(SEGMENT_SUFFIX)}({re.escape(OPEN_SUFFIX)})?$")


def segment_name(index: int, open: bool = False) -> str:
    """Segment ``index``'s file name (``fastprof.{N}.json.gz``, with
    ``.part`` while it is open)."""
    return f"{SEGMENT_PREFIX}{index}{SEGMENT_SUFFIX}{OPEN_SUFFIX if open else ''}"


def is_open_segment_name(name: str) -> bool:
    """Whether a file name is an open segment's (``fastprof.*.json.gz.part``),
    the one ``.part`` file readers take (a killed writer's, salvaged)."""
    return name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX + OPEN_SUFFIX)


#: A rank's folder in a run directory; group 1 its rank.
RANK_DIR = re.compile(r"^rank(\d+)$")
#: The run directory's claim (hidden: no reader takes it for a trace).
RUN_CLAIM = ".fastprof-run"
#: A rank's "I am done" marker: a file in its folder (local runs), the same
#: name as an object in the store (runs on object storage).
DONE_MARKER = ".fastprof-done"
#: A rank's own summary of its run (JSON), written at its end (what a report
#: of many ranks combines without reading their traces, #38). Not ``.json``:
#: no reader of a rank folder (the merge's walker, HTA) takes it for a trace.
RANK_SUMMARY_JSON = "summary.fastprof"
#: A rank whose traces hold more gzip than this (one segment of the default
#: ``segment_size``, ~2.7 M steps of a bare loop) is a long run: it writes no
#: summary at its end (``profiler/drivers/summary.py``) and its report reads
#: it through the step pass (``reports/long_run.py``). One figure for both,
#: so that a rank the summary leaves out is the one the pass reads.
LONG_RANK_BYTES = 256 << 20
#: In a spool's rank folder (hidden: never uploaded by name): which claim of
#: the store this rank's files belong to, ``{"key": ..., "job": ...}``, so
#: that ``fastprof upload`` sends them only where that job's claim stands.
STORE_CLAIM = ".fastprof-store-claim"
#: A request to the job (``fastprof trigger``), in the run's or a rank's folder.
TRIGGER_FILE = "TRIGGER"

# --------------------------------------------------------------- URL rule


def is_url(text: str | os.PathLike[str]) -> bool:
    """Whether ``text`` names a place through fsspec (``s3://b/runs``,
    ``file:///tmp/x``, ``simplecache::s3://...``) rather than a local path:
    ``^[A-Za-z][A-Za-z0-9+.-]+(://|::)``, the core's own rule (its readers
    take URLs too). ``C:\\runs`` and ``runs/s3:`` are paths."""
    return isinstance(text, str) and _core._is_url(text)
