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
from fastprof.reports import long_run
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
#: ... and of the counters (20 bytes per row: a counter is told by its
#: name and rank; its checks, :func:`counter_warnings`, read them first).
_UNUSED_COUNTERS = ("file", "pid", "tid", "cat")
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
    #: A long run (:mod:`fastprof.reports.long_run`): rank -> what the step
    #: pass kept of the names every step records (their rows are not in
    #: ``cols``); None for a run read whole.
    long: dict[int, long_run.RankSteps] | None = None
    _ranks: list[int] | None = None
    _walls: dict[int | None, tuple[int, int]] = field(default_factory=dict)
    _steps: dict[int, tuple[Spans, str]] = field(default_factory=dict)
    _span_index: _Groups | None = None
    _counter_index: _Groups | None = None
    _span_names: list[str] | None = None
    _name_ids: dict[str, int] | None = None

    @property
    def inputs(self) -> list[str]:
        """The trace files read (not those skipped, e.g. a rank's profiler.json)."""
        return [str(f["path"]) for f in self.cols.files if not f.get("skipped")]

    @property
    def ranks(self) -> list[int]:
        if self._ranks is None:
            cols = (self.cols.spans["rank"], self.cols.counters["rank"], self.cols.folded.get("rank", np.zeros(0)))
            found = {x for col in cols for x in _distinct(col)}
            found.update(self.long or {})
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
        if self._name_ids is None:
            self._name_ids = {}
            for i, n in enumerate(self.cols.names):
                self._name_ids.setdefault(n, i)
        return self._name_ids.get(name)

    def span_names(self) -> list[str]:
        if self._span_names is None:
            names = [self.cols.names[i] for i in self._span_groups().name_ids()]
            met = sorted({n for r in (self.long or {}).values() for n in r.stats} - set(names))
            self._span_names = names + met
        return list(self._span_names)

    def _span_groups(self) -> _Groups:
        if self._span_index is None:
            s = self.cols.spans
            self._span_index = _Groups.build(s["name"], s["rank"], s["ts"])
        return self._span_index

    def _counter_groups(self) -> _Groups:
        if self._counter_index is None:
            c = self.cols.counters
            self._counter_index = _Groups.build(c["name"], c["rank"], c["ts"])
        return self._counter_index

    def spans(self, name: str, rank: int | None = None) -> Spans:
        """Rows of one span name (all ranks when ``rank`` is None), by start
        (rows of one start in the order read). One rank's rows are a slice
        of the rank index (:class:`_Groups`), never a scan of the column.
        A long run's names the step pass reads have no rows: asking for one
        is an error (the sections read the pass for them), except those it
        keeps (:data:`long_run.KEPT_SPANS`)."""
        if self.long is not None and name in long_run.PASS_SPAN_SET:
            if name not in long_run.KEPT_SPANS or rank is None:
                raise LongRunError(f"{name!r}: read through the step pass in a long run, not as rows")
            got = self.long.get(rank)
            kept = got.kept.get(name) if got is not None else None
            if kept is None:
                return Spans(np.zeros(0, np.int64), np.zeros(0, np.int64))
            return Spans(kept[0], kept[1])
        nid = self.name_id(name)
        if nid is None:
            return Spans(np.zeros(0, np.int64), np.zeros(0, np.int64))
        return self.spans_of_ids([nid], rank)

    def spans_of_ids(self, ids: list[int], rank: int | None = None) -> Spans:
        """Rows of several span names (ids) as one list, by start."""
        s = self.cols.spans
        groups = self._span_groups()
        rows = groups.rows_by_start(ids, rank, s["ts"])
        return Spans(s["ts"][rows].astype(np.int64, copy=False), s["dur"][rows].astype(np.int64, copy=False))

    def span_rows(self, name: str, rank: int) -> npt.NDArray[Any]:
        """Row numbers of one span name on one rank, by start (as
        :meth:`spans` orders them): a view of the rank index, no copy (never
        write to it); index the span columns with it."""
        nid = self.name_id(name)
        if nid is None:
            return np.zeros(0, np.intp)
        groups = self._span_groups()
        a, b = groups._group(nid, rank)
        return groups.order[a:b]

    def counter(self, name: str, rank: int) -> tuple[I64, F64]:
        """(ts ns, value) of one counter track on one rank, by time."""
        c = self.cols.counters
        nid = self.name_id(name)
        if nid is None:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        rows = self._counter_groups().rows_by_start([nid], rank, c["ts"])
        return c["ts"][rows].astype(np.int64, copy=False), c["value"][rows].astype(np.float64, copy=False)

    def counter_rows(self, name: str, rank: int) -> npt.NDArray[np.intp]:
        """Row numbers of one counter track on one rank, in the order read
        (index the counter columns with them: series, value, ts)."""
        nid = self.name_id(name)
        if nid is None:
            return np.zeros(0, np.intp)
        return np.sort(self._counter_groups().rows_by_start([nid], rank, self.cols.counters["ts"]))

    def counter_names(self) -> list[str]:
        return [self.cols.names[i] for i in self._counter_groups().name_ids()]

    def wall(self, rank: int | None = None) -> tuple[int, int]:
        """First and last instant (epoch ns) of the rank's spans and counters
        (every rank's, computed together in one pass, when one is asked)."""
        if rank not in self._walls:
            if rank is None:
                self._walls[None] = _widest([self._wall_of_all(), *(r.wall for r in (self.long or {}).values())])
            else:
                self._walls.update(self._walls_by_rank())
                for r, got in (self.long or {}).items():
                    self._walls[r] = _widest([self._walls.get(r, (0, 0)), got.wall])
                self._walls.setdefault(rank, (0, 0))
        return self._walls[rank]

    def _wall_of_all(self) -> tuple[int, int]:
        s, c, f = self.cols.spans, self.cols.counters, self.cols.folded
        lo: list[int] = []
        hi: list[int] = []
        for a in range(0, len(s["ts"]), _CHUNK):
            ts, dur = s["ts"][a : a + _CHUNK], s["dur"][a : a + _CHUNK]
            lo.append(int(ts.min()))
            hi.append(int((ts + dur).max()))
        if len(c["ts"]):
            lo.append(int(c["ts"].min()))
            hi.append(int(c["ts"].max()))
        if f and len(f["rank"]):
            lo.append(int(f["first_ns"].min()))
            hi.append(int(f["last_ns"].max()))
        return (min(lo), max(hi)) if lo else (0, 0)

    def _walls_by_rank(self) -> dict[int | None, tuple[int, int]]:
        """Every rank's (first, last) instant, by one chunked pass per table."""
        s, c, f = self.cols.spans, self.cols.counters, self.cols.folded
        ranks = [r for r in self.ranks]
        rlo = min(ranks)
        width = max(ranks) - rlo + 1
        big = np.iinfo(np.int64).max
        lo = np.full(width, big, np.int64)
        hi = np.full(width, -big, np.int64)
        tables = [(s["rank"], s["ts"], s["dur"]), (c["rank"], c["ts"], None)]
        if f and len(f["rank"]):
            tables.append((f["rank"], f["first_ns"], None))
            tables.append((f["rank"], f["last_ns"], None))
        for rank_col, ts_col, dur_col in tables:
            for a in range(0, len(ts_col), _CHUNK):
                idx = rank_col[a : a + _CHUNK].astype(np.intp) - rlo
                ts = ts_col[a : a + _CHUNK]
                np.minimum.at(lo, idx, ts)
                np.maximum.at(hi, idx, ts if dur_col is None else ts + dur_col[a : a + _CHUNK])
        return {rlo + i: (int(lo[i]), int(hi[i])) for i in range(width) if lo[i] != big}


