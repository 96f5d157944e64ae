"""What a report reads: one run directory or one trace, as numpy columns.

Everything per event comes from :func:`fastprof.read_columns` (the Rust
scanner), read once per report; this module only groups those columns with
numpy. The columns are the report's largest memory (44 bytes per span row),
so a torch window's operators, kernels and runtime calls (the Kineto
categories, :data:`KINETO_CATEGORIES`) are folded while reading into one
total per (rank, name, category), ``cols.folded``, except ``ProfilerStep#N``
(a verbose report, which lists every name's percentiles, keeps them all as
rows), and every ``ProfilerStep#N`` is read under one name,
``ProfilerStep#*`` (the steps are told apart by time; a name per step was
most of a million-step report's memory). What is derived from all rows (ranks, wall, each rank's steps) is
computed once and kept, name and category tests go through boolean lookup
tables indexed by the id columns, and scans that need a per-row temporary run
in chunks of :data:`_CHUNK` rows. The few small
JSON documents next to the traces (``rank*/profiler.json``, the fastprof
segments' ``otherData``) are read whole, the segments' tail by a streaming
decompression that keeps only the last megabyte.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fastprof._core import FastprofError
from fastprof.readers.columns import Columns, read_columns
from fastprof.recording.names import (
    MODEL_SUMMARY_JSON,
    OOM_JSON,
    PROFILER_JSON,
    RANK_DIR,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    STEP_SPAN,
    loader_of_next,
)
from fastprof.reports.finite import counter_warnings
from fastprof.storage.run_view import RunView, open_run

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

_TAIL_BYTES = 1 << 20
#: Rows per chunk where a scan over every span would otherwise build a
#: full-length int64 temporary (8 MB per chunk instead of 8 bytes x rows).
_CHUNK = 1 << 20
#: Columns no report reads, dropped once read (4 bytes per row).
_UNUSED = ("file",)
#: Kineto's categories (record_function annotations included): events of
#: torch windows, folded into totals unless the report is verbose.
KINETO_CATEGORIES = frozenset(
    {
        "cpu_op",
        "python_function",
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "cuda_runtime",
        "cuda_driver",
        "ac2g",
        "Trace",
        "gpu_user_annotation",
        "cpu_instant_event",
        "user_annotation",
    }
)


class ReportInputError(FastprofError, ValueError):
    """The path given to a report is not a run directory or a trace."""


@dataclass
class Spans:
    """One span name's rows on one rank, sorted by start: ts and dur in ns."""

    ts: I64
    dur: I64

    @property
    def end(self) -> I64:
        return self.ts + self.dur


