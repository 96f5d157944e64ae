"""FTS-style collection of chosen functions (issue #16): entries at start
and end of the collected iterations, the activation proxy equal to the bytes
autograd saves (by hand), a known 64 MiB allocation in rss_diff, YAML and JSON with
FTS's keys, counters in the trace, and through Lightning's training_step."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from fastprof.memory import collect, collected

torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")
MIB = 1 << 20


def test_two_collected_iterations_of_a_training_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 3)
    kept: list[Any] = []

    @collect("training_step", iterations=(1, 2))
    def training_step(x: Any) -> Any:
        # Autograd saves x (4x8 float32, 128 B: W's gradient needs it) and
        # relu's output (4x3, 48 B); W and b are Parameters, not counted.
        y = torch.relu(lin(x)).sum()
        # 64 MiB, written: above glibc's largest mmap threshold (32 MiB), so
        # fresh pages whatever the heap holds: resident, exactly.
        kept.append(torch.ones(64 * 256 * 1024))
        return y

    prof = fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=False, sample_hz=0)
    with prof:
        for x in prof.loader([torch.randn(4, 8) for _ in range(4)]):
            training_step(x).backward()
            prof.step()
    entries = collected()
    assert sorted(entries) == [
        "0.training_step.1.end",
        "0.training_step.1.start",
        "0.training_step.2.end",
        "0.training_step.2.start",
    ]
    for it in (1, 2):
        start, end = entries[f"0.training_step.{it}.start"], entries[f"0.training_step.{it}.end"]
        assert end["npp_pre_forward"] == 0 and end["npp_post_forward"] == end["npp_diff"] == 128 + 48
        assert end["rss_pre"] == start["rss"] and end["rss_post"] == end["rss"]
        # The 64 MiB kept by the call, within a few pages of allocator slack.
        assert end["rss_diff"] == pytest.approx(64 * MIB, abs=256 * 1024)
        assert end["vms_diff"] >= 0
        assert not any(k.startswith("allocated_bytes") for k in end) or torch.cuda.is_initialized()
    # Files with FTS's keys, read back by parsers we did not write.
    mem = prof.rank_dir / "memory"
    assert yaml.safe_load((mem / "collected.yaml").read_text()) == entries
    assert json.loads((mem / "collected.json").read_text()) == entries
    # Counters in the trace: one start and one end sample per collected call.
    cols = fastprof.read_columns(prof.trace_path, kinds=["counters"], name_prefix="mem.collect.")
    names = cols.names_of(cols.counters["name"])
    assert (names == "mem.collect.training_step.npp [B]").sum() == 4
    npp = cols.counters["value"][names == "mem.collect.training_step.npp [B]"]
    assert sorted(np.asarray(npp).tolist()) == [0.0, 0.0, 176.0, 176.0]
    # `fastprof merge RUN` still works (memory/ holds fastprof's own files).
    fastprof.merge(prof.run_dir, prof.run_dir / "trace.json.gz", force=True)


def test_uncollected_calls_run_untouched_and_bad_iterations_are_refused() -> None:
    calls = []

    @collect(iterations=(5,))
    def step(i: int) -> int:
        calls.append(i)
        return i * 2

    assert [step(i) for i in range(3)] == [0, 2, 4] and calls == [0, 1, 2]
    assert step.__name__ == "step"
    assert not any(".step." in k for k in collected())
    with pytest.raises(fastprof.ConfigError, match="iterations"):
        collect(iterations=(-1,))


def test_lightning_training_step_is_collected(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning.pytorch")
    from fastprof.integrations.lightning import FastprofProfiler

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 2)

        @collect("training_step", iterations=(1,))
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return torch.relu(self.lin(batch[0])).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8)), batch_size=4)
    prof = FastprofProfiler(out_dir=str(tmp_path), run_name="lt")
    trainer = lightning.Trainer(
        max_epochs=1, profiler=prof, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    with warnings.catch_warnings():
        # Lightning's advice and its deprecations under a newer torch are not
        # this test's business; fastprof's own warnings still fail it.
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", fastprof.FastprofWarning)
        trainer.fit(Module(), data)
    doc = yaml.safe_load((tmp_path / "lt" / "rank0" / "memory" / "collected.yaml").read_text())
    assert sorted(doc) == ["0.training_step.1.end", "0.training_step.1.start"]
    # batch (4x8, 128 B) and relu's output (4x2, 32 B).
    assert doc["0.training_step.1.end"]["npp_diff"] == 128 + 32


class _Allocator:
    """A stand-in CUDA allocator (none can exist here; gpu_check runs the real one)."""

    def __init__(self) -> None:
        self.taken = 0

    def available(self) -> str | None:
        return None

    def initialized(self) -> bool:
        return True

    def snapshot(self) -> dict[str, Any]:
        self.taken += 1
        return {"segments": [{"total_size": self.taken << 20, "blocks": []}], "device_traces": [[]]}


def _collected_run(tmp_path: Path, **options: Any) -> fastprof.Profiler:
    @collect("training_step", iterations=(0, 2), snapshots=True, **options)
    def training_step(x: Any) -> Any:
        return (x * 2).sum()

    prof = fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=False, sample_hz=0)
    with prof:
        for x in prof.loader([torch.ones(3) for _ in range(3)]):
            training_step(x)
            prof.step()
    return prof


def test_allocator_snapshots_at_start_and_end_named_as_fts_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    from fastprof.memory import collector

    alloc = _Allocator()
    monkeypatch.setattr(collector, "_allocator", lambda: alloc)
    prof = _collected_run(tmp_path)
    mem = prof.rank_dir / "memory"
    names = [f"cuda_alloc_rank0.training_step.{i}.{w}.pickle" for i in (0, 2) for w in ("start", "end")]
    assert sorted(p.name for p in mem.glob("cuda_alloc_*")) == sorted(names)
    # In the order taken: start, end of iteration 0, then of iteration 2.
    for n, name in enumerate(names, 1):
        with open(mem / name, "rb") as f:
            assert pickle.load(f)["segments"][0]["total_size"] == n << 20
    doc = json.loads((prof.rank_dir / "profiler.json").read_text())["memory"]["collect"]
    assert doc["snapshot_reason"] is None
    assert [Path(s["path"]).name for s in doc["snapshots"]] == names
    assert all(
        s["bytes"] == (mem / Path(s["path"]).name).stat().st_size and s["snapshot_s"] >= 0 for s in doc["snapshots"]
    )
    cols = fastprof.read_columns(prof.trace_path, kinds=["spans"], names=["memory.collect.snapshot"])
    assert len(cols.spans["ts"]) == 4
    # Elsewhere when asked.
    other = tmp_path / "elsewhere"
    _collected_run(tmp_path / "b", snapshot_dir=other)
    assert sorted(p.name for p in other.iterdir()) == sorted(names)


def test_allocator_snapshots_without_cuda_say_why_once(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    prof = _collected_run(tmp_path)
    doc = json.loads((prof.rank_dir / "profiler.json").read_text())["memory"]["collect"]
    assert doc["snapshots"] == [] and doc["snapshot_reason"] == "no CUDA device (torch.cuda.is_available() is False)"
    # The rest of the collection is whole.
    assert len(doc["entries"]) == 4 and (prof.rank_dir / "memory" / "collected.json").is_file()
    assert not list((prof.rank_dir / "memory").glob("cuda_alloc_*"))
