"""A long run's report in bounded memory (issue #38, item 1): a rank whose
traces hold more than :data:`LONG_BYTES` of gzip is read in chunks
(``read_columns(..., chunk_rows=...)``), and the spans and counters every
step records (:data:`PASS_SPAN_SET`, :data:`PASS_COUNTERS`) are not kept as
rows: a step pass (:class:`StepPass`) keeps of them what the sections read,
~45 bytes a step where the rows took ~235:

- each step's start and duration (``data.step_spans``), its six phases by
  the anatomy's own rule (:func:`fastprof.reports.phases.split`, run on
  each batch of closed steps: the rule exists once) and the time the
  overlap rule gave from one phase to another, the train loader's time
  inside it, and whether it starts an epoch (the reader gives each step
  span's ``args.epoch`` with the rows);
- per (rank, name) the count, total, longest, and a quantile sketch of the
  durations (:class:`Sketch`: the time table's p50 and p95 within
  :data:`SKETCH_ERROR` of the exact value, said in the table);
- the train loader's wait counter as a count and a sum; each rank's first
  and last instant;
- the rows of the phases the straggler verdict compares ranks at
  (backward, communication, the gradients-ready mark), 16 bytes each.

A step is closed once its rank's reading is :data:`LAG_NS` past its end (a
span of another thread is written within a flush interval of its end); the
rows of closed steps are then dropped. Every other name is kept as rows, as
the report reads a run of any length. Which phase names count (fastprof's
``phase.*`` or the user's) is decided with what has been read so far of the
rank, as ``fastprof export`` decides it.
"""

from __future__ import annotations

import ctypes
import gzip
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fastprof import _core
from fastprof.readers.columns import Columns, read_columns
from fastprof.recording.names import (
    BACKWARD_GRADS_SPAN,
    LONG_RANK_BYTES,
    PHASE_SPANS,
    PHASES,
    RANK_DIR,
    STEP_COUNTER,
    STEP_SPAN,
    TRAIN_LOADER,
    TRAIN_NEXT,
    loader_wait,
)
from fastprof.reports.finite import counter_warnings
from fastprof.reports.phases import ALL_NAMES, PhaseSplit, chosen, split, sum_inside

I64 = npt.NDArray[np.int64]

#: A rank is read through the step pass above this much gzip of traces.
LONG_BYTES = LONG_RANK_BYTES
#: Rows per chunk of the reader.
CHUNK_ROWS = 1 << 18
#: How far past a step's end its rank's reading must be before it is closed.
LAG_NS = 5_000_000_000
#: The sketch's relative error on a quantile.
SKETCH_ERROR = 0.01
#: Steps closed at a time at most.
BATCH_STEPS = 1 << 16

#: The names whose rows the straggler verdict reads.
KEPT_SPANS = (PHASE_SPANS["backward"], PHASE_SPANS["communication"], BACKWARD_GRADS_SPAN)
#: The train loader's wait counter, read as a count and a sum.
WAIT_COUNTER = loader_wait(TRAIN_LOADER)
#: Counters read as a count and a sum only (fastprof.step: in no section).
PASS_COUNTERS = (WAIT_COUNTER, STEP_COUNTER)


#: Every span name the pass reads instead of rows: the steps, the train
#: loader's next(), the gradients-ready mark and every phase's names.
PASS_SPAN_SET = frozenset({STEP_SPAN, TRAIN_NEXT, BACKWARD_GRADS_SPAN, *ALL_NAMES})


