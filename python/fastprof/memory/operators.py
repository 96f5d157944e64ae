"""Operators' memory and time from a finished torch.profiler window's structured data.

``operator_table(prof, top=20)`` reads ``prof.key_averages()`` field by field
(never the printed table, whose layout changes between torch releases) and
the window's raw ``[memory]`` records, which split each operator's net self
memory into the bytes it allocated and the bytes it freed. Field names differ
between torch versions (``self_device_*`` since 2.4, ``self_cuda_*`` before),
so every field is read with a fallback.
"""

from __future__ import annotations

import csv
import heapq
import io
import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fastprof.memory._files import write_atomic
from fastprof.memory._rows import MEMORY_EVENT, SHAPES_PER_ROW, OperatorRow
from fastprof.memory.operators_trace import trace_rows
from fastprof.recording.names import OPERATORS_JSON

SCHEMA = "fastprof.operators"
VERSION = 1

NO_MEMORY_NOTE = "memory not recorded: profile with profile_memory=True"
NO_SHAPES_NOTE = "input shapes not recorded: profile with record_shapes=True"
NO_SPLIT_NOTE = "allocated/freed bytes not available from this torch: only the net self memory is"

# Device types whose records count as CPU memory, as torch counts them.
_CPU_TYPES = ("CPU", "MKLDNN", "IDEEP")

RANKINGS = ("self_cpu_memory", "self_device_memory", "self_cpu_time", "self_device_time")


@dataclass
class OperatorTable:
    """What :func:`operator_table` returns: every operator, and the top ``top`` of each ranking.

    ``top`` maps a ranking (``self_cpu_memory``, ``self_cpu_time``, and
    ``self_device_memory`` / ``self_device_time`` when the window has any) to
    rows sorted by that figure, largest first (ties by name). ``notes`` says
    what the window lacked.
    """

    rows: list[OperatorRow]
    top: dict[str, list[OperatorRow]]
    limit: int
    memory_recorded: bool
    shapes_recorded: bool
    split_available: bool
    grouped_by_input_shape: bool
    notes: list[str] = field(default_factory=list)

    @property
    def note(self) -> str | None:
        """The notes as one line, or ``None``."""
        return "; ".join(self.notes) or None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: the rankings with their rows and the window's totals."""
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "units": {"memory": "bytes", "time": "us"},
            "top": self.limit,
            "memory_recorded": self.memory_recorded,
            "shapes_recorded": self.shapes_recorded,
            "allocated_freed_available": self.split_available,
            "grouped_by_input_shape": self.grouped_by_input_shape,
            "note": self.note,
            "operators": len(self.rows),
            "totals": self.totals(),
            "rankings": {k: [asdict(r) for r in v] for k, v in self.top.items()},
        }

    def totals(self) -> dict[str, Any]:
        """Sums over every operator's self figures (self figures do not double-count children)."""

        def total(attr: str) -> Any:
            vals = [getattr(r, attr) for r in self.rows]
            return None if any(v is None for v in vals) else sum(vals)

        keys = ("count", "self_cpu_memory", "self_device_memory", "cpu_allocated", "cpu_freed")
        out = {k: total(k) for k in keys}
        out.update(
            {k: total(k) for k in ("device_allocated", "device_freed", "self_cpu_time_us", "self_device_time_us")}
        )
        return out

    def csv_text(self) -> str:
        """One CSV row per (ranking, rank) pair: ``ranking,rank,<every OperatorRow field>``."""
        names = [f.name for f in fields(OperatorRow)]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["ranking", "rank", *names])
        for ranking, rows in self.top.items():
            for i, r in enumerate(rows, 1):
                d = asdict(r)
                if d["input_shapes"] is not None:
                    d["input_shapes"] = json.dumps(d["input_shapes"], separators=(",", ":"))
                w.writerow([ranking, i, *("" if d[n] is None else d[n] for n in names)])
        return buf.getvalue()

    def write(self, directory: str | Path) -> tuple[Path, Path]:
        """Write ``operators.json`` and ``operators.csv`` into ``directory`` (created if
        missing), each through a temporary name and a rename."""
        d = Path(directory)
        j = write_atomic(d / OPERATORS_JSON, json.dumps(self.to_dict(), indent=1) + "\n")
        c = write_atomic(d / "operators.csv", self.csv_text())
        return j, c


