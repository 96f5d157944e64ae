"""Recording sessions: each Recorder owns its data; pause/resume; clock
offset and step markers in the trace; writer faults reported, never raised.

Traces are read with gzip + json (see conftest), never with fastprof's reader.
"""

from __future__ import annotations

import gzip
import json
import time

import pytest

import fastprof


def _sample_until(rec, n: int) -> None:
    """Let ``rec``'s sampler take ``n`` readings, however slowly a loaded machine gets there."""
    deadline = time.monotonic() + 60  # a hang guard, not a measurement
    while len(rec.counters().get("proc.rss [B]", ((),))[0]) < n:
        assert time.monotonic() < deadline, f"fewer than {n} readings in 60 s"
        time.sleep(0.01)


def test_two_recorders_keep_their_own_sampler_data(tmp_path):
    a = fastprof.Recorder(tmp_path, "a", sample_hz=40, sample_gpus="none")
    with a:
        _sample_until(a, 5)
    a_end = time.monotonic_ns()
    b = fastprof.Recorder(tmp_path, "b", sample_hz=20, sample_gpus="none")
    with b:
        _sample_until(b, 3)
    ca, cb = a.counters(), b.counters()
    ts_a, _ = ca["proc.rss [B]"]
    ts_b, _ = cb["proc.rss [B]"]
    assert len(ts_a) >= 5 and len(ts_b) >= 3
    # a's readings all predate b's start, and b saw none of a's.
    assert ts_a.max() <= a_end < ts_b.min()
    assert a.sampler_info()["hz"] == 40
    assert b.sampler_info()["hz"] == 20
    # A recorder that never sampled has no data, not someone else's.
    c = fastprof.Recorder(tmp_path, "c", sample_hz=0)
    with c:
        pass
    assert c.counters() == {}
    assert c.sampler_info() is None


def test_pause_gates_new_events_and_open_spans_close(tmp_path, traces):
    rec = fastprof.start(tmp_path, "pause", flush_interval=0.05)
    with fastprof.span("outer"):  # open across the pause
        fastprof.instant("before")
        rec.pause()
        assert rec.paused and rec.active
        with fastprof.span("while_paused"):
            with fastprof.span("nested_in_paused"):
                fastprof.instant("gated_instant")
            fastprof.counter("gated_counter", 1.0)
        rec.mark_step(7)  # step markers pass a pause
        with fastprof.span("spans_resume"):
            rec.resume()  # resumed inside a skipped span: still skipped
            with fastprof.span("inside_skipped"):
                pass
        assert not rec.paused
        with fastprof.span("after"):
            fastprof.counter("c", 2.0)
    rec.stop()
    run = traces.read(rec.trace_dir)
    traces.nesting(run)
    names = {e["name"] for e in run.data_events()}
    assert {"outer", "before", "after", "c", "fastprof.step"} <= names
    assert names.isdisjoint(
        {"while_paused", "nested_in_paused", "gated_instant", "gated_counter", "spans_resume", "inside_skipped"}
    ), names
    (outer,) = run.of("X", "outer")
    assert "unclosed" not in outer.get("args", {})
    (step,) = run.of("C", "fastprof.step")
    assert step["args"] == {"value": 7}
    assert rec.stats is not None and rec.stats.dropped == 0  # gated is not dropped


def test_pause_and_resume_need_a_running_recorder(tmp_path):
    rec = fastprof.Recorder(tmp_path, "idle")
    with pytest.raises(fastprof.NotRunningError):
        rec.pause()
    rec.start()
    rec.stop()
    with pytest.raises(fastprof.NotRunningError):
        rec.resume()


def test_steps_and_clock_offset_reach_every_closed_segment(tmp_path, traces):
    rec = fastprof.start(tmp_path, "steps", segment_size="64KiB", flush_interval=0.02)
    rec.set_clock_offset(-1_234_567, 890)
    for step in range(1, 40):
        rec.mark_step(step)
        with fastprof.span("work", pad="x" * 200, step=step):
            pass
        time.sleep(0.003)
    assert rec.step[0] == 39 and rec.step[1] <= time.monotonic_ns()
    rec.stop()
    run = traces.read(rec.trace_dir)
    steps = [int(e["args"]["value"]) for e in run.of("C", "fastprof.step")]
    assert steps == list(range(1, 40))
    for other in run.others:
        clock = other["clock"]
        # The close extends the start metadata, it does not replace it.
        assert clock["ticks"] in ("tsc", "CLOCK_MONOTONIC")
        assert clock["ticks_reason"]
        assert clock["start"]["realtime_ns"] == run.segments[0].base_ns
        assert clock["offset_ns"] == -1_234_567
        assert clock["offset_uncertainty_ns"] == 890
        assert clock["anchors"][0]["label"] == "start"
    assert run.final["last_step"]["step"] == 39