class Sketch:
    """Durations (ns, >= 0) counted in log buckets of ratio
    ``(1 + e) / (1 - e)`` (``e`` = :data:`SKETCH_ERROR`): a quantile is
    within ``e`` of the exact one (relative); zeros counted apart. Mergeable,
    ~10 KB whatever the count."""

    def __init__(self) -> None:
        self.gamma = (1 + SKETCH_ERROR) / (1 - SKETCH_ERROR)
        self.log_gamma = math.log(self.gamma)
        self.zeros = 0
        self.lo = 0
        self.counts = np.zeros(0, np.int64)

    def add(self, values: npt.NDArray[Any]) -> None:
        v = np.asarray(values, dtype=np.float64)
        pos = v[v > 0]
        self.zeros += len(v) - len(pos)
        if not len(pos):
            return
        idx = np.ceil(np.log(pos) / self.log_gamma).astype(np.int64)
        lo, hi = int(idx.min()), int(idx.max())
        if not len(self.counts):
            self.lo = lo
            self.counts = np.zeros(hi - lo + 1, np.int64)
        new_lo, new_hi = min(lo, self.lo), max(hi, self.lo + len(self.counts) - 1)
        if new_lo != self.lo or new_hi != self.lo + len(self.counts) - 1:
            grown = np.zeros(new_hi - new_lo + 1, np.int64)
            grown[self.lo - new_lo : self.lo - new_lo + len(self.counts)] = self.counts
            self.lo, self.counts = new_lo, grown
        self.counts += np.bincount(idx - self.lo, minlength=len(self.counts))

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) by numpy's "linear" method (as the time
        table's exact one): the order statistics either side of ``q * (n -
        1)`` from their buckets, interpolated."""
        n = self.zeros + int(self.counts.sum())
        if not n:
            return math.nan
        pos = q * (n - 1)
        lo = math.floor(pos)
        a, b = self._order(lo), self._order(min(lo + 1, n - 1))
        return a + (b - a) * (pos - lo)

    def _order(self, k: int) -> float:
        """The ``k``-th smallest value (0-based), as its bucket's middle by
        relative error: ``2 g^i / (g + 1)``."""
        if k < self.zeros:
            return 0.0
        i = int(np.searchsorted(np.cumsum(self.counts), k - self.zeros, side="right"))
        return 2.0 * self.gamma ** (self.lo + i) / (self.gamma + 1.0)


@dataclass
class NameStats:
    """One span name's durations on one rank."""

    count: int = 0
    total: int = 0
    longest: int = 0
    sketch: Sketch = field(default_factory=Sketch)

    def add(self, dur: I64) -> None:
        if not len(dur):
            return
        self.count += len(dur)
        self.total += int(dur.sum())
        self.longest = max(self.longest, int(dur.max()))
        self.sketch.add(dur)


def _empty() -> I64:
    return np.zeros(0, np.int64)


@dataclass
class _Pending:
    """Rows not yet given to a closed step: ts, dur, the file they came from
    (and for steps their place among the step rows read)."""

    ts: I64 = field(default_factory=_empty)
    dur: I64 = field(default_factory=_empty)
    file: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    epoch: I64 = field(default_factory=_empty)

    def add(self, ts: I64, dur: I64, file: int, epoch: I64 | None = None) -> None:
        self.ts = np.concatenate([self.ts, ts])
        self.dur = np.concatenate([self.dur, dur])
        self.file = np.concatenate([self.file, np.full(len(ts), file, np.int32)])
        if epoch is not None:
            self.epoch = np.concatenate([self.epoch, epoch])

    def sort(self) -> None:
        if len(self.ts) > 1 and np.any(self.ts[1:] < self.ts[:-1]):
            o = np.argsort(self.ts, kind="stable")
            self.ts, self.dur, self.file = self.ts[o], self.dur[o], self.file[o]
            if len(self.epoch):
                self.epoch = self.epoch[o]

    def take(self, upto: int) -> tuple[I64, I64]:
        """The first ``upto`` rows out (ts, dur): copies, so that what is kept
        of them never holds the pending buffer (a view would keep all of it)."""
        ts, dur = self.ts[:upto].copy(), self.dur[:upto].copy()
        self.ts, self.dur, self.file = self.ts[upto:], self.dur[upto:], self.file[upto:]
        if len(self.epoch):
            self.epoch = self.epoch[upto:]
        return ts, dur

    def move(self, file: int, by: int) -> None:
        self.ts = np.where(self.file == file, self.ts + by, self.ts)


