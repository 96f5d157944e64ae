"""``fastprof demo``: a profiled training run of a small CNN on synthetic
CIFAR-shaped data (CPU, or the GPU when there is one) under
``fastprof.Profiler``: two epochs through a DataLoader whose samples are made
and augmented per item, validation after each epoch, Composer's epoch
schedule driving torch.profiler windows, host sampling, and one unified
trace at the end. Prints where the trace is and what to run next."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import fastprof
from fastprof.cli.args import integer, location
from fastprof.cli.errors import CommandError
from fastprof.cli.workloads import make_workload, require_torch

#: The span names the demo records inside each step, in order.
STEP_SPANS = ("data", "forward", "backward", "optimizer_step")
EPOCHS = 2


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "demo",
        help="profile a short CNN training on synthetic data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-o", "--out-dir", type=location, default=None, help="parent of the run directory (default: fastprof_runs)"
    )
    p.add_argument("--run-name", default=None, help="run directory name (default: run-<timestamp>)")
    p.add_argument(
        "--steps",
        type=integer(1, 1_000_000, "a number of steps"),
        default=64,
        help="training steps over the two epochs (default: 64)",
    )
    p.add_argument(
        "--workers",
        type=integer(0, 256, "a number of processes"),
        default=0,
        help="DataLoader worker processes (default: 0)",
    )
    p.add_argument(
        "--batch-size", type=integer(1, 4096, "a number of samples"), default=32, help="batch size (default: 32)"
    )
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the trace location")
    p.set_defaults(run=run)


def check_out_dir(out: Path) -> None:
    """The demo's whole point is what it records: an out_dir where no run
    directory can be made is bad input (exit 2) before training, not a demo
    that trains unrecorded (a Profiler never takes a job down: it warns)."""
    base = out
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise CommandError(f"--out-dir {out}: {base} is not a directory; give a directory to record in", 2)
    if not os.access(base, os.W_OK | os.X_OK):
        raise CommandError(f"--out-dir {out}: {base} is not writable; give a directory to record in", 2)


def _placed(path: Any, prof: Any, run_url: str | None) -> str:
    """A file of the run as the user finds it: a URL run's object URL."""
    if run_url is None:
        return str(path)
    try:
        return f"{run_url}/{Path(path).relative_to(prof.run_dir).as_posix()}"
    except ValueError:
        return str(path)


def resolve_device(name: str | None) -> Any:
    """The torch device to train on, checked before anything is recorded: a
    name torch does not know, a device type other than cpu/cuda, or cuda
    where there is no usable GPU is a one-line error, not a traceback from
    inside the loop after the run directory was made."""

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


