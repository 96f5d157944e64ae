"""A verdict matrix (issue #36, item 6): does fastprof cry wolf, and does it
find what is there?

Real jobs, each run N times, in classes of situations; for each run the bench
reads what fastprof concluded from its own files (``rank*/triggers.json``:
anomalies with their cause, anomaly captures and flight dumps; report.json,
written by ``fastprof.report``: ``anatomy.stragglers[]`` and
``anatomy.ranks_in_pace``) and prints per class the runs with a false alarm
and the runs in which the real thing was found. Run it beside a CPU hog
(``python -c 'while 1: pass' &``): that is the host a shared node gives.

Classes (one process unless said; multi-rank classes are ``torchrun`` with
gloo, DDP and one ``all_reduce`` of the loss a step, Profiler defaults):

- ``steady``: a steady loop. Nothing to find.
- ``host_burst``: the job pinned to CPU 0; at the middle step three spinning
  processes, pinned to CPU 0 and started beforehand, are let go for 0.4 s.
  Found: a slow step in the burst called host contention.
- ``slow_work`` / ``slow_batch``: the job's own slow step at the middle step
  (30x a step's work in forward; the batch's collate sleeps 0.2 s).
  Found: an anomaly at that step, the job's, captured (on the slow rank,
  rank 0 in one process).
- ``slow_collective`` (2 ranks): rank 1 sleeps 0.2 s before the loss's
  all-reduce at the middle step, so rank 0 waits in the collective. Found:
  rank 1's anomaly at that step, the job's, captured (rank 0's is a wait for
  another rank: recorded, not captured). One slow step is not a straggler: a
  rank named is a false straggler.
- ``no_slow`` (2 ranks): nothing to find.
- ``slow_dataloader`` / ``slow_forward`` / ``slow_backward`` /
  ``slow_optimizer`` (2 ranks): rank 1 sleeps ``--delay`` a step in that
  phase (collate; a module's forward; an autograd function's backward; the
  optimizer's step). Found: rank 1 named, with that phase, and no other.
- ``one_in_four`` (4 ranks): rank 2 slow in forward. Found: rank 2 alone.
- ``intermittent`` (2 ranks): rank 1 sleeps 4x ``--delay`` in forward every
  4th step. Found: rank 1 named. Its slow steps are the job's, so anomaly
  captures at them are not false.
- ``two_slow`` (4 ranks): ranks 1 and 2 slow in forward. Found: both, only.

False alarms: an anomaly capture or an anomaly's flight dump for a step the
job did not slow (in every class but the injected slow steps, +-1 step); a
straggler named that was not slow. Goal: none in any run; every real one
found.

    .venv/bin/python benches/bench_verdicts.py [--runs 3] [--classes steady,no_slow,...] [--out matrix.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import fastprof
from _util import machine

WORKER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    cls, out, steps, slow, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
    slow = {int(r) for r in slow.split(",") if r}
    hogs = []
    if cls == "host_burst":
        # Pinned before torch starts a thread: every thread of the job inherits CPU 0.
        os.sched_setaffinity(0, {0})
        spin = "import sys, time\\nsys.stdin.read(1)\\nt = time.time() + 0.4\\nwhile time.time() < t: pass"
        hogs = [subprocess.Popen([sys.executable, "-S", "-c", spin], stdin=subprocess.PIPE) for _ in range(3)]
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mid = steps // 2
    state = {"step": 0}

    def slowed(phase):
        # This rank's delay in ``phase`` at this step, in seconds.
        s = state["step"]
        if cls == "slow_" + phase and rank in slow:
            return delay
        if cls in ("one_in_four", "two_slow") and phase == "forward" and rank in slow:
            return delay
        if cls == "intermittent" and phase == "forward" and rank in slow and s % 4 == 0:
            return 4 * delay
        return 0.0

    class Data(Dataset):
        def __len__(self):
            return 8 * steps
        def __getitem__(self, i):
            return torch.randn(64), i % 4

    def collate(items):
        d = slowed("dataloader")
        if cls == "slow_batch" and state["step"] == mid:
            d = 0.2
        if d:
            time.sleep(d)
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])

    work = torch.randn(256, 256)

    class Slow(torch.nn.Module):
        def forward(self, x):
            d = slowed("forward")
            if d:
                time.sleep(d)
            if cls == "slow_work" and state["step"] == mid:
                for _ in range(30):  # the job's own work: ~30x a step's
                    work @ work
            return x

    class SlowGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)
        @staticmethod
        def backward(ctx, g):
            d = slowed("backward")
            if d:
                time.sleep(d)
            return g

    class SlowBackward(torch.nn.Module):
        def forward(self, x):
            return SlowGrad.apply(x)

    class SGD(torch.optim.SGD):
        def step(self, closure=None):
            d = slowed("optimizer")
            if d:
                time.sleep(d)
            return super().step(closure)

    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), SlowBackward(), torch.nn.ReLU(), Slow(), torch.nn.Linear(256, 4))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = SGD(model.parameters(), lr=0.01)
    prof = fastprof.Profiler(out_dir=out, run_name="job", merge_timeout=120)
    with prof:
        for x, y in prof.loader(DataLoader(Data(), batch_size=8, collate_fn=collate)):
            if hogs and state["step"] == mid:
                for h in hogs:  # the host takes CPU 0 for 0.4 s
                    h.stdin.write(b"x")
                    h.stdin.flush()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if distributed:
                if cls == "slow_collective" and rank in slow and state["step"] == mid:
                    time.sleep(0.2)
                dist.all_reduce(loss.detach())
            prof.step()
            state["step"] += 1
            if state["step"] >= steps:
                break
    for h in hogs:
        h.wait()
    if distributed:
        dist.destroy_process_group()
    """
)


