"""The step table (issue #38, item 5): one row per rank and step of a run,
for query engines (DuckDB, polars, Spark, pandas).

Columns, in this order (:data:`COLUMNS`):

- ``rank`` (int32), ``step`` (int64: the step span's ``args.step`` or
  ``args.batch``, else its order on the rank), ``epoch`` (int64, null where
  the span has none);
- ``start_ns`` (int64, epoch ns, the rank's clock offset applied as the
  columns apply it) and ``duration_ns`` (int64), the Profiler's ``step`` span;
- one ``<phase>_ns`` (int64) per phase of the step anatomy
  (:data:`fastprof.recording.names.PHASES`), as the report's anatomy defines
  them (:mod:`fastprof.reports.anatomy`): the time a phase's spans cover in
  the step (a span belongs to the step it starts in and ends with it at the
  latest), fastprof's own ``phase.*`` spans or, on a rank with none of them
  for the phase, the user's spans named for it, overlapping phases resolved
  by the anatomy's one rule (:data:`fastprof.reports.anatomy.OVERLAP_RULE`,
  :func:`fastprof.reports.phases.split`); ``other_ns`` what no phase
  covers, so a row's phases add up to its ``duration_ns``. All null on a
  rank with no phase span at all;
- the memory read at the step's end where it was read (``rss_bytes`` and the
  CUDA allocator's ``cuda_*`` figures; short steps share a reading, so a step
  may have none): a reading belongs to the last step that ended at or before it;
- the GPU phase times of the steps the anatomy's budget timed on the GPU
  (``gpu_<phase>_ns``, ``gpu_span_ns``), null elsewhere.

A run directory is read one segment at a time, rank after rank, through the
core's streaming readers (:func:`fastprof.read_columns` and the step spans'
args, ``_core._read_step_args``): memory is bounded by a segment (the
recorder rotates them by size), not by the run's length. Rows carried from
one segment to the next are the steps not yet closed and the spans and
readings after the last closed one. A single trace file (a merged trace, a
segment) is read whole.

One difference from the report, where a run is read whole: which names count
for a phase is decided with what has been read so far on the rank, so a rank
whose ``phase.*`` spans begin only after its first segment counts the user's
spans of that phase until then.

pyarrow writes and reads the table (``pip install 'fastprof-torch[parquet]'``);
it is imported only here, when a table is written or loaded.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fastprof import _core
from fastprof._core import ConfigError, FastprofError
from fastprof._package import pip_install
from fastprof.readers.columns import read_columns
from fastprof.recording.names import (
    CUDA_COUNTERS,
    GPU_PHASE_COUNTER,
    GPU_PHASE_STEP_COUNTER,
    PHASES,
    RANK_DIR,
    RSS_COUNTER,
    SEGMENT,
    STEP_SPAN,
)
from fastprof.reports.anatomy import GPU_PHASES
from fastprof.reports.phases import ALL_NAMES, chosen, split
from fastprof.storage.run_view import RunView, open_run

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

#: The file ``fastprof export`` writes into a run directory by default.
DEFAULT_NAME = "steps.parquet"
#: The extra that brings pyarrow.
EXTRA = "parquet"


def _counter_column(name: str) -> str:
    """``mem.rss [B]`` -> ``rss_bytes``, ``mem.cuda.num_ooms`` -> ``cuda_num_ooms``."""
    base = name.removeprefix("mem.")
    if base.endswith(" [B]"):
        base = base[: -len(" [B]")] + "_bytes"
    return base.replace(".", "_")


#: Memory counters read at a step's end -> their column.
MEMORY: dict[str, str] = {n: _counter_column(n) for n in (RSS_COUNTER, *(c for _, c in CUDA_COUNTERS))}
#: The GPU counter's series -> their column.
GPU: dict[str, str] = {**{p: f"gpu_{p}_ns" for p in GPU_PHASES}, "span": "gpu_span_ns"}
#: Every column, and whether it may be null.
COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("rank", "int32", False),
    ("step", "int64", False),
    ("epoch", "int64", True),
    ("start_ns", "int64", False),
    ("duration_ns", "int64", False),
    *((f"{p}_ns", "int64", True) for p in PHASES),
    *((c, "int64", True) for c in MEMORY.values()),
    *((c, "int64", True) for c in GPU.values()),
)
#: Steps held back at a segment's end: a GPU step's times are recorded a
#: step or two after it, a step's memory reading just after its end.
HOLD = 8
#: Rows per row group written (a batch of fewer rows waits for the next).
ROW_GROUP = 1 << 17

_SPAN_NAMES = sorted({STEP_SPAN, *ALL_NAMES})
_COUNTER_NAMES = sorted({*MEMORY, GPU_PHASE_COUNTER, GPU_PHASE_STEP_COUNTER})


class StepTableError(FastprofError, ValueError):
    """A run holds no step to put in a table (no fastprof ``step`` span), or
    one of its files does not read as the step table needs."""


def optional(module: str) -> Any:
    """An optional package the step table needs (pyarrow, its parquet
    module, polars), imported here only; a :class:`fastprof.ConfigError`
    saying what to install when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        hint = pip_install(EXTRA) if top == "pyarrow" else f"pip install {top}"
        raise ConfigError(f"the step table needs {top}, which is not installed: {hint}") from e