@dataclass
class RunData:
    """A run's columns and side documents (see :func:`load`)."""

    path: Path
    run_dir: Path | None
    cols: Columns
    #: Where the run lives, as it was read (:mod:`fastprof.storage.run_view`):
    #: for a run in a store, ``run_dir`` is the local copy of its side documents.
    run: RunView
    #: rank -> parsed rank{R}/profiler.json (of a segment read alone: the
    #: one beside it, when it is that recording's, see :func:`load`)
    profiler: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: The fastprof segment read alone (a report of one segment file; None
    #: for a run directory or any other trace).
    alone: Path | None = None
    #: rank -> otherData of that rank's main fastprof recording (last segment)
    other: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: rank -> otherData of DataLoader workers' recordings (last segment each)
    worker_other: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    #: rank -> parsed rank{R}/memory/oom.json (an out-of-memory capture)
    oom: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: rank -> rank{R}/memory/model_summary.json (Profiler(model=...))
    model_summary: dict[int, Path] = field(default_factory=dict)
    #: The operator table of the report's memory section (a
    #: ``fastprof.memory.OperatorTable``), written beside the report.
    operator_table: Any = None
    #: Every window's operator table, by the file stem written beside the
    #: report (``operators.rank{R}.<window>``): (stem, OperatorTable).
    operator_tables: list[tuple[str, Any]] = field(default_factory=list)
    #: The step-time breakdown's columns (a ``reports.breakdown.Breakdown``),
    #: once the report has computed it: breakdown.csv and the page's bars.
    breakdown: Any = None
    _ranks: list[int] | None = None
    _walls: dict[int | None, tuple[int, int]] = field(default_factory=dict)
    _steps: dict[int, tuple[Spans, str]] = field(default_factory=dict)

    @property
    def inputs(self) -> list[str]:
        """The trace files read (not those skipped, e.g. a rank's profiler.json)."""
        return [str(f["path"]) for f in self.cols.files if not f.get("skipped")]

    @property
    def ranks(self) -> list[int]:
        if self._ranks is None:
            cols = (self.cols.spans["rank"], self.cols.counters["rank"], self.cols.folded.get("rank", np.zeros(0)))
            found = {int(x) for col in cols for x in np.unique(col)}
            self._ranks = sorted(found) or [0]
        return list(self._ranks)

    def name_mask(self, ids: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """A lookup table over name ids, True at ``ids`` (index it with a name
        column: one byte per row, where ``np.isin`` sorts the column)."""
        lut = np.zeros(len(self.cols.names), bool)
        lut[np.asarray(ids, dtype=np.intp)] = True
        return lut

    def category_mask(self, ids: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """As :meth:`name_mask`, over category ids."""
        lut = np.zeros(len(self.cols.categories), bool)
        lut[np.asarray(ids, dtype=np.intp)] = True
        return lut

    def name_id(self, name: str) -> int | None:
        try:
            return self.cols.names.index(name)
        except ValueError:
            return None

    def span_names(self) -> list[str]:
        ids = np.unique(self.cols.spans["name"])
        return [self.cols.names[int(i)] for i in ids]

    def spans(self, name: str, rank: int | None = None) -> Spans:
        """Rows of one span name (all ranks when ``rank`` is None), by start."""
        s = self.cols.spans
        nid = self.name_id(name)
        if nid is None:
            return Spans(np.zeros(0, np.int64), np.zeros(0, np.int64))
        m = s["name"] == nid
        if rank is not None:
            m &= s["rank"] == rank
        ts, dur = s["ts"][m], s["dur"][m]
        order = np.argsort(ts, kind="stable")
        return Spans(ts[order].astype(np.int64), dur[order].astype(np.int64))

    def counter(self, name: str, rank: int) -> tuple[I64, F64]:
        """(ts ns, value) of one counter track on one rank, by time."""
        c = self.cols.counters
        nid = self.name_id(name)
        if nid is None:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        m = (c["name"] == nid) & (c["rank"] == rank)
        ts, v = c["ts"][m], c["value"][m]
        order = np.argsort(ts, kind="stable")
        return ts[order].astype(np.int64), v[order].astype(np.float64)

    def counter_names(self) -> list[str]:
        return [self.cols.names[int(i)] for i in np.unique(self.cols.counters["name"])]

    def wall(self, rank: int | None = None) -> tuple[int, int]:
        """First and last instant (epoch ns) of the rank's spans and counters."""
        if rank not in self._walls:
            s, c = self.cols.spans, self.cols.counters
            lo: list[int] = []
            hi: list[int] = []
            for a in range(0, len(s["ts"]), _CHUNK):
                ts, dur = s["ts"][a : a + _CHUNK], s["dur"][a : a + _CHUNK]
                if rank is not None:
                    m = s["rank"][a : a + _CHUNK] == rank
                    ts, dur = ts[m], dur[m]
                if len(ts):
                    lo.append(int(ts.min()))
                    hi.append(int((ts + dur).max()))
            cts = c["ts"] if rank is None else c["ts"][c["rank"] == rank]
            if len(cts):
                lo.append(int(cts.min()))
                hi.append(int(cts.max()))
            f = self.cols.folded
            if f and len(f["rank"]):
                m = np.ones(len(f["rank"]), bool) if rank is None else f["rank"] == rank
                if m.any():
                    lo.append(int(f["first_ns"][m].min()))
                    hi.append(int(f["last_ns"][m].max()))
            self._walls[rank] = (min(lo), max(hi)) if lo else (0, 0)
        return self._walls[rank]


def load(path: str | os.PathLike[str], fold: bool = True, run: RunView | None = None) -> RunData:
    """Read a run directory (its unified ``trace.json.gz`` when there is one,
    else every rank's segments and torch windows) or a single trace.
    ``fold``: spans of :data:`KINETO_CATEGORIES` as totals, not rows.
    ``run``: the run as the caller opened and read it
    (:func:`fastprof.storage.run_view.open_run`); without it, ``path`` is
    opened here, wherever it lives.

    Raises :class:`fastprof.FastprofFileNotFoundError` for a missing path,
    :class:`fastprof.TraceError` for a file that is not a trace and
    :class:`ReportInputError` for a directory holding no trace."""
    # Read here, the run stays read as long as its data (a store run's copy
    # of its side documents is removed with the view).
    return _load(Path(path), fold, run if run is not None else open_run(path).read())


def _load(p: Path, fold: bool, run: RunView) -> RunData:
    target, run_dir = run.target, run.folder
    # Instants are in no report; each unused column is dropped as soon as read.
    cols = read_columns(
        target,
        kinds=("spans", "counters"),
        fold_categories=sorted(KINETO_CATEGORIES) if fold else None,
        fold_except="ProfilerStep#",
        step_column=False,
        collapse_numbered="ProfilerStep#",
    )
    cols.warnings.extend(counter_warnings(cols))
    for table in (cols.spans, cols.counters):
        for key in _UNUSED:
            table.pop(key, None)
    if not cols.files or (
        not len(cols.spans["ts"]) and not len(cols.counters["ts"]) and not len(cols.folded.get("rank", ()))
    ):
        raise ReportInputError(f"{run.name}: no trace events found (expected a fastprof run directory or a trace file)")
    data = RunData(path=p, run_dir=run_dir, cols=cols, run=run)
    alone = run.local_file
    if run_dir is not None:
        _read_side_documents(data, run_dir)
    elif alone is not None and alone.name.startswith(SEGMENT_PREFIX) and alone.name.endswith(SEGMENT_SUFFIX):
        data.alone = alone
        other = read_other_data(run, alone)
        if other is not None:
            data.other[int(other.get("rank", 0) or 0)] = other
        _read_own_profiler(data, alone, other)
    return data


def _read_own_profiler(data: RunData, segment: Path, other: dict[str, Any] | None) -> None:
    """A segment read alone: the ``profiler.json`` beside it, when it is the
    account of that segment's recording (same run name and rank; without
    the segment's metadata, a rank folder's own), read as a run directory's
    is. What a report judges with it (the steps of the profiler's windows,
    the schedule's warm-up) is then what the run directory's report judges."""
    summary = segment.parent / PROFILER_JSON
    if not summary.is_file():
        return
    try:
        doc = json.loads(summary.read_text())
    except (OSError, ValueError):
        data.cols.warnings.append(f"{summary}: not valid JSON; its schedule and windows are left out")
        return
    if not isinstance(doc, dict):
        return
    m = RANK_DIR.match(segment.parent.name)
    if other is not None:
        same = doc.get("run_name") == other.get("run_name") and doc.get("rank") == other.get("rank")
    else:
        same = m is not None and doc.get("rank") == int(m.group(1))
    if same:
        data.profiler[int(doc.get("rank") or 0)] = doc


def _read_side_documents(data: RunData, run_dir: Path) -> None:
    """The side documents of a run directory (``run_dir``, laid out as one:
    a store run's local copy), its segments' ``otherData`` read where they are."""
    for rank_dir in sorted(run_dir.glob("rank*")):
        m = RANK_DIR.match(rank_dir.name)
        if not m or not rank_dir.is_dir():
            continue
        rank = int(m.group(1))
        summary_json = rank_dir / "memory" / MODEL_SUMMARY_JSON
        if summary_json.is_file():
            data.model_summary[rank] = summary_json
        oom = rank_dir / "memory" / OOM_JSON
        if oom.is_file():
            try:
                data.oom[rank] = json.loads(oom.read_text())
            except (OSError, ValueError):
                data.cols.warnings.append(f"{oom}: not valid JSON; the out-of-memory capture is left out")
        summary = rank_dir / PROFILER_JSON
        if summary.is_file():
            try:
                data.profiler[rank] = json.loads(summary.read_text())
            except (OSError, ValueError):
                data.cols.warnings.append(f"{summary}: not valid JSON; its schedule and windows are left out")
        # The last closed segment of each recording holds its final counts.
        last: dict[str, tuple[int, Path | str]] = {}
        for key, name, seg in data.run.segments(rank_dir):
            parts = name.split(".")
            try:
                n = int(parts[-3])
            except (ValueError, IndexError):
                continue
            if key not in last or n > last[key][0]:
                last[key] = (n, seg)
        for parent, (_, seg) in sorted(last.items()):
            other = read_other_data(data.run, seg)
            if other is None:
                continue
            if Path(parent) == rank_dir:
                data.other[rank] = other
            else:
                data.worker_other.setdefault(rank, []).append(other)


def where_now(data: RunData, recorded: str) -> str:
    """Where a file a rank wrote (a torch window, a flight dump: profiler.json
    holds the absolute path it had then) is now. A run on object storage was
    recorded in a spool the uploader emptied: the file is its object,
    ``<run URL>/rank{R}/...``. A run directory moved or copied since: the same
    ``rank{R}/...`` under where it is now. Otherwise the recorded path."""
    return data.run.where_now(recorded)


def read_other_data(run: RunView, path: Path | str) -> dict[str, Any] | None:
    """The ``otherData`` object at the end of a fastprof segment of ``run``,
    found by decompressing the file as a stream and keeping only its tail
    (an object is read by ranged reads)."""
    tail = b""
    try:
        with run.open_file(path) as f:
            d = zlib.decompressobj(zlib.MAX_WBITS | 16)
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                tail = (tail + d.decompress(chunk))[-_TAIL_BYTES:]
                while d.unused_data:  # a further gzip member
                    rest = d.unused_data
                    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
                    tail = (tail + d.decompress(rest))[-_TAIL_BYTES:]
            tail = (tail + d.flush())[-_TAIL_BYTES:]
    except Exception:  # noqa: BLE001 - OSError, zlib.error, a store's error: no counts, the report goes on
        return None
    at = tail.rfind(b'"otherData":')
    if at < 0:
        return None
    body = tail[at + len(b'"otherData":') :].rstrip()
    if body.endswith(b"}"):
        body = body[:-1]
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def warmup_from_schedule(profiler: dict[str, Any]) -> int:
    """skip_first of the Profiler's schedule (0 when it has none)."""
    m = re.search(r"skip_first=(\d+)", str(profiler.get("schedule", "")))
    return int(m.group(1)) if m else 0


def grouped_quantiles(values: F64, starts: I64, counts: I64, q: float) -> F64:
    """Quantile ``q`` of each group of ``values`` (sorted within groups),
    group g being ``values[starts[g]:starts[g]+counts[g]]``; numpy's
    "linear" method, for every group at once."""
    if not len(counts):
        return np.zeros(0, np.float64)
    pos = (counts - 1) * q
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, counts - 1)
    a = values[starts + lo]
    b = values[starts + hi]
    return np.asarray(a + (b - a) * (pos - lo), dtype=np.float64)


def step_spans(data: RunData, rank: int) -> tuple[Spans, str]:
    """The rank's training steps: fastprof ``step`` spans, else torch's
    ``ProfilerStep#N`` spans. Returns the spans and the source's name
    (computed once per rank; the arrays are shared, never write to them)."""
    if rank not in data._steps:
        data._steps[rank] = _step_spans(data, rank)
    return data._steps[rank]


def _step_spans(data: RunData, rank: int) -> tuple[Spans, str]:
    s = data.spans(STEP_SPAN, rank)
    if len(s.ts):
        return s, STEP_SPAN
    names = data.cols.names
    ids = [i for i, n in enumerate(names) if n.startswith("ProfilerStep#")]
    if not ids:
        return s, "none"
    sp = data.cols.spans
    m = data.name_mask(ids)[sp["name"]] & (sp["rank"] == rank)
    ts, dur = sp["ts"][m], sp["dur"][m]
    order = np.argsort(ts, kind="stable")
    return Spans(ts[order].astype(np.int64), dur[order].astype(np.int64)), "ProfilerStep#N"


def loader_names(data: RunData) -> list[str]:
    return sorted(loader for n in data.span_names() if (loader := loader_of_next(n)) is not None)


def sum_inside(inner_ts: I64, inner_dur: I64, outer_ts: I64, outer_end: I64) -> I64:
    """Per outer interval, the summed duration of the inner spans that start
    inside it (both sorted by start)."""
    if not len(outer_ts):
        return np.zeros(0, np.int64)
    csum = np.concatenate([[0], np.cumsum(inner_dur, dtype=np.int64)])
    a = np.searchsorted(inner_ts, outer_ts, side="left")
    b = np.searchsorted(inner_ts, outer_end, side="left")
    return np.asarray(csum[b] - csum[a], dtype=np.int64)


#: Binary units, each 1024 times the one before.
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def binary_unit(v: float) -> tuple[str, float]:
    """The binary unit :func:`human_bytes` writes ``v`` bytes in, and its
    size in bytes: the page draws byte axes in it, so that a plot's axis and
    the figure quoted beside it say the same unit."""
    x, scale = abs(float(v)), 1.0
    for unit in BINARY_UNITS[:-1]:
        if x < 1024:
            return unit, scale
        x /= 1024
        scale *= 1024
    return BINARY_UNITS[-1], scale


def human_bytes(v: Any) -> str:
    """A byte count with a binary unit ("969.4 MiB"); "-" for None."""
    if v is None:
        return "-"
    unit, scale = binary_unit(v)
    return f"{float(v) / scale:.1f} {unit}"


#: The host table's columns (terminal and HTML).
HOST_COLUMNS = ("rank", "CPU mean/max %", "process CPU %", "peak RSS", "workers", "workers CPU %", "workers RSS")


def host_rows(host: list[dict[str, Any]]) -> list[list[str]]:
    """The host table's rows (``system.host`` of a report), as text."""

    def n(v: Any, fmt: str = "{:.0f}") -> str:
        return "-" if v is None else fmt.format(v)

    return [
        [
            str(h["rank"]),
            f"{n(h['cpu_mean_pct'])}/{n(h['cpu_max_pct'])}",
            n(h["process_cpu_mean_pct"]),
            human_bytes(h["rss_peak_b"]),
            n(h["workers_max"], "{}"),
            n(h["workers_cpu_mean_pct"]),
            human_bytes(h["workers_rss_peak_b"]),
        ]
        for h in host
    ]