@dataclass(frozen=True)
class Case:
    """A class of situations: how to run it and what there is to find."""

    name: str
    nproc: int = 1  # 1: a plain process; more: torchrun
    slow: tuple[int, ...] = ()  # the slow ranks
    steps: int = 300
    #: What counts as found: "contention" (a slow step in the burst called the
    #: host's), "anomaly" (the job's slow step captured), "straggler" (exactly
    #: ``slow`` named), or "" (nothing to find).
    find: str = ""
    #: Steps the job slowed (a capture there is not false): "mid", "every4", "".
    slowed: str = ""
    #: The phase a straggler must be named with ("": any).
    phase: str = ""


CASES = {
    c.name: c
    for c in (
        Case("steady"),
        Case("host_burst", find="contention"),
        Case("slow_work", find="anomaly", slowed="mid"),
        Case("slow_batch", find="anomaly", slowed="mid"),
        Case("slow_collective", nproc=2, slow=(1,), steps=120, find="anomaly", slowed="mid"),
        Case("no_slow", nproc=2, steps=120),
        Case("slow_dataloader", nproc=2, slow=(1,), steps=120, find="straggler", phase="dataloader"),
        Case("slow_forward", nproc=2, slow=(1,), steps=120, find="straggler", phase="forward"),
        Case("slow_backward", nproc=2, slow=(1,), steps=120, find="straggler", phase="backward"),
        Case("slow_optimizer", nproc=2, slow=(1,), steps=120, find="straggler", phase="optimizer"),
        Case("one_in_four", nproc=4, slow=(2,), steps=80, find="straggler", phase="forward"),
        Case("intermittent", nproc=2, slow=(1,), steps=120, find="straggler", slowed="every4"),
        Case("two_slow", nproc=4, slow=(1, 2), steps=80, find="straggler", phase="forward"),
    )
}

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(worker: Path, case: Case, out: Path, delay: float, steps: int) -> None:
    """The job, to its end; a torchrun that gloo aborts at start on a loaded
    host is retried (twice), as benches/bench_rank0_arrival.py does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_") and k not in TORCHRUN_VARS}
    env.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    args = [str(worker), case.name, str(out), str(steps), ",".join(map(str, case.slow)), str(delay)]
    for attempt in range(3):
        cmd = [sys.executable, *args]
        if case.nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(case.nproc)]
            cmd += ["--master-addr", "127.0.0.1", "--master-port", str(_port()), *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if not r.returncode:
            return
        print(f"  {case.name}: job failed ({r.returncode}), attempt {attempt + 1}: {r.stderr.strip()[-300:]!r}")
        shutil.rmtree(out, ignore_errors=True)
    raise SystemExit(f"{case.name}: job failed ({r.returncode})\n{r.stderr[-3000:]}")


def _slowed_steps(case: Case, steps: int) -> set[int]:
    if case.slowed == "mid":
        return {steps // 2}
    if case.slowed == "every4":
        return set(range(0, steps, 4))
    return set()


def _near(step: int, steps: set[int]) -> bool:
    return any(abs(step - s) <= 1 for s in steps)


@dataclass
class Verdict:
    """What fastprof concluded in one run, and how it scores."""

    anomaly_captures: list[tuple[int, int]] = field(default_factory=list)  # (rank, anomaly step)
    flight_dumps: list[tuple[int, int]] = field(default_factory=list)  # (rank, anomaly step)
    contention_steps: int = 0
    other_rank_steps: int = 0  # slow steps that waited for another rank
    job_anomalies: list[tuple[int, int, str]] = field(default_factory=list)  # (rank, step, action)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    ranks_in_pace: dict[str, Any] | None = None
    false_captures: int = 0
    false_dumps: int = 0
    false_stragglers: list[int] = field(default_factory=list)
    found: bool | None = None
    said: str = ""


def read_verdict(case: Case, run: Path, rep: Path, steps: int) -> Verdict:
    """Read the run's triggers.json files and its report.json (made here with
    ``fastprof.report``) with Python's json, and score them."""
    v = Verdict()
    mid = steps // 2
    slowed = _slowed_steps(case, steps)
    found_contention = found_anomaly = False
    for rank in range(case.nproc):
        trig = json.loads((run / f"rank{rank}" / "triggers.json").read_text())
        by_seq = {r.get("seq"): r.get("anomaly_step") for r in trig["requests"] if r.get("source") == "anomaly"}
        for c in trig["captures"]:
            if c["source"] == "anomaly":
                v.anomaly_captures.append((rank, by_seq.get(c["seq"], c["first_step"] - 1)))
        for d in trig["flight_dumps"]:
            if d["reason"] == "anomaly":
                v.flight_dumps.append((rank, by_seq.get(d["seq"], d["step"] - 1)))
        for a in trig["anomalies"]:
            if a.get("cause") == "host contention":
                v.contention_steps += 1
                found_contention |= rank == 0 and mid <= a["step"] <= mid + 60
            elif a.get("cause") == "another rank":
                v.other_rank_steps += 1
            else:
                v.job_anomalies.append((rank, a["step"], a["action"]))
                late = rank in (case.slow or (0,))  # the rank that slowed the step
                found_anomaly |= late and abs(a["step"] - mid) <= 1 and a["action"] == "captured"
    v.false_captures = sum(not _near(s, slowed) for _, s in v.anomaly_captures)
    v.false_dumps = sum(not _near(s, slowed) for _, s in v.flight_dumps)
    if case.nproc > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fastprof.report(run, out_dir=rep, formats=("json",))
        anatomy = json.loads((rep / "report.json").read_text())["anatomy"] or {}
        v.stragglers = anatomy.get("stragglers") or []
        v.ranks_in_pace = anatomy.get("ranks_in_pace")
        named = [s["rank"] for s in v.stragglers]
        v.false_stragglers = [r for r in named if r not in case.slow or case.find != "straggler"]
        if v.stragglers:
            v.said = "; ".join(
                f"rank {s['rank']} {s['phase']} {s['excess_per_step_ns'] / 1e6:.2f} ms/step "
                f"{100 * s['wait_caused_share']:.0f}%"
                for s in v.stragglers
            )
        elif v.ranks_in_pace and v.ranks_in_pace.get("most_behind"):
            mb = v.ranks_in_pace["most_behind"]
            v.said = (
                f"in pace (jitter {v.ranks_in_pace['jitter_ns'] / 1e3:.0f} us; most behind rank {mb['rank']}, "
                f"{100 * mb['cost_share']:.1f}%)"
            )
    if case.find == "contention":
        v.found = found_contention
    elif case.find == "anomaly":
        v.found = found_anomaly
    elif case.find == "straggler":
        v.found = sorted(s["rank"] for s in v.stragglers) == sorted(case.slow) and all(
            not case.phase or s["phase"] == case.phase for s in v.stragglers
        )
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs per class")
    ap.add_argument("--classes", default=",".join(CASES), help="comma-separated: " + ",".join(CASES))
    ap.add_argument("--delay", type=float, default=0.006, help="a slow rank's sleep a step, seconds")
    ap.add_argument("--steps-scale", type=float, default=1.0, help="scale every class's steps (a quick run: 0.5)")
    ap.add_argument("--out", type=Path, help="write the matrix as JSON here")
    ap.add_argument("--keep", type=Path, help="keep the run directories here")
    ap.add_argument(
        "--rescore",
        action="store_true",
        help="run nothing: score the runs kept in --keep again with this checkout's report (a changed rule)",
    )
    a = ap.parse_args()
    cases = [CASES[c] for c in a.classes.split(",")]
    if a.rescore and not a.keep:
        ap.error("--rescore reads the runs kept in --keep")
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}")
    results: dict[str, list[Verdict]] = {c.name: [] for c in cases}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        worker = root / "worker.py"
        root.mkdir(parents=True, exist_ok=True)
        worker.write_text(WORKER)
        for r in range(a.runs):
            for case in cases:
                steps = max(40, int(case.steps * a.steps_scale))
                out = root / f"{case.name}-{r}"
                if a.rescore:
                    shutil.rmtree(out / "report", ignore_errors=True)
                else:
                    launch(worker, case, out, a.delay, steps)
                v = read_verdict(case, out / "job", out / "report", steps)
                results[case.name].append(v)
                print(
                    f"  run {r + 1} {case.name:<16} captures {v.anomaly_captures} dumps {v.flight_dumps} "
                    f"contention {v.contention_steps} another rank {v.other_rank_steps} "
                    f"job anomalies {v.job_anomalies[:4]} "
                    f"found {v.found} {v.said}",
                    flush=True,
                )
    elapsed = time.monotonic() - t0
    print(f"\n{a.runs} run(s) a class, {elapsed:.0f} s; load average {os.getloadavg()[0]:.2f}")
    print("goal: no false anomaly capture, flight dump or straggler in any run; every real one found\n")
    head = f"{'class':<16} {'ranks':>5} {'false captures':>15} {'false dumps':>12} "
    head += f"{'false stragglers':>17} {'found':>7}"
    print(head + "  what fastprof said (last run)")
    rows = []
    for case in cases:
        vs = results[case.name]
        n = len(vs)
        fc = sum(v.false_captures > 0 for v in vs)
        fd = sum(v.false_dumps > 0 for v in vs)
        fs = sum(bool(v.false_stragglers) for v in vs) if case.nproc > 1 else None
        found = sum(bool(v.found) for v in vs) if case.find else None
        last = vs[-1]
        said = last.said or (
            f"{last.contention_steps} contention steps; job anomalies at {[s for _, s, _ in last.job_anomalies][:4]}"
        )
        print(
            f"{case.name:<16} {case.nproc:>5} {f'{fc}/{n}':>15} {f'{fd}/{n}':>12} "
            f"{'-' if fs is None else f'{fs}/{n}':>17} {'-' if found is None else f'{found}/{n}':>7}  {said}"
        )
        rows.append(
            {
                "class": case.name,
                "ranks": case.nproc,
                "runs": n,
                "false_capture_runs": fc,
                "false_dump_runs": fd,
                "false_straggler_runs": fs,
                "found_runs": found,
                "goal_met": fc == 0 and fd == 0 and not fs and (found is None or found == n),
                "per_run": [
                    {
                        "anomaly_captures": v.anomaly_captures,
                        "flight_dumps": v.flight_dumps,
                        "contention_steps": v.contention_steps,
                        "other_rank_steps": v.other_rank_steps,
                        "job_anomalies": v.job_anomalies,
                        "stragglers": [s["rank"] for s in v.stragglers],
                        "ranks_in_pace": v.ranks_in_pace,
                        "found": v.found,
                        "said": v.said,
                    }
                    for v in vs
                ],
            }
        )
    if a.out:
        a.out.write_text(json.dumps({"machine": machine(), "runs": a.runs, "seconds": elapsed, "classes": rows}))


if __name__ == "__main__":
    main()
