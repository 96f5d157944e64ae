"""A ``Trainer.train()`` that raises undoes what ``FastprofCallback`` put on
Accelerate's ``DataLoaderShard`` class (#35, item 6): the ``__iter__`` that
times passes over the loaders is accelerate's own again once ``train()`` is
left, whether the exception came through the loader (a bad sample) or not
(the model's forward), and a later ``train()`` of the same Trainer profiles
as usual. A real ``transformers.Trainer`` on the CPU (a tiny randomly
initialised BERT, no download), in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = """
import json, sys, torch, transformers, accelerate.data_loader as adl
from fastprof.integrations.transformers import FastprofCallback

torch.manual_seed(0)
ORIGINAL = vars(adl.DataLoaderShard)["__iter__"]
FAIL = {"sample": -1, "forward": -1}


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i == FAIL["sample"]:
            raise RuntimeError(f"bad sample {i}")
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": i % 2}


def trainer(name, how):
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, num_labels=2)
    model = transformers.BertForSequenceClassification(cfg)
    calls = [0]

    def forward(module, inputs):
        calls[0] += 1
        if calls[0] == FAIL["forward"]:
            raise RuntimeError(f"bad forward {calls[0]}")

    model.register_forward_pre_hook(forward)
    args = transformers.TrainingArguments(
        output_dir=sys.argv[1] + "/" + name, per_device_train_batch_size=4, num_train_epochs=1, save_strategy="no",
        logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    cb = FastprofCallback(run_name=name, sample_hz=0, schedule="never")
    if how == "init":
        return transformers.Trainer(model=model, args=args, train_dataset=Data(), callbacks=[cb]), calls
    t = transformers.Trainer(model=model, args=args, train_dataset=Data())
    t.add_callback(cb)
    return t, calls


out = {}
# Per Trainer: what fails in each of its train() calls (None: nothing).
PLANS = {"forward-init": ["forward", None], "sample-init": ["sample", None], "forward-added": [None, "forward", None]}
for name, plan in PLANS.items():
    t, calls = trainer(name, name.split("-")[1])
    out[name] = []
    for fail in plan:
        FAIL.update(sample=-1, forward=-1)
        if fail is not None:
            calls[0] = 0
            FAIL[fail] = 3 if fail == "forward" else 9
        try:
            steps, raised = t.train().global_step, None
        except RuntimeError as e:
            steps, raised = None, str(e)
        restored = vars(adl.DataLoaderShard)["__iter__"] is ORIGINAL
        out[name].append({"raised": raised, "steps": steps, "restored": restored})
print(json.dumps(out), flush=True)
"""


def test_a_failed_train_leaves_the_loader_class_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "train.py", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert [r["raised"] for r in got["forward-init"]] == ["bad forward 3", None], got
    assert [r["raised"] for r in got["sample-init"]] == ["bad sample 9", None], got
    # Added with add_callback (no event of the callback sees the Trainer being
    # made): the Trainer is guarded from the train() after its first on.
    assert [r["raised"] for r in got["forward-added"]] == [None, "bad forward 3", None], got
    for name, calls in got.items():
        assert all(r["restored"] for r in calls), (name, got)
        # 32 samples, 4 a batch: 8 updates, profiled in the run of that train() call.
        for i, r in enumerate(calls, 1):
            if r["raised"] is None:
                assert r["steps"] == 8, (name, got)
                run = tmp_path / "out" / name / "fastprof" / (name if i == 1 else f"{name}-{i}")
                assert json.loads((run / "rank0" / "profiler.json").read_text())["steps"] == 8, (name, i)
