"""The in-memory window (flight recorder): bounded, compressed,
overwrite-oldest, dumped as a complete trace without stopping the session.

Dumps are read with Python's gzip + json; memory is checked by what a dump
holds (its events' random bytes cannot compress), not by the process's RSS.
"""

from __future__ import annotations

import json
import threading
import zlib

import pytest

import fastprof


def load_dump(path):
    raw = path.read_bytes()
    d = zlib.decompressobj(wbits=31)
    body = d.decompress(raw) + d.flush()
    assert d.eof and d.unused_data == b"", "a dump is one complete gzip member"
    return json.loads(body)


def test_dump_is_a_complete_trace_and_recording_goes_on(tmp_path, traces):
    rec = fastprof.start(tmp_path, "win", window_seconds=60, window_bytes="4MiB", flush_interval=0.05)
    started = threading.Event()
    release = threading.Event()

    def worker():
        with fastprof.span("worker_open"):
            started.set()
            release.wait(10)

    t = threading.Thread(target=worker, name="w1")
    t.start()
    started.wait(10)
    with fastprof.span("main_open"):
        for i in range(200):
            with fastprof.span("step", i=i):
                fastprof.counter("loss", 1.0 / (i + 1))
        info = rec.dump(tmp_path / "dump1.json.gz")
        with fastprof.span("after_dump"):
            pass
    release.set()
    t.join()
    rec.stop()

    doc = load_dump(tmp_path / "dump1.json.gz")
    assert info["path"] == tmp_path / "dump1.json.gz"
    assert isinstance(doc["baseTimeNanoseconds"], int)
    evs = doc["traceEvents"]
    names = [e.get("name") for e in evs]
    assert names.count("step") == 200 and names.count("loss") == 200
    opened = {e["name"]: e for e in evs if e.get("args", {}).get("unclosed")}
    assert set(opened) == {"main_open", "worker_open"}, opened
    assert "after_dump" not in names
    assert info["events"] == len([e for e in evs if e["ph"] != "M"]) and info["open_spans"] == 2
    tnames = {e["args"]["name"] for e in evs if e.get("name") == "thread_name"}
    assert {"MainThread", "w1"} <= tnames
    assert doc["otherData"]["window"]["seconds"] == 60
    # The session kept recording: the segments have everything, spans closed normally.
    run = traces.read(rec.trace_dir)
    traces.nesting(run)
    assert len(run.of("X", "step")) == 200 and run.of("X", "after_dump")
    assert not any(e.get("args", {}).get("unclosed") for e in run.of("X"))
    assert not list(tmp_path.glob(".dump1*")), "temporary file left behind"


def test_dump_needs_a_window_and_a_running_recorder(tmp_path):
    rec = fastprof.start(tmp_path, "nowin")
    with pytest.raises(fastprof.ConfigError, match="window_seconds"):
        rec.dump(tmp_path / "x.json.gz")
    rec.stop()
    with pytest.raises(fastprof.NotRunningError):
        rec.dump(tmp_path / "x.json.gz")
    assert not (tmp_path / "x.json.gz").exists()


def test_window_keeps_the_newest_events_within_its_bound(pyscript):
    """Flood the window with many times its bound of incompressible args: the
    dump holds a contiguous run of the newest events, every recorded event is
    either kept or counted as evicted, and what is kept fits the bound.

    Memory is checked by what the window holds, not by the process's RSS
    (which moves with the allocator and with how far the writer lags on a
    loaded machine): each kept event carries 48 random bytes, which no
    compressor can store in fewer, so ``kept x 48`` is a floor on the bytes
    the window really held, whatever it reports about itself."""
    r = pyscript.run(
        """
        import gzip, json, os, sys, time
        import fastprof
        out = sys.argv[1]
        rec = fastprof.start(out, "flood", window_seconds=3600, window_bytes="2MiB",
                             buffer_size=1 << 16, flush_interval=0.01, sample_hz=0)
        n = 250000
        for i in range(n):
            fastprof.instant("e", i=i, noise=os.urandom(48).hex())
            if i % 500 == 0:
                fastprof.counter("progress", i)
            if i % 2000 == 0:
                # Let the writer keep up: what a ring holds in flight is
                # bounded by its slots, not measured here.
                time.sleep(0.005)
        info = rec.dump(os.path.join(out, "w.json.gz"))
        stats = rec.stop()
        doc = json.loads(gzip.decompress(open(os.path.join(out, "w.json.gz"), "rb").read()))
        ids = [e["args"]["i"] for e in doc["traceEvents"] if e.get("name") == "e"]
        noise = {len(e["args"]["noise"]) for e in doc["traceEvents"] if e.get("name") == "e"}
        w = doc["otherData"]["window"]
        print(json.dumps({"ids": [ids[0], ids[-1], len(ids)], "noise": sorted(noise), "window": w,
                          "dumped": info["events"], "dropped": stats.dropped, "written": stats.events_written}))
        """,
        str(pyscript.tmp_path / "runs"),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    first, last, count = got["ids"]
    w = got["window"]
    bound = 2 << 20
    assert got["dropped"] == 0, got  # the rings kept up: every event reached the window
    recorded = 250000 + 250000 // 500  # the instants and the counters, nothing else (no sampler)
    assert got["written"] == recorded, got
    # Every recorded event is kept or evicted, none lost or counted twice.
    assert w["events"] - w["open_spans"] + w["evicted_events"] == recorded, w
    assert w["evicted_events"] > 0 and w["evicted_blocks"] > 0, w
    # Contiguous and newest: nothing missing between first and last kept.
    assert count == last - first + 1 and last == 250000 - 1, got["ids"]
    # The bound: as the window reports it, and as the entropy of what it kept proves it.
    assert w["memory_bytes"] <= bound, w
    assert got["noise"] == [96], got["noise"]  # 48 random bytes as hex in every kept event
    assert count * 48 <= bound, (count, "events of 48 random bytes cannot fit in", bound)
    # ... and the window is not trivially small: it holds most of its bound.
    assert count * 48 > bound // 8, count