class LongRunError(RuntimeError):
    """A section asked a long run for rows the step pass keeps no rows of (a bug)."""


def _widest(walls: list[tuple[int, int]]) -> tuple[int, int]:
    """The span of several (first, last) instants; (0, 0) stands for none."""
    got = [w for w in walls if w != (0, 0)]
    return (min(w[0] for w in got), max(w[1] for w in got)) if got else (0, 0)


def _distinct(col: npt.NDArray[Any]) -> list[int]:
    """The distinct values of an integer column (ranks), by counting: one
    pass, no sort of the column."""
    if not len(col):
        return []
    lo, hi = int(col.min()), int(col.max())
    counts = np.bincount((col.astype(np.int64) - lo), minlength=hi - lo + 1)
    return [int(x) for x in np.flatnonzero(counts) + lo]


@dataclass
class _Groups:
    """A table's rows grouped by (name id, rank), each group by start: the
    rank index of :class:`RunData`. Built once per table (a stable sort by
    the group key; rows of one name on one rank are read in start order,
    so the start order within groups is only checked, and the few groups
    out of order sorted alone), it makes one rank's rows of a name a slice:
    the reports' per-rank loops touch only that rank's rows.

    ``order``: row numbers, group after group (int32 where the table has
    under 2^31 rows: 4 bytes per row); ``keys``: each group's key,
    ``name * stride + rank - rank_lo``, ascending; ``bounds``: where each
    group starts in ``order``, and its end."""

    order: npt.NDArray[np.integer[Any]]
    keys: I64
    bounds: I64
    stride: int
    rank_lo: int
    #: Rows handed out by lookups (the rank index's cost, read by tests).
    rows_touched: int = 0

    @classmethod
    def build(cls, name: npt.NDArray[Any], rank: npt.NDArray[Any], ts: npt.NDArray[Any]) -> _Groups:
        n = len(name)
        if not n:
            return cls(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(1, np.int64), 1, 0)
        rank_lo = int(rank.min())
        stride = int(rank.max()) - rank_lo + 1
        width = (int(name.max()) + 1) * stride
        key_type = np.int32 if width < 2**31 else np.int64
        if width <= _DENSE_KEYS and n < 2**31:
            order, keys, bounds = _placed(name, rank, rank_lo, stride, width)
        else:
            key = name.astype(key_type) * key_type(stride) + (rank.astype(key_type) - key_type(rank_lo))
            order = np.argsort(key, kind="stable")
            if n < 2**31:
                order = order.astype(np.int32)
            sorted_key = key[order]
            del key
            cut = np.flatnonzero(sorted_key[1:] != sorted_key[:-1]) + 1
            bounds = np.concatenate([[0], cut, [n]]).astype(np.int64)
            keys = sorted_key[bounds[:-1]].astype(np.int64)
            del sorted_key
        # Start order within each group: a group out of order is sorted alone.
        unsorted: list[int] = []
        for a in range(0, n - 1, _CHUNK):
            b = min(a + _CHUNK + 1, n)
            t = ts[order[a:b]]
            down = np.flatnonzero(t[1:] < t[:-1]) + a + 1
            if len(down):
                groups = np.searchsorted(bounds, down, side="right") - 1
                unsorted.extend(int(g) for g in np.unique(groups[bounds[groups] != down]))
        for g in sorted(set(unsorted)):
            a, b = int(bounds[g]), int(bounds[g + 1])
            rows = order[a:b]
            order[a:b] = rows[np.argsort(ts[rows], kind="stable")]
        return cls(order, keys, bounds, stride, rank_lo)

    def name_ids(self) -> list[int]:
        """The name ids present, ascending."""
        return [int(x) for x in np.unique(self.keys // self.stride)]

    def _group(self, nid: int, rank: int) -> tuple[int, int]:
        r = rank - self.rank_lo
        if not 0 <= r < self.stride:
            return 0, 0
        k = nid * self.stride + r
        i = int(np.searchsorted(self.keys, k))
        if i == len(self.keys) or int(self.keys[i]) != k:
            return 0, 0
        return int(self.bounds[i]), int(self.bounds[i + 1])

    def rows_by_start(self, ids: list[int], rank: int | None, ts: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
        """Row numbers of names ``ids`` on ``rank`` (every rank: None) by
        start, rows of one start in table order (as a stable sort of the
        matching rows by start would give them)."""
        parts: list[npt.NDArray[Any]] = []
        for nid in ids:
            if rank is not None:
                a, b = self._group(int(nid), rank)
            else:
                a_key, b_key = int(nid) * self.stride, (int(nid) + 1) * self.stride
                a = int(self.bounds[np.searchsorted(self.keys, a_key)])
                b = int(self.bounds[np.searchsorted(self.keys, b_key)])
            if b > a:
                parts.append(self.order[a:b])
        if not parts:
            return np.zeros(0, np.intp)
        self.rows_touched += sum(len(p) for p in parts)
        if len(parts) == 1 and rank is not None:
            return parts[0].astype(np.intp)
        rows = np.sort(np.concatenate(parts)).astype(np.intp)
        return rows[np.argsort(ts[rows], kind="stable")]


#: Group keys (names x ranks) up to which :class:`_Groups` places rows by
#: counting (a count per possible key, 16 bytes each) instead of sorting.
_DENSE_KEYS = 1 << 22


def _placed(name: Any, rank: Any, rank_lo: int, stride: int, width: int) -> tuple[Any, I64, I64]:
    """:class:`_Groups`' order, keys and bounds, placed by counting a chunk
    of rows at a time (the same as a stable sort of the keys, in ~4 bytes a
    row, where the sort held ~20): each key's rows in row order."""
    n = len(name)
    counts = np.zeros(width, np.int64)
    for a in range(0, n, _CHUNK):
        k = name[a : a + _CHUNK].astype(np.int64) * stride + (rank[a : a + _CHUNK].astype(np.int64) - rank_lo)
        counts += np.bincount(k, minlength=width)
    present = np.flatnonzero(counts)
    bounds = np.concatenate([[0], np.cumsum(counts[present])]).astype(np.int64)
    nxt = np.zeros(width, np.int64)
    nxt[present] = bounds[:-1]
    del counts
    order = np.empty(n, np.int32)
    for a in range(0, n, _CHUNK):
        k = name[a : a + _CHUNK].astype(np.int64) * stride + (rank[a : a + _CHUNK].astype(np.int64) - rank_lo)
        o = np.argsort(k, kind="stable")
        sk = k[o]
        first = np.concatenate([[True], sk[1:] != sk[:-1]])
        run_at = np.flatnonzero(first)
        within = np.arange(len(sk)) - np.repeat(run_at, np.diff(np.concatenate([run_at, [len(sk)]])))
        order[nxt[sk] + within] = o + a
        nxt[sk[run_at]] += np.diff(np.concatenate([run_at, [len(sk)]]))
    return order, present.astype(np.int64), bounds


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


def load_rank(run_dir: Path, rank: int) -> RunData:
    """One rank of a local run directory as its own report reads it: the
    segments and torch windows of ``rank{R}/`` only, and that rank's side
    documents (what the rank summarises of itself at its end, see
    :mod:`fastprof.reports.summaries`; the run's unified trace is not read)."""
    return load_ranks(run_dir, [rank])


def load_ranks(run_dir: Path, ranks: list[int]) -> RunData:
    """:func:`load_rank` of several ranks at once (their folders read together)."""
    folders = [run_dir / f"rank{r}" for r in ranks]
    run = open_run(folders[0]).read()
    target: Any = folders[0] if len(folders) == 1 else [str(f) for f in folders]
    data = _load(folders[0], True, run, side=False, target=target)
    data.run_dir = run_dir
    for r in ranks:
        _read_side_documents(data, run_dir, only=r)
    return data


def _load(p: Path, fold: bool, run: RunView, side: bool = True, target: Any = None) -> RunData:
    run_dir = run.folder
    if target is None:
        target = run.target
    # Instants are in no report; each unused column is dropped as soon as read.
    opts: dict[str, Any] = {
        "kinds": ("spans", "counters"),
        "fold_categories": sorted(KINETO_CATEGORIES) if fold else None,
        "fold_except": "ProfilerStep#",
        "step_column": False,
        "collapse_numbered": "ProfilerStep#",
        # Never stored (the counters' file is read by counter_warnings first).
        "omit": [f"spans.{k}" for k in _UNUSED] + [f"counters.{k}" for k in _UNUSED_COUNTERS if k != "file"],
    }
    long: dict[int, long_run.RankSteps] | None = None
    if files := long_run.long_files(target):
        # A long rank: the names every step records through the step pass, not as rows.
        cols, long = long_run.read(target, files, **opts)
    else:
        cols = read_columns(target, **opts)
    cols.warnings.extend(counter_warnings(cols))
    for table, unused in ((cols.spans, _UNUSED), (cols.counters, _UNUSED_COUNTERS)):
        for key in unused:
            table.pop(key, None)
    _narrow(cols.spans, ("pid", "tid"))
    if not cols.files or (
        not len(cols.spans["ts"]) and not len(cols.counters["ts"]) and not len(cols.folded.get("rank", ())) and not long
    ):
        raise ReportInputError(f"{run.name}: no trace events found (expected a fastprof run directory or a trace file)")
    data = RunData(path=p, run_dir=run_dir, cols=cols, run=run, long=long)
    alone = run.local_file
    if not side:
        return data
    if run_dir is not None:
        _read_side_documents(data, run_dir)
    elif alone is not None and alone.name.startswith(SEGMENT_PREFIX) and alone.name.endswith(SEGMENT_SUFFIX):
        data.alone = alone
        other = read_other_data(run, alone)
        if other is not None:
            data.other[int(other.get("rank", 0) or 0)] = other
        _read_own_profiler(data, alone, other)
    return data


def _narrow(table: dict[str, npt.NDArray[Any]], keys: tuple[str, ...]) -> None:
    """int64 id columns whose values all fit in int32 become int32 (4
    bytes a row each; the reports only compare them)."""
    for key in keys:
        col = table.get(key)
        if col is not None and len(col) and col.dtype == np.int64:
            if int(col.min()) >= -(2**31) and int(col.max()) < 2**31:
                table[key] = col.astype(np.int32)


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


def _read_side_documents(data: RunData, run_dir: Path, only: int | None = None) -> None:
    """The side documents of a run directory (``run_dir``, laid out as one:
    a store run's local copy), its segments' ``otherData`` read where they
    are; ``only``: of that rank alone."""
    for rank_dir in sorted(run_dir.glob("rank*")):
        m = RANK_DIR.match(rank_dir.name)
        if not m or not rank_dir.is_dir() or (only is not None and int(m.group(1)) != only):
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
    got = (data.long or {}).get(rank)
    if got is not None and len(got.ts):
        return Spans(got.ts, got.dur), STEP_SPAN
    if data.long is not None:
        s = Spans(np.zeros(0, np.int64), np.zeros(0, np.int64))
    else:
        s = data.spans(STEP_SPAN, rank)
    if len(s.ts):
        return s, STEP_SPAN
    names = data.cols.names
    ids = [i for i, n in enumerate(names) if n.startswith("ProfilerStep#")]
    if not ids:
        return s, "none"
    return data.spans_of_ids(ids, rank), "ProfilerStep#N"


def loader_names(data: RunData) -> list[str]:
    return sorted(loader for n in data.span_names() if (loader := loader_of_next(n)) is not None)


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