Batch = dict[str, npt.NDArray[Any]]


@dataclass
class _Rank:
    """What one rank carries from a segment to the next."""

    rank: int
    first: bool = True
    #: Steps seen and not yet written: start, duration, number, epoch (-1: none).
    ts: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    dur: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    number: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    epoch: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    #: Steps numbered by order (no args.step / args.batch).
    ordinal: int = 0
    #: Phase span name -> (ts, dur) sorted by ts, from the first unwritten step on.
    spans: dict[str, tuple[I64, I64]] = field(default_factory=dict)
    #: Span names met on the rank so far.
    met: set[str] = field(default_factory=set)
    #: Memory counter -> (ts, value) not yet given to a step.
    readings: dict[str, tuple[I64, F64]] = field(default_factory=dict)
    #: The last ``phase.gpu.step`` value (the step of the GPU times after it).
    gpu_step: float = -1.0
    #: Step number -> GPU series -> ms, for steps not yet written.
    gpu: dict[int, dict[str, float]] = field(default_factory=dict)
    gpu_late: int = 0


#: The reader's columns the step table does not read (a span's pid is
#: checked against its args, then dropped).
_OMIT = (
    "spans.tid",
    "spans.cat",
    "spans.file",
    "counters.pid",
    "counters.tid",
    "counters.cat",
    "counters.file",
)


def _cat(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return b if not len(a) else a if not len(b) else np.concatenate([a, b])


def _by_ts(ts: I64, *rest: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], ...]:
    order = np.argsort(ts, kind="stable")
    return (ts[order], *(r[order] for r in rest))


