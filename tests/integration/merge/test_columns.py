"""``fastprof.read_columns`` on real files: a recorded trace, a run directory
with two ranks, a merged trace, a torch-style trace, filters, a malformed
event, errors, and memory on a large trace. Every expected column is
computed here from Python's own ``gzip`` + ``json`` (decimals kept as
``Decimal``, so times are exact), independently of the Rust reader."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof

Row = tuple[Any, ...]


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw, parse_float=Decimal)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def ns(us: Any) -> int:
    return int((Decimal(us) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def step_markers(events: list[dict[str, Any]], shift: int) -> list[tuple[int, int, int, int]]:
    """(pid, start, end, number) of fastprof 'step' spans and ProfilerStep#N."""
    out = []
    for e in events:
        if e.get("ph") != "X":
            continue
        name = e.get("name", "")
        if name == "step":
            number = e["args"]["step"]
        elif name.startswith("ProfilerStep#"):
            number = int(name.split("#")[1])
        else:
            continue
        t0 = ns(e["ts"]) + shift
        out.append((e["pid"], t0, t0 + ns(e["dur"]), number))
    return out


def step_of(markers: list[tuple[int, int, int, int]], pid: int, ts: int) -> int:
    mine = [m for m in markers if m[0] == pid] or markers
    covering = [m for m in mine if m[1] <= ts < m[2]]
    return max(covering, key=lambda m: m[1])[3] if covering else -1


