"""Training-thread stall where a torch.profiler window ends, side by side in one run.

Every case profiles the same window with torch.profiler (CPU activity, record_shapes):
one warmup step and ACTIVE recorded steps of the workload's CNN (``fastprof.cli.workloads``),
driven by a schedule, so that the window ends between two training steps, as in training.
What is timed is the gap on the training thread between the end of the window's last
step's work and the start of the next step's work (``step()`` and the fetch of the next
batch: torch stops inside ``step()``, fastprof at the next fetch), and then the next
AFTER steps (the export a case moved off the training thread still shares the cores and,
where it holds the GIL, the thread):
  * torch, no handler: ``on_trace_ready=None``, the bare stop (collection and event
    processing, no file);
  * torch, export_chrome_trace: a plain .json written in the handler;
  * torch, tensorboard_trace_handler(dir, use_gzip=True): the usual choice, gzip in the handler;
  * fastprof.Profiler with torch windows (export off the training thread): the same window through
    ``fastprof.TorchWindows(record_shapes=True)`` and ``fastprof.schedule.cyclic``.
Cases are interleaved round by round, each round with a fresh profiler and output
directory; the median over rounds is reported, with the size of what was written.

Run: python benches/bench_window_stall.py [--rounds 5] [--active 3] [--batch-size 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastprof
from _util import machine
from fastprof.cli.workloads import make_workload, require_torch

WARMUP = 1
AFTER = 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--active", type=int, default=3, help="recorded steps per window (default 3)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: no spin contention)")
    ap.add_argument(
        "--long-run",
        type=int,
        default=1000,
        help="steps of the long run (a window every 50 steps) that checks whether saving a window "
        "costs more later in the run (0: skip; default 1000)",
    )
    args = ap.parse_args()
    torch = require_torch()
    torch.set_num_threads(args.threads)
    tp = torch.profiler
    w = make_workload(batch_size=args.batch_size, device="cpu")
    n_steps = WARMUP + args.active + AFTER
    end_at = WARMUP + args.active - 1  # index of the step() call that closes the window

    def train(batch: Any) -> None:
        x, y = batch
        loss = w.loss_fn(w.model(x), y)
        w.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        w.optimizer.step()
        float(loss.detach())

    batches = [w.batches[i % len(w.batches)] for i in range(n_steps)]

    def timed(loader: Any, step: Callable[[], None]) -> list[tuple[float, float]]:
        """(training work, gap to the next step's work) per step: the gap holds
        ``step()`` and the next fetch (and, after the last step, the loop's end)."""
        calls: list[tuple[float, float]] = []
        prev = train_s = 0.0
        for batch in loader:
            t0 = time.perf_counter()
            if prev:
                calls.append((train_s, t0 - prev))
            train(batch)
            prev = time.perf_counter()
            train_s = prev - t0
            step()
        calls.append((train_s, time.perf_counter() - prev))
        return calls

    def torch_case(handler: Callable[[Path], Any] | None) -> Callable[[Path], list[tuple[float, float]]]:
        def run(out: Path) -> list[float]:
            with tp.profile(
                activities=[tp.ProfilerActivity.CPU],
                schedule=tp.schedule(wait=0, warmup=WARMUP, active=args.active, repeat=1),
                on_trace_ready=handler(out) if handler else None,
                record_shapes=True,
            ) as p:
                calls = timed(batches, p.step)
            return calls

        return run

    def plain_json(out: Path) -> Callable[[Any], None]:
        def export(p: Any) -> None:
            out.mkdir(parents=True, exist_ok=True)
            p.export_chrome_trace(str(out / "window.pt.trace.json"))

        return export

    cases: dict[str, Callable[[Path], list[tuple[float, float]]]] = {
        "torch, no handler (bare stop)": torch_case(None),
        "torch, export_chrome_trace (.json)": torch_case(plain_json),
        "torch, tensorboard_trace_handler(gzip)": torch_case(
            lambda out: tp.tensorboard_trace_handler(str(out), use_gzip=True)
        ),
    }
    if hasattr(fastprof, "Profiler") and hasattr(fastprof, "TorchWindows"):

        def fastprof_case(out: Path) -> list[tuple[float, float]]:
            prof = fastprof.Profiler(
                out_dir=str(out),
                run_name="window",
                schedule=fastprof.schedule.cyclic(wait=0, warmup=WARMUP, active=args.active, repeat=1),
                torch=fastprof.TorchWindows(record_shapes=True),
                merge=False,
            )
            with prof:
                calls = timed(prof.loader(batches), prof.step)
            return calls

        cases["fastprof.Profiler torch windows"] = fastprof_case

    stall: dict[str, list[float]] = {k: [] for k in cases}
    after: dict[str, list[float]] = {k: [] for k in cases}
    plain: list[float] = []
    late = dict.fromkeys(cases, 0)
    size: dict[str, int] = {}
    names = list(cases)
    with tempfile.TemporaryDirectory() as tmpdir, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own notices, the same in every case
        tmp = Path(tmpdir)
        for i in range(n_steps):  # warm-up: allocator, kernels; and torch.profiler's first start
            train(batches[i])
        cases[names[0]](tmp / "warmup")
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                out = tmp / f"{r}-{len(stall[name])}-{names.index(name)}"
                calls = cases[name](out)
                step_calls = [c for _, c in calls]
                if max(range(n_steps), key=step_calls.__getitem__) != end_at:
                    late[name] += 1  # the longest gap between two steps was not the window's end
                stall[name].append(step_calls[end_at])
                after[name].extend(t + c for t, c in calls[end_at + 1 :])
                plain.extend(t for t, _ in calls[:end_at])
                files = [f for f in out.rglob("*") if f.is_file()] if out.exists() else []
                size[name] = sum(
                    f.stat().st_size
                    for f in files
                    if "torch" in f.parts or f.name.endswith(".pt.trace.json") or f.name.endswith(".pt.trace.json.gz")
                )

    step = statistics.median(plain)
    print(f"machine: {machine()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"window: {WARMUP} warmup + {args.active} active CNN steps (batch {args.batch_size}), CPU activity, "
        f"record_shapes; {args.rounds} interleaved rounds, medians; a training step alone: {step * 1e3:.1f} ms\n"
    )
    print(f"  {'case':<40} {'stall at window end':>20} {'next ' + str(AFTER) + ' steps':>14} {'written':>10}")
    for k in cases:
        s = statistics.median(stall[k]) * 1e3
        a = statistics.median(after[k]) * 1e3
        note = f"  (longest gap elsewhere in {late[k]} rounds)" if late[k] else ""
        print(f"  {k:<40} {s:17.1f} ms {a:11.1f} ms {size.get(k, 0) / 1e6:7.2f} MB{note}")
    bare = statistics.median(stall[names[0]])
    gz = statistics.median(stall["torch, tensorboard_trace_handler(gzip)"])
    js = statistics.median(stall["torch, export_chrome_trace (.json)"])
    print(
        f"\n  of tensorboard_trace_handler(gzip)'s stall: bare stop {100 * bare / gz:.0f}%, "
        f"export+gzip+write {100 * (gz - bare) / gz:.0f}%"
    )
    print(f"  gzip handler / plain-json export: {gz / js:.2f}x")
    if "fastprof.Profiler torch windows" in stall:
        fp = statistics.median(stall["fastprof.Profiler torch windows"])
        print(
            f"  tensorboard_trace_handler(gzip) / fastprof.Profiler: {gz / fp:.1f}x; "
            f"bare stop / fastprof: {bare / fp:.1f}x"
        )
    else:
        print("  (fastprof.Profiler with TorchWindows is not in this build: torch's cases only)")

    if args.long_run and "fastprof.Profiler torch windows" in stall:
        long_run(args.long_run, batches, timed)


def long_run(n: int, pool: list[Any], timed: Callable[..., list[tuple[float, float]]]) -> None:
    """A window every 50 steps over ``n`` steps: the stall and the export time
    of the first and the last window (Composer's per-window trace merge grows
    with the run: 0.2 s per save at batch 50, 4.8 s at batch 950)."""
    batches = [pool[i % len(pool)] for i in range(n)]
    with tempfile.TemporaryDirectory() as tmpdir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = fastprof.Profiler(
            out_dir=tmpdir,
            run_name="long",
            schedule=fastprof.schedule.cyclic(wait=45, warmup=1, active=4, repeat=0),
            torch=fastprof.TorchWindows(record_shapes=True),
        )
        with prof:
            calls = timed(prof.loader(batches), prof.step)
            t_exit = time.perf_counter()
        exit_s = time.perf_counter() - t_exit
    saved = [w for w in prof.windows if w["saved"]]
    first, last = saved[0], saved[-1]
    print(f"\nlong run: {n} steps, a window every 50 steps ({len(saved)} saved)")
    for label, w in (("first", first), ("last", last)):
        gap = calls[w["last_step"]][1]
        print(
            f"  {label} window (steps {w['first_step']}-{w['last_step']}): stall {gap * 1e3:.1f} ms, "
            f"torch stop {w['stop_stall_s'] * 1e3:.1f} ms, export {w['export_s'] * 1e3:.0f} ms off the thread"
        )
    ratio = last["export_s"] / first["export_s"]
    print(f"  last / first window export: {ratio:.2f}x (no merge per window; the exit, with its merge: {exit_s:.2f} s)")


if __name__ == "__main__":
    main()
