"""Per-step memory statistics: fastprof's against the Fine-Tuning Scheduler's
way (issue #16), on the same model, in one run.

FTS's MemProfiler reads host memory with psutil (``Process.memory_info()``:
rss and vms) in a forward pre-hook and a forward hook on *every* module, on
the training thread. fastprof reads ``/proc/self/statm`` once per step in the
core (``Profiler(memory_stats=True)``, ``mem.rss [B]``).

1. Bookkeeping alone, µs per step, best of interleaved rounds:
   * FTS-style: the hooks' work for one training step of the workload's CNN
     (two psutil reads per module call, the readings kept in a list);
   * fastprof: ``for b in prof.loader(data): prof.step()`` with memory_stats
     on, minus the same with it off.
   Goals: fastprof >= 10x cheaper, and <= 5 µs per step.
2. Around the real CNN training step (batch 8, one torch thread): median step
   time with the FTS-style hooks registered, with fastprof's Profiler
   (memory_stats on), and with neither, in interleaved blocks (shown for
   honesty: a CPU step's noise is larger than fastprof's µs).

    python benches/bench_memory.py [--steps 2000] [--rounds 7] [--model-steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil

import fastprof
from _util import best, interleaved, machine, verdict
from fastprof.cli.workloads import make_workload, require_torch


class FtsStyleHooks:
    """psutil in forward pre/post hooks on every module, as FTS's MemProfiler
    collects host memory (rss and vms before and after each module call)."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.rows: list[tuple[str, int, int]] = []
        self.handles: list[Any] = []

    def pre(self, module: Any, args: Any) -> None:
        m = self.proc.memory_info()
        self.rows.append(("pre", m.rss, m.vms))

    def post(self, module: Any, args: Any, out: Any) -> None:
        m = self.proc.memory_info()
        self.rows.append(("post", m.rss, m.vms))

    def attach(self, model: Any) -> None:
        for mod in model.modules():
            self.handles.append(mod.register_forward_pre_hook(self.pre))
            self.handles.append(mod.register_forward_hook(self.post))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="steps per round of part 1")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--model-steps", type=int, default=60, help="CNN steps per case in part 2 (0: skip)")
    args = ap.parse_args()
    torch = require_torch()
    torch.set_num_threads(1)
    print(f"machine: {machine()}; torch {torch.__version__}, psutil {psutil.__version__}")
    w = make_workload(batch_size=8, device="cpu")
    calls = sum(1 for _ in w.model.modules())  # each module is called once per forward
    print(f"model: the workloads CNN, {calls} modules (FTS-style: {2 * calls} psutil reads per step)")

    hooks = FtsStyleHooks()
    data = list(range(args.steps))
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)

        def fts_bookkeeping() -> None:
            for _ in data:
                for _ in range(calls):
                    hooks.pre(None, None)
                    hooks.post(None, None, None)
            hooks.rows.clear()

        def profiler_case(on: bool) -> float:
            prof = fastprof.Profiler(out_dir=tmp, run_name=f"mem-{on}", torch=False, sample_hz=0, memory_stats=on)
            with prof:
                times = interleaved(
                    {"loop": lambda: [prof.step() for _ in prof.loader(data)], "base": lambda: [None for _ in data]},
                    args.rounds,
                )
            return (best(times["loop"]) - best(times["base"])) / args.steps * 1e6

        fts = best(interleaved({"fts": fts_bookkeeping}, args.rounds)["fts"]) / args.steps * 1e6
        on, off = profiler_case(True), profiler_case(False)
        ours = on - off
        print(f"\n1. per-step memory bookkeeping alone ({args.steps} steps/round, best of {args.rounds} rounds)")
        print(f"  FTS-style psutil hooks on every module   {fts:9.2f} µs/step")
        print(f"  fastprof memory_stats (on - off)         {ours:9.2f} µs/step  ({on:.2f} on, {off:.2f} off)")
        print(f"  FTS-style / fastprof: {fts / max(ours, 1e-9):.0f}x  target >= 10x  {verdict(fts >= 10 * ours)}")
        print(f"  fastprof Profiler with memory_stats <= 5 µs/step: {on:.2f}  {verdict(on <= 5)}")

        if args.model_steps:
            model, opt, loss_fn = w.model, w.optimizer, w.loss_fn
            batches = w.batches

            def train(n: int, step: Any = None) -> list[float]:
                out = []
                for i in range(n):
                    x, y = batches[i % len(batches)]
                    t0 = time.perf_counter()
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    if step is not None:
                        step()
                    out.append(time.perf_counter() - t0)
                return out

            block = 10
            res: dict[str, list[float]] = {"none": [], "FTS-style hooks": [], "fastprof memory_stats": []}
            prof = fastprof.Profiler(out_dir=tmp, run_name="model", torch=False, sample_hz=0, memory_stats=True)
            train(5)
            for r in range(max(1, args.model_steps // block)):
                for case in list(res)[r % 3 :] + list(res)[: r % 3]:
                    if case == "FTS-style hooks":
                        hooks.attach(model)
                        res[case] += train(block)
                        hooks.detach()
                        hooks.rows.clear()
                    elif case == "fastprof memory_stats":
                        with prof.__class__(
                            out_dir=tmp, run_name=f"model-{r}", torch=False, sample_hz=0, memory_stats=True
                        ) as p:
                            res[case] += train(block, p.step)
                    else:
                        res[case] += train(block)
            base = statistics.median(res["none"])
            print(f"\n2. around the CNN training step (batch 8, {args.model_steps} steps per case); median step")
            for k, v in res.items():
                m = statistics.median(v)
                print(f"  {k:<26} {m * 1e3:8.3f} ms  {(m - base) * 1e6:+9.1f} µs vs none")
            print("  (a CPU step's noise is larger than fastprof's µs: part 1 is the measure)")


if __name__ == "__main__":
    main()
