"""Each rank summarises itself (issue #38, item 2).

At the end of a run every rank writes ``rank{R}/summary.fastprof``
(:data:`fastprof.recording.names.RANK_SUMMARY_JSON`): the report of that
rank alone, made by the report's own code from the rank's own segments
(:mod:`fastprof.reports.rank_summary`, run by the rank's driver in a
process of its own at the end of the run), and the few columns the sections that compare ranks
read (each step's start and duration, the train loader's waits, the
backward and communication phases, the batch-size and loader counters),
packed as zlib-compressed numpy arrays. The job's ranks are the distributed
engine: a report of N ranks combines N summaries (:func:`combine`) and
reads no trace.

A run's summaries are used only when every rank folder has one and each is
this run's: its format and fastprof version are this reader's, its rank is
its folder's, and the segments it was made from are the rank's segments now
(the same names and sizes: a run resumed or appended to since, or a rank
cut short before it wrote one, is read from its segments as before).

What a report from summaries gives differently (docs/reports.md):

- ``source.inputs`` lists the summaries (kind ``"summary"``), not the traces;
- the per-rank sections are each rank's own clock's, not the merge's
  clock-aligned timeline (durations are the same; a rank's times relative to
  the run's start, e.g. rotated segments' ``*_s``, may differ by the
  ranks' clock offsets, which the merge aligns and each rank alone does not);
- ``breakdown.csv`` (one row per step and rank) is each rank's rows, as the
  core's pass over the rank's segments wrote them at its end, one rank after
  the other (the same bytes as the report of the segments writes), and the
  page's breakdown bars are each rank's (:func:`breakdown_kept`,
  :func:`breakdown_of`); the torch windows' operator tables are read from
  their traces;
- the page (report.html) reads the segments of the first
  :data:`DETAIL_RANKS` ranks for its detail (spans within steps, counters,
  operators); its per-step figures of every rank come from the summaries,
  and so do its counter plots' series of the other ranks (each kept at most
  :data:`PAGE_POINTS` points, :func:`page_counters`): above
  ``many.MANY_RANKS`` ranks the bands across the ranks count every rank.
"""

from __future__ import annotations

import base64
import gc
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fastprof._core import __version__
from fastprof.readers.columns import Columns
from fastprof.recording.names import (
    BACKWARD_GRADS_SPAN,
    PHASE_SPANS,
    PROFILER_JSON,
    RANK_DIR,
    RANK_SUMMARY_JSON,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    STEP_SPAN,
    TRAIN_NEXT,
    loader_batch_size,
    loader_iter,
    loader_next,
    loader_of_next,
    loader_wait,
)
from fastprof.reports import counter_plots
from fastprof.reports import data as _data
from fastprof.reports.breakdown import Breakdown, steps_from
from fastprof.reports.hangs import hangs_report
from fastprof.reports.memory import _operators as memory_operators
from fastprof.reports.ranks import ranks_report
from fastprof.reports.recommendations import recommend
from fastprof.reports.speed import speed_report
from fastprof.reports.stragglers import straggler_section

__all__ = [
    "DETAIL_RANKS",
    "FORMAT",
    "VERSION",
    "account_kept",
    "breakdown_kept",
    "breakdown_of",
    "columns_kept",
    "combine",
    "names_of",
    "pack",
    "page_counters",
    "read_all",
    "segments_of",
    "with_detail",
    "write",
]

FORMAT = "fastprof.rank_summary"
#: 2: each rank's part of breakdown.csv and of the page's bars (#38).
VERSION = 2
#: The step spans torch writes, read under one name (``data.load``).
_TORCH_STEPS = "ProfilerStep#*"
#: The counters the cross-rank sections read, besides the loaders' own.
_COUNTERS = ("batch_size",)
#: The phases the straggler verdict compares ranks at.
_PHASES = ("backward", "communication")


def columns_kept(names: list[str]) -> tuple[set[str], set[str]]:
    """The span and counter names a summary keeps rows of (what
    :func:`combine`'s cross-rank sections read), among ``names``."""
    loaders = sorted(loader for n in names if (loader := loader_of_next(n)) is not None)
    spans = {STEP_SPAN, _TORCH_STEPS, TRAIN_NEXT, BACKWARD_GRADS_SPAN, *(PHASE_SPANS[p] for p in _PHASES)}
    spans.update(f(x) for x in loaders for f in (loader_next, loader_iter))
    counters = {*_COUNTERS, *(f(x) for x in loaders for f in (loader_wait, loader_batch_size))}
    return spans, counters


