"""Ring overflow: with a tiny per-thread ring and a flood of events, every
event is either recorded or counted as dropped, exactly. The bounded ring
(``buffer_growth=0``) drops at once; the default grows instead, and drops
only once the growth budget is spent.

The drop count must agree between ``RunStats``, ``otherData.drops`` (total
and per thread) and the ``FastprofWarning`` emitted at stop.
"""

from __future__ import annotations

import threading
import time

import pytest

import fastprof

FLOOD = 200_000


def _stop_expecting_drop_warning():
    with pytest.warns(fastprof.FastprofWarning) as caught:
        stats = fastprof.stop()
    messages = [str(w.message) for w in caught if issubclass(w.category, fastprof.FastprofWarning)]
    assert stats.dropped > 0
    assert any(str(stats.dropped) in m for m in messages), messages
    return stats


def test_instant_flood_counts_every_drop(tmp_path, traces):
    rec = fastprof.start(out_dir=tmp_path, run_name="flood", buffer_size=64, buffer_growth=0, flush_interval=10.0)
    tid = threading.get_native_id()
    for _ in range(FLOOD):
        fastprof.instant("flood")
    stats = _stop_expecting_drop_warning()

    run = traces.read(rec.trace_dir)
    recorded = len(run.of("i", "flood"))
    assert recorded > 0
    assert recorded + stats.dropped == FLOOD
    assert stats.dropped_per_thread == {tid: stats.dropped}
    assert stats.events_written == recorded
    drops = run.final["drops"]
    assert drops["total"] == stats.dropped
    assert drops["per_thread"] == {str(tid): stats.dropped}


def test_instant_flood_with_args(tmp_path, traces):
    """Dropped events that carry args are counted the same way (and freed)."""
    rec = fastprof.start(out_dir=tmp_path, run_name="flood-args", buffer_size=64, buffer_growth=0, flush_interval=10.0)
    n = FLOOD // 4
    for i in range(n):
        fastprof.instant("flood", i=i)
    stats = _stop_expecting_drop_warning()
    run = traces.read(rec.trace_dir)
    seen = [e["args"]["i"] for e in run.of("i", "flood")]
    assert len(seen) + stats.dropped == n
    # What was kept is in issue order and never duplicated.
    assert seen == sorted(set(seen))


def test_nested_span_flood(tmp_path, traces):
    """A dropped span takes its nested spans with it; each counts as one drop."""
    rec = fastprof.start(out_dir=tmp_path, run_name="spans", buffer_size=64, buffer_growth=0, flush_interval=10.0)
    outer_n = FLOOD // 4
    for _ in range(outer_n):
        with fastprof.span("outer"):
            with fastprof.span("inner"):
                fastprof.instant("leaf")
    stats = _stop_expecting_drop_warning()
    assert stats.unclosed_spans == 0

    run = traces.read(rec.trace_dir)
    outers = run.of("X", "outer")
    inners = run.of("X", "inner")
    leaves = run.of("i", "leaf")
    issued = 3 * outer_n
    assert len(outers) + len(inners) + len(leaves) + stats.dropped == issued
    assert run.final["drops"]["total"] == stats.dropped

    # Every recorded inner span sits inside a recorded outer span.
    nested = traces.nesting(run)
    (spans,) = nested.values()
    for _, _, depth, e in spans:
        assert depth == {"outer": 0, "inner": 1}[e["name"]]
    assert len(inners) <= len(outers)


def test_threads_count_drops_separately(tmp_path, traces):
    rec = fastprof.start(out_dir=tmp_path, run_name="threads", buffer_size=64, buffer_growth=0, flush_interval=10.0)
    per_thread = 60_000
    tids: dict[str, int] = {}
    barrier = threading.Barrier(3)

    def flood(name: str) -> None:
        tids[name] = threading.get_native_id()
        barrier.wait()
        for _ in range(per_thread):
            fastprof.instant(name)

    ts = [threading.Thread(target=flood, args=(f"flood-{k}",), name=f"flood-{k}") for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stats = _stop_expecting_drop_warning()

    run = traces.read(rec.trace_dir)
    per_thread_json = run.final["drops"]["per_thread"]
    assert sum(per_thread_json.values()) == run.final["drops"]["total"] == stats.dropped
    for name, tid in tids.items():
        recorded = len(run.of("i", name, tid))
        dropped = stats.dropped_per_thread.get(tid, 0)
        assert recorded + dropped == per_thread, name
        assert per_thread_json.get(str(tid), 0) == dropped
    assert sum(stats.dropped_per_thread.values()) == stats.dropped


def test_recording_resumes_after_overflow(tmp_path, traces):
    """Once the writer drains the ring, new events are recorded again."""
    rec = fastprof.start(out_dir=tmp_path, run_name="resume", buffer_size=64, buffer_growth=0, flush_interval=0.05)
    for _ in range(50_000):
        fastprof.instant("burst")
    # Wait until the writer has drained (it flushes every 50 ms).
    time.sleep(0.3)
    for i in range(10):
        fastprof.instant("after", i=i)
        time.sleep(0.001)
    stats = _stop_expecting_drop_warning()
    run = traces.read(rec.trace_dir)
    assert [e["args"]["i"] for e in run.of("i", "after")] == list(range(10))
    assert len(run.of("i", "burst")) + stats.dropped == 50_000


def test_a_full_ring_grows_instead_of_dropping(tmp_path, traces):
    # The same flood at the default growth budget: nothing is lost, the
    # growth is on record, and the memory is given back by the end.
    rec = fastprof.start(out_dir=tmp_path, run_name="grow", buffer_size=64, flush_interval=10.0)
    for _ in range(FLOOD):
        fastprof.instant("flood")
    stats = fastprof.stop()
    assert stats.dropped == 0
    run = traces.read(rec.trace_dir)
    assert len(run.of("i", "flood")) == FLOOD
    growth = run.final["ring_growth"]
    assert growth["chunks"] > 0
    assert 0 < growth["peak_bytes"] <= growth["limit_bytes"] == 256 << 20
    assert run.final["drops"]["total"] == 0


def test_past_the_growth_budget_drops_are_counted(tmp_path, traces):
    # 64 KiB of growth: a 64-slot ring grows to 2048 slots (48 KiB in chunks
    # of 128..2048 slots alive at once) and then drops what does not fit.
    rec = fastprof.start(
        out_dir=tmp_path, run_name="budget", buffer_size=64, buffer_growth="64KiB", flush_interval=10.0
    )
    for _ in range(FLOOD):
        fastprof.instant("flood")
    stats = _stop_expecting_drop_warning()
    run = traces.read(rec.trace_dir)
    recorded = len(run.of("i", "flood"))
    assert recorded + stats.dropped == FLOOD
    assert recorded > 64
    growth = run.final["ring_growth"]
    assert growth["chunks"] > 0 and growth["peak_bytes"] <= 64 << 10
