"""The Transformers callback's default torch.profiler windows keep Kineto's
own log lines (``USDT: ... profiler_start``, and on a machine without a GPU
``ERROR: ... gpuGetDeviceCount failed``) out of the job's stderr (#34, item
12), as ``fastprof run`` does: a real ``transformers.Trainer`` on the CPU
(a tiny randomly initialised BERT, no download), windows still written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = """
import sys, torch, transformers
from fastprof.integrations.transformers import FastprofCallback

torch.manual_seed(0)
cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, num_labels=2)
model = transformers.BertForSequenceClassification(cfg)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": i % 2}


args = transformers.TrainingArguments(
    output_dir=sys.argv[1], per_device_train_batch_size=4, num_train_epochs=2, save_strategy="no",
    logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
# The callback's defaults: its schedule opens torch.profiler windows.
trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(),
                               callbacks=[FastprofCallback(run_name="hf", sample_hz=0)])
trainer.train()
print("trained", flush=True)
"""

# Kineto's (glog-style) lines: LEVEL:date time pid:tid file.cpp:line] text
KINETO_LINE = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\]", re.M)


def test_callback_windows_keep_kineto_off_the_jobs_stderr(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPROF_", "KINETO_"))}
    p = subprocess.run(
        [sys.executable, "train.py", "out"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.splitlines()[-1] == "trained"
    assert not KINETO_LINE.search(p.stderr), p.stderr[-4000:]
    # The windows were recorded all the same.
    windows = list((tmp_path / "out" / "fastprof" / "hf" / "rank0" / "torch").glob("*.pt.trace.json.gz"))
    assert windows, sorted(str(f) for f in (tmp_path / "out").rglob("*"))