def operator_table(source: Any, top: int = 20, group_by_input_shape: bool = False) -> OperatorTable:
    """Top-``top`` operators of a window by self CPU memory, self device memory (when
    any), self CPU time and self device time (when any).

    ``source``: a finished ``torch.profiler.profile`` (read through
    ``key_averages()``), or the path of the Kineto trace it wrote
    (``*.pt.trace.json[.gz]``; see ``fastprof.memory.operators_trace``: the
    same figures but no device time).

    ``group_by_input_shape``: one row per (operator, input shapes), as
    ``key_averages(group_by_input_shape=True)``; needs ``record_shapes=True``.
    Raises ``ValueError`` for a window that has not run (no results yet) or a
    file that is not a trace (naming the file and the place), ``FileNotFoundError``
    for a missing one.
    """
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"operator_table: top must be an int >= 1, got {top!r}")
    if isinstance(source, (str, os.PathLike)):
        rows, memory, shapes, by_shape, notes = trace_rows(Path(source), group_by_input_shape)
        return _assemble(rows, top, memory, shapes, memory, by_shape, notes)
    if not hasattr(source, "key_averages"):
        raise TypeError(f"operator_table: expected a torch.profiler.profile, got {type(source).__name__}")
    inner = getattr(source, "profiler", source)  # torch.profiler.profile wraps the autograd profiler
    if inner is None or getattr(inner, "function_events", None) is None:
        raise ValueError("operator_table: the profiler window has no results (is it finished?)")

    memory = bool(getattr(source, "profile_memory", getattr(inner, "profile_memory", False)))
    shapes = bool(getattr(source, "record_shapes", getattr(inner, "record_shapes", False)))
    by_shape = group_by_input_shape and shapes
    averages = source.key_averages(group_by_input_shape=by_shape)
    events = list(source.events())
    split = _split_memory(inner, events, by_shape) if memory else None

    seen_shapes: dict[str, Counter[str]] = {}
    if shapes and not by_shape:
        for e in events:
            s = getattr(e, "input_shapes", None)
            if s:
                seen_shapes.setdefault(e.key, Counter())[json.dumps(s)] += 1

    rows = []
    for a in averages:
        key = _group_key(a.key, a.input_shapes if by_shape else None)
        alloc = split.get(key, (0, 0, 0, 0)) if split is not None else None
        if by_shape:
            row_shapes: Any = a.input_shapes or None
        elif a.key in seen_shapes:
            row_shapes = [
                {"shapes": json.loads(s), "count": n} for s, n in seen_shapes[a.key].most_common(SHAPES_PER_ROW)
            ]
        else:
            row_shapes = None
        rows.append(
            OperatorRow(
                name=a.key,
                count=int(a.count),
                self_cpu_memory=int(_field(a, "self_cpu_memory_usage")),
                cpu_memory=int(_field(a, "cpu_memory_usage")),
                self_device_memory=int(_field(a, "self_device_memory_usage", "self_cuda_memory_usage")),
                device_memory=int(_field(a, "device_memory_usage", "cuda_memory_usage")),
                cpu_allocated=None if alloc is None else alloc[0],
                cpu_freed=None if alloc is None else alloc[1],
                device_allocated=None if alloc is None else alloc[2],
                device_freed=None if alloc is None else alloc[3],
                self_cpu_time_us=float(_field(a, "self_cpu_time_total")),
                cpu_time_us=float(_field(a, "cpu_time_total")),
                self_device_time_us=float(_field(a, "self_device_time_total", "self_cuda_time_total")),
                device_time_us=float(_field(a, "device_time_total", "cuda_time_total")),
                input_shapes=row_shapes,
            )
        )

    return _assemble(rows, top, memory, shapes, split is not None, by_shape, [])