class SyntheticImages:
    """CIFAR-shaped samples made per item: a seeded image, a random crop and
    flip, and normalisation (real per-sample work for the loader to time)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        torch = require_torch()
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        img = torch.rand(3, 40, 40, generator=g)
        dx, dy = (int(v) for v in torch.randint(0, 9, (2,), generator=g))
        img = img[:, dy : dy + 32, dx : dx + 32]
        if bool(torch.rand(1, generator=g) < 0.5):
            img = img.flip(-1)
        img = (img - 0.5) / 0.25
        return img, int(torch.randint(0, 10, (1,), generator=g))


def schedule_for(batches_per_epoch: int) -> Any:
    """Composer's documented schedule when an epoch is long enough for it,
    else one short window per epoch."""
    if batches_per_epoch >= 9:
        return fastprof.schedule.epoch(skip_first=1, wait=1, warmup=1, active=2, repeat=1)
    return fastprof.schedule.epoch(warmup=min(1, batches_per_epoch - 1), active=1, repeat=1)


def train(prof: fastprof.Profiler, steps: int, batch_size: int, workers: int, device: Any, progress: bool) -> None:
    """The profiled loop: each step holds data/forward/backward/optimizer_step."""
    torch = require_torch()
    DataLoader = torch.utils.data.DataLoader

    w = make_workload(batch_size=batch_size, num_batches=1, device=str(device))
    per_epoch = max(1, steps // EPOCHS)
    train_dl = DataLoader(SyntheticImages(per_epoch * batch_size, 0), batch_size=batch_size, num_workers=workers)
    val_dl = DataLoader(SyntheticImages(max(1, per_epoch // 4) * batch_size, 1), batch_size=batch_size)
    data, fwd, bwd, opt = (fastprof.name_id(n) for n in STEP_SPANS)
    t0 = time.perf_counter()
    done = 0
    for epoch in range(EPOCHS):
        w.model.train()
        for x, y in prof.loader(train_dl):
            with data:
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
            prof.step()
            done += 1
            if progress and done % max(1, steps // 10) == 0:
                rate = done / (time.perf_counter() - t0)
                print(f"  epoch {epoch} step {done:>5}/{per_epoch * EPOCHS}  loss {loss_value:.3f}  {rate:.1f} steps/s")
        w.model.eval()
        with torch.no_grad():
            for x, _y in prof.loader(val_dl, name="val"):
                w.model(x.to(w.device))


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    # Kineto logs each window's start and stop to stderr, and on a machine
    # without a GPU an ERROR that it found none ("gpuGetDeviceCount failed
    # with code 35"): noise beside fastprof's own account of every window.
    # Silenced for the demo (read when the first window starts); a
    # KINETO_LOG_LEVEL the user exported wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    per_epoch = max(1, args.steps // EPOCHS)
    prof = fastprof.Profiler(
        args.out_dir,
        args.run_name,
        schedule=schedule_for(per_epoch),
        torch=fastprof.TorchWindows(record_shapes=True),
    )
    check_out_dir(prof.run_dir.parent)  # a URL run's spool
    with prof:
        if not args.quiet:
            # Once started: a run name an earlier run holds becomes NAME-2 at the start.
            print(
                f"fastprof demo: {EPOCHS} epochs x {per_epoch} steps of a small CNN on {device}, "
                f"recording into {prof.run_dir}"
            )
        fastprof.instant("train_begin", steps=per_epoch * EPOCHS, batch_size=args.batch_size)
        train(prof, args.steps, args.batch_size, args.workers, device, progress=not args.quiet)
        fastprof.instant("train_end")
    stats = prof.recorder.stats
    trace = prof.trace_path if prof.trace_url is None else prof.trace_url
    run_url = prof.recorder.options.run_url
    where = str(prof.run_dir) if run_url is None else run_url
    if stats is None:
        # The run directory could not be written after all (the warning above says why).
        raise CommandError(f"{prof.run_dir}: nothing recorded", exit_code=1)
    if args.quiet:
        print(trace)
        return 0
    rank_place = prof.recorder.options.rank_url or prof.rank_dir
    print(f"\nrecorded {stats.events_written} events ({stats.dropped} dropped) in {rank_place}")
    for wdw in prof.windows:
        if wdw["saved"]:
            print(
                f"torch window steps {wdw['first_step']}-{wdw['last_step']}: {_placed(wdw['path'], prof, run_url)} "
                f"(training thread stalled {wdw['stop_stall_s'] * 1e3:.1f} ms at its end; "
                f"export {wdw['export_s'] * 1e3:.0f} ms off the training thread)"
            )
    counters = prof.recorder.counters()
    if "proc.rss [B]" in counters:
        rss = counters["proc.rss [B]"][1]
        info = prof.recorder.sampler_info() or {}
        nvml = info.get("nvml", {})
        gpu = "sampled" if nvml.get("available") else f"unavailable ({nvml.get('reason', '?')})"
        print(f"sampled: peak RSS {rss.max() / 2**20:.0f} MiB; GPU: {gpu}")
    print(f"\nunified trace: {trace}")
    fetch = "" if run_url is None else "copy it from the store, then "
    print(f"open it:  {fetch}drag the file into https://ui.perfetto.dev (or chrome://tracing)")
    print(f"redo it:  fastprof merge {shlex.quote(where)} -o {shlex.quote(str(trace))} --force")
    print(f"report:   fastprof report {shlex.quote(where)}   (where the time of a step goes)")
    sys.stdout.flush()
    return 0
