"""Training-loop overhead: the demo's CNN on synthetic data, interleaved A/B
blocks in one run.

Variants, each with the same model, data and step:
  * baseline: no instrumentation;
  * fastprof: a recorder running, spans around step/data/forward/backward/optimizer
    and a loss counter (exactly what ``fastprof demo`` records);
  * record_function: the same spans as ``torch.profiler.record_function``
    with no profiler active (what Lightning's and Composer's markers cost at best);
  * Python marker: the same spans as a Composer-style pure-Python marker.
Blocks of BLOCK steps rotate through the variants until each has STEPS steps;
the overhead is the ratio of median step times against the baseline.

Target (issue #2): fastprof <= 1% step-time overhead.

Run: python benches/bench_training.py [--steps 400] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import fastprof
from _util import machine, verdict
from fastprof.cli.workloads import make_workload, require_torch

BLOCK = 20
NAMES = ("step", "data", "forward", "backward", "optimizer_step")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400, help="steps per variant (default 400)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch = require_torch()
    w = make_workload(batch_size=32, device=args.device)
    sync = torch.cuda.synchronize if w.device.type == "cuda" else (lambda: None)

    fp_names = [fastprof.name_id(n) for n in NAMES]
    rf = torch.profiler.record_function
    events: list[tuple[str, str, int, int]] = []

    class Marker(AbstractContextManager[None]):
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            events.append((self.name, "B", time.time_ns(), threading.get_ident()))

        def __exit__(self, *a: object) -> None:
            events.append((self.name, "E", time.time_ns(), threading.get_ident()))

    null = nullcontext()
    variants: dict[str, Callable[[str], Any]] = {
        "baseline": lambda n: null,
        "fastprof": lambda n: fp_names[NAMES.index(n)],
        "record_function": lambda n: rf(n),
        "Python marker": lambda n: Marker(n),
    }
    counters = {"fastprof": lambda v: fastprof.counter("loss", v)}
    times: dict[str, list[float]] = {k: [] for k in variants}

    def run_block(variant: str, i0: int) -> None:
        ctx = variants[variant]
        count = counters.get(variant)
        for i in range(i0, i0 + BLOCK):
            t0 = time.perf_counter()
            with ctx("step"):
                with ctx("data"):
                    x, y = w.batches[i % len(w.batches)]
                    x, y = x.to(w.device), y.to(w.device)
                with ctx("forward"):
                    loss = w.loss_fn(w.model(x), y)
                with ctx("backward"):
                    w.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with ctx("optimizer_step"):
                    w.optimizer.step()
                sync()
            if count is not None:
                count(float(loss.detach()))
            else:
                float(loss.detach())
            times[variant].append(time.perf_counter() - t0)
        events.clear()

    for i in range(3 * BLOCK):  # warm-up: allocator, kernels, caches
        run_block("baseline", i)
    times["baseline"].clear()

    names = list(variants)
    with tempfile.TemporaryDirectory() as tmp:
        rec = fastprof.start(tmp, "bench-training")
        step, r = 0, 0
        while len(times["baseline"]) < args.steps:
            order = names[r % len(names) :] + names[: r % len(names)]
            for v in order:
                run_block(v, step)
            step += BLOCK
            r += 1
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            stats = rec.stop()

    base = statistics.median(times["baseline"])
    print(f"machine: {machine()}; torch {torch.__version__}, {torch.get_num_threads()} threads, device {w.device}")
    print(f"{args.steps} steps per variant in interleaved blocks of {BLOCK}; median step time\n")
    for v, ts in times.items():
        med = statistics.median(ts)
        print(f"  {v:<16} {med * 1e3:8.3f} ms   overhead {100 * (med / base - 1):+6.2f}%")
    fp = statistics.median(times["fastprof"]) / base - 1
    print(f"\nfastprof overhead {100 * fp:+.2f}% (target <= 1%): {verdict(fp <= 0.01)}")
    print(f"fastprof wrote {stats.events_written} events, dropped {stats.dropped}")


if __name__ == "__main__":
    main()