def expected(path: Path, rank: int, shift: int | None = None, merged: bool = False) -> dict[str, list[Row]]:
    """Rows per kind from one file, as read_columns should give them (file index aside)."""
    doc = load(path)
    if shift is None:
        shift = doc.get("baseTimeNanoseconds", 0)
    events = doc["traceEvents"]
    markers = step_markers(events, shift)
    rows: dict[str, list[Row]] = {"spans": [], "instants": [], "counters": []}
    for e in events:
        ph = e.get("ph")
        if ph not in ("X", "i", "I", "C"):
            continue
        ts = ns(e["ts"]) + shift
        r = e["pid"] // 100_000 - 1 if merged else rank
        common = (e.get("name", ""), e.get("cat", ""), ts, e["pid"], e["tid"], r)
        if merged:
            # Each rank's markers are its own; a merged trace gives pids per rank.
            step = step_of([m for m in markers if m[0] // 100_000 - 1 == r], e["pid"], ts)
        else:
            step = step_of(markers, e["pid"], ts)
        if ph == "X":
            rows["spans"].append((*common, ns(e["dur"]), step))
        elif ph == "C":
            for key, value in e["args"].items():
                if isinstance(value, (int, Decimal)) and not isinstance(value, bool):
                    rows["counters"].append((*common, key, float(value), step))
        else:
            rows["instants"].append((*common, step))
    return rows


def got(cols: fastprof.Columns) -> dict[str, list[Row]]:
    """The same rows from read_columns' arrays."""
    out: dict[str, list[Row]] = {}
    for kind in ("spans", "instants", "counters"):
        t = getattr(cols, kind)
        n = len(t["ts"])
        for col, arr in t.items():
            assert isinstance(arr, np.ndarray) and arr.shape == (n,), (kind, col)
        rows = []
        for i in range(n):
            common = (
                cols.names[t["name"][i]],
                cols.categories[t["cat"][i]],
                int(t["ts"][i]),
                int(t["pid"][i]),
                int(t["tid"][i]),
                int(t["rank"][i]),
            )
            if kind == "spans":
                rows.append((*common, int(t["dur"][i]), int(t["step"][i])))
            elif kind == "counters":
                rows.append((*common, cols.names[t["series"][i]], float(t["value"][i]), int(t["step"][i])))
            else:
                rows.append((*common, int(t["step"][i])))
        out[kind] = rows
    return out


def merge_rows(parts: Iterable[dict[str, list[Row]]]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {"spans": [], "instants": [], "counters": []}
    for p in parts:
        for k, v in p.items():
            out[k].extend(v)
    return {k: sorted(v) for k, v in out.items()}


def record(out_dir: Path, rank: int = 0, steps: int = 5) -> fastprof.Recorder:
    """A real recording: step spans with nested work on two threads, instants, counters."""
    rec = fastprof.start(out_dir=out_dir, run_name="run", rank=rank, flush_interval=0.05)

    def worker() -> None:
        for i in range(50):
            with fastprof.span("load", i=i):
                pass

    t = threading.Thread(target=worker, name="loader")
    t.start()
    for i in range(steps):
        with fastprof.span("step", step=i):
            with fastprof.span("forward"):
                fastprof.counter("loss", 1.0 / (i + 1))
            with fastprof.span("backward"):
                fastprof.instant("grad_ready", i=i)
            fastprof.counter("mem", {"alloc": i * 1024, "reserved": 4096})
    t.join()
    rec.stop()
    return rec


def segments(trace_dir: Path) -> list[Path]:
    return sorted(trace_dir.glob("fastprof.*.json.gz"))


def test_recorded_trace_every_column_matches_json(tmp_path: Path) -> None:
    rec = record(tmp_path)
    files = segments(rec.trace_dir)
    assert files
    cols = fastprof.read_columns(rec.trace_dir)
    assert cols.warnings == []
    assert [Path(f["path"]) for f in cols.files] == files
    assert all(f["kind"] == "fastprof" and f["rank"] == 0 for f in cols.files)
    want = merge_rows(expected(p, rank=0) for p in files)
    have = {k: sorted(v) for k, v in got(cols).items()}
    assert len(have["spans"]) == 5 * 3 + 50
    assert len(have["counters"]) == 5 * 3
    assert len(have["instants"]) == 5
    assert have == want
    # Steps come from the step spans' args, for the loader thread too (same pid).
    steps = {r[7] for r in have["spans"] if r[0] == "forward"}
    assert steps == {0, 1, 2, 3, 4}
    # A file that was given directly reads the same.
    one = fastprof.read_columns(files[0])
    assert len(one.spans["ts"]) == sum(1 for r in expected(files[0], 0)["spans"])


def test_run_directory_with_two_ranks(tmp_path: Path) -> None:
    r0 = record(tmp_path, rank=0, steps=3)
    r1 = record(tmp_path, rank=1, steps=4)
    run_dir = tmp_path / "run"
    assert r0.run_dir == r1.run_dir == run_dir
    cols = fastprof.read_columns(run_dir, kinds=("spans",))
    assert {f["rank"] for f in cols.files} == {0, 1}
    want = merge_rows(
        [*(expected(p, 0) for p in segments(r0.trace_dir)), *(expected(p, 1) for p in segments(r1.trace_dir))]
    )
    have = got(cols)
    assert sorted(have["spans"]) == want["spans"]
    assert have["instants"] == have["counters"] == []
    ranks, counts = np.unique(cols.spans["rank"], return_counts=True)
    assert ranks.tolist() == [0, 1]
    assert counts.tolist() == [3 * 3 + 50, 4 * 3 + 50]


def test_merged_trace(tmp_path: Path) -> None:
    record(tmp_path, rank=0, steps=3)
    record(tmp_path, rank=1, steps=2)
    run_dir = tmp_path / "run"
    out = tmp_path / "merged.json.gz"
    fastprof.merge([run_dir], out)
    cols = fastprof.read_columns(out)
    assert [f["kind"] for f in cols.files] == ["merged"]
    have = {k: sorted(v) for k, v in got(cols).items()}
    assert have == merge_rows([expected(out, rank=-1, merged=True)])
    # The merge and the run directory place every event at the same epoch ns.
    direct = fastprof.read_columns(run_dir)
    key = [(n, ts, r, s) for n, _c, ts, _p, _t, r, _d, s in have["spans"]]
    key_direct = sorted((n, ts, r, s) for n, _c, ts, _p, _t, r, _d, s in got(direct)["spans"])
    assert sorted(key) == key_direct
    # A merged trace next to its inputs is skipped, not counted twice.
    fastprof.merge([run_dir], run_dir / "trace.json.gz")
    again = fastprof.read_columns(run_dir)
    assert len(again.spans["ts"]) == len(direct.spans["ts"])
    assert any("previous merge output" in w for w in again.warnings)


TORCH = {
    "schemaVersion": 1,
    "distributedInfo": {"backend": "nccl", "rank": 2, "world_size": 4},
    "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 311, "tid": 311,
         "ts": "@1700000000000100.125", "dur": 400.5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 311, "tid": 311,
         "ts": "@1700000000000120.001", "dur": "@30.999", "args": {"External id": 1}},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7,
         "ts": "@1700000000000200.5", "dur": 12.25},
        {"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 311, "tid": 311,
         "ts": 1700000000000300, "s": "t"},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#8", "pid": 311, "tid": 311,
         "ts": "@1700000000000600.125", "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 1700000000000650, "dur": 1},
        {"ph": "M", "name": "process_name", "pid": 311, "tid": 0, "args": {"name": "python"}},
    ],
    "traceName": "host_311.1700000000.pt.trace.json",
}  # fmt: skip


