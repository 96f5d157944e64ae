"""``fastprof.integrations.lightning.FastprofProfiler`` under a real Lightning
``Trainer`` (CPU, a tiny module, random tensors): the unified trace read back
with gzip + json, steps and epochs, Lightning's actions, torch.profiler
windows per the schedule, the summary table, and a second fit in the same
process.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

import lightning.pytorch as pl  # noqa: E402

import fastprof  # noqa: E402
from fastprof.integrations.lightning import FastprofProfiler  # noqa: E402

EPOCHS, BATCHES = 2, 4


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(n: int) -> Any:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=2)


def _fit(profiler: FastprofProfiler, root: Path) -> None:
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        limit_train_batches=BATCHES,
        limit_val_batches=2,
        num_sanity_val_steps=1,
        profiler=profiler,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        default_root_dir=root,
    )
    with _lightning_warnings():
        trainer.fit(Tiny(), _loader(32), _loader(8))


@contextlib.contextmanager
def _lightning_warnings() -> Iterator[None]:
    """Lightning's advice (worker counts, small logs) and its deprecations
    under a newer torch are not this test's business; fastprof's own warnings
    still fail it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", fastprof.FastprofWarning)
        yield


def _load(path: Path) -> dict[str, Any]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert isinstance(doc, dict) and "traceEvents" in doc
    return doc


def _spans(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == name]


def test_fit_records_actions_steps_windows_and_summary(tmp_path: Path) -> None:
    prof = FastprofProfiler(
        tmp_path / "out",
        "fit",
        schedule=fastprof.schedule.epoch(wait=1, warmup=1, active=2),
        torch=fastprof.TorchWindows(),
    )
    _fit(prof, tmp_path)

    run = tmp_path / "out" / "fit"
    doc = _load(run / "trace.json.gz")
    # Steps: the fit's training batches only, numbered epochs x batches.
    steps = sorted(_spans(doc, "step"), key=lambda e: e["ts"])
    assert [(s["args"]["epoch"], s["args"]["batch_in_epoch"]) for s in steps] == [
        (e, b) for e in range(EPOCHS) for b in range(BATCHES)
    ]
    assert [s["args"]["batch"] for s in steps] == list(range(EPOCHS * BATCHES))
    # Lightning's actions, as spans of their names.
    names = {e.get("name") for e in doc["traceEvents"] if e.get("ph") == "X"}
    for action in (
        "run_training_epoch",
        "run_training_batch",
        "[_TrainingEpochLoop].train_dataloader_next",
        "[Strategy]SingleDeviceStrategy.training_step",
        "[LightningModule]Tiny.optimizer_step",
        "[_EvaluationLoop].val_next",
        "lightning.fit",
    ):
        assert action in names, action
    assert len(_spans(doc, "run_training_epoch")) == EPOCHS
    # Every training batch (and its fetch) lies inside its own step.
    batches = sorted(_spans(doc, "run_training_batch"), key=lambda e: e["ts"])
    fetches = sorted(_spans(doc, "[_TrainingEpochLoop].train_dataloader_next"), key=lambda e: e["ts"])
    assert len(batches) == len(steps) == len(fetches)
    for step, batch, fetch in zip(steps, batches, fetches, strict=True):
        for inner in (batch, fetch):
            assert step["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= step["ts"] + step["dur"] + 0.002
    # The step anatomy (issue #25) under Lightning: each training step holds
    # its backward, a forward (the module's call inside training_step) and
    # the optimizer's step (split around the closure's forward and backward,
    # so that phases never overlap).
    for step in steps:

        def inside(name: str, step: dict[str, Any] = step) -> list[dict[str, Any]]:
            return [
                e for e in _spans(doc, name) if step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]
            ]

        assert len(inside("phase.backward")) == 1 and len(inside("phase.forward")) >= 1, step
        assert len(inside("phase.optimizer")) >= 1, step
        phases = sorted(
            (e["ts"], e["ts"] + e["dur"]) for n in ("forward", "backward", "optimizer") for e in inside(f"phase.{n}")
        )
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(phases)), phases
    # Torch windows: in each epoch, warmup at batch 1, active at batches 2 and 3.
    windows = sorted((run / "rank0" / "torch").glob("*.pt.trace.json.gz"))
    assert [w.name for w in windows] == ["ep0-ba3.pt.trace.json.gz", "ep1-ba7.pt.trace.json.gz"]
    for window, expected in zip(
        windows, ({"ProfilerStep#2", "ProfilerStep#3"}, {"ProfilerStep#6", "ProfilerStep#7"}), strict=True
    ):
        events = _load(window)["traceEvents"]
        found = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
        assert found == expected, window
    # The summary table, read back from the trace.
    text = prof.summary()
    for action in ("run_training_batch", "[Strategy]SingleDeviceStrategy.training_step", "lightning.fit", "step"):
        assert action in text, action
    assert (run / "fastprof_summary.txt").read_text().strip() == text.strip()
    row = next(line for line in text.splitlines() if "run_training_batch" in line)
    assert [c.strip() for c in row.strip("|").split("|")][1] == str(EPOCHS * BATCHES)