def _assemble(
    rows: list[OperatorRow],
    top: int,
    memory: bool,
    shapes: bool,
    split: bool,
    by_shape: bool,
    notes: list[str],
) -> OperatorTable:
    rankings = {"self_cpu_memory": rows, "self_cpu_time": rows}
    if any(r.self_device_memory or r.device_allocated for r in rows):
        rankings["self_device_memory"] = rows
    if any(r.self_device_time_us for r in rows):
        rankings["self_device_time"] = rows
    ranked = {k: _top(v, k, top) for k, v in sorted(rankings.items(), key=lambda kv: RANKINGS.index(kv[0]))}

    notes = list(notes)
    if not memory:
        notes.insert(0, NO_MEMORY_NOTE)
    elif not split:
        notes.append(NO_SPLIT_NOTE)
    if not shapes:
        notes.append(NO_SHAPES_NOTE)
    return OperatorTable(
        rows=rows,
        top=ranked,
        limit=top,
        memory_recorded=memory,
        shapes_recorded=shapes,
        split_available=split,
        grouped_by_input_shape=by_shape,
        notes=notes,
    )


def _field(obj: Any, *names: str) -> Any:
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return 0


def _group_key(name: str, shapes: Any) -> tuple[str, str]:
    return (name, "" if shapes is None else json.dumps(shapes))


def _top(rows: list[OperatorRow], ranking: str, n: int) -> list[OperatorRow]:
    attr = {"self_cpu_time": "self_cpu_time_us", "self_device_time": "self_device_time_us"}.get(ranking, ranking)
    return sorted(rows, key=lambda r: (-getattr(r, attr), r.name, json.dumps(r.input_shapes)))[:n]


def _split_memory(
    inner: Any, events: Iterable[Any], by_shape: bool
) -> dict[tuple[str, str], tuple[int, int, int, int]] | None:
    """Allocated and freed bytes (CPU, device) per operator key, from the window's raw records.

    Each ``[memory]`` record goes to the innermost CPU operator whose span
    holds its time (the one that began last among those still open), which is
    where torch's self memory puts it: an operator's total counts every record
    in its span and its self figure subtracts its children's. Records no
    operator holds stay under ``[memory]``, as in ``key_averages()``. ``None``
    when this torch does not expose the records (``kineto_results``).
    """
    results = getattr(inner, "kineto_results", None)
    try:
        raw = list(results.events()) if results is not None else None
        base = results.trace_start_ns() if results is not None else None
    except (AttributeError, TypeError, RuntimeError):  # a torch without these accessors: say so, do not guess
        return None
    if raw is None or base is None:
        return None
    records = []
    for r in raw:
        if r.name() == MEMORY_EVENT:
            # The same µs float torch builds FunctionEvent times from, so comparisons agree with its own.
            records.append(((r.start_ns() - base) / 1000, int(r.nbytes()), _device_name(r.device_type()) in _CPU_TYPES))
    records.sort(key=lambda x: x[0])

    ops = []
    for e in events:
        if e.name == MEMORY_EVENT or _device_name(getattr(e, "device_type", None)) != "CPU":
            continue
        tr = e.time_range
        ops.append((tr.start, tr.end, _group_key(e.key, e.input_shapes if by_shape else None)))
    ops.sort(key=lambda x: x[0])

    out: dict[tuple[str, str], list[int]] = {}
    unheld = _group_key(MEMORY_EVENT, [] if by_shape else None)
    open_ops: list[tuple[float, float, int, tuple[str, str]]] = []  # max-heap on start
    i = 0
    for t, nbytes, is_cpu in records:
        while i < len(ops) and ops[i][0] <= t:
            s, end, key = ops[i]
            heapq.heappush(open_ops, (-s, end, i, key))
            i += 1
        # An op that ended before t ended before every later record too.
        while open_ops and open_ops[0][1] < t:
            heapq.heappop(open_ops)
        key = open_ops[0][3] if open_ops else unheld
        acc = out.setdefault(key, [0, 0, 0, 0])
        slot = 0 if is_cpu else 2
        if nbytes >= 0:
            acc[slot] += nbytes
        else:
            acc[slot + 1] -= nbytes
    return {k: (v[0], v[1], v[2], v[3]) for k, v in out.items()}


def _device_name(dt: Any) -> str:
    return str(getattr(dt, "name", dt)).rsplit(".", 1)[-1]