def torch_text(indent: int | None = None) -> str:
    """TORCH as JSON, with its "@<decimal>" strings written as the bare
    numbers (a Python float would round 1700000000000120.001)."""
    return re.sub(r'"@([-0-9.]+)"', r"\1", json.dumps(TORCH, indent=indent))


def test_torch_trace_with_profiler_steps_and_absolute_microseconds(tmp_path: Path) -> None:
    path = tmp_path / "host_311.pt.trace.json"
    path.write_text(torch_text(indent=1))
    assert "1700000000000120.001," in path.read_text()
    cols = fastprof.read_columns(path)
    assert cols.warnings == []
    assert cols.files[0]["kind"] == "kineto" and cols.files[0]["base_ns"] is None
    want = expected(path, rank=2, shift=0)
    assert got(cols) == want  # file order kept
    # Exact: 1700000000000120.001 µs is 1700000000000120001 ns, not a float's neighbour.
    assert cols.spans["ts"][1] == 1_700_000_000_000_120_001
    # The GPU pid has no markers of its own and takes its rank's.
    assert cols.spans["step"].tolist() == [7, 7, 7, 8, 8]


def test_filters(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json.gz"
    path.write_bytes(gzip.compress(torch_text().encode()))
    all_rows = expected(path, rank=2, shift=0)

    def names(cols: fastprof.Columns, kind: str = "spans") -> list[str]:
        return list(cols.names_of(getattr(cols, kind)["name"]))

    assert names(fastprof.read_columns(path, names=["sgemm"])) == ["sgemm", "sgemm"]
    assert names(fastprof.read_columns(path, name_prefix="ProfilerStep#")) == ["ProfilerStep#7", "ProfilerStep#8"]
    both = fastprof.read_columns(path, names="sgemm", name_prefix=["aten::"])
    assert names(both) == ["aten::linear", "sgemm", "sgemm"]
    # Steps still come from markers the name filter left out.
    assert both.spans["step"].tolist() == [7, 7, 8]
    cats = fastprof.read_columns(path, categories=["kernel", "cpu_instant_event"])
    assert names(cats) == ["sgemm", "sgemm"] and names(cats, "instants") == ["mark"]
    assert cats.categories == ["kernel", "cpu_instant_event"]
    t0, t1 = 1_700_000_000_000_150_000, 1_700_000_000_000_300_000
    window = fastprof.read_columns(path, start_ns=t0, end_ns=t1)
    want = [r for r in all_rows["spans"] if r[2] < t1 and r[2] + r[6] > t0]
    assert [r[0] for r in want] == ["ProfilerStep#7", "aten::linear", "sgemm"]
    assert got(window)["spans"] == want
    assert got(window)["instants"] == []  # the instant at t1 is outside [t0, t1)
    only = fastprof.read_columns(path, kinds=["instants"])
    assert len(only.spans["ts"]) == 0 and names(only, "instants") == ["mark"]
    with pytest.raises(fastprof.ConfigError, match="kinds"):
        fastprof.read_columns(path, kinds=["spans", "flows"])


def test_malformed_events_in_the_middle_are_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    good = [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 1} for i in range(6)]
    lines = [json.dumps(e) for e in good]
    lines.insert(2, '{"ph": "X", "name": "tab\there", "pid": 1, "tid": 1, "ts": 15, "dur": 1}')
    lines.insert(5, '{"ph": "X", "name": "nul\x00here", "pid": 1, "tid": 1, "ts": 25, "dur": 1}')
    text = '{"baseTimeNanoseconds": 1000000, "traceEvents": [\n' + ",\n".join(lines) + "\n] garbage }"
    text = text.replace("] garbage }", ", @@ ,\n" + json.dumps(good[0] | {"name": "last"}) + "]}")
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    cols = fastprof.read_columns(path)
    assert list(cols.names_of(cols.spans["name"])) == ["e0", "e1", "e2", "e3", "e4", "e5", "last"]
    assert cols.spans["ts"].tolist() == [1_000_000 + i * 10_000 for i in range(6)] + [1_000_000]
    dropped = [w for w in cols.warnings if "dropped the unreadable event" in w]
    assert len(dropped) == 2 and all(w.startswith(str(path)) for w in dropped)
    assert any("skipped" in w for w in cols.warnings)
    assert not cols.files[0]["salvaged"]
    # read_trace resyncs the same way: every good event, nothing called truncated.
    with pytest.warns(fastprof.FastprofWarning) as caught:
        doc = fastprof.read_trace(path)
    assert [e["name"] for e in doc["traceEvents"]] == [*(e["name"] for e in good), "last"]
    assert "salvaged" not in doc.get("otherData", {})
    assert sum("dropped the unreadable event" in str(w.message) for w in caught) == 2


