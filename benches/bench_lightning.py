"""Cost per Lightning action: fastprof's Lightning profiler against
Lightning's own, side by side in one run.

Lightning calls its profiler around every hook of every batch, two ways:
``profiler.start(name)`` ... ``profiler.stop(name)`` (the loops' fetches,
manual optimization) and ``with profiler.profile(name):`` (every hook). Per
action (start + stop, or one ``with``), on 20 hook-like names:
  * PassThroughProfiler: Lightning's do-nothing profiler (the floor of a
    Python ``start``/``stop``; its ``profile`` is the base class's);
  * SimpleProfiler: Lightning's default timing profiler;
  * fastprof: ``FastprofProfiler`` in its fit stage, a recorder running.
Each case runs in short chunks, rotating, and is timed by the thread's CPU
time (``time.thread_time``): on a loaded machine a chunk that is preempted
would otherwise count the other processes' time. The best chunk is kept.
Then (``--fit``) ``Trainer.fit`` of a tiny CPU model with each profiler:
the median wall time per batch of the training epoch (about 40 actions a
batch), and the rest of the fit (fastprof's stop, merge and table).

Target (issue #10): fastprof >= 3x cheaper per action than SimpleProfiler.

Run: python benches/bench_lightning.py [--fit]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

from _util import machine, verdict

N = 2000  # actions per chunk
ROUNDS = 80
NAMES = [f"[Callback]ModelCheckpoint{{'monitor': None}}.on_hook_{i}" for i in range(20)]


def _pairs(prof: Any) -> Callable[[], None]:
    start, stop = prof.start, prof.stop

    def run() -> None:
        for _ in range(N // len(NAMES)):
            for a in NAMES:
                start(a)
                stop(a)

    return run


def _withs(prof: Any) -> Callable[[], None]:
    profile = prof.profile

    def run() -> None:
        for _ in range(N // len(NAMES)):
            for a in NAMES:
                with profile(a):
                    pass

    return run


def _best_ns(cases: dict[str, Callable[[], None]]) -> dict[str, float]:
    best = dict.fromkeys(cases, float("inf"))
    names = list(cases)
    for r in range(ROUNDS):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.thread_time_ns()
            cases[name]()
            best[name] = min(best[name], (time.thread_time_ns() - t0) / N)
            time.sleep(0.001)  # let the writer thread drain off this thread's time
    return best


def per_action(tmp: str) -> None:
    from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

    from fastprof.integrations.lightning import FastprofProfiler

    simple, passthrough = SimpleProfiler(), PassThroughProfiler()
    fp = FastprofProfiler(tmp, "bench-actions", torch=False, sample_hz=0, buffer_size="64MiB")
    fp.setup("fit")
    try:
        best = _best_ns(
            {
                "pass start/stop": _pairs(passthrough),
                "simple start/stop": _pairs(simple),
                "fastprof start/stop": _pairs(fp),
                "pass with profile()": _withs(passthrough),
                "simple with profile()": _withs(simple),
                "fastprof with profile()": _withs(fp),
            }
        )
    finally:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            fp.teardown("fit")
    stats = fp.last.recorder.stats if fp.last is not None else None
    print(f"{N} actions per chunk, best of {ROUNDS} rotating chunks, thread CPU ns per action\n")
    for k, v in best.items():
        print(f"  {k:<28} {v:8.1f} ns")
    s, f, p = best["simple start/stop"], best["fastprof start/stop"], best["pass start/stop"]
    sw, fw = best["simple with profile()"], best["fastprof with profile()"]
    print("\nratios")
    print(f"  simple / fastprof, start/stop        {s / f:6.2f}x   target >= 3x  {verdict(s / f >= 3)}")
    print(f"  simple / fastprof, with profile()    {sw / fw:6.2f}x   target >= 3x  {verdict(sw / fw >= 3)}")
    print(f"  simple / pass-through, start/stop    {s / p:6.2f}x   (the most a Python start/stop could reach)")
    print(f"  fastprof / pass-through, start/stop  {f / p:6.2f}x   (recording vs. two empty Python calls)")
    if stats is not None:
        print(f"\nwriter: {stats.events_written} events written, {stats.dropped} dropped")


def per_batch(tmp: str, batches: int) -> None:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

    from fastprof.integrations.lightning import FastprofProfiler

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ds = torch.utils.data.TensorDataset(torch.randn(batches * 4, 32), torch.randn(batches * 4, 1))

    class EpochClock(pl.Callback):
        """Times the training epoch alone: not the stage's setup and the
        profilers' own work at its end (fastprof's merge, the tables)."""

        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            self.t0, self.c0 = time.perf_counter(), time.thread_time()

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            self.seconds = time.perf_counter() - self.t0
            self.cpu = time.thread_time() - self.c0

    def fit(profiler: Any) -> tuple[float, float, float]:
        clock = EpochClock()
        trainer = pl.Trainer(
            callbacks=[clock],
            max_epochs=1,
            profiler=profiler,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
            default_root_dir=tmp,
        )
        t0 = time.perf_counter()
        trainer.fit(Tiny(), torch.utils.data.DataLoader(ds, batch_size=4))
        return clock.cpu / batches, clock.seconds / batches, time.perf_counter() - t0 - clock.seconds

    makers: dict[str, Callable[[], Any]] = {
        "pass-through": PassThroughProfiler,
        "simple": SimpleProfiler,
        "fastprof": lambda: FastprofProfiler(tmp, torch=False, sample_hz=0),
    }
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in makers}
    for r in range(7):
        for k in list(makers)[r % 3 :] + list(makers)[: r % 3]:
            times[k].append(fit(makers[k]()))
    cpu = {k: statistics.median(t[0] for t in v) * 1e6 for k, v in times.items()}
    wall = {k: statistics.median(t[1] for t in v) * 1e6 for k, v in times.items()}
    rest = {k: statistics.median(t[2] for t in v) for k, v in times.items()}
    print(f"\nTrainer.fit, one epoch of {batches} batches of a tiny CPU model, median of 7 fits")
    print("  per batch: training-thread CPU (overhead vs pass-through), wall; then the rest of the fit")
    for k in makers:
        over = cpu[k] - cpu["pass-through"]
        print(f"  {k:<14} {cpu[k]:8.1f} us CPU ({over:+7.1f} us)  {wall[k]:8.1f} us wall   rest {rest[k]:5.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", action="store_true", help="also time whole Trainer.fit runs")
    ap.add_argument("--batches", type=int, default=300)
    args = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about workers and logging
        per_action(tmp)
        if args.fit:
            import logging

            logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
            per_batch(tmp, args.batches)


if __name__ == "__main__":
    main()