def account_kept(account: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a rank's summary keeps of its ``profiler.json`` account: all of
    it but its triggers' slow steps (``triggers.anomalies``, up to 200
    records a rank), which the summary's report holds already in the
    report's form (``report.triggers.per_rank[0].anomalies``), and nothing
    read from summaries reads again. Written twice, they were a third of a
    trigger-heavy summary (93 of 267 KB) and of a 1,024-rank report's time
    spent parsing summaries."""
    if not isinstance(account, dict) or not isinstance(account.get("triggers"), dict):
        return account
    triggers = {k: v for k, v in account["triggers"].items() if k != "anomalies"}
    return {**account, "triggers": triggers}


def pack(a: npt.NDArray[Any]) -> dict[str, Any]:
    """An array as ``{"dtype", "n", "z"}``: int64 columns by their step-over-
    step differences (a start column is nearly regular), zlib, base64."""
    if a.dtype.kind in "iu":
        v = np.diff(a.astype("<i8"), prepend=np.int64(0))
        kind = "i8d"
    else:
        v = a.astype("<f8")
        kind = "f8"
    return {"dtype": kind, "n": len(a), "z": base64.b64encode(zlib.compress(v.tobytes(), 6)).decode("ascii")}


def _unpack(p: dict[str, Any]) -> npt.NDArray[Any]:
    raw = zlib.decompress(base64.b64decode(p["z"]))
    if p["dtype"] == "i8d":
        return np.cumsum(np.frombuffer(raw, "<i8"), dtype=np.int64)
    return np.frombuffer(raw, "<f8").astype(np.float64)


def breakdown_kept(b: Breakdown, csv: Path) -> dict[str, Any]:
    """What a rank's summary keeps of its step-time breakdown ``b`` (made
    with its rows written to ``csv``, as a report writes breakdown.csv):
    the file's header and the rank's rows (zlib, base64: ~15 bytes a step),
    the per-rank summaries, the page's bars (packed) and the step count."""
    text = csv.read_bytes() if csv.is_file() else b""
    head, _, body = text.partition(b"\n")
    return {
        "header": head.decode(),
        "rows": base64.b64encode(zlib.compress(body, 6)).decode("ascii"),
        "summaries": list(b.summaries),
        "bars": [{k: pack(v) if isinstance(v, np.ndarray) else v for k, v in bars.items()} for bars in b.bars],
        "step_count": int(b.step_count),
        "kernel_wait_ns": int(b.kernel_wait_ns),
    }


class _PackedBars(Mapping[str, Any]):
    """One rank's bars as its summary keeps them, each array unpacked when
    read (a page draws a few ranks' bars, not 1,024)."""

    def __init__(self, packed: dict[str, Any]) -> None:
        self._packed = packed

    def __getitem__(self, key: str) -> Any:
        v = self._packed[key]
        return _unpack(v) if isinstance(v, dict) else v

    def __iter__(self) -> Iterator[str]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)


def breakdown_of(sums: list[dict[str, Any]], csv: Path | None) -> Breakdown:
    """The run's step-time breakdown from its ranks' summaries, as the
    core's pass over the traces gives it (per-rank summaries, bars, step
    count; no rows kept), and, with ``csv``, breakdown.csv written there:
    the header and every rank's rows in rank order, the bytes the report of
    the segments writes (none without steps)."""
    parts = [s["breakdown"] for s in sums]
    steps = sum(int(p["step_count"]) for p in parts)
    if csv is not None and steps:
        with open(csv, "wb") as f:
            f.write(next(p["header"] for p in parts if p["step_count"]).encode() + b"\n")
            for p in parts:
                f.write(zlib.decompress(base64.b64decode(p["rows"])))
    return Breakdown(
        steps={},
        devices={},
        files=[],
        warnings=[],
        kernel_wait_ns=int(parts[0]["kernel_wait_ns"]),
        summaries=[x for p in parts for x in p["summaries"]],
        bars=[_PackedBars(b) for p in parts for b in p["bars"]],  # type: ignore[misc]
        step_count=steps,
        csv_path=csv if csv is not None and steps else None,
    )


