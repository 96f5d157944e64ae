"""One story per report (issue #36, item 3): a run whose anomaly opens a
torch.profiler capture of a few steps that are not like the others.

* The recommendations quote the every-step anatomy, not the captured steps'
  breakdown, and the breakdown's figures say which steps they are ("the 5
  steps captured after the anomaly at step 60").
* One slow-step rule: the live anomaly trigger (triggers.json), report.json's
  ``slow_steps[]``, the terminal and the page state the same rule and name the
  same steps.

Real torch on CPU with the real Profiler, a real DataLoader and its triggers;
report.json and triggers.json are read with Python's json."""

from __future__ import annotations

import html
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fastprof
from fastprof.profiler.slow_step import SlowStepRule

torch = pytest.importorskip("torch")

SLOW = 60
JOB = f"""
import sys, time, torch, fastprof
SLOW = {SLOW}
class Data(torch.utils.data.Dataset):
    # The loader's wait is long only in the 30 steps after the slow one: the
    # capture the anomaly opens sees mostly loader; every step, far less.
    def __len__(self):
        return 260
    def __getitem__(self, i):
        if SLOW < i <= SLOW + 30:
            time.sleep(0.04)
        return torch.randn(16, 64)
torch.manual_seed(0)
model = torch.nn.Linear(64, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=0)
prof = fastprof.Profiler(sys.argv[1], "run", torch=fastprof.TorchWindows(), sample_hz=0, sync_clocks=False,
                         schedule=fastprof.schedule.epoch(wait=100000, warmup=0, active=1, repeat=0),
                         triggers=fastprof.Triggers(poll_s=0.05))
with prof:
    for i, x in enumerate(prof.loader(loader)):
        time.sleep(0.01)  # steps of ~10 ms: a loaded host's hiccups stay under 3x
        if i == SLOW:
            time.sleep(0.4)
        model(x).sum().backward()
        opt.step(); opt.zero_grad()
        prof.step()
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("story")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run([sys.executable, "-c", JOB, str(tmp)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp / "run"


@pytest.fixture(scope="module")
def reported(run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, str]:
    """report.json, the terminal's text and the page's text (whitespace folded)."""
    out = tmp_path_factory.mktemp("story-report")
    rep = fastprof.report(run, out_dir=out, formats=("json", "html"))
    doc = json.loads((out / "report.json").read_text())
    buf = io.StringIO()
    rep.print(file=buf)
    page = html.unescape((out / "report.html").read_text())
    return doc, " ".join(buf.getvalue().split()), " ".join(page.split())


def test_recommendations_use_every_step_and_the_captures_figures_say_what_they_are(
    run: Path, reported: tuple[dict[str, Any], str, str]
) -> None:
    doc, terminal, page = reported
    triggers = json.loads((run / "rank0" / "triggers.json").read_text())
    capture = next(c for c in triggers["captures"] if c["source"] == "anomaly")
    assert capture["status"] == "done" and SLOW < capture["first_step"] <= SLOW + 30 - capture["steps"]
    (an,) = doc["anatomy"]["per_rank"]
    every = 100 * an["phases"]["dataloader"]["total_ns"] / an["step_total_ns"]
    (bd,) = doc["breakdown"]["per_rank"]
    captured = 100 * bd["dataloader_ns"] / bd["duration_ns"]
    # The two stories differ: the captured steps are mostly the loader's wait.
    assert bd["steps"] == capture["steps"] and captured > every + 20, (captured, every)
    (check,) = [c for c in doc["recommendations"]["checks"] if c["rule"] == "dataloader"]
    assert check["measured"] == pytest.approx(every, rel=1e-9)
    assert f"{every:.1f}%" in check["message"] and f"every step: {an['steps']} steps" in check["message"]
    # The breakdown's figures are labelled as what they are, in report.json and the terminal.
    last = capture["first_step"] + capture["steps"] - 1
    label = (
        f"the {capture['steps']} steps captured after the anomaly at step {SLOW} "
        f"(steps {capture['first_step']}..{last})"
    )
    assert label in doc["breakdown"]["steps_from"]
    assert f"Step-time breakdown (% of step time in {label}" in terminal
    assert f"Step-time breakdown (in {label}" in page


def test_one_slow_step_rule_in_the_trigger_report_terminal_and_page(
    run: Path, reported: tuple[dict[str, Any], str, str]
) -> None:
    doc, terminal, page = reported
    triggers = json.loads((run / "rank0" / "profiler.json").read_text())["triggers"]
    live = {int(a["step"]): a for a in triggers["anomalies"]}
    assert SLOW in live, live
    # The rule the trigger ran with is the one the report states.
    rule = SlowStepRule.of_triggers(triggers["config"])
    assert doc["anatomy"]["slow_step_rule"] == rule.to_dict()
    (an,) = doc["anatomy"]["per_rank"]
    # The same steps: every anomaly the trigger found is a slow step of the report, and no other.
    assert an["slow_step_count"] == len(live)
    listed = {int(s["step"]): s for s in an["slow_steps"]}
    assert set(listed) <= set(live) and len(listed) == min(len(live), 10)
    for step, s in listed.items():
        assert s["trigger"] == live[step]["action"]
        assert s["dur_ns"] / 1e6 == pytest.approx(live[step]["duration_ms"], rel=0.05)
    assert listed[SLOW]["trigger"] == "captured"
    # The terminal and the page say the rule once and list the same steps, one kind of slow step.
    assert rule.text() in terminal and rule.text() in page
    for step in sorted(listed, key=lambda k: -listed[k]["dur_ns"])[:3]:
        assert terminal.count(f"Slow step on rank 0: step {step} took") == 1
        assert f"Slow step on rank 0: step {step} took" in page
    assert "(the anomaly trigger): step" not in terminal


EPOCHS = """
import sys, time, torch, fastprof
SEEN = set()
class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 100
    def __getitem__(self, i):
        # The first batch of the second epoch is slow (a loader's restart),
        # and so is one batch in the middle of it.
        if (i == 0 and i in SEEN) or (i == 50 and i in SEEN):
            time.sleep(0.3)
        SEEN.add(i)
        return torch.randn(16, 64)
model = torch.nn.Linear(64, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=0)
prof = fastprof.Profiler(sys.argv[1], "run", torch=fastprof.TorchWindows(), sample_hz=0, sync_clocks=False,
                         schedule=fastprof.schedule.epoch(wait=100000, warmup=0, active=1, repeat=0),
                         triggers=fastprof.Triggers(poll_s=0.05, anomaly_max=0))
with prof:
    for epoch in range(2):
        for x in prof.loader(loader):
            time.sleep(0.01)
            model(x).sum().backward()
            opt.step(); opt.zero_grad()
            prof.step()
"""


def test_the_first_step_of_an_epoch_is_judged_by_neither(tmp_path: Path) -> None:
    """The live detector leaves an epoch's first step out (a loader's
    restart); the report reads the steps' epochs and leaves it out too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", EPOCHS, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    live = json.loads((tmp_path / "run" / "rank0" / "triggers.json").read_text())["anomalies"]
    assert 150 in {a["step"] for a in live} and 100 not in {a["step"] for a in live}, live
    rep = fastprof.report(tmp_path / "run", formats=())
    (an,) = rep["anatomy"]["per_rank"]
    slow = {s["step"] for s in an["slow_steps"]}
    assert 150 in slow and 100 not in slow, an["slow_steps"]
    assert an["slow_step_count"] == len(live) and slow <= {a["step"] for a in live}
