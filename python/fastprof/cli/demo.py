"""``fastprof demo``: profile a short training run of a small CNN on
synthetic CIFAR-shaped data (CPU, or the GPU when there is one), with spans
around data, forward, backward and the optimizer step, and print where the
trace is and how to open it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import fastprof
from fastprof.workloads import make_workload, require_torch

#: The span names the demo records once per step, in order.
STEP_SPANS = ("data", "forward", "backward", "optimizer_step")


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "demo",
        help="profile a short CNN training on synthetic data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-o", "--out-dir", default=None, help="parent of the run directory (default: fastprof_runs)")
    p.add_argument("--run-name", default=None, help="run directory name (default: run-<timestamp>)")
    p.add_argument("--steps", type=int, default=100, help="training steps (default: 100)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default: 32)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the trace location")
    p.set_defaults(run=run)


def resolve_device(name: str | None) -> Any:
    """The torch device to train on, checked before anything is recorded: a
    name torch does not know, a device type other than cpu/cuda, or cuda
    where there is no usable GPU is a one-line error, not a traceback from
    inside the loop after the run directory was made."""
    from fastprof.cli.main import CommandError

    torch = require_torch()
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise CommandError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N", exit_code=2) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise CommandError(
                f"--device {name}: no usable CUDA GPU here (torch.cuda.is_available() is False); use --device cpu",
                exit_code=2,
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise CommandError(
                f"--device {name}: there are {torch.cuda.device_count()} CUDA device(s), numbered from 0",
                exit_code=2,
            )
    elif dev.type != "cpu":
        raise CommandError(f"--device {name}: the demo runs on cpu or cuda", exit_code=2)
    return dev


def train(steps: int, batch_size: int, device: Any, progress: bool) -> None:
    """The profiled loop: a 'step' span holding data/forward/backward/optimizer_step."""
    torch = require_torch()
    w = make_workload(batch_size=batch_size, device=str(device))
    step_span, data, fwd, bwd, opt = (fastprof.name_id(n) for n in ("step", *STEP_SPANS))
    w.model.train()
    t0 = time.perf_counter()
    for i in range(steps):
        with step_span:
            with data:
                x, y = w.batches[i % len(w.batches)]
                x, y = x.to(w.device, non_blocking=True), y.to(w.device, non_blocking=True)
            with fwd:
                loss = w.loss_fn(w.model(x), y)
            with bwd:
                w.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with opt:
                w.optimizer.step()
            if w.device.type == "cuda":
                torch.cuda.synchronize()
        # detach(): float() of a tensor that requires grad warns (UserWarning).
        loss_value = float(loss.detach())
        fastprof.counter("loss", loss_value)
        if progress and (i + 1) % max(1, steps // 10) == 0:
            rate = (i + 1) / (time.perf_counter() - t0)
            print(f"  step {i + 1:>5}/{steps}  loss {loss_value:.3f}  {rate:.1f} steps/s", flush=True)


def run(args: argparse.Namespace) -> int:
    from fastprof.cli.main import CommandError

    if args.steps < 1:
        raise CommandError("--steps must be at least 1", exit_code=2)
    if args.batch_size < 1:
        raise CommandError("--batch-size must be at least 1", exit_code=2)
    device = resolve_device(args.device)
    rec = fastprof.Recorder(args.out_dir, args.run_name)
    if not args.quiet:
        print(f"fastprof demo: training a small CNN for {args.steps} steps, recording into {rec.trace_dir}")
    with rec:
        fastprof.instant("train_begin", steps=args.steps, batch_size=args.batch_size)
        train(args.steps, args.batch_size, device, progress=not args.quiet)
        fastprof.instant("train_end")
    stats = rec.stats
    assert stats is not None
    segments = [Path(p) for p in stats.segments]
    if args.quiet:
        for s in segments:
            print(s)
        return 0
    print(f"\nwrote {stats.events_written} events ({stats.dropped} dropped) in {len(segments)} segment(s):")
    for s in segments:
        print(f"  {s}")
    counters = rec.counters()
    if "proc.rss [B]" in counters:
        rss = counters["proc.rss [B]"][1]
        cpu = counters.get("proc.cpu_user [%]", (None, rss[:0]))[1]
        line = f"sampled: peak RSS {rss.max() / 2**20:.0f} MiB"
        if cpu.size:
            line += f", mean CPU {cpu.mean():.0f}% of a core"
        info = rec.sampler_info() or {}
        nvml = info.get("nvml", {})
        line += "; GPU: " + ("sampled" if nvml.get("available") else f"unavailable ({nvml.get('reason', '?')})")
        print(line)
    print("\nopen it: drag the file into https://ui.perfetto.dev (or chrome://tracing)")
    print(f"next:    fastprof merge {rec.run_dir}    # one trace for every rank and torch.profiler window")
    sys.stdout.flush()
    return 0