#: Points a summary keeps of each counter the page plots: a longer series
#: is kept as the means of this many equal slices of its time (the page's
#: bands across ranks are at most ``html_ranks.BAND_POINTS`` points).
PAGE_POINTS = 1000


def page_counters(data: _data.RunData, rank: int) -> dict[str, dict[str, Any]]:
    """The series of ``rank`` that the page's counter plots draw
    (:data:`~fastprof.reports.counter_plots.COUNTER_PLOTS`), each at most
    :data:`PAGE_POINTS` points (ts, value; packed)."""
    out = {}
    for name in counter_plots.plotted(data.counter_names()):
        ts, v = data.counter(name, rank)
        if not len(ts):
            continue
        if len(ts) > PAGE_POINTS:
            # Equal slices of the series' own time; each kept slice's mean
            # instant and value (the same slices for series on one tick).
            b = (ts - ts[0]).astype(np.float64) * PAGE_POINTS // (float(ts[-1] - ts[0]) + 1.0)
            cut = np.flatnonzero(np.diff(b)) + 1
            starts = np.concatenate(([0], cut))
            n = np.diff(np.concatenate((starts, [len(ts)])))
            ts = np.round(np.add.reduceat(ts.astype(np.float64), starts) / n).astype(np.int64)
            v = np.add.reduceat(v.astype(np.float64), starts) / n
        out[name] = {"ts": pack(ts), "value": pack(v)}
    return out


def segments_of(rank_dir: Path) -> dict[str, int]:
    """The rank's segment files and their sizes: what a summary was made from."""
    out = {}
    for p in sorted(rank_dir.iterdir()):
        if p.name.startswith(SEGMENT_PREFIX) and p.name.endswith(SEGMENT_SUFFIX) and p.is_file():
            out[p.name] = p.stat().st_size
    return out


def names_of(c: Columns, ids: npt.NDArray[Any]) -> list[list[Any]]:
    """Run-length names of rows sorted by name: ``[[name, count], ...]``."""
    if not len(ids):
        return []
    cut = np.flatnonzero(np.diff(ids)) + 1
    starts = np.concatenate(([0], cut))
    counts = np.diff(np.concatenate((starts, [len(ids)])))
    return [[c.names[int(ids[s])], int(k)] for s, k in zip(starts, counts, strict=True)]


