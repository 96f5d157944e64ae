"""The step anatomy's cost (issue #25): a CPU MLP step of a few ms, and the
empty loop, with the Profiler's anatomy on and off, beside the same loop with
no profiler; interleaved rounds, training-thread CPU time beside wall time.

Goals: the anatomy adds <= 1% to a ~3-5 ms CPU step, <= 5 us of training-thread
CPU to a one-layer step (its hooks' own cost: issue #35) and <= 2 us per step to
the empty loop.

    .venv/bin/python benches/bench_anatomy.py [--steps 200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import fastprof
from _util import interleaved_cpu, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="MLP steps per round")
    ap.add_argument("--empty-steps", type=int, default=20000, help="empty-loop steps per round")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )  # fmt: skip
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(16)]
    tmp = tempfile.mkdtemp(prefix="bench-anatomy-")
    runs = iter(range(10**9))

    tiny = torch.nn.Linear(4, 2)
    tiny_opt = torch.optim.SGD(tiny.parameters(), lr=0.01)
    tiny_x = torch.randn(1, 4)

    steady: dict[str, list[float]] = {}

    def train(prof: fastprof.Profiler | None, steps: int, kind: str) -> float:
        """Runs the loop; returns its steady thread CPU per step: from the
        tenth of the steps on, the Profiler's start, the anatomy's learning
        and the close left out."""
        data = [batches[i % 16] for i in range(steps)]
        it = prof.loader(data) if prof is not None else data
        warm = steps // 10
        t0 = 0.0
        for i, (x, y) in enumerate(it):
            if i == warm:
                t0 = time.thread_time()
            if kind == "mlp":
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
            elif kind == "tiny":  # the hooks' own cost stands out of a ~50 µs step
                tiny_opt.zero_grad()
                tiny(tiny_x).sum().backward()
                tiny_opt.step()
            if prof is not None:
                prof.step()
        return (time.thread_time() - t0) / (steps - warm)

    def case(anatomy: bool | None, kind: str) -> None:
        steps = args.steps if kind == "mlp" else args.empty_steps // 10 if kind == "tiny" else args.empty_steps
        name = f"{kind}, {'no profiler' if anatomy is None else f'anatomy={anatomy}'}"
        if anatomy is None:
            steady.setdefault(name, []).append(train(None, steps, kind))
            return
        prof = fastprof.Profiler(
            tmp, f"r{next(runs)}", torch=False, sample_hz=0, merge=False, anatomy=anatomy, triggers=False
        )
        with prof:
            steady.setdefault(name, []).append(train(prof, steps, kind))

    cases = {
        "MLP, no profiler": lambda: case(None, "mlp"),
        "MLP, anatomy=False": lambda: case(False, "mlp"),
        "MLP, anatomy=True": lambda: case(True, "mlp"),
        "tiny, anatomy=False": lambda: case(False, "tiny"),
        "tiny, anatomy=True": lambda: case(True, "tiny"),
        "empty, anatomy=False": lambda: case(False, "empty"),
        "empty, anatomy=True": lambda: case(True, "empty"),
    }
    case(True, "mlp")  # warm up
    wall, cpu = interleaved_cpu(cases, args.rounds)
    print(f"machine: {machine()}, torch {torch.__version__}, 1 thread")
    per = {
        k: args.steps if k.startswith("MLP") else args.empty_steps // 10 if k.startswith("tiny") else args.empty_steps
        for k in cases
    }
    best = {k: min(cpu[k]) / per[k] for k in cases}
    med = {k: statistics.median(cpu[k]) / per[k] for k in cases}
    print(f"{'':28s} {'thread CPU µs/step (best, median)':>36s}  wall median")
    for k in cases:
        print(
            f"  {k:26s} {best[k] * 1e6:12.2f} {med[k] * 1e6:12.2f}  {statistics.median(wall[k]) / per[k] * 1e6:12.2f}"
        )
    step = best["MLP, anatomy=False"]
    added = best["MLP, anatomy=True"] - step
    share = added / step
    print(f"  anatomy on a {step * 1e3:.2f} ms MLP step: +{added * 1e6:.2f} µs ({100 * share:+.2f}%)  target <= 1%  "
          f"{'PASS' if share <= 0.01 else 'MISS'}")  # fmt: skip
    hooks = best["tiny, anatomy=True"] - best["tiny, anatomy=False"]
    hooks_med = med["tiny, anatomy=True"] - med["tiny, anatomy=False"]
    print(
        f"  the hooks' own cost (a one-layer step: forward, backward, step, zero_grad), whole runs: "
        f"{hooks * 1e6:+.2f} µs/step (medians: {hooks_med * 1e6:+.2f})"
    )
    on, off = steady["tiny, anatomy=True"], steady["tiny, anatomy=False"]
    s_best, s_med = min(on) - min(off), statistics.median(on) - statistics.median(off)
    print(
        f"  the same in steady steps (the tenth of the steps on; start, learning and close left out): "
        f"{s_best * 1e6:+.2f} µs/step (medians: {s_med * 1e6:+.2f})  target <= 5 µs  "
        f"{'PASS' if s_med <= 5e-6 else 'MISS'}"
    )
    fixed = (
        statistics.median(cpu["tiny, anatomy=True"])
        - statistics.median(cpu["tiny, anatomy=False"])
        - s_med * per["tiny, anatomy=True"]
    )
    print(f"  the anatomy's cost per run (start, learning the modules, close): {fixed * 1e3:+.2f} ms")
    empty = best["empty, anatomy=True"] - best["empty, anatomy=False"]
    print(
        f"  anatomy on the empty loop: {empty * 1e6:+.3f} µs/step  target <= 2 µs  "
        f"{'PASS' if empty <= 2e-6 else 'MISS'}"
    )


if __name__ == "__main__":
    main()
