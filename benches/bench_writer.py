"""Writer drain throughput and drops, side by side with a Composer-style
Python serializer, in one run.

1. Drain throughput on one core: 1.5M spans sit in a ring (flush interval
   far away, ring large enough that nothing drains early); ``stop()`` then
   drains, formats and gzips them on the writer thread. events/s = spans / stop time.
2. Peer: the same events as Python dicts through ``json.dumps`` +
   ``gzip.compress(level=1)`` (what Python profilers do at the end of a window).
3. Bursts at the default buffer size: one Python thread records spans as fast
   as it can (``with name:``), bursts of 100k..1M spans: drops per burst.
4. A sustained flood for 2 s: the rate the writer keeps up with, and drops.

Target (issue #2): >= 2M events/s into gzip on one core; no drops at the
default buffer for a single Python thread recording as fast as it can.

Run: python benches/bench_writer.py
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import time
import warnings

import fastprof
from _util import machine, verdict

SPANS = 1_500_000


def drain_throughput(tmp: str) -> tuple[float, float]:
    fwd = fastprof.name_id("forward")
    rec = fastprof.start(tmp, "drain", buffer_size=1 << 24, flush_interval=3600, sample_hz=0)
    begin, end = fwd.begin, fastprof.end
    for _ in range(SPANS):
        begin()
        end()
    t0 = time.perf_counter()
    stats = rec.stop()
    dt = time.perf_counter() - t0
    assert stats.dropped == 0 and stats.events_written == SPANS, stats
    return SPANS / dt, stats.bytes_compressed / SPANS


def python_peer(tmp: str) -> tuple[float, float]:
    pid, tid = os.getpid(), 1234
    t_start = time.perf_counter()
    events = [
        {"ph": "X", "cat": "user", "name": "forward", "pid": pid, "tid": tid, "ts": i * 0.1, "dur": 0.05}
        for i in range(SPANS)
    ]
    blob = gzip.compress(json.dumps({"traceEvents": events}).encode(), compresslevel=1)
    with open(os.path.join(tmp, "peer.json.gz"), "wb") as f:
        f.write(blob)
    dt = time.perf_counter() - t_start
    return SPANS / dt, len(blob) / SPANS


def burst(tmp: str, n: int) -> tuple[float, int, int]:
    fwd = fastprof.name_id("forward")
    rec = fastprof.start(tmp, f"burst{n}", sample_hz=0)
    t0 = time.perf_counter()
    for _ in range(n):
        with fwd:
            pass
    rate = n / (time.perf_counter() - t0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        stats = rec.stop()
    return rate, stats.events_written, stats.dropped


def flood(tmp: str, seconds: float) -> tuple[float, int, int]:
    fwd = fastprof.name_id("forward")
    rec = fastprof.start(tmp, "flood", sample_hz=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10_000):
            with fwd:
                pass
        n += 10_000
    rate = n / (time.perf_counter() - t0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        stats = rec.stop()
    return rate, n, stats.dropped


def main() -> None:
    print(f"machine: {machine()}\n")
    with tempfile.TemporaryDirectory() as tmp:
        fp_rate, fp_bytes = drain_throughput(tmp)
        py_rate, py_bytes = python_peer(tmp)
        print(f"drain {SPANS} spans -> gzip (level 1), one writer thread:")
        print(f"  fastprof writer            {fp_rate / 1e6:6.2f} M events/s  {fp_bytes:5.1f} B/event on disk")
        print(f"  Python json.dumps + gzip   {py_rate / 1e6:6.2f} M events/s  {py_bytes:5.1f} B/event on disk")
        print(f"  ratio fastprof / Python    {fp_rate / py_rate:6.1f}x")
        print(f"  target >= 2M events/s: {verdict(fp_rate >= 2e6)}\n")
        print("bursts, default buffer (1Mi events/thread), one thread, `with name:` as fast as it can:")
        all_clean = True
        for n in (100_000, 300_000, 1_000_000):
            rate, written, dropped = burst(tmp, n)
            all_clean &= dropped == 0
            print(f"  {n:>9} spans at {rate / 1e6:5.2f} M spans/s: written {written:>9}, dropped {dropped}")
        print(f"  no drops in bursts: {verdict(all_clean)}\n")
        rate, n, dropped = flood(tmp, 2.0)
        print(f"sustained 2 s flood at {rate / 1e6:.2f} M spans/s: {n} issued, {dropped} dropped ({dropped / n:.0%})")
        print("  (the writer keeps ~its drain rate; beyond it the ring fills and drops are counted, never blocking)")


if __name__ == "__main__":
    main()
