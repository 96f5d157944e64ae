"""Does fastprof make rank 0 late? (issue #36, item 2)

A real 2-rank ``torchrun`` job (gloo, CPU, DDP) with one ``all_reduce`` of the
loss per step, run without fastprof and with ``fastprof.Profiler`` (defaults,
and with one part at a time turned off), in interleaved rounds. Each rank
stamps CLOCK_MONOTONIC (one clock for both processes on one host) just before
``loss.backward()`` (DDP's gradient all-reduce holds the ranks together inside
backward) and just before the loss's ``all_reduce``: its arrival at the two
sync points of every step. Printed per mode: at how many sync points rank 0
arrived last, and rank 0's median and mean lead over rank 1 (positive: rank 0
later), warm-up steps left out; and the same for each rank's *own time* before
each point (its arrival less its release from the sync point before), which
is what fastprof's own work on a rank would lengthen.

    .venv/bin/python benches/bench_rank0_arrival.py [--steps 400] [--rounds 3] [--modes off,on,...]

Modes: ``off`` (no fastprof), ``on`` (Profiler defaults: sampler, anatomy,
triggers, merge), ``on-sample0`` (sample_hz=0), ``on-notriggers``,
``on-noanatomy``, ``on-nomerge``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _util import machine

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    mode, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class Data(Dataset):
        def __len__(self):
            return 4 * steps
        def __getitem__(self, i):
            return torch.randn(32), i % 4

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Data(), batch_size=4)
    bw, bw_end, ar, ar_end = [], [], [], []
    clock = time.monotonic_ns

    def loop(step):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            bw.append(clock())
            loss.backward()
            bw_end.append(clock())
            opt.step()
            opt.zero_grad()
            ar.append(clock())
            dist.all_reduce(loss.detach())
            ar_end.append(clock())
            step()

    if mode == "off":
        loop(lambda: None)
    else:
        import fastprof
        opts = {
            "on": {},
            "on-sample0": {"sample_hz": 0},
            "on-notriggers": {"triggers": False},
            "on-noanatomy": {"anatomy": False},
            "on-nomerge": {"merge": False},
        }[mode]
        prof = fastprof.Profiler(out_dir=os.path.join(out, "runs"), run_name="job", **opts)
        with prof:
            loader = prof.loader(loader)
            loop(prof.step)
    with open(os.path.join(out, f"arrivals{rank}.json"), "w") as f:
        json.dump({"backward": bw, "backward_end": bw_end, "all_reduce": ar, "all_reduce_end": ar_end}, f)
    dist.barrier()
    dist.destroy_process_group()
    """
)

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_once(worker: Path, mode: str, steps: int, out: Path) -> dict[str, list[int]]:
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_") and k not in TORCHRUN_VARS}
    env.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(_port()), str(worker), mode, str(out), str(steps)]
    for attempt in range(3):  # gloo on a loaded host now and then aborts a rank at start; counted
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        if not r.returncode:
            break
        print(f"  {mode}: torchrun failed ({r.returncode}), attempt {attempt + 1}: {r.stderr.strip()[:200]!r}")
        shutil.rmtree(out)
        out.mkdir(parents=True)
        cmd[cmd.index("--master-port") + 1] = str(_port())
    else:
        raise SystemExit(f"{mode}: torchrun failed ({r.returncode})\n{r.stderr[-3000:]}")
    got = [json.loads((out / f"arrivals{k}.json").read_text()) for k in (0, 1)]
    lead = {p: [a - b for a, b in zip(got[0][p], got[1][p], strict=True)] for p in ("backward", "all_reduce")}
    # Own time: arrival less this rank's release from the sync point before
    # (the all-reduce of the step before; backward), the rank's own work.
    own = [
        {
            "backward": [b - e for b, e in zip(g["backward"][1:], g["all_reduce_end"][:-1], strict=True)],
            "all_reduce": [a - e for a, e in zip(g["all_reduce"], g["backward_end"], strict=True)],
        }
        for g in got
    ]
    for p in ("backward", "all_reduce"):
        lead["own " + p] = [a - b for a, b in zip(own[0][p], own[1][p], strict=True)]
    return lead


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--modes", default="off,on,on-sample0,on-notriggers,on-noanatomy")
    args = ap.parse_args()
    modes = args.modes.split(",")
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}")
    print(
        f"2-rank torchrun, gloo, DDP MLP, {args.steps} steps, {args.warmup} warm-up steps left out, "
        f"{args.rounds} rounds"
    )
    kinds = ("backward", "all_reduce", "own backward", "own all_reduce")
    leads: dict[str, dict[str, list[list[int]]]] = {m: {k: [] for k in kinds} for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp) / "worker.py"
        worker.write_text(WORKER)
        for r in range(args.rounds):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                got = run_once(worker, mode, args.steps, Path(tmp) / f"{mode}-{r}")
                for point, d in got.items():
                    leads[mode][point].append(d[args.warmup :])
    print()
    print("lead: rank 0's arrival less rank 1's; own: each rank's arrival less its release from the point before")
    print(f"{'mode':<15} {'sync point':<15} {'rank 0 later (per round)':<26} {'lead p50 us':>12} {'lead mean us':>13}")
    for mode in modes:
        for point in kinds:
            runs = leads[mode][point]
            shares = " ".join(f"{100 * sum(x > 0 for x in d) / len(d):3.0f}%" for d in runs)
            flat = [x for d in runs for x in d]
            print(
                f"{mode:<15} {point:<15} {shares:<26} {statistics.median(flat) / 1e3:12.1f} "
                f"{statistics.fmean(flat) / 1e3:13.1f}"
            )


if __name__ == "__main__":
    main()
