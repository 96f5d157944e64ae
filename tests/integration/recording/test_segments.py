"""Segment rotation by size and by time: every closed segment is a complete,
single-member gzip JSON trace on its own, indices run 0..N-1, only the last
is final, and the events of all segments add up to what was recorded.
"""

from __future__ import annotations

import time

import fastprof

BATCHES = 40
PER_BATCH = 2500


def _noisy(i: int) -> str:
    # Deterministic but poorly compressible, so segments fill quickly.
    return f"{(i * 2654435761) % 2**32:08x}{(i * 40503) % 65521:05d}"


def _check_segments(run, traces, *, expect_at_least: int):
    segs = run.segments
    assert len(segs) >= expect_at_least, [s.path.name for s in segs]
    assert [s.path.name for s in segs] == [f"fastprof.{k}.json.gz" for k in range(len(segs))]
    base = segs[0].base_ns
    for k, seg in enumerate(segs):
        other = seg.other
        assert other["segment"] == k
        assert other["final"] is (k == len(segs) - 1)
        assert other["producer"] == "fastprof"
        names = {e["name"] for e in seg.events if e["ph"] == "M"}
        assert "process_name" in names, f"segment {k} lacks process metadata"
        # Each segment names the threads whose events it holds.
        tids = {e["tid"] for e in seg.events if e["ph"] != "M"}
        named = {e["tid"] for e in seg.events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert tids <= named, f"segment {k}: threads without thread_name"
        assert isinstance(seg.base_ns, int) and abs(seg.base_ns - base) < 10 * 10**9
        traces.time_format(seg.text)
    return segs


def test_size_rotation(tmp_path, traces):
    rec = fastprof.start(
        out_dir=tmp_path,
        run_name="size",
        segment_size=64 * 1024,
        flush_interval=0.02,
        buffer_size=1 << 16,
    )
    i = 0
    for _ in range(BATCHES):
        for _ in range(PER_BATCH):
            fastprof.instant("ev", i=i, tag=_noisy(i))
            i += 1
        time.sleep(0.03)  # rotation is checked at flush time
    with fastprof.span("last"):
        pass
    stats = fastprof.stop()
    assert stats.dropped == 0

    run = traces.read(rec.trace_dir)
    segs = _check_segments(run, traces, expect_at_least=3)
    assert sorted(stats.segments) == sorted(s.path for s in segs)
    assert stats.segments == [s.path for s in segs]

    seen = [e["args"]["i"] for e in run.of("i", "ev")]
    assert seen == list(range(BATCHES * PER_BATCH))
    assert all(e["args"]["tag"] == _noisy(e["args"]["i"]) for e in run.of("i", "ev"))
    per_segment = [sum(1 for e in s.events if e["ph"] != "M") for s in segs]
    assert sum(per_segment) == stats.events_written == BATCHES * PER_BATCH + 1
    assert all(n > 0 for n in per_segment[:-1])
    assert run.final["events_written"] == stats.events_written
    for seg, n in zip(segs, per_segment, strict=True):
        if "segment_events" in seg.other:
            assert seg.other["segment_events"] == n
    # Compressed segments stay near the limit: rotation is checked at each
    # flush, so a segment overshoots by at most one flush's worth.
    for seg in segs[:-1]:
        assert seg.path.stat().st_size >= 64 * 1024


def test_time_rotation(tmp_path, traces):
    """Record until three segments have rotated (however slowly a loaded
    machine gets there), then check rotation against the trace's own clock:
    a segment is closed only once it is ``segment_seconds`` old, so everything
    it held was recorded after the previous segment's last event and before
    the next one's first, and those two are at least 0.3 s apart."""
    rec = fastprof.start(out_dir=tmp_path, run_name="time", segment_seconds=0.3, flush_interval=0.05)
    deadline = time.monotonic() + 60  # a hang guard, not a measurement
    n = 0
    while len(list(rec.trace_dir.glob("fastprof.*.json.gz"))) < 3:
        assert time.monotonic() < deadline, "no three rotations in 60 s"
        fastprof.instant("tick", n=n)
        n += 1
        time.sleep(0.005)
    fastprof.instant("tick", n=n)
    n += 1
    stats = fastprof.stop()
    run = traces.read(rec.trace_dir)
    segs = _check_segments(run, traces, expect_at_least=4)
    assert [e["args"]["n"] for e in run.of("i", "tick")] == list(range(n))
    assert stats.segments == [s.path for s in segs]
    ticks = [[s.base_ns + traces.us_to_ns(e["ts"]) for e in s.events if e.get("name") == "tick"] for s in segs]
    assert all(ticks[:-1]), "a rotated segment without events"
    # Segment k spans at least 0.3 s: the next segment's first event comes at
    # least that long after the previous segment's last (1 ms of slack for an
    # event stamped just before the drain that flushed it).
    for k in range(1, len(segs) - 1):
        if ticks[k + 1]:
            gap = min(ticks[k + 1]) - max(ticks[k - 1])
            assert gap >= 0.3e9 - 1e6, (k, gap / 1e9)


def test_span_across_rotation_stays_whole(tmp_path, traces):
    """A span open across a rotation is written once, complete, in the segment where it ends."""
    rec = fastprof.start(out_dir=tmp_path, run_name="across", segment_seconds=0.1, flush_interval=0.02)
    with fastprof.span("long"):
        for k in range(30):
            with fastprof.span("short", k=k):
                time.sleep(0.01)
    fastprof.stop()
    run = traces.read(rec.trace_dir)
    assert len(run.segments) >= 2
    (long,) = run.of("X", "long")
    assert [e["args"]["k"] for e in run.of("X", "short")] == list(range(30))
    assert long["dur"] >= 300_000
    nested = traces.nesting(run)
    (spans,) = nested.values()
    assert {e["name"]: d for _, _, d, e in spans} == {"long": 0, "short": 1}


def test_a_busy_thread_cannot_overshoot_segment_size(tmp_path, traces):
    """Rotation is checked after every batch the writer hands over, not only
    at the timed flush: with a 64 KiB segment size and a one-minute flush
    interval, no closed segment grows far past its size."""
    import os

    rec = fastprof.start(tmp_path, "busy", segment_size="64KiB", flush_interval=60, buffer_size=1 << 16)
    for i in range(60_000):
        fastprof.instant("e", i=i, noise=os.urandom(8).hex())
    stats = rec.stop()
    assert stats.dropped == 0
    sizes = [p.stat().st_size for p in sorted(rec.trace_dir.glob("fastprof.*.json.gz"))]
    assert len(sizes) >= 10, sizes
    # One batch is at most 256 KiB of JSON, far less once compressed.
    assert max(sizes[:-1]) < 2 * 64 * 1024, sizes
    run = traces.read(rec.trace_dir)
    assert len(run.of("i", "e")) == 60_000
