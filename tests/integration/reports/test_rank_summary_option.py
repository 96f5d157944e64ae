"""``rank_summary`` turns a rank's summary off (issue #38): with it off, the
run's end starts no summary process, no ``rank{R}/summary.fastprof`` is
written, and the report of the run reads the segments. The option is taken
like every Profiler option: ``Profiler(rank_summary=...)`` wins over
``FASTPROF_RANK_SUMMARY``, which wins over the default (on); ``fastprof run``
takes the variable, and a script under it that starts its own Profiler that
Profiler's option (argument, else variable), as its other options.

The runs are real: a Python process with the real Profiler (no torch: the
summary is made of the fastprof segments alone), ended normally; the report
is read back with Python's ``json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fastprof.recording.names import RANK_SUMMARY_JSON
from fastprof.reports.report import report

STEPS = 20

#: ``argv[2]``: the argument, ``none`` (not given), ``0`` or ``1``.
JOB = textwrap.dedent(
    f"""
    import sys
    import fastprof

    given = {{"none": None, "0": False, "1": True}}[sys.argv[2]]
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", torch=False, rank_summary=given)
    with prof:
        for _ in prof.loader(range({STEPS})):
            with fastprof.span("work"):
                sum(range(20_000))
            prof.step()
    """
)

#: The same loop for ``fastprof run`` (its own Profiler steps at each next()).
ZERO_CODE = textwrap.dedent(
    f"""
    import fastprof

    for _ in range({STEPS}):
        with fastprof.span("work"):
            sum(range(20_000))
    """
)

#: A script that starts its own Profiler, given ``argv[1]`` (as ``JOB``),
#: for ``fastprof run`` (which decides where the run records).
OWN = textwrap.dedent(
    f"""
    import sys
    import fastprof

    given = {{"none": None, "0": False, "1": True}}[sys.argv[1]]
    prof = fastprof.Profiler(torch=False, rank_summary=given)
    with prof:
        for _ in prof.loader(range({STEPS})):
            with fastprof.span("work"):
                sum(range(20_000))
            prof.step()
    """
)

#: A Lightning fit whose FastprofProfiler is given ``argv[2]`` (as ``JOB``).
LIGHTNING = textwrap.dedent(
    """
    import sys, warnings
    import torch
    import lightning.pytorch as pl
    from fastprof.integrations.lightning import FastprofProfiler

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    warnings.simplefilter("ignore")  # Lightning's advice is not this test's business
    given = {"none": None, "0": False, "1": True}[sys.argv[2]]
    ds = torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 1))
    trainer = pl.Trainer(
        max_epochs=1, profiler=FastprofProfiler(sys.argv[1], "job", rank_summary=given), logger=False,
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
        accelerator="cpu", devices=1, default_root_dir=sys.argv[1],
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(ds, batch_size=2))
    """
)


def _env(variable: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    env["FASTPROF_SAMPLE_HZ"] = "0"
    if variable is not None:
        env["FASTPROF_RANK_SUMMARY"] = variable
    return env


def _job(tmp_path: Path, given: str, variable: str | None, code: str = JOB) -> Path:
    """The rank folder of a run (``code``) whose Profiler is given ``given``
    with ``FASTPROF_RANK_SUMMARY`` set to ``variable`` (None: unset)."""
    script = tmp_path / "job.py"
    script.write_text(code)
    out = tmp_path / f"out-{given}-{variable}"
    r = subprocess.run(
        [sys.executable, str(script), str(out), given],
        env=_env(variable),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "summary" not in r.stderr, r.stderr[-2000:]  # neither failed nor cut short
    rank = out / "job" / "rank0"
    assert any(rank.glob("fastprof.*.json.gz")), sorted(p.name for p in rank.iterdir())
    return rank


def _kinds(doc: dict[str, Any]) -> set[str]:
    return {str(i["kind"]) for i in doc["source"]["inputs"]}


@pytest.mark.parametrize(
    ("given", "variable", "written"),
    [
        ("none", None, True),  # the default: on
        ("0", None, False),  # off by the argument
        ("none", "0", False),  # off by the variable
        ("1", "0", True),  # the argument wins over the variable ...
        ("0", "1", False),  # ... both ways
    ],
)
def test_the_argument_wins_over_the_variable_which_wins_over_the_default(
    tmp_path: Path, given: str, variable: str | None, written: bool
) -> None:
    rank = _job(tmp_path, given, variable)
    assert (rank / RANK_SUMMARY_JSON).is_file() is written


def test_the_report_of_a_run_without_summaries_reads_its_segments(tmp_path: Path) -> None:
    rank = _job(tmp_path, "0", None)
    run = rank.parent
    assert not (rank / RANK_SUMMARY_JSON).exists()
    doc = report(run, tmp_path / "report", formats=("json", "csv", "html")).data
    assert "summary" not in _kinds(doc) and _kinds(doc)
    assert doc["speed"]["train"]["per_rank"][0]["steps"] == STEPS
    # The CLI's report of it, its report.json read with Python's json.
    p = subprocess.run(
        [sys.executable, "-m", "fastprof", "report", str(run), "-o", str(tmp_path / "cli")],
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    cli = json.loads((tmp_path / "cli" / "report.json").read_text())
    assert "summary" not in _kinds(cli) and cli["speed"]["train"]["per_rank"][0]["steps"] == STEPS
    assert (tmp_path / "cli" / "report.html").stat().st_size > 0


def _fastprof_run(tmp_path: Path, code: str, variable: str | None, *args: str) -> Path:
    """The rank folder of ``fastprof run`` of ``code`` (its arguments
    ``args``), ``FASTPROF_RANK_SUMMARY`` set to ``variable`` (None: unset)."""
    script = tmp_path / "train.py"
    script.write_text(code)
    out = tmp_path / "runs"
    r = subprocess.run(
        [sys.executable, "-m", "fastprof", "run", "-o", str(out), "--run-name", "zero", str(script), *args],
        env=_env(variable),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "summary" not in r.stderr, r.stderr[-2000:]  # neither failed nor cut short
    rank = out / "zero" / "rank0"
    assert any(rank.glob("fastprof.*.json.gz")), r.stderr[-2000:]
    return rank


@pytest.mark.parametrize(("variable", "written"), [(None, True), ("0", False)])
def test_fastprof_run_takes_the_variable(tmp_path: Path, variable: str | None, written: bool) -> None:
    rank = _fastprof_run(tmp_path, ZERO_CODE, variable)
    assert (rank / RANK_SUMMARY_JSON).is_file() is written


@pytest.mark.parametrize(
    ("given", "variable", "written"),
    [
        ("none", None, True),  # the default: on
        ("0", None, False),  # off by the script's argument
        ("none", "0", False),  # off by the variable
        ("1", "0", True),  # the script's argument wins over the variable ...
        ("0", "1", False),  # ... both ways
    ],
)
def test_under_fastprof_run_the_scripts_own_profiler_decides(
    tmp_path: Path, given: str, variable: str | None, written: bool
) -> None:
    rank = _fastprof_run(tmp_path, OWN, variable, given)
    assert (rank / RANK_SUMMARY_JSON).is_file() is written
    if written:  # the run's summary: the script's steps, as its Profiler took them
        doc = json.loads((rank / RANK_SUMMARY_JSON).read_text())
        assert doc["report"]["speed"]["train"]["per_rank"][0]["steps"] == STEPS


@pytest.mark.parametrize(("given", "written"), [("none", True), ("0", False)])
def test_lightnings_profiler_takes_it(tmp_path: Path, given: str, written: bool) -> None:
    pytest.importorskip("lightning")
    # The variable says on: the argument, through FastprofProfiler, says otherwise.
    rank = _job(tmp_path, given, "1", LIGHTNING)
    assert (rank / RANK_SUMMARY_JSON).is_file() is written
