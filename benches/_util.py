"""Shared helpers for the benchmarks: interleaved timing and ratio tables."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable


def machine() -> str:
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except ImportError:
        gpu = "no GPU (torch not installed)"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        cpu = platform.processor() or "?"
    import os

    return f"{cpu}, {os.cpu_count()} CPUs, {gpu}, Python {platform.python_version()}"


def interleaved(cases: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Run every case once per round, in rotating order; seconds per run."""
    out: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            cases[name]()
            out[name].append(time.perf_counter() - t0)
    return out


def interleaved_cpu(
    cases: dict[str, Callable[[], None]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """As :func:`interleaved`, with the calling thread's CPU time beside the
    wall time (seconds per run each). The thread's CPU time is what the
    training thread pays: on a loaded machine it does not count the time
    other processes held the core, which wall time does."""
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            c0, t0 = time.thread_time(), time.perf_counter()
            cases[name]()
            t1, c1 = time.perf_counter(), time.thread_time()
            wall[name].append(t1 - t0)
            cpu[name].append(c1 - c0)
    return wall, cpu


def best(xs: list[float]) -> float:
    return min(xs)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


#: A long run on one rank, recorded by the real Profiler with three spans a
#: step and paced so that the rings never fill (the writer drains every
#: 50 ms): ``python -c PACED_RUN STEPS OUT [SUMMARY [SEGMENT_SIZE]]``, SUMMARY
#: "1" or "0" for ``rank_summary`` ("-" or absent: the Profiler's default),
#: SEGMENT_SIZE 0 or absent for the default.
PACED_RUN = """
import sys, time, fastprof
steps, out = int(sys.argv[1]), sys.argv[2]
opts = {}
if len(sys.argv) > 3 and sys.argv[3] in ("0", "1"):
    opts["rank_summary"] = sys.argv[3] == "1"
if len(sys.argv) > 4 and int(sys.argv[4]):
    opts["segment_size"] = int(sys.argv[4])
prof = fastprof.Profiler(out, "run", torch=False, sample_hz=0, flush_interval=0.05, **opts)
with prof:
    for i, _ in enumerate(prof.loader(range(steps))):
        with fastprof.span("forward"):
            pass
        with fastprof.span("backward"):
            pass
        with fastprof.span("optimizer"):
            pass
        prof.step()
        if i % 2000 == 1999:
            time.sleep(0.002)  # pace: the writer drains every 50 ms, rings never fill
"""

#: Run a command (argv[2:]) and write "wall_s cpu_s peak_rss_bytes exit_code"
#: to argv[1] (its CPU and peak from ``wait4``).
SPAWN = """
import os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[2:])
_, status, ru = os.wait4(p.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{time.perf_counter() - t0} {ru.ru_utime + ru.ru_stime} {ru.ru_maxrss * 1024} "
            f"{os.waitstatus_to_exitcode(status)}")
"""
