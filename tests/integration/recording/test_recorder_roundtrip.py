"""Round trip: record from several Python threads, stop, and read the closed
segments back with Python's own gzip + json.

Checks exact counts per name and thread, strict nesting, parent/child
structure, args, thread names, time format (three-decimal µs), the
``baseTimeNanoseconds`` anchor, and the per-thread order of sibling spans.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict

import fastprof

THREADS = 4
GROUPS = 10_000  # per thread; each group is 5 spans -> 50_000 spans per thread
SPANS_PER_THREAD = GROUPS * 5


def _work(k: int, tids: dict[int, int], barrier: threading.Barrier) -> None:
    tids[k] = threading.get_native_id()
    barrier.wait()
    # outer { mid { inner, inner }, mid { } }: three levels deep.
    for i in range(GROUPS):
        with fastprof.span("outer", i=i, thread=k):
            with fastprof.span("mid"):
                with fastprof.span("inner", j=2 * i):
                    pass
                with fastprof.span("inner"):
                    pass
            with fastprof.span("mid"):
                pass


def test_four_threads_round_trip(tmp_path, traces):
    t_before = time.time_ns()
    rec = fastprof.start(out_dir=tmp_path, run_name="rt", buffer_size=1 << 18, flush_interval=0.1)
    t_after = time.time_ns()
    assert fastprof.is_active()
    assert rec.run_dir == tmp_path / "rt"
    assert rec.trace_dir == tmp_path / "rt" / "rank0"

    tids: dict[int, int] = {}
    barrier = threading.Barrier(THREADS)
    threads = [threading.Thread(target=_work, args=(k, tids, barrier), name=f"rt-worker-{k}") for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = fastprof.stop()
    assert not fastprof.is_active()

    assert stats.dropped == 0, stats
    assert sum(stats.dropped_per_thread.values()) == 0
    assert stats.unclosed_spans == 0
    assert stats.error is None
    assert len(set(tids.values())) == THREADS

    run = traces.read(rec.trace_dir)
    assert sorted(stats.segments) == sorted(s.path for s in run.segments)

    # baseTimeNanoseconds: epoch ns taken at start.
    for seg in run.segments:
        assert t_before - 5_000_000_000 <= seg.base_ns <= t_after + 5_000_000_000
        assert traces.time_format(seg.text) >= 2 * THREADS * SPANS_PER_THREAD

    # Exact counts per (thread, name) and nothing else recorded.
    pid = os.getpid()
    data = run.data_events()
    assert {e["ph"] for e in data} == {"X"}
    assert all(e["pid"] == pid for e in run.events)
    counts = Counter((e["tid"], e["name"]) for e in data)
    expected = {}
    for tid in tids.values():
        expected[(tid, "outer")] = GROUPS
        expected[(tid, "mid")] = 2 * GROUPS
        expected[(tid, "inner")] = 2 * GROUPS
    assert dict(counts) == expected
    assert stats.events_written == THREADS * SPANS_PER_THREAD
    assert run.final["events_written"] == THREADS * SPANS_PER_THREAD
    assert all(e["pid"] == pid for e in data)

    # Args exactly where given, absent elsewhere.
    for k, tid in tids.items():
        outers = run.of("X", "outer", tid)
        assert sorted(e["args"]["i"] for e in outers) == list(range(GROUPS))
        assert all(e["args"] == {"i": e["args"]["i"], "thread": k} for e in outers)
        inners = run.of("X", "inner", tid)
        with_args = [e for e in inners if "args" in e]
        assert sorted(e["args"]["j"] for e in with_args) == [2 * i for i in range(GROUPS)]
        assert all(e["args"] == {"j": e["args"]["j"]} for e in with_args)
        assert len(inners) - len(with_args) == GROUPS
        assert all("args" not in e for e in run.of("X", "mid", tid))

    # Strict nesting, with the structure the code produced.
    nested = traces.nesting(run)
    assert set(nested) == set(tids.values())
    level_name = {0: "outer", 1: "mid", 2: "inner"}
    for tid, spans in nested.items():
        for _, _, depth, e in spans:
            assert level_name[depth] == e["name"], f"tid {tid}: {e['name']} at depth {depth}"

        # Same-depth spans of one thread are disjoint, so whatever order the
        # writer uses (end order), their starts never go backwards in the file.
        last_start: dict[int, int] = defaultdict(lambda: -1)
        last_end: dict[int, int] = defaultdict(lambda: -1)
        for t0, t1, depth, e in spans:
            assert t0 >= last_start[depth], f"tid {tid}: {e['name']} starts before its previous sibling"
            assert t0 >= last_end[depth], f"tid {tid}: {e['name']} starts before its previous sibling ended"
            last_start[depth], last_end[depth] = t0, t1
        # outer i=0..N-1 appear in program order.
        assert [e["args"]["i"] for _, _, d, e in spans if d == 0] == list(range(GROUPS))

    # Thread names: metadata events and otherData.threads.
    names = run.thread_names()
    for k, tid in tids.items():
        assert names[tid] == f"rt-worker-{k}"
        assert run.final["threads"][str(tid)] == f"rt-worker-{k}"


def test_otherdata_and_metadata(tmp_path, traces):
    t_before = time.time_ns()
    rec = fastprof.start(out_dir=str(tmp_path), run_name="meta")
    with fastprof.span("one"):
        pass
    stats = fastprof.stop()
    run = traces.read(rec.trace_dir)
    assert len(run.segments) == 1
    seg = run.segments[0]
    other = seg.other
    assert other["producer"] == "fastprof"
    assert isinstance(other["version"], str) and other["version"]
    assert isinstance(other["host"], str) and other["host"]
    assert other["pid"] == os.getpid()
    assert other["rank"] == 0
    assert other["world_size"] == 1
    assert other["run_name"] == "meta"
    assert other["segment"] == 0
    assert other["final"] is True
    assert other["drops"]["total"] == 0
    assert all(n == 0 for n in other["drops"]["per_thread"].values())
    assert other["events_written"] == stats.events_written == 1
    assert other["unclosed_spans"] == 0
    assert isinstance(other["config"], dict)
    assert other["threads"] == {str(threading.get_native_id()): "MainThread"}

    anchors = other["clock"]["anchors"]
    labels = [a["label"] for a in anchors]
    assert labels[0] == "start" and labels[-1] == "stop"
    assert set(labels) <= {"start", "periodic", "stop"}
    for a in anchors:
        assert isinstance(a["realtime_ns"], int) and isinstance(a["monotonic_ns"], int)
    assert anchors[0]["realtime_ns"] == seg.base_ns
    assert abs(anchors[0]["realtime_ns"] - t_before) < 5_000_000_000
    assert anchors[-1]["monotonic_ns"] >= anchors[0]["monotonic_ns"]

    meta = {e["name"]: e for e in seg.events if e["ph"] == "M"}
    assert {"process_name", "thread_name", "fastprof_info"} <= set(meta)
    assert meta["process_name"]["pid"] == os.getpid()
    assert isinstance(meta["fastprof_info"]["args"], dict)
    assert meta["thread_name"]["tid"] == threading.get_native_id()
    assert meta["thread_name"]["args"]["name"] == "MainThread"


def test_timestamps_are_on_the_wall_clock(tmp_path, traces):
    """base + ts lands where time.time_ns() said the event happened."""
    rec = fastprof.start(out_dir=tmp_path, run_name="clock")
    marks = []
    for k in range(5):
        before = time.time_ns()
        fastprof.instant("mark", k=k)
        after = time.time_ns()
        marks.append((before, after))
        time.sleep(0.02)
    fastprof.stop()
    run = traces.read(rec.trace_dir)
    seg = run.segments[0]
    events = run.of("i", "mark")
    assert [e["args"]["k"] for e in events] == list(range(5))
    for e, (before, after) in zip(events, marks, strict=True):
        assert e["s"] == "t"
        at = seg.base_ns + traces.us_to_ns(e["ts"])
        # realtime/monotonic drift over a second is far below this slack.
        assert before - 2_000_000 <= at <= after + 2_000_000


def test_short_lived_threads_keep_their_events(tmp_path, traces):
    """Threads that exit before stop still have every event and their name."""
    rec = fastprof.start(out_dir=tmp_path, run_name="short", flush_interval=0.02)
    tids: dict[str, int] = {}

    def work(name: str) -> None:
        tids[name] = threading.get_native_id()
        for i in range(200):
            with fastprof.span("short", i=i):
                fastprof.instant("tick")

    for wave in range(4):
        ts = [threading.Thread(target=work, args=(f"w{wave}-{k}",), name=f"w{wave}-{k}") for k in range(5)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        time.sleep(0.05)  # let the writer see them exit
    stats = fastprof.stop()
    assert stats.dropped == 0
    run = traces.read(rec.trace_dir)
    all_names = {e["args"]["name"] for e in run.of("M", "thread_name")}
    by_tid = Counter(e["tid"] for e in run.of("X", "short"))
    ticks = Counter(e["tid"] for e in run.of("i", "tick"))
    # Native tids may be reused by later threads; count per name instead.
    assert len(run.of("X", "short")) == 20 * 200
    assert len(run.of("i", "tick")) == 20 * 200
    for tid in tids.values():
        assert tid in by_tid and tid in ticks
    assert set(tids) <= all_names
    traces.nesting(run)