@dataclass
class _Rank:
    rank: int
    steps: _Pending = field(default_factory=_Pending)
    spans: dict[str, _Pending] = field(default_factory=dict)
    met: set[str] = field(default_factory=set)
    stats: dict[str, NameStats] = field(default_factory=dict)
    wait_count: int = 0
    wait_sum: float = 0.0
    #: The rank's first instant, and its latest end read so far (the
    #: reading's front: steps close :data:`LAG_NS` behind it).
    lo: int = np.iinfo(np.int64).max
    hi: int = np.iinfo(np.int64).min
    # Closed steps, batch by batch (joined by finish()).
    c_ts: list[I64] = field(default_factory=list)
    c_dur: list[I64] = field(default_factory=list)
    c_file: list[npt.NDArray[np.int32]] = field(default_factory=list)
    c_start: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    #: The epoch of the last step closed (None before the first).
    last_epoch: int | None = None
    c_phase: dict[str, list[npt.NDArray[Any]]] = field(default_factory=dict)
    c_given: dict[tuple[str, str], list[tuple[int, npt.NDArray[Any]]]] = field(default_factory=dict)
    c_loader: list[npt.NDArray[Any]] = field(default_factory=list)
    closed: int = 0
    kept: dict[str, list[tuple[I64, I64, npt.NDArray[np.int32]]]] = field(default_factory=dict)

    def has(self, names: tuple[str, ...]) -> bool:
        """Whether a span of one of ``names`` was read on the rank so far."""
        return any(x in self.met for x in names)