def write(rank_dir: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` as ``rank_dir/summary.fastprof`` (under a temporary name,
    then renamed: a reader never sees half of one)."""
    out = rank_dir / RANK_SUMMARY_JSON
    tmp = rank_dir / f".{RANK_SUMMARY_JSON}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(doc, separators=(",", ":"), allow_nan=True, default=str))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def read_all(run_dir: Path) -> tuple[list[dict[str, Any]] | None, str]:
    """Every rank's summary of the local run ``run_dir``, by rank, or None
    and why they cannot stand for its segments."""
    ranks = sorted(
        (int(m.group(1)), p) for p in run_dir.iterdir() if (m := RANK_DIR.match(p.name)) is not None and p.is_dir()
    )
    if not ranks:
        return None, "no rank folders"
    out = []
    # The cyclic collector is paused while the summaries are parsed: JSON
    # makes no cycle, and the collections the millions of new containers
    # set off each walked every summary read before (~0.3 s of 1,024
    # summaries of ~250 KB).
    collecting = gc.isenabled()
    gc.disable()
    try:
        for rank, rank_dir in ranks:
            path = rank_dir / RANK_SUMMARY_JSON
            try:
                doc = json.loads(path.read_bytes())
            except FileNotFoundError:
                return None, f"rank {rank} wrote no {RANK_SUMMARY_JSON}"
            except (OSError, ValueError) as e:
                return None, f"{path}: unreadable ({e})"
            why = _stale(doc, rank, rank_dir)
            if why is not None:
                return None, f"{path}: {why}"
            out.append(doc)
    finally:
        if collecting:
            gc.enable()
    return out, ""


def _stale(doc: Any, rank: int, rank_dir: Path) -> str | None:
    """Why ``doc`` is not this rank's summary of its segments now (None: it is)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return "not a rank summary of this format"
    if doc.get("fastprof_version") != __version__:
        return f"written by fastprof {doc.get('fastprof_version')}, not {__version__}"
    if doc.get("rank") != rank:
        return f"of rank {doc.get('rank')}, in rank{rank}/"
    if doc.get("segments") != segments_of(rank_dir):
        return "its rank's segments changed since it was written"
    try:
        named = _member((rank_dir / PROFILER_JSON).read_text(), "run_name")
    except (OSError, ValueError):
        named = None
    if named is not None and named[0] != doc.get("run_name"):
        return f"of run {doc.get('run_name')!r}, not {named[0]!r}"
    return None


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace: matches at any index


def _skip(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]


def _member(text: str, key: str) -> tuple[Any] | None:
    """``(value,)`` of the member ``key`` of the JSON object ``text``, read
    member by member up to it (None: not an object; ``(None,)``: no such
    member); ValueError where what was read up to it is not JSON. A rank's
    profiler.json holds its triggers' whole account (~100 KB beside a CPU
    hog), all of it parsed for its second member took 1.4 s of a 1,024-rank
    report (issue #38)."""
    at = _skip(text, 0)
    if text[at : at + 1] != "{":
        return None
    at = _skip(text, at + 1)
    if text[at : at + 1] == "}":
        return (None,)
    while True:
        if text[at : at + 1] != '"':
            raise ValueError(f"expected a member's name at {at}")
        name, at = _DECODER.parse_string(text, at + 1, True)  # type: ignore[attr-defined]
        at = _skip(text, at)
        if text[at : at + 1] != ":":
            raise ValueError(f"expected ':' at {at}")
        value, at = _DECODER.raw_decode(text, _skip(text, at + 1))
        if name == key:
            return (value,)
        at = _skip(text, at)
        if text[at : at + 1] == "}":
            return (None,)
        if text[at : at + 1] != ",":
            raise ValueError(f"expected ',' or '}}' at {at}")
        at = _skip(text, at + 1)


def _light_data(run: Any, sums: list[dict[str, Any]]) -> _data.RunData:
    """A :class:`~fastprof.reports.data.RunData` holding the summaries' kept
    columns: what the cross-rank sections read, as if from the traces."""
    names: list[str] = []
    ids: dict[str, int] = {}

    def table(part: str, cols: tuple[str, str]) -> dict[str, npt.NDArray[Any]]:
        # Each column allocated once at its final length and filled rank by
        # rank (a concatenation held every part and the whole at once).
        total = sum(int(s[part][cols[0]]["n"]) for s in sums)
        out: dict[str, npt.NDArray[Any]] = {
            "name": np.empty(total, np.uint32),
            "rank": np.empty(total, np.int32),
            cols[0]: np.empty(total, np.int64),
            cols[1]: np.empty(total, np.int64 if cols[1] == "dur" else np.float64),
        }
        at = 0
        for s in sums:
            t = s[part]
            run_names = [n for n, _ in t["names"]]
            counts = np.asarray([k for _, k in t["names"]], dtype=np.int64)
            for n in run_names:
                ids.setdefault(n, len(ids))
                if ids[n] == len(names):
                    names.append(n)
            end = at + int(t[cols[0]]["n"])
            out["name"][at:end] = np.repeat(np.asarray([ids[n] for n in run_names], np.uint32), counts)
            out["rank"][at:end] = int(s["rank"])
            out[cols[0]][at:end] = _unpack(t[cols[0]])
            out[cols[1]][at:end] = _unpack(t[cols[1]])
            at = end
        return out

    spans = table("spans", ("ts", "dur"))
    n = len(spans["ts"])
    spans.update(cat=np.zeros(n, np.uint32), pid=np.zeros(n, np.int32), tid=np.zeros(n, np.int32))
    counters = table("counters", ("ts", "value"))
    counters["series"] = counters["name"].copy()
    cols = Columns(
        spans=spans,
        instants={},
        counters=counters,
        names=names,
        categories=[""],
        files=[],
        warnings=[],
    )
    data = _data.RunData(path=Path(run.name), run_dir=run.folder, cols=cols, run=run)
    for s in sums:  # each rank's account, as the report of its segments reads it
        account = s.get("profiler")
        if isinstance(account, dict):
            data.profiler[int(s["rank"])] = account
    data._ranks = [int(s["rank"]) for s in sums]
    w = [s["wall"] for s in sums]
    data._walls[None] = (min(int(a) for a, _ in w), max(int(b) for _, b in w))
    for s, (a, b) in zip(sums, w, strict=True):
        data._walls[int(s["rank"])] = (int(a), int(b))
    return data


#: Ranks whose segments a report from summaries reads for its page's
#: detail (the first ones: each rank's spans over its steps, its counters,
#: its torch windows' operators); the page's per-step figures of every rank
#: come from the summaries' columns.
DETAIL_RANKS = 8


class _PageData(_data.RunData):
    """The page's data of a run of many ranks from summaries: the ranks read
    in detail as their segments hold them, and the other ranks' counters the
    page plots as their summaries keep them (:func:`page_counters`)."""

    #: rank -> counter name -> packed ts and value, of the ranks not in detail.
    page: dict[int, dict[str, dict[str, Any]]]

    def counter(self, name: str, rank: int) -> tuple[_data.I64, _data.F64]:
        kept = self.page.get(rank, {}).get(name)
        if kept is None:
            return super().counter(name, rank)
        return _unpack(kept["ts"]).astype(np.int64), _unpack(kept["value"]).astype(np.float64)

    def counter_names(self) -> list[str]:
        have = super().counter_names()
        more = sorted({n for kept in self.page.values() for n in kept} - set(have))
        return have + more


def with_detail(light: _data.RunData, detail: _data.RunData, sums: list[dict[str, Any]] | None = None) -> _data.RunData:
    """``light`` (:func:`combine`'s data) with every column of the ranks
    ``detail`` read from their segments in place of their kept rows, and
    with ``sums`` (the summaries) the other ranks' counters the page plots."""
    names = list(light.cols.names)
    ids = {n: i for i, n in enumerate(names)}
    for n in detail.cols.names:
        if n not in ids:
            ids[n] = len(names)
            names.append(n)
    name_map = np.asarray([ids[n] for n in detail.cols.names], dtype=np.uint32)
    cats = list(detail.cols.categories)
    if "" not in cats:
        cats.append("")
    light_cat = cats.index("")
    mine = np.asarray(detail.ranks, dtype=np.int64)

    def joined(a: dict[str, npt.NDArray[Any]], b: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        keep = ~np.isin(a["rank"], mine)
        out = {}
        for key in a.keys() & b.keys():
            x, y = a[key][keep], b[key]
            if key in ("name", "series"):
                y = name_map[y]
            elif key == "cat":
                x = np.full(len(x), light_cat, np.uint32)
            dtype = np.result_type(x.dtype, y.dtype)
            out[key] = np.concatenate((x.astype(dtype, copy=False), y.astype(dtype, copy=False)))
        return out

    folded = dict(detail.cols.folded)
    if len(folded.get("name", ())):
        folded["name"] = name_map[folded["name"]]
    cols = Columns(
        spans=joined(light.cols.spans, detail.cols.spans),
        instants={},
        counters=joined(light.cols.counters, detail.cols.counters),
        names=names,
        categories=cats,
        files=list(detail.cols.files),
        warnings=light.cols.warnings,
        folded=folded,
    )
    data = _PageData(path=light.path, run_dir=light.run_dir, cols=cols, run=light.run)
    shown = set(detail.ranks)
    data.page = {int(s["rank"]): s.get("page_counters") or {} for s in sums or [] if int(s["rank"]) not in shown}
    data.profiler = {**light.profiler, **detail.profiler}
    data.other, data.worker_other = detail.other, detail.worker_other
    data.oom, data.model_summary = detail.oom, detail.model_summary
    data.operator_table, data.operator_tables = light.operator_table, light.operator_tables
    data._ranks = light.ranks
    data._walls = dict(light._walls)
    return data


def _concat(docs: Iterable[dict[str, Any] | None], key: str, ranks: list[int] | None = None) -> list[Any]:
    """The ``key`` lists of ``docs``, one after the other; with ``ranks``
    (one per doc), of each doc only its rank's entries (a rank's own report
    reads some run-wide side documents, every rank's ``triggers.json``)."""
    if ranks is None:
        return [x for d in docs if d for x in d.get(key) or []]
    return [x for d, r in zip(docs, ranks, strict=True) if d for x in d.get(key) or [] if x.get("rank") == r]


def combine(run: Any, sums: list[dict[str, Any]]) -> tuple[dict[str, Any], _data.RunData]:
    """The report document of the run from its ranks' summaries, and the
    light data it was made from (for the page)."""
    docs = [s["report"] for s in sums]
    data = _light_data(run, sums)
    for d in docs:
        data.cols.warnings.extend(d["source"]["warnings"])
    first = docs[0]
    speed = speed_report(data, None, None)
    warm = int(speed["warmup"]["steps_excluded"])
    w0, w1 = data.wall()
    system = dict(first["system"])
    system["duration_s"] = (w1 - w0) / 1e9
    for key in ("host", "overhead"):
        system[key] = _concat((d["system"] for d in docs), key)
    gpus = [d["system"]["gpu"] for d in docs]
    system["gpu"] = next((g for g in gpus if g.get("available")), gpus[0]) | {"devices": _concat(gpus, "devices")}
    ranks = ranks_report(data, warm)
    breakdown = _breakdown(docs)
    memory = _first_with(docs, "memory")
    if memory is not None:
        memory = dict(memory)
        memory["per_rank"] = _concat((d["memory"] for d in docs), "per_rank")
        memory["oom"] = _concat((d["memory"] for d in docs), "oom")
        memory["model"] = next((d["memory"]["model"] for d in docs if d["memory"] and d["memory"]["model"]), None)
        # The torch windows' operator tables are shared out across the ranks'
        # windows (MAX_OPERATOR_WINDOWS): read here, from every rank's account.
        memory["operators"] = memory_operators(data)
    anatomy = _first_with(docs, "anatomy")
    if anatomy is not None:
        per_rank = _concat((d["anatomy"] for d in docs), "per_rank")
        warm_a = min(int(a["warmup_steps_excluded"]) for a in per_rank)
        anatomy = {**anatomy, "per_rank": per_rank, **straggler_section(data, per_rank, warm_a)}
    triggers = _first_with(docs, "triggers")
    if triggers is not None:
        own = [int(s["rank"]) for s in sums]
        triggers = {**triggers, "per_rank": _concat((d["triggers"] for d in docs), "per_rank", own)}
    if breakdown is not None:
        breakdown["steps_from"] = steps_from(breakdown, triggers)
    time = dict(first["time"])
    time["rows"] = _concat((d["time"] for d in docs), "rows")
    recs = recommend(speed, system, breakdown, memory, anatomy)
    run_dir = Path(run.folder)
    doc = {
        "schema": first["schema"],
        "schema_version": first["schema_version"],
        "fastprof_version": __version__,
        "source": {
            "path": run.name,
            "run_dir": run.run_dir_name,
            "inputs": [
                {"path": str(run_dir / f"rank{s['rank']}" / RANK_SUMMARY_JSON), "kind": "summary", "rank": s["rank"]}
                for s in sums
            ],
            "ranks": data.ranks,
            "warnings": list(data.cols.warnings),
            "rotated": _concat((d["source"] for d in docs), "rotated"),
            "resumed": _concat((d["source"] for d in docs), "resumed"),
        },
        "wall": {"start_ns": w0, "end_ns": w1, "duration_s": (w1 - w0) / 1e9},
        "time": time,
        "speed": speed,
        "system": system,
        "ranks": ranks,
        "breakdown": breakdown,
        "breakdown_reason": None if breakdown is not None else first["breakdown_reason"],
        "memory": memory,
        "memory_reason": None if memory is not None else first["memory_reason"],
        "anatomy": anatomy,
        "anatomy_reason": None if anatomy is not None else first["anatomy_reason"],
        "triggers": triggers,
        "hangs": hangs_report(data),
        "recommendations": recs,
    }
    return doc, data


def _first_with(docs: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((d[key] for d in docs if d.get(key) is not None), None)


def _breakdown(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    parts = [d["breakdown"] for d in docs if d.get("breakdown") is not None]
    if not parts:
        return None
    out = dict(parts[0])
    out["per_rank"] = _concat(parts, "per_rank")
    out["step_count"] = sum(int(p["step_count"]) for p in parts)
    out["gpu_activity"] = any(bool(p["gpu_activity"]) for p in parts)
    return out
