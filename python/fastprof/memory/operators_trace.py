"""Operator rows from a Kineto trace file (``*.pt.trace.json[.gz]``), for windows whose
profiler object is gone.

The figures are built the way ``key_averages()`` builds them from the same
window: ``cpu_op`` and ``user_annotation`` spans are the operators; a span's
self time is its duration less its direct children's on the same thread; each
``[memory]`` instant (``args.Bytes``, written with ``profile_memory=True``)
counts in every span whose interval holds it (``cpu_memory``) and, as self
memory, in the innermost one. Times are read as exact decimals and compared
in integer ns, so a record on a span's edge falls where torch put it.

The columnar reader (``fastprof.read_columns``) keeps no instant args, and
``Bytes`` lives there, so this reads the JSON; one window's trace is small
next to a run's, and the walk is linear after a sort.
"""

from __future__ import annotations

import bisect
import gzip
import heapq
import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

from fastprof.memory._rows import MEMORY_EVENT, SHAPES_PER_ROW, OperatorRow

_SPAN_CATS = ("cpu_op", "user_annotation")
# c10::DeviceType values torch counts as CPU memory: CPU, MKLDNN, IDEEP.
_CPU_DEVICE_TYPES = (0, 2, 5)
_KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_STEP = re.compile(r"^ProfilerStep#\d+$")

NO_DEVICE_TIME_NOTE = "device time is not attributed to operators from a trace file: use the profiler object"

_Key = tuple[str, str]
# start ns, end ns, pid, tid, key, input dims as JSON
_Span = tuple[int, int, int, int, _Key, str]


def trace_rows(path: Path, group_by_input_shape: bool) -> tuple[list[OperatorRow], bool, bool, bool, list[str]]:
    """``(rows, memory_recorded, shapes_recorded, grouped_by_input_shape, notes)`` of one trace file."""
    doc = _load(path)
    events = doc["traceEvents"]
    spans: list[_Span] = []
    records: list[tuple[int, int, bool]] = []  # t, bytes, is_cpu
    kernels = False
    any_dims = False
    for e in events:
        if not isinstance(e, dict):
            continue
        ph, cat, name = e.get("ph"), e.get("cat"), e.get("name")
        raw_args = e.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        if ph == "i" and name == MEMORY_EVENT and isinstance(args.get("Bytes"), int):
            is_cpu = args.get("Device Type", 0) in _CPU_DEVICE_TYPES
            records.append((_ns(e.get("ts")), args["Bytes"], is_cpu))
        elif ph == "X" and cat in _SPAN_CATS and isinstance(name, str):
            dims = args.get("Input Dims")
            any_dims = any_dims or dims is not None
            start = _ns(e.get("ts"))
            key = (_STEP.sub("ProfilerStep*", name), "")
            spans.append((start, start + _ns(e.get("dur")), _int(e.get("pid")), _int(e.get("tid")), key, _dims(dims)))
        elif cat in _KERNEL_CATS:
            kernels = True

    memory = bool(doc["profile_memory"]) if isinstance(doc.get("profile_memory"), bool) else bool(records)
    shapes = bool(doc["record_shapes"]) if isinstance(doc.get("record_shapes"), bool) else any_dims
    by_shape = group_by_input_shape and shapes
    if by_shape:
        spans = [(s, e, p, t, (k[0], d), d) for s, e, p, t, k, d in spans]

    acc: dict[_Key, dict[str, Any]] = {}

    def row(key: _Key) -> dict[str, Any]:
        return acc.setdefault(
            key,
            {"count": 0, "cpu_ns": 0, "child_ns": 0, "mem": [0, 0, 0, 0], "total": [0, 0], "shapes": Counter()},
        )

    nested = _drop_repeats(spans)
    # Counts, total times and shapes; self time by per-thread nesting.
    for (s, e, _p, _t, key, dims), parent in nested:
        r = row(key)
        r["count"] += 1
        r["cpu_ns"] += e - s
        if shapes and not by_shape and dims != "[]":
            r["shapes"][dims] += 1
        if parent is not None:
            row(parent)["child_ns"] += e - s

    # Memory in each span (children included): prefix sums over the records' times.
    records.sort(key=lambda x: x[0])
    times = [t for t, _, _ in records]
    pre_cpu, pre_dev = [0], [0]
    for _, b, is_cpu in records:
        pre_cpu.append(pre_cpu[-1] + (b if is_cpu else 0))
        pre_dev.append(pre_dev[-1] + (0 if is_cpu else b))
    for (s, e, _p, _t, key, _d), _parent in nested:
        lo, hi = bisect.bisect_left(times, s), bisect.bisect_right(times, e)
        r = row(key)
        r["total"][0] += pre_cpu[hi] - pre_cpu[lo]
        r["total"][1] += pre_dev[hi] - pre_dev[lo]

    # Self memory: each record to the innermost span holding it (latest start; the shorter on a tie).
    kept = [sp for sp, _ in nested]
    order = sorted(range(len(kept)), key=lambda i: kept[i][0])
    open_spans: list[tuple[int, int, int]] = []
    j = 0
    unheld: _Key = (MEMORY_EVENT, "[]" if by_shape else "")
    for t, b, is_cpu in records:
        while j < len(order) and kept[order[j]][0] <= t:
            k = order[j]
            heapq.heappush(open_spans, (-kept[k][0], kept[k][1], k))
            j += 1
        while open_spans and open_spans[0][1] < t:
            heapq.heappop(open_spans)
        if open_spans:
            key = kept[open_spans[0][2]][4]
        else:
            key = unheld
            r = row(key)
            r["count"] += 1  # key_averages lists each unheld record as a [memory] event
            r["total"][0 if is_cpu else 1] += b
        slot = 0 if is_cpu else 2
        row(key)["mem"][slot if b >= 0 else slot + 1] += abs(b)

    rows = []
    for (name, dims), r in acc.items():
        m = r["mem"]
        if by_shape:
            row_shapes: Any = json.loads(dims) or None
        elif r["shapes"]:
            row_shapes = [{"shapes": json.loads(d), "count": n} for d, n in r["shapes"].most_common(SHAPES_PER_ROW)]
        else:
            row_shapes = None
        rows.append(
            OperatorRow(
                name=name,
                count=r["count"],
                self_cpu_memory=m[0] - m[1],
                cpu_memory=r["total"][0],
                self_device_memory=m[2] - m[3],
                device_memory=r["total"][1],
                cpu_allocated=m[0] if memory else None,
                cpu_freed=m[1] if memory else None,
                device_allocated=m[2] if memory else None,
                device_freed=m[3] if memory else None,
                self_cpu_time_us=(r["cpu_ns"] - r["child_ns"]) / 1000,
                cpu_time_us=r["cpu_ns"] / 1000,
                self_device_time_us=0.0,
                device_time_us=0.0,
                input_shapes=row_shapes,
            )
        )
    notes = [NO_DEVICE_TIME_NOTE] if kernels else []
    return rows, memory, shapes, by_shape, notes