def test_merge_applies_the_recorded_clock_offset(tmp_path):
    def record(name, offset):
        rec = fastprof.start(tmp_path, name)
        if offset is not None:
            rec.set_clock_offset(offset, 10)
        with fastprof.span("x"):
            pass
        rec.stop()
        return rec

    plain = record("plain", None)
    shifted = record("shifted", 5_000_000)

    def merged_start(rec):
        out = tmp_path / f"{rec.options.run_name}.json.gz"
        summary = fastprof.merge([rec.run_dir], out)
        doc = json.loads(gzip.decompress(out.read_bytes()))
        (x,) = [e for e in doc["traceEvents"] if e.get("name") == "x"]
        return summary, doc["baseTimeNanoseconds"] + round(x["ts"] * 1000)

    s_plain, t_plain = merged_start(plain)
    s_shift, t_shift = merged_start(shifted)
    raw = json.loads(gzip.decompress(next(shifted.trace_dir.glob("fastprof.0.json.gz")).read_bytes()))
    (x,) = [e for e in raw["traceEvents"] if e.get("name") == "x"]
    recorded = raw["baseTimeNanoseconds"] + round(x["ts"] * 1000)
    # The merged event sits exactly offset_ns later than where the rank recorded it.
    assert abs(t_shift - recorded - 5_000_000) <= 1
    assert s_shift["uncertainty_ns"] >= 10 > 0 == s_plain["inputs"][0].get("offset_ns", 0)
    assert t_plain > 0


def test_writer_panic_is_a_warning_not_an_exception(pyscript):
    r = pyscript.run(
        """
        import sys, time, warnings
        import fastprof
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rec = fastprof.start(sys.argv[1], "panic", flush_interval=0.02)
            with fastprof.span("s"):
                time.sleep(0.2)
            stats = rec.stop()           # must not raise
        msgs = [str(w.message) for w in caught if issubclass(w.category, fastprof.FastprofWarning)]
        assert any("panicked" in m and "injected writer fault" in m for m in msgs), msgs
        assert stats.error and "panicked" in stats.error
        # The job goes on, and a new recorder can start.
        with fastprof.Recorder(sys.argv[1], "after") as r2:
            pass
        print("OK")
        """,
        str(pyscript.tmp_path / "runs"),
        env={"FASTPROF_TEST_FAULT": "writer_panic"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("OK")


def test_thread_without_ring_under_address_space_limit(pyscript, traces):
    """Under ``ulimit -v`` a new thread's ring cannot be allocated: its events
    are counted as dropped with one warning; the process does not abort."""
    r = pyscript.run(
        """
        import resource, sys, threading, warnings
        import fastprof
        rec = fastprof.start(sys.argv[1], "ulimit", buffer_size=1 << 24)  # 384 MiB rings
        with fastprof.span("main_before"):
            pass                          # the main thread's ring exists
        vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + (200 << 20), resource.RLIM_INFINITY))
        caught = []
        def work():
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                for i in range(1000):
                    with fastprof.span("in_thread"):
                        fastprof.instant("tick")
                caught.extend(str(x.message) for x in w)
        t = threading.Thread(target=work, name="starved")
        t.start(); t.join()
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            stats = rec.stop()
        assert len(caught) == 1 and "could not allocate" in caught[0], caught
        assert stats.dropped == 2000, stats.dropped
        print("OK")
        """,
        str(pyscript.tmp_path / "runs"),
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "could not allocate" in r.stderr  # also said on stderr, at the time
    run = traces.read(pyscript.tmp_path / "runs" / "ulimit" / "rank0")
    assert run.of("X", "main_before") and not run.of("X", "in_thread")
    drops = run.final["drops"]
    assert drops["ringless_events"] == 2000 and drops["total"] == 2000
    assert [t["name"] for t in drops["ringless_threads"]] == ["starved"]


def test_columns_assign_steps_from_mark_step(tmp_path):
    """The step markers the recorder writes are the ones the read-back uses."""
    rec = fastprof.start(tmp_path, "cols", flush_interval=0.02)
    for step in (10, 11, 12):
        rec.mark_step(step)
        for _ in range(3):
            with fastprof.span("work"):
                time.sleep(0.001)
    rec.stop()
    cols = fastprof.read_columns(rec.run_dir, names=["work"], kinds=("spans",))
    spans = cols.spans
    assert len(spans["ts"]) == 9
    order = spans["ts"].argsort()
    assert spans["step"][order].tolist() == [10] * 3 + [11] * 3 + [12] * 3
    assert set(cols.names_of(spans["name"])) == {"work"}


def test_rings_of_exited_threads_are_freed(tmp_path):
    """Each thread's ring is 96 MiB of address space here; 16 short-lived
    threads would hold 1.5 GiB if rings outlived their threads."""
    import resource
    import threading

    def vm_bytes():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize()

    rec = fastprof.start(tmp_path, "threads", buffer_size=1 << 22, flush_interval=0.02)
    ring = (1 << 22) * 24
    with fastprof.span("main"):
        pass
    before = vm_bytes()
    for k in range(16):
        t = threading.Thread(target=lambda k=k: fastprof.instant("t", k=k), name=f"short{k}")
        t.start()
        t.join()
    deadline = time.monotonic() + 10
    while vm_bytes() - before > 2 * ring and time.monotonic() < deadline:
        time.sleep(0.02)
    assert vm_bytes() - before <= 2 * ring, (vm_bytes() - before) / ring
    stats = rec.stop()
    assert stats.events_written >= 17 and stats.dropped == 0