def test_errors(tmp_path: Path) -> None:
    page = tmp_path / "page.json"
    page.write_text("<html>502 Bad Gateway</html>")
    with pytest.raises(fastprof.TraceError) as err:
        fastprof.read_columns(page)
    assert err.value.path == str(page) and err.value.offset == 0
    assert str(page) in str(err.value) and "at byte 0" in str(err.value)
    with pytest.raises(FileNotFoundError) as missing:
        fastprof.read_columns(tmp_path / "nope.json.gz")
    assert isinstance(missing.value, fastprof.FastprofFileNotFoundError)
    assert missing.value.filename == str(tmp_path / "nope.json.gz")


MEMORY_CHILD = textwrap.dedent(
    """
    import resource, sys
    import fastprof
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cols = fastprof.read_columns(sys.argv[1], names=["needle"])
    n = len(cols.spans["ts"])
    print(n, before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    """
)


def write_big_trace(path: Path, target_bytes: int) -> int:
    """A plain-JSON trace of about ``target_bytes``, written in chunks; returns needle count."""
    needles = 0
    with path.open("w") as f:
        f.write('{"baseTimeNanoseconds": 1700000000000000000, "traceEvents": [\n')
        i = 0
        while f.tell() < target_bytes:
            chunk = []
            for _ in range(10_000):
                name = "needle" if i % 1000 == 0 else f"aten::op_{i % 97}"
                needles += name == "needle"
                chunk.append(
                    f'{{"ph":"X","cat":"cpu_op","name":"{name}","pid":1,"tid":{i % 8},'
                    f'"ts":{i}.125,"dur":0.750,"args":{{"External id":{i},"Input Dims":[[64,64]]}}}},\n'
                )
                i += 1
            f.write("".join(chunk))
        f.write('{"ph":"i","name":"end","pid":1,"tid":0,"ts":0}\n]}\n')
    return needles


def test_memory_stays_far_below_the_file_size(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    needles = write_big_trace(path, 200 << 20)
    size = path.stat().st_size
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Through sh, which forks the child: Linux carries ru_maxrss across exec,
    # so a child exec'd straight from this (big) process would start at its RSS.
    out = subprocess.run(
        ["/bin/sh", "-c", '"$@"; exit $?', "sh", sys.executable, "-c", MEMORY_CHILD, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    rows, before, rss = map(int, out.stdout.split())
    assert rows == needles
    # The whole process (interpreter, numpy, the extension) against the file,
    # and what reading added: the scanner's buffer and the rows kept.
    assert rss < size * 0.25, (
        f"peak RSS {rss >> 20} MiB ({before >> 20} MiB before reading) for a {size >> 20} MiB trace"
    )
    assert rss - before < size * 0.05, f"reading added {(rss - before) >> 20} MiB for a {size >> 20} MiB trace"


def test_string_ids_are_valid_and_only_malformed_ids_are_counted(tmp_path: Path) -> None:
    # Kineto names its own tracks with string tids ("PyTorch Profiler"); a
    # number that is not an integer is what the warning is for.
    events = [
        {
            "ph": "X",
            "cat": "Trace",
            "name": "PyTorch Profiler (0)",
            "pid": 7,
            "tid": "PyTorch Profiler",
            "ts": 1,
            "dur": 5,
        },
        {"ph": "X", "name": "op", "pid": 7, "tid": 3, "ts": 2, "dur": 1},
        {"ph": "X", "name": "odd", "pid": 7, "tid": 1.5, "ts": 3, "dur": 1},
    ]
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 0, "traceEvents": events}))
    cols = fastprof.read_columns(path)
    assert cols.spans["tid"].tolist() == [-1, 3, -1]
    assert [w for w in cols.warnings if "not an integer" in w] == [
        f"{path}: 1 events have a pid or tid that is not an integer (read as -1)"
    ]