def _drop_repeats(spans: list[_Span]) -> list[tuple[_Span, _Key | None]]:
    """Nest each thread's spans and drop a span that is its parent's only child and has
    its parent's name (``aten::sum`` calling ``aten::sum``), as ``key_averages()`` does:
    the parent keeps the child's children. Returns the kept spans with their parent's key.
    """
    by_thread: dict[tuple[int, int], list[int]] = {}
    for i, sp in enumerate(spans):
        by_thread.setdefault((sp[2], sp[3]), []).append(i)
    parent: list[int | None] = [None] * len(spans)
    children: list[list[int]] = [[] for _ in spans]
    pre_order: list[int] = []
    for idx in by_thread.values():
        idx.sort(key=lambda i: (spans[i][0], -spans[i][1]))
        stack: list[int] = []
        for i in idx:
            # A span is inside the top of the stack when it starts before that ends and ends no later.
            while stack and (spans[i][0] >= spans[stack[-1]][1] or spans[i][1] > spans[stack[-1]][1]):
                stack.pop()
            if stack:
                parent[i] = stack[-1]
                children[stack[-1]].append(i)
            stack.append(i)
        pre_order.extend(idx)
    dropped = [False] * len(spans)
    for i in pre_order:  # parents come first, so a chain A > A > A folds into its top
        p = parent[i]
        if p is not None and spans[p][4][0] == spans[i][4][0] and len(children[p]) == 1:
            dropped[i] = True
            children[p] = children[i]
            for c in children[i]:
                parent[c] = p
    out: list[tuple[_Span, _Key | None]] = []
    for i, sp in enumerate(spans):
        if not dropped[i]:
            p = parent[i]
            out.append((sp, None if p is None else spans[p][4]))
    return out


def _load(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        opener: Any = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as f:
            doc = json.load(f, parse_float=Decimal)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON trace (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable trace ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome/Kineto trace (no traceEvents list)")
    return doc


def _ns(us: Any) -> int:
    """µs as written in the trace (an exact decimal) to integer ns."""
    if isinstance(us, (int, Decimal)):
        return int(us * 1000)
    return 0


def _int(v: Any) -> int:
    return v if isinstance(v, int) else -1


def _dims(dims: Any) -> str:
    return json.dumps(dims if isinstance(dims, list) else [])
