"""``fastprof.integrations.transformers.FastprofCallback`` in a real
``transformers.Trainer`` (a tiny randomly initialised BERT on the CPU, no
download): steps are optimizer updates (gradient accumulation included),
Accelerate's DataLoaderShard passes are timed, evaluations are spans
outside the steps, the step anatomy is recorded, and the training itself is
the same as without fastprof (its loss, bit for bit)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = """
import json, sys, torch, transformers, accelerate.data_loader as adl
torch.manual_seed(0)
cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, num_labels=2)
model = transformers.BertForSequenceClassification(cfg)

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 48
    def __getitem__(self, i):
        if i == int(sys.argv[3]):
            raise RuntimeError(f"bad sample {i}")
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": i % 2}

args = transformers.TrainingArguments(
    output_dir=sys.argv[1], per_device_train_batch_size=4, per_device_eval_batch_size=8, num_train_epochs=2,
    gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=4, logging_steps=4, save_strategy="no",
    report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
callbacks = []
if sys.argv[2] == "fastprof":
    from fastprof.integrations.transformers import FastprofCallback
    callbacks.append(FastprofCallback(run_name="hf", sample_hz=0, schedule="never"))
trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(), eval_dataset=Data(), callbacks=callbacks)
out = trainer.train()
print(json.dumps({
    "loss": out.training_loss, "global_step": trainer.state.global_step,
    "shard_iter_restored": "__wrapped__" not in vars(adl.DataLoaderShard.__iter__),
}), flush=True)
"""


def _train(tmp: Path, mode: str, bad_sample: int = -1) -> subprocess.CompletedProcess[str]:
    (tmp / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    return subprocess.run(
        [sys.executable, str(tmp / "train.py"), str(tmp / "out"), mode, str(bad_sample)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        cwd=tmp,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = {}
    for mode in ("plain", "fastprof"):
        tmp = tmp_path_factory.mktemp(mode)
        p = _train(tmp, mode)
        assert p.returncode == 0, p.stderr[-4000:]
        out[mode] = {"result": json.loads(p.stdout.strip().splitlines()[-1]), "dir": tmp}
    return out


def _events(run: Path) -> list[dict[str, Any]]:
    with gzip.open(run / "trace.json.gz", "rt") as f:
        return list(json.load(f)["traceEvents"])


def test_training_is_the_same_with_and_without_fastprof(runs: dict[str, Any]) -> None:
    plain, ours = runs["plain"]["result"], runs["fastprof"]["result"]
    assert ours["loss"] == plain["loss"] and ours["global_step"] == plain["global_step"] == 12, (plain, ours)
    # The DataLoaderShard patch is gone once training ends.
    assert ours["shard_iter_restored"] is True


def test_steps_are_updates_with_their_batches_phases_and_evaluations_outside(runs: dict[str, Any]) -> None:
    run = runs["fastprof"]["dir"] / "out" / "fastprof" / "hf"
    summary = json.loads((run / "rank0" / "profiler.json").read_text())
    assert summary["steps"] == 12 and summary["epochs"] == 2, summary
    events = [e for e in _events(run) if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"] == "step"), key=lambda e: e["ts"])
    assert [e["args"]["batch"] for e in steps] == list(range(12))
    assert [e["args"]["epoch"] for e in steps] == [0] * 6 + [1] * 6

    def inside(name: str) -> list[int]:
        got = [0] * len(steps)
        for e in events:
            if e["name"] != name:
                continue
            for i, s in enumerate(steps):
                if s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]:
                    got[i] += 1
        return got

    # Gradient accumulation 2: two fetches, forwards and backwards per update, one optimizer step.
    assert inside("loader.train.next") == [2] * 12
    assert inside("phase.forward") == [2] * 12
    assert inside("phase.backward") == [2] * 12
    assert inside("phase.optimizer") == [1] * 12
    # Evaluations at updates 4, 8 and 12: spans outside the steps, with their
    # loader's fetches (48 samples / 8 = 6 each) in them.
    evals = [e for e in events if e["name"] == "hf.evaluate"]
    assert [e["args"]["global_step"] for e in evals] == [4, 8, 12]
    assert inside("hf.evaluate") == [0] * 12
    val = [e for e in events if e["name"] == "loader.val.next"]
    assert len(val) == 3 * 7  # 6 batches and the fetch that finds the loader exhausted, per evaluation
    assert all(any(v["ts"] >= e["ts"] and v["ts"] <= e["ts"] + e["dur"] for e in evals) for v in val)


def test_the_report_reads_the_run_with_its_anatomy(runs: dict[str, Any], tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import fastprof

    run = runs["fastprof"]["dir"] / "out" / "fastprof" / "hf"
    fastprof.report(run, out_dir=tmp_path, formats=("json",))
    doc = json.loads((tmp_path / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    (r,) = doc["anatomy"]["per_rank"]
    shares = {p: v["share"] for p, v in r["phases"].items()}
    assert min(shares["dataloader"], shares["forward"], shares["backward"], shares["optimizer"]) > 0, shares
    assert shares["forward"] + shares["backward"] + shares["optimizer"] + shares["dataloader"] >= 0.6, shares


def test_a_bad_option_is_refused_before_training() -> None:
    import fastprof
    from fastprof.integrations.transformers import FastprofCallback

    with pytest.raises(fastprof.ConfigError, match="sample_hz"):
        FastprofCallback(sample_hz=-3)


def test_an_exception_in_a_batch_ends_the_job_as_it_would_without_fastprof(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = _train(tmp_path / "a", "plain", bad_sample=21)
    ours = _train(tmp_path / "b", "fastprof", bad_sample=21)
    assert plain.returncode == ours.returncode == 1
    last = plain.stderr.strip().splitlines()[-1]
    assert last == ours.stderr.strip().splitlines()[-1] == "RuntimeError: bad sample 21"
    # What was recorded up to the exception is on disk and parses.
    segments = sorted((tmp_path / "b" / "out" / "fastprof" / "hf" / "rank0").glob("fastprof.*.json.gz"))
    assert segments
    with gzip.open(segments[-1], "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert "step" in names and "loader.train.next" in names