class _Reader:
    """Feeds each file's rows to the ranks in it and yields the closed steps."""

    def __init__(self) -> None:
        self.ranks: dict[int, _Rank] = {}
        self.warnings: list[str] = []

    def read(self, path: str, last: bool) -> Iterator[Batch]:
        """The steps ``path`` closes (all of them when it is its ranks' ``last``)."""
        # Columns no step needs are never stored: 16 bytes a span row, 24 a counter row.
        cols = read_columns(
            path,
            names=_SPAN_NAMES + _COUNTER_NAMES,
            kinds=("spans", "counters"),
            step_column=False,
            omit=_OMIT,
        )
        self.warnings.extend(cols.warnings)
        args = _core._read_step_args(path)
        sp, ct = cols.spans, cols.counters
        # Each row's name as a small code (an index into cols.names), not a str per row.
        code = sp["name"].astype(np.int32, copy=False)
        step_id = cols.names.index(STEP_SPAN) if STEP_SPAN in cols.names else -1
        is_step = code == step_id
        if int(is_step.sum()) != len(args["pid"]) or not np.array_equal(sp["pid"][is_step], args["pid"]):
            raise StepTableError(
                f"{path}: its step spans read {int(is_step.sum())} rows as columns and {len(args['pid'])} with "
                "their args; the file changed while it was read, or this is a bug"
            )
        del sp["pid"]
        ranks = sorted({int(r) for r in np.unique(sp["rank"])} | {int(r) for r in np.unique(ct["rank"])})
        for rank in ranks:
            state = self.ranks.setdefault(rank, _Rank(rank))
            m = sp["rank"] == rank if len(ranks) > 1 else np.ones(len(code), bool)
            sm = m & is_step
            at = sm[is_step]
            self._add_steps(state, sp["ts"][sm], sp["dur"][sm], args["number"][at], args["epoch"][at])
            for nid in np.unique(code[m & ~is_step]).tolist():
                k = m & (code == nid)
                name = cols.names[nid]
                state.met.add(name)
                old = state.spans.get(name, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
                state.spans[name] = _by_ts(_cat(old[0], sp["ts"][k]), _cat(old[1], sp["dur"][k]))  # type: ignore[assignment]
            self._add_counters(state, cols.names, ct, ct["rank"] == rank)
        # The rows are in the ranks' state now: the columns go before the batches are built.
        del cols, sp, ct, code, is_step, args
        for rank in ranks:
            while (batch := self._close(self.ranks[rank], last)) is not None:
                yield batch

    def finish(self) -> Iterator[Batch]:
        """Every rank's steps still held (a file read alone held none back)."""
        for state in self.ranks.values():
            while (batch := self._close(state, True)) is not None:
                yield batch
            if state.gpu_late or state.gpu:
                self.warnings.append(
                    f"rank {state.rank}: {state.gpu_late + len(state.gpu)} GPU phase readings name a step that is "
                    "not in the table (left out)"
                )

    @staticmethod
    def _add_steps(state: _Rank, ts: I64, dur: I64, number: I64, epoch: I64) -> None:
        if not len(ts):
            return
        ts, dur, number, epoch = _by_ts(ts, dur, number, epoch)
        unnumbered = number < 0
        if unnumbered.any():
            number = number.copy()
            number[unnumbered] = state.ordinal + np.arange(int(unnumbered.sum()))
        state.ordinal += len(ts)
        state.ts, state.dur = _cat(state.ts, ts), _cat(state.dur, dur)
        state.number, state.epoch = _cat(state.number, number), _cat(state.epoch, epoch)

    @staticmethod
    def _add_counters(
        state: _Rank, names: list[str], ct: dict[str, npt.NDArray[Any]], m: npt.NDArray[np.bool_]
    ) -> None:
        if not m.any():
            return
        cname = np.asarray(names, dtype=object)[ct["name"][m]]
        series = np.asarray(names, dtype=object)[ct["series"][m]]
        ts, value = ct["ts"][m], ct["value"][m]
        for name in MEMORY:
            k = cname == name
            if k.any():
                old = state.readings.get(name, (np.zeros(0, np.int64), np.zeros(0, np.float64)))
                state.readings[name] = _by_ts(_cat(old[0], ts[k]), _cat(old[1], value[k]))  # type: ignore[assignment]
        # The GPU times' step: the phase.gpu.step counter just before them, in time.
        k = (cname == GPU_PHASE_COUNTER) | (cname == GPU_PHASE_STEP_COUNTER)
        if not k.any():
            return
        order = np.argsort(ts[k], kind="stable")
        for c, s, v in zip(cname[k][order].tolist(), series[k][order].tolist(), value[k][order].tolist(), strict=True):
            if c == GPU_PHASE_STEP_COUNTER:
                state.gpu_step = float(v)
            elif s in GPU and state.gpu_step >= 0:
                state.gpu.setdefault(int(state.gpu_step), {})[s] = float(v)

    def _close(self, state: _Rank, last: bool) -> Batch | None:
        """The next at most :data:`ROW_GROUP` steps that are closed (all the
        rank's when ``last``), None when no more are."""
        n = min(len(state.ts) if last else max(len(state.ts) - HOLD, 0), ROW_GROUP)
        flush = last and n == len(state.ts)
        if n == 0:
            if last:
                state.spans.clear()
                state.readings.clear()
            return None
        ts, dur = state.ts[:n], state.dur[:n]
        out: Batch = {
            "rank": np.full(n, state.rank, np.int32),
            "step": state.number[:n].copy(),
            "epoch": np.where(state.epoch[:n] >= 0, state.epoch[:n], np.nan),
            "start_ns": ts.copy(),
            "duration_ns": dur.copy(),
        }
        # Phases: the report's definition and its overlap rule (fastprof.reports.phases.split):
        # the phases are disjoint and add up to the step.
        use, found = chosen(lambda names: any(x in state.met for x in names))
        # Only the spans that start by the closed steps' end can be theirs
        # (views, their ends made a block at a time): not every held span's
        # end each time a row group closes (O(held) per close).
        reach = int((ts + dur).max())
        spans: dict[str, list[tuple[I64, Any]]] = {}
        for phase, names in use.items():
            got = (state.spans.get(name) for name in names)
            spans[phase] = [_upto(s, reach) for s in got if s is not None and len(s[0])]
        if found:
            for phase, v in split(ts, dur, spans).per_step.items():
                out[f"{phase}_ns"] = v.astype(np.float64)
        else:
            for p in PHASES:
                out[f"{p}_ns"] = np.full(n, np.nan)
        # Memory: each reading to the last step that ended at or before it.
        ends: I64 | None = None
        for name, column in MEMORY.items():
            col = np.full(n, np.nan)
            r = state.readings.get(name)
            if r is not None and len(r[0]):
                if ends is None:  # the held steps' ends in order (a run without readings sorts none)
                    ends_all = state.ts + state.dur
                    order = np.argsort(ends_all, kind="stable")
                    ends = ends_all[order]
                at = np.searchsorted(ends, r[0], side="right") - 1
                idx = np.where(at >= 0, order[np.maximum(at, 0)], -1)
                if state.first:
                    idx = np.where(at < 0, 0, idx)  # before the first step's end: step 0, as the report reads it
                mine = (idx >= 0) & (idx < n)
                col[idx[mine]] = r[1][mine]  # the last reading of a step wins
                keep = idx >= n if not flush else np.zeros(len(idx), bool)
                state.readings[name] = (r[0][keep], r[1][keep])
            out[column] = col
        # GPU times, by step number.
        for column in GPU.values():
            out[column] = np.full(n, np.nan)
        if state.gpu:
            for i, number in enumerate(out["step"].tolist()):
                g = state.gpu.pop(int(number), None)
                if g is not None:
                    for key, ms in g.items():
                        out[GPU[key]][i] = round(ms * 1e6)
            # Times of a step already written, or of none: left out, counted.
            held, written = set(state.number[n:].tolist()), int(out["step"].max())
            for number in [k for k in state.gpu if k <= written and k not in held]:
                state.gpu_late += 1
                del state.gpu[number]
        # Carry the rest: steps held back, spans and readings from the first of them on.
        state.ts, state.dur = state.ts[n:], state.dur[n:]
        state.number, state.epoch = state.number[n:], state.epoch[n:]
        state.first = False
        cut = int(state.ts[0]) if len(state.ts) else None
        for name, (sts, sdur) in list(state.spans.items()):
            if cut is None:
                del state.spans[name]
            else:
                k = sts >= cut
                state.spans[name] = (sts[k], sdur[k])
        return out


def _upto(s: tuple[I64, I64], reach: int) -> tuple[I64, Any]:
    """One name's (begins, ends) for :func:`~fastprof.reports.phases.split`:
    the spans (``s``: begins and durations, by begin) that begin by
    ``reach``, their ends a function of a slice."""
    k = int(np.searchsorted(s[0], reach, side="right"))
    b, d = s[0][:k], s[1][:k]
    return b, lambda i, j: b[i:j] + d[i:j]


def _sources(view: RunView) -> list[tuple[str, bool]]:
    """The files to read, in order, each with whether it is the last of its
    rank: every rank's own segments (workers' and torch windows' hold no step)
    in order, else the trace itself."""
    traces = _core.trace_inputs([str(view.location)])[0]
    per_rank: dict[int, list[tuple[int, str]]] = {}
    for path in traces:
        parts = path.replace("\\", "/").rsplit("/", 2)
        if len(parts) < 3:
            continue
        seg, rank_dir = SEGMENT.match(parts[2]), RANK_DIR.match(parts[1])
        if seg and rank_dir:
            per_rank.setdefault(int(rank_dir.group(1)), []).append((int(seg.group(1)), path))
    if not per_rank:
        return [(p, True) for p in traces]
    out: list[tuple[str, bool]] = []
    for rank in sorted(per_rank):
        files = [p for _, p in sorted(per_rank[rank])]
        out.extend((p, i == len(files) - 1) for i, p in enumerate(files))
    return out


@dataclass
class StepTable:
    """What :func:`step_batches` read: the warnings (salvaged files, GPU
    readings without their step) and the rows written."""

    warnings: list[str] = field(default_factory=list)
    rows: int = 0
    files: int = 0


def step_batches(run: str | os.PathLike[str], table: StepTable | None = None) -> Iterator[Batch]:
    """The step table of ``run`` (a run directory, a trace file, or a URL of
    either) in batches of numpy columns (:data:`COLUMNS`; a column that may be
    null is float64 with NaN for null), rank after rank, each in order of
    start. ``table`` collects the warnings and counts.

    Raises :class:`fastprof.FastprofFileNotFoundError` for a missing run,
    :class:`fastprof.TraceError` naming the file and byte offset for a file
    that is not a trace, and :class:`StepTableError` for a run without steps."""
    table = table if table is not None else StepTable()
    view = open_run(run, "run")
    view.must_exist("a run directory or a trace")
    sources = _sources(view)
    if not sources:
        raise StepTableError(f"{view.name}: no trace files found (expected a fastprof run directory or a trace file)")
    reader = _Reader()
    for path, last in sources:
        table.files += 1
        for batch in reader.read(path, last):
            table.rows += len(batch["step"])
            yield batch
    for batch in reader.finish():
        table.rows += len(batch["step"])
        yield batch
    table.warnings.extend(reader.warnings)
    if table.rows == 0:
        raise StepTableError(
            f"{view.name}: no fastprof step spans (the Profiler records one per step; a trace of a Recorder "
            "without a Profiler, or of torch.profiler alone, has none)"
        )


# ------------------------------------------------------------------ pyarrow


def schema() -> Any:
    """The table's pyarrow schema."""
    pa = optional("pyarrow")
    return pa.schema([pa.field(n, getattr(pa, t)(), nullable=null) for n, t, null in COLUMNS])


def to_arrow(batch: Batch) -> Any:
    """One batch as a pyarrow record batch of :func:`schema`."""
    pa = optional("pyarrow")
    arrays = []
    for name, kind, null in COLUMNS:
        v = batch[name]
        if null:
            missing = np.isnan(v)
            arrays.append(pa.array(np.where(missing, 0, v).astype(kind), mask=missing))
        else:
            arrays.append(pa.array(v.astype(kind, copy=False)))
    return pa.RecordBatch.from_arrays(arrays, schema=schema())


def write_parquet(
    run: str | os.PathLike[str], output: str | os.PathLike[str], table: StepTable | None = None
) -> StepTable:
    """Write the step table of ``run`` to the Parquet file ``output`` (a path
    or a URL), a row group at a time: memory is one segment's rows, never the
    run's. The file appears complete or not at all (a temporary name, renamed;
    a store's object is put once written)."""
    pq = optional("pyarrow.parquet")
    table = table if table is not None else StepTable()
    open_run(run, "run").must_exist("a run directory or a trace")  # before the output's folder is made
    dest = open_run(output, "output")
    local = dest.local_path
    folder = local.parent if local is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fastprof-export-", suffix=".parquet.tmp", dir=folder)
    os.close(fd)
    try:
        with pq.ParquetWriter(tmp, schema(), compression="zstd") as writer:
            held: list[Any] = []
            rows = 0
            for batch in step_batches(run, table):
                held.append(to_arrow(batch))
                rows += len(batch["step"])
                if rows >= ROW_GROUP:
                    writer.write_batch(_concat(held)) if len(held) > 1 else writer.write_batch(held[0])
                    held, rows = [], 0
            if held:
                writer.write_batch(_concat(held)) if len(held) > 1 else writer.write_batch(held[0])
        if local is not None:
            os.replace(tmp, local)
        else:
            dest.put(Path(tmp), "")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return table


def _concat(batches: list[Any]) -> Any:
    pa = optional("pyarrow")
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def load(run: str | os.PathLike[str], engine: str = "pandas") -> Any:
    """The step table of ``run`` (a run directory, a trace, or a URL of
    either) as a pandas DataFrame (``engine="pandas"``) or a polars one
    (``engine="polars"``), the same as ``fastprof export`` writes and
    ``pandas.read_parquet`` / ``polars.read_parquet`` read back. Needs
    pyarrow (``pip install 'fastprof-torch[parquet]'``), and pandas or
    polars for the frame. Warnings of the read (salvaged files) are
    :class:`fastprof.FastprofWarning`."""
    if engine not in ("pandas", "polars"):
        raise ConfigError(f"engine={engine!r}: expected 'pandas' or 'polars'")
    pa = optional("pyarrow")
    table = StepTable()
    batches = [to_arrow(b) for b in step_batches(run, table)]
    _warn(table)
    t = pa.Table.from_batches(batches, schema=schema())
    if engine == "polars":
        return optional("polars").from_arrow(t)
    optional("pandas")
    return t.to_pandas()


def _warn(table: StepTable) -> None:
    for line in table.warnings:
        warnings.warn(line, _core.FastprofWarning, stacklevel=3)