def test_second_fit_and_validate_in_one_process(tmp_path: Path) -> None:
    prof = FastprofProfiler(tmp_path / "out", "again", torch=False)
    _fit(prof, tmp_path)
    _fit(prof, tmp_path)
    for run in ("again", "again-2"):
        doc = _load(tmp_path / "out" / run / "trace.json.gz")
        assert len(_spans(doc, "step")) == EPOCHS * BATCHES, run
        assert len(_spans(doc, "lightning.fit")) == 1
    # A validate stage: spans, no steps.
    trainer = pl.Trainer(
        limit_val_batches=2, profiler=prof, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    with _lightning_warnings():
        trainer.validate(Tiny(), _loader(8))
    doc = _load(tmp_path / "out" / "again-3" / "trace.json.gz")
    assert _spans(doc, "step") == []
    assert len(_spans(doc, "[_EvaluationLoop].val_next")) >= 2
    assert "lightning.validate" in prof.summary()


def test_default_out_dir_is_the_trainer_log_dir(tmp_path: Path) -> None:
    prof = FastprofProfiler(torch=False)
    _fit(prof, tmp_path)
    assert prof.last is not None
    assert prof.last.run_dir.parent == tmp_path / "fastprof"
    assert (prof.last.run_dir / "trace.json.gz").is_file()


def test_bad_option_raises_before_training() -> None:
    with pytest.raises(fastprof.ConfigError, match="schedule"):
        FastprofProfiler(schedule="nonsense:x=1")


def test_action_clock_unnested_and_reentered(tmp_path: Path) -> None:
    clock = fastprof._core._ActionClock()
    with fastprof.Recorder(tmp_path, "clock"):
        clock.start("a")
        clock.start("b")
        clock.stop("a")  # not nested: a ends inside b
        clock.start("b")  # b re-entered
        clock.stop("b")
        clock.stop("b")
        clock.stop("never started")
        with clock.profile("c") as name:
            assert name == "c"
        with pytest.raises(KeyError), clock.profile("d"):
            raise KeyError("body")
        assert clock.open() == []
    segs = sorted((tmp_path / "clock" / "rank0").glob("fastprof.*.json.gz"))
    events = [e for p in segs for e in _load(p)["traceEvents"] if e.get("ph") == "X"]
    assert sorted(e["name"] for e in events) == ["a", "b", "b", "c", "d"]
    assert sorted(clock.names()) == ["a", "b", "c", "d", "never started"]


def test_import_fastprof_does_not_import_lightning_and_missing_lightning_is_explained(pyscript: Any) -> None:
    out = pyscript.run(
        """
        import sys, fastprof
        assert "lightning" not in sys.modules, "import fastprof imported lightning"
        sys.modules["lightning"] = None  # what a Python without lightning answers to its import
        try:
            import fastprof.integrations.lightning
        except ImportError as e:
            print(e)
        """,
        env={"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr
    assert "fastprof.integrations.lightning needs Lightning" in out.stdout
    assert "pip install 'fastprof-torch[lightning]'" in out.stdout


class _Stream(torch.utils.data.IterableDataset):
    """No length: Lightning prefetches a batch ahead to find the epoch's end."""

    def __iter__(self) -> Iterator[Any]:
        g = torch.Generator().manual_seed(1)
        for _ in range(2 * BATCHES):
            yield torch.randn(8, generator=g), torch.randn(1, generator=g)


def test_prefetched_batches_of_an_unsized_loader_are_steps(tmp_path: Path) -> None:
    prof = FastprofProfiler(tmp_path / "out", "stream", torch=False)
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        profiler=prof,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    with _lightning_warnings():
        trainer.fit(Tiny(), torch.utils.data.DataLoader(_Stream(), batch_size=2))
    doc = _load(tmp_path / "out" / "stream" / "trace.json.gz")
    steps = sorted(_spans(doc, "step"), key=lambda e: e["ts"])
    assert [(s["args"]["epoch"], s["args"]["batch_in_epoch"]) for s in steps] == [
        (e, b) for e in range(EPOCHS) for b in range(BATCHES)
    ]
    batches = sorted(_spans(doc, "run_training_batch"), key=lambda e: e["ts"])
    for step, batch in zip(steps, batches, strict=True):
        assert step["ts"] <= batch["ts"] and batch["ts"] + batch["dur"] <= step["ts"] + step["dur"] + 0.002
