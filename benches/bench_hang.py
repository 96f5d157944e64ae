"""What the hang watchdog (issue #37) costs the training thread, per step.

The training thread's part is one relaxed atomic store per step (the core's step
heartbeat); the watchdog is a core thread that polls it every 0.25 s, and the hang
driver's Python helper thread wakes every 0.5 s (it takes the GIL briefly then).
This runs the same Profiler loop (no model, ``schedule="never"``, no sampler,
``memory_stats=False``) with the watchdog off (``FASTPROF_HANG_TIMEOUT=off``) and on
(the default rule), in interleaved rounds, and prints the training thread's CPU time
and the wall time per step of each, best of the rounds, and their difference.

Run: .venv/bin/python benches/bench_hang.py [--steps 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import fastprof
from _util import machine


def loop(out: str, steps: int, hang: str) -> tuple[float, float]:
    """(wall s, training-thread CPU s) of ``steps`` Profiler steps."""
    os.environ["FASTPROF_HANG_TIMEOUT"] = hang
    data = list(range(steps))
    prof = fastprof.Profiler(
        out_dir=out, run_name=f"h{hang}-{time.monotonic_ns()}", schedule="never", memory_stats=False, sample_hz=0
    )
    with prof:
        c0, t0 = time.thread_time(), time.perf_counter()
        for _ in prof.loader(data):
            prof.step()
        t1, c1 = time.perf_counter(), time.thread_time()
    return t1 - t0, c1 - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    res: dict[str, list[tuple[float, float]]] = {"off": [], "auto": []}
    with tempfile.TemporaryDirectory() as out:
        loop(out, 1000, "off")  # warm-up: imports, the first Profiler
        for r in range(a.rounds):
            for case in ["off", "auto"] if r % 2 == 0 else ["auto", "off"]:
                res[case].append(loop(out, a.steps, case))
    print(f"machine: {machine()}")
    print(f"{a.steps} steps x {a.rounds} rounds; best round, per step")
    best = {}
    for case, xs in res.items():
        wall = min(w for w, _ in xs) / a.steps * 1e9
        cpu = min(c for _, c in xs) / a.steps * 1e9
        best[case] = (wall, cpu)
        print(f"  watchdog {case:4}: {cpu:8.1f} ns CPU   {wall:8.1f} ns wall")
    print(
        f"  difference (on - off): {best['auto'][1] - best['off'][1]:+.1f} ns CPU, "
        f"{best['auto'][0] - best['off'][0]:+.1f} ns wall per step"
    )


if __name__ == "__main__":
    main()