def _join(parts: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
    """The batches as one array, emptying ``parts`` and giving their memory
    back at once."""
    out = np.concatenate(parts) if parts else np.zeros(0, dtype)
    parts.clear()
    trim()
    return out


def _narrow(a: I64) -> npt.NDArray[Any]:
    """Non-negative int64 as uint32 where every value fits (4 bytes a step)."""
    if not len(a) or (int(a.min()) >= 0 and int(a.max()) < 2**32):
        return a.astype(np.uint32)
    return a


@dataclass
class RankSteps:
    """What the pass kept of one rank, its steps in order of start."""

    ts: I64
    dur: I64
    #: Each step: the first of an epoch (its ``args.epoch`` not the step's before; the first step).
    epoch_start: npt.NDArray[np.bool_]
    phases: dict[str, npt.NDArray[Any]] | None
    given: dict[tuple[str, str], I64]
    #: The train loader's time inside each step (uint32 where every value fits).
    loader: npt.NDArray[Any]
    has_loader: bool
    stats: dict[str, NameStats]
    wait_count: int
    wait_sum: float
    wall: tuple[int, int]
    kept: dict[str, tuple[I64, I64]]

    def split(self, skip: int = 0) -> PhaseSplit | None:
        """The anatomy's :class:`PhaseSplit` of the steps from ``skip`` (as
        ``anatomy.split_phases`` gives it for a run read whole)."""
        if self.phases is None or len(self.ts) <= skip:
            return None
        # Views (4 bytes a step where they fit): sums, percentiles and medians read them as they are.
        per_step = {p: v[skip:] for p, v in self.phases.items()}
        return PhaseSplit(self.dur[skip:], per_step, {k: v[skip:] for k, v in self.given.items()})


class StepPass:
    """Feeds on the reader's chunks; see the module's docstring."""

    def __init__(self, lag_ns: int = LAG_NS) -> None:
        self.lag_ns = lag_ns
        self.ranks: dict[int, _Rank] = {}

    # -- reading

    @staticmethod
    def luts(names: list[str]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Per name id: a pass span, a pass counter."""
        spans = np.array([n in PASS_SPAN_SET for n in names], bool)
        counters = np.array([n in PASS_COUNTERS for n in names], bool)
        return spans, counters

    def spans(self, names: list[str], sp: dict[str, Any], take: npt.NDArray[np.bool_], file: int) -> None:
        """The pass's span rows of a chunk (``take``)."""
        if not take.any():
            return
        name, ts, dur, rank = sp["name"][take], sp["ts"][take], sp["dur"][take], sp["rank"][take]
        epoch = sp["epoch"][take]
        step_id = names.index(STEP_SPAN) if STEP_SPAN in names else -1
        for r in np.unique(rank).tolist():
            st = self.ranks.setdefault(int(r), _Rank(int(r)))
            m = rank == r
            n_r, ts_r, dur_r = name[m], ts[m].astype(np.int64), dur[m].astype(np.int64)
            st.lo = min(st.lo, int(ts_r.min()))
            end = ts_r + dur_r
            st.hi = max(st.hi, int(end.max()))
            for nid in np.unique(n_r).tolist():
                k = n_r == nid
                nm = names[int(nid)]
                st.met.add(nm)
                st.stats.setdefault(nm, NameStats()).add(dur_r[k])
                if nid == step_id:
                    st.steps.add(ts_r[k], dur_r[k], file, epoch[m][k])
                    continue
                st.spans.setdefault(nm, _Pending()).add(ts_r[k], dur_r[k], file)
                if nm in KEPT_SPANS:
                    st.kept.setdefault(nm, []).append((ts_r[k], dur_r[k], np.full(int(k.sum()), file, np.int32)))

    def counters(self, names: list[str], ct: dict[str, Any], take: npt.NDArray[np.bool_]) -> None:
        if not take.any():
            return
        wait = names.index(WAIT_COUNTER) if WAIT_COUNTER in names else -1
        name, rank, ts, value = ct["name"][take], ct["rank"][take], ct["ts"][take], ct["value"][take]
        for r in np.unique(rank).tolist():
            st = self.ranks.setdefault(int(r), _Rank(int(r)))
            m = rank == r
            st.lo = min(st.lo, int(ts[m].min()))
            st.hi = max(st.hi, int(ts[m].max()))
            w = m & (name == wait)
            st.wait_count += int(w.sum())
            st.wait_sum += float(value[w].sum())

    def moved(self, file: int, by: int) -> None:
        """A file's earlier chunks were placed ``by`` ns too early."""
        if not by:
            return
        for st in self.ranks.values():
            st.steps.move(file, by)
            for p in st.spans.values():
                p.move(file, by)
            for i, (ts, f) in enumerate(zip(st.c_ts, st.c_file, strict=True)):
                st.c_ts[i] = np.where(f == file, ts + by, ts)
            for rows in st.kept.values():
                for j, (ts, dur, f) in enumerate(rows):
                    rows[j] = (np.where(f == file, ts + by, ts), dur, f)
            if np.any(st.steps.file == file) or any(np.any(f == file) for f in st.c_file):
                st.lo += by
                st.hi += by

    # -- closing steps

    def close(self, final: bool = False) -> None:
        for st in self.ranks.values():
            self._close(st, final)

    def _close(self, st: _Rank, final: bool) -> None:
        st.steps.sort()
        for p in st.spans.values():
            p.sort()
        while len(st.steps.ts):
            ends = st.steps.ts + st.steps.dur
            if final:
                k = len(ends)
            else:
                late = np.flatnonzero(ends > st.hi - self.lag_ns)
                k = int(late[0]) if len(late) else len(ends)
            k = min(k, BATCH_STEPS)
            if k == 0:
                return
            last_end = int(ends[:k].max())
            cut = int(st.steps.ts[k]) if k < len(ends) else last_end
            if final and k == len(ends):
                cut = np.iinfo(np.int64).max
            self._batch(st, k, cut)

    def _batch(self, st: _Rank, k: int, cut: int) -> None:
        f_step = st.steps.file[:k].copy()
        ep = st.steps.epoch[:k].copy()
        ts, dur = st.steps.take(k)
        first = st.last_epoch is None or int(ep[0]) != st.last_epoch
        st.c_start.append(np.concatenate([[first], ep[1:] != ep[:-1]]))
        st.last_epoch = int(ep[-1])
        rows: dict[str, tuple[I64, I64]] = {}
        for nm, p in st.spans.items():
            j = int(np.searchsorted(p.ts, cut, side="left"))
            rows[nm] = p.take(j)
        # Each phase's names by what was read so far of the rank (as the anatomy chooses them).
        use, _ = chosen(st.has)
        spans = {ph: [(rows[n][0], rows[n][0] + rows[n][1]) for n in names if n in rows] for ph, names in use.items()}
        got = split(ts, dur, spans)
        for ph, v in got.per_step.items():
            st.c_phase.setdefault(ph, []).append(_narrow(v))
        for pair, v in got.given.items():
            if v.any():
                st.c_given.setdefault(pair, []).append((st.closed, v))
        nxt = rows.get(TRAIN_NEXT)
        inside = sum_inside(nxt[0], nxt[1], ts, ts + dur) if nxt is not None else np.zeros(len(ts), np.int64)
        st.c_loader.append(_narrow(inside))
        st.c_ts.append(ts)
        st.c_dur.append(dur)
        st.c_file.append(f_step)
        st.closed += len(ts)

    def finish(self) -> dict[int, RankSteps]:
        self.close(final=True)
        out: dict[int, RankSteps] = {}
        for r, st in self.ranks.items():
            n = st.closed
            # Each column joined and its batches given back before the next
            # (the batches sit in the C heap: held twice, every column at once
            # took the run's figures twice, +480 MB at 10^7 steps).
            st.c_file = []
            ts = _join(st.c_ts, np.int64)
            dur = _join(st.c_dur, np.int64)
            starts = _join(st.c_start, np.bool_)
            _, found = chosen(st.has)
            phases = None
            if found and n:
                # Each phase joined and its batches dropped at once (never every phase twice).
                phases = {p: _join(st.c_phase[p], np.uint32) for p in PHASES}
            st.c_phase.clear()
            given: dict[tuple[str, str], I64] = {}
            for pair, parts in st.c_given.items():
                full = np.zeros(n, np.int64)
                for start, v in parts:
                    full[start : start + len(v)] = v
                given[pair] = full
            loader = _join(st.c_loader, np.uint32)
            kept = {}
            for nm, rows in st.kept.items():
                kts = np.concatenate([p[0] for p in rows])
                kdur = np.concatenate([p[1] for p in rows])
                o = np.argsort(kts, kind="stable")
                kept[nm] = (kts[o], kdur[o])
            out[r] = RankSteps(
                ts=ts,
                dur=dur,
                epoch_start=starts,
                phases=phases,
                given=given,
                loader=loader,
                has_loader=TRAIN_NEXT in st.met,
                stats=st.stats,
                wait_count=st.wait_count,
                wait_sum=st.wait_sum,
                wall=(st.lo, st.hi),
                kept=kept,
            )
        return out


def _trace_files(target: Any) -> list[str]:
    """The trace files of ``target`` (what the report reads: a run
    directory, a trace, a merged trace, a list of rank folders), as the
    reader finds them; none for a run in a store (read whole)."""
    paths = [str(t) for t in (target if isinstance(target, (list, tuple)) else [target])]
    return [] if any("://" in p for p in paths) else list(_core.trace_inputs(paths)[0])


def long_files(target: Any) -> list[str]:
    """The trace files of ``target`` where some rank's hold more than
    :data:`LONG_BYTES` (a rank folder's files together, a merged trace
    shared by the rank folders beside it), else none."""
    files = _trace_files(target)
    per: dict[str, int] = {}
    for f in files:
        p = Path(f)
        try:
            size = p.stat().st_size
        except OSError:
            continue
        if RANK_DIR.match(p.parent.name):
            key = str(p.parent)
        else:
            ranks = sum(1 for d in p.parent.iterdir() if d.is_dir() and RANK_DIR.match(d.name))
            key, size = str(p), size // max(ranks, 1)
        per[key] = per.get(key, 0) + size
    return files if any(v > LONG_BYTES for v in per.values()) else []


#: A recording's flush interval, as its head writes it (``fastprof_info``'s config).
_FLUSH = re.compile(rb'"flush_interval_s":\s*([0-9.eE+-]+)')
#: How much of a trace's head is looked at for it.
_HEAD_BYTES = 64 << 10


def lag_ns(target: Any, files: list[str] | None = None) -> int:
    """How long the pass keeps a step open: :data:`LAG_NS`, or three of the
    longest flush interval the traces' heads name where that is longer (a
    span of another thread is written within a flush of its end).
    ``files``: the target's trace files, when already found."""
    longest = 0.0
    for f in _trace_files(target) if files is None else files:
        try:
            with gzip.open(f, "rb") if f.endswith(".gz") else open(f, "rb") as fh:
                head = fh.read(_HEAD_BYTES)
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        for m in _FLUSH.finditer(head):
            try:
                longest = max(longest, float(m.group(1)))
            except ValueError:
                continue
    return max(LAG_NS, int(3 * longest * 1e9))


def read(target: Any, files: list[str], **opts: Any) -> tuple[Columns, dict[int, RankSteps]]:
    """``read_columns(target, **opts)`` in chunks: the rows of the names the
    step pass reads go to it, the others are the returned columns (as the
    whole read gives them), with what the pass kept of each rank.
    ``files``: the target's trace files (:func:`long_files`)."""
    sp = StepPass(lag_ns(target, files))
    blocks: dict[str, list[tuple[int, dict[str, Any]]]] = {"spans": [], "counters": []}
    empty: dict[str, dict[str, Any]] = {}
    luts: dict[int, tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]] = {}
    bad: list[dict[str, Any]] = []

    def on_chunk(ch: dict[str, Any]) -> None:
        names, file = ch["names"], int(ch["file"])
        if ch["last"] and ch["moved_ns"]:
            # Placed before the file said its clock offset: moved now, this chunk excepted.
            by = int(ch["moved_ns"])
            sp.moved(file, by)
            for kind in blocks:
                for f, b in blocks[kind]:
                    if f == file:
                        b["ts"] = b["ts"] + by
        if len(names) not in luts:
            luts[len(names)] = sp.luts(names)
        lut_s, lut_c = luts[len(names)]
        for kind, lut in (("spans", lut_s), ("counters", lut_c)):
            t = ch[kind]
            empty.setdefault(kind, {k: v[:0] for k, v in t.items() if k != "epoch"})
            take = lut[t["name"]] if len(t["name"]) else np.zeros(0, bool)
            if kind == "spans":
                sp.spans(names, t, take, file)
            else:
                sp.counters(names, t, take)
                # The pass's non-finite samples, for the report's warnings (the kept rows' are read with them).
                odd = take & ~np.isfinite(t["value"])
                if odd.any():
                    bad.append({k: v[odd] for k, v in t.items()})
            if len(take) and not take.all():
                blocks[kind].append((file, {k: v[~take] for k, v in t.items() if k != "epoch"}))
        sp.close()
        trim()

    got = read_columns(target, **opts, chunk_rows=CHUNK_ROWS, on_chunk=on_chunk, step_epochs=True)
    tables: dict[str, dict[str, Any]] = {}
    for kind in ("spans", "counters"):
        parts = [b for _, b in blocks[kind]]
        base = empty.get(kind) or getattr(got, kind)
        tables[kind] = {k: np.concatenate([p[k] for p in parts]) if parts else v for k, v in base.items()}
        blocks[kind] = []
    if bad:
        odd = Columns(
            spans={},
            instants={},
            counters={k: np.concatenate([b[k] for b in bad]) for k in bad[0]},
            names=got.names,
            categories=got.categories,
            files=got.files,
            warnings=[],
        )
        got.warnings.extend(counter_warnings(odd))
    cols = Columns(
        spans=tables["spans"],
        instants=got.instants,
        counters=tables["counters"],
        names=got.names,
        categories=got.categories,
        files=got.files,
        warnings=got.warnings,
        folded=got.folded,
        exact=dict.fromkeys(("spans", "instants", "counters"), True),
    )
    done = sp.finish()
    trim()
    return cols, done


def trim() -> None:
    """Give the C heap's free pages back to the system (glibc's
    ``malloc_trim``; nothing elsewhere). Each chunk's rows and the pass's
    batches come and go below the size glibc maps on its own, and the holes
    they leave kept the pages: at 10^6 steps the read held 231 MB of which
    97 MB were in use."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


def epoch_starts(long: dict[int, RankSteps]) -> dict[int, Any]:
    """rank -> a bool per step (in time order): the first step of an epoch,
    as ``anatomy.epoch_starts`` gives it for a run read whole (the reader
    gave each step span's ``args.epoch`` with the rows: no second pass)."""
    return {r: x.epoch_start for r, x in long.items() if len(x.ts)}
