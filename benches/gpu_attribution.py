"""Where the always-on Profiler's cost on a real CUDA step comes from: each
part on its own (the bare step loop, per-step memory statistics, the
anatomy, the sampler with and without NVML) against no fastprof,
interleaved rounds, per-step wall time (synchronised) and the training
thread's CPU time per step. Runs on the CPU too (a tiny step, no verdict).

    python benches/gpu_attribution.py [--rounds 6] [--steps 30] [--out attribution.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

import fastprof
from fastprof.profiler import anatomy as anatomy_mod
from fastprof.profiler.drivers.anatomy import AnatomyDriver
from gpu_check import transformer_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default="attribution.json")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    small = dev == "cpu"
    step = transformer_step(torch, dev, batch=4 if small else 16, seq=32 if small else 128, width=64 if small else 256)

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    for _ in range(10):
        step()
    sync()
    base = dict(schedule="never", merge=False, sync_clocks=False)
    bare = dict(base, anatomy=False, memory_stats=False, sample_hz=0)
    configs: dict[str, dict | None] = {
        "none": None,
        "bare loop": bare,
        "+memory_stats": dict(bare, memory_stats=True),
        "+anatomy": dict(bare, anatomy=True),
        "+anatomy, no CUDA events": dict(bare, anatomy=True),
        "+anatomy, events every step": dict(bare, anatomy=True),
        "+triggers": dict(bare, triggers=True),
        "+sampler 10Hz host": dict(bare, sample_hz=10, sample_gpus="none"),
        "+sampler 10Hz nvml": dict(bare, sample_hz=10),
        "+sampler 100Hz nvml": dict(bare, sample_hz=100),
        "defaults (never)": dict(base),
    }
    tmp = Path(tempfile.mkdtemp(prefix="attribution-"))
    budget = anatomy_mod.GPU_BUDGET_FACTOR
    status: dict[str, str | None] = {}
    wall: dict[str, list[float]] = {k: [] for k in configs}
    cpu: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(configs)[::-1]
        for name in order:
            kw = configs[name]
            run = f"r{r}-{name.replace(' ', '_').replace('+', '')}"
            # The anatomy's CUDA events: off by its environment switch, or every step (no budget).
            os.environ["FASTPROF_ANATOMY_GPU"] = "0" if name == "+anatomy, no CUDA events" else "1"
            anatomy_mod.GPU_BUDGET_FACTOR = 0 if name == "+anatomy, events every step" else budget
            p = fastprof.Profiler(out_dir=tmp, run_name=run, **kw).start() if kw else None
            ts, cs = [], []
            for _ in range(args.steps):
                t0, c0 = time.perf_counter(), time.thread_time()
                step()
                if p is not None:
                    p.step()
                sync()
                ts.append(time.perf_counter() - t0)
                cs.append(time.thread_time() - c0)
            if p is not None:
                p.stop()
                d = p._driver(AnatomyDriver)  # the anatomy is a driver of the Profiler (#35)
                status[name] = None if d is None else d.anatomy.gpu_status
            wall[name].append(statistics.median(ts))
            cpu[name].append(statistics.median(cs))
    b, bc = statistics.median(wall["none"]), statistics.median(cpu["none"])
    res: dict = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "configs": {}}
    print(f"device: {res['device']}; median of {args.rounds} interleaved rounds of {args.steps} steps")
    for k in configs:
        w, c = statistics.median(wall[k]), statistics.median(cpu[k])
        res["configs"][k] = {
            "step_ms": w * 1e3,
            "vs_none_pct": 100 * (w / b - 1),
            "cpu_ms": c * 1e3,
            "cpu_vs_none_pct": 100 * (c / bc - 1),
            "rounds_ms": [round(x * 1e3, 3) for x in wall[k]],
            "anatomy_gpu": status.get(k),
        }
        line = f"{k:28s} {w * 1e3:8.3f} ms {100 * (w / b - 1):+6.2f}%"
        print(f"{line}   cpu {c * 1e3:8.3f} ms {100 * (c / bc - 1):+6.2f}%   {status.get(k) or ''}")
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
