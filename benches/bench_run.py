"""Training-thread cost of ``fastprof run``'s zero-code bookkeeping, against
the same records asked for in code (``prof.loader`` + ``prof.step()``).

One process, one running ``fastprof.Profiler`` (sampler off, torch windows
off, memory statistics off), interleaved rounds of one pass each over a
``torch.utils.data.DataLoader`` of N items (batch size 1, no collate work,
no workers) whose body is an ``optimizer.step()`` of an optimizer with
nothing to update (torch's step hooks still run):

* baseline: ``for b in loader: opt.step()``, DataLoader and optimizer
  untouched;
* explicit: ``for b in prof.loader(loader): opt.step(); prof.step()``;
* fastprof run: ``for b in loader: opt.step()`` with ``ZeroCode`` installed
  (the patched ``DataLoader.__iter__`` and the optimizer hook, as under
  ``fastprof run``), installed and removed around each of its rounds.

Each records the same per step: a ``step`` span, a ``loader.train.next``
span and a ``loader.train.wait_ms`` counter. Cost per step = (case -
baseline) / N, best of the rounds.

Run: .venv/bin/python benches/bench_run.py [--steps 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import fastprof
from _util import best, interleaved, machine
from fastprof.cli.workloads import require_torch
from fastprof.run import ZeroCode


def _same(batch: list[Any]) -> Any:
    return batch[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch = require_torch()

    class Idle(torch.optim.Optimizer):  # type: ignore[misc]
        """An optimizer with nothing to do: what is left is torch's hook machinery."""

        def step(self, closure: Any = None) -> None:
            return None

    opt = Idle([torch.zeros(1, requires_grad=True)], {})
    loader = torch.utils.data.DataLoader(list(range(a.steps)), batch_size=1, collate_fn=_same)
    with tempfile.TemporaryDirectory() as tmp:
        prof = fastprof.Profiler(tmp, "bench", torch=False, sample_hz=0, memory_stats=False, merge=False)
        prof.start()
        prof.remove_optimizer_hook()  # the baseline runs no fastprof hook
        zero = ZeroCode(prof)

        def baseline() -> None:
            for _ in loader:
                opt.step()

        def explicit() -> None:
            for _ in prof.loader(loader):
                opt.step()
                prof.step()

        def zero_code() -> None:
            zero.install()
            try:
                for _ in loader:
                    opt.step()
            finally:
                zero.uninstall()

        times = interleaved({"baseline": baseline, "explicit": explicit, "fastprof run": zero_code}, a.rounds)
        steps = prof.batch
        prof.stop()
    if steps < 2 * a.rounds * a.steps:
        # Each explicit and zero-code pass records its steps: fewer means a
        # case timed doing nothing (as when a reinstalled ZeroCode stayed off).
        want = 2 * a.rounds * a.steps
        raise SystemExit(f"bench_run: {steps} steps recorded, expected {want}: a case recorded nothing")
    base = best(times["baseline"])
    print(f"machine: {machine()}")
    print(f"{a.steps} steps per round, best of {a.rounds} rounds; {steps} steps recorded in all")
    print(f"baseline (DataLoader pass + optimizer.step): {base / a.steps * 1e6:8.2f} us/step")
    for name in ("explicit", "fastprof run"):
        cost = (best(times[name]) - base) / a.steps * 1e6
        print(f"{name:>12}: +{cost:6.2f} us/step")
    ratio = (best(times["fastprof run"]) - base) / max(best(times["explicit"]) - base, 1e-12)
    print(f"fastprof run / explicit: {ratio:.2f}x")


if __name__ == "__main__":
    main()
