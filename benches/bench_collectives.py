"""What the collectives' wavefront costs the training thread (issue #37,
item 1): the anatomy's record of each collective a rank enters and
completes (op and sequence number per process group), for the hang
diagnosis. Goal: <= 0.3 µs of training-thread CPU per collective. (The
job's call site is not looked up per call: reading the caller's frame cost
~0.2 µs more; a stuck rank's line is in its evidence's stack.)

A one-rank gloo group, ``all_reduce`` of one float from one line of the
loop, the Profiler's anatomy on; interleaved rounds of the same loop with
the wavefront's record on and with it replaced by no-ops (the rest of the
anatomy's wrapper is the same in both), training-thread CPU time. gloo's
own ~30 µs a call varies by more than the record costs on a loaded VM, so
``--stand-in`` (the default) times a do-nothing function put in
``torch.distributed.all_reduce``'s place before the Profiler wraps it: the
same wrapper and record, without gloo's noise (``--gloo`` for the real one).

    .venv/bin/python benches/bench_collectives.py [--calls 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

import fastprof
from _util import machine
from fastprof.profiler import anatomy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000, help="collectives per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--gloo", action="store_true", help="time gloo's all_reduce, not a stand-in")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(1)
    if not args.gloo:

        def all_reduce(tensor: torch.Tensor, op: object = None, group: object = None, async_op: bool = False) -> None:
            return None

        dist.all_reduce = all_reduce  # type: ignore[assignment]

    def off() -> None:
        anatomy.WAVEFRONT = False

    def on() -> None:
        anatomy.WAVEFRONT = True

    cpu: dict[str, list[float]] = {"record on": [], "record off": []}
    prof = fastprof.Profiler(tempfile.mkdtemp(prefix="bench-coll-"), "r", torch=False, sample_hz=0, merge=False)
    with prof:
        for _ in range(200):
            dist.all_reduce(t)
        for _ in range(args.rounds):
            for name, setup in (("record on", on), ("record off", off)):
                setup()
                t0 = time.thread_time()
                for _ in range(args.calls):
                    dist.all_reduce(t)
                cpu[name].append((time.thread_time() - t0) / args.calls)
        on()
    dist.destroy_process_group()
    what = "gloo's all_reduce" if args.gloo else "a do-nothing all_reduce (one-rank gloo group)"
    print(f"machine: {machine()}, torch {torch.__version__}; {what}, the anatomy on")
    for name, v in cpu.items():
        print(f"  {name:10s} {min(v) * 1e6:8.2f} µs/collective best, {statistics.median(v) * 1e6:8.2f} median")
    best = min(cpu["record on"]) - min(cpu["record off"])
    med = statistics.median(cpu["record on"]) - statistics.median(cpu["record off"])
    print(
        f"  the wavefront's record: {best * 1e6:+.3f} µs/collective best ({med * 1e6:+.3f} medians)  "
        f"target <= 0.3 µs  {'PASS' if best <= 0.3e-6 else 'MISS'}"
    )


if __name__ == "__main__":
    main()
