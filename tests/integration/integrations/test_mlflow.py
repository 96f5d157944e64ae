"""MLflow logging of reports (issue #11): a real CPU run through
fastprof.Profiler, reported with a real MLflow (mlflow-skinny) tracking a
local file store in the test's directory, read back with MlflowClient and
the artifacts' report.json with Python's json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import fastprof
from fastprof.integrations.mlflow import headline, log_report

mlflow = pytest.importorskip("mlflow")

PYTHON = Path(fastprof.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short training run (no torch windows: the report's numbers are
    what matters here, not their source)."""
    out = tmp_path_factory.mktemp("mlflow_run")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = DataLoader(TensorDataset(torch.randn(40, 8), torch.randn(40, 1)), batch_size=4)
    with fastprof.Profiler(out_dir=out, run_name="run", sample_hz=50, torch=False) as prof:
        for x, y in prof.loader(data):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return out / "run"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A file store of its own; no run left active afterwards."""
    # MLflow 3 refuses the file store unless asked; it is the local store
    # mlflow-skinny can run (the SQL stores need SQLAlchemy).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", root.as_uri())
    yield root
    while mlflow.active_run() is not None:
        mlflow.end_run()


def logged(run_id: str) -> tuple[dict[str, float], list[str]]:
    client = mlflow.MlflowClient()
    metrics = dict(client.get_run(run_id).data.metrics)
    arts = [a.path for a in client.list_artifacts(run_id)]
    for top in list(arts):
        arts.extend(a.path for a in client.list_artifacts(run_id, top))
    return metrics, sorted(arts)


def test_active_run_gets_artifacts_and_metrics(run_dir: Path, store: Path, tmp_path: Path) -> None:
    with mlflow.start_run() as run:
        rep = fastprof.report(run_dir, out_dir=tmp_path / "reports")
    metrics, arts = logged(run.info.run_id)
    names = {f.name for f in rep.files}
    assert {"report.json", "report.html", "speed.csv", "time.csv"} <= names
    assert arts == sorted(["fastprof", *(f"fastprof/{n}" for n in names)])
    speed, host = rep["speed"], rep["system"]["host"]
    expected = {
        "fastprof.train_iterations_per_s": speed["train"]["iterations_per_s"],
        "fastprof.train_samples_per_s": speed["train"]["samples_per_s"],
        "fastprof.step_p50_s": speed["step_time"]["p50_s"],
        "fastprof.step_p95_s": speed["step_time"]["p95_s"],
        "fastprof.step_max_s": speed["step_time"]["max_s"],
        "fastprof.steps": speed["step_time"]["count"],
        "fastprof.peak_rss_bytes": max(h["rss_peak_b"] for h in host),
        "fastprof.dataloader_share_pct": next(
            c["measured"] for c in rep["recommendations"]["checks"] if c["rule"] == "dataloader"
        ),
    }
    for k, v in expected.items():
        assert v is not None and metrics[k] == pytest.approx(float(v), rel=1e-12), k
    assert speed["train"]["per_rank"][0]["steps"] == 10
    # No GPU here: no GPU or energy metric rather than a made-up zero.
    if not rep["system"]["gpu"]["devices"]:
        assert not any(k.startswith(("fastprof.gpu_", "fastprof.energy")) for k in metrics)
    assert set(metrics) == {"fastprof." + k for k in headline(rep.data)}
    # The artifact is the report itself.
    got = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="fastprof/report.json", dst_path=str(tmp_path / "dl")
    )
    assert json.loads(Path(got).read_text()) == json.loads((tmp_path / "reports" / "report.json").read_text())


def test_no_active_run_logs_nothing(run_dir: Path, store: Path, tmp_path: Path) -> None:
    rep = fastprof.report(run_dir, out_dir=tmp_path / "reports", formats=("json",))
    assert rep.files and not store.exists()  # the store was never even created
    # and a run started afterwards holds nothing from it
    with mlflow.start_run() as run:
        pass
    assert logged(run.info.run_id) == ({}, [])


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_disabled_logs_nothing(run_dir: Path, store: Path, tmp_path: Path, how: str, monkeypatch) -> None:
    if how == "environment":
        monkeypatch.setenv("FASTPROF_MLFLOW", "0")
    with mlflow.start_run() as run:
        rep = fastprof.report(
            run_dir, out_dir=tmp_path / "r", formats=("json",), mlflow=False if how == "argument" else None
        )
    assert rep.files
    assert logged(run.info.run_id) == ({}, [])


def test_broken_store_warns_and_writes_the_report(run_dir: Path, store: Path, tmp_path: Path, monkeypatch) -> None:
    with mlflow.start_run() as run:
        # The store now points below a regular file: nothing can be written.
        blocker = tmp_path / "not_a_dir"
        blocker.write_text("x")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", (blocker / "mlruns").as_uri())
        with pytest.warns(fastprof.FastprofWarning, match="report not logged to MLflow") as rec:
            rep = fastprof.report(run_dir, out_dir=tmp_path / "reports", formats=("json", "csv"))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    assert len([w for w in rec if issubclass(w.category, fastprof.FastprofWarning)]) == 1
    assert (tmp_path / "reports" / "report.json").is_file() and len(rep.files) > 2
    assert logged(run.info.run_id) == ({}, [])


def test_explicit_true_without_run_warns(run_dir: Path, store: Path, tmp_path: Path) -> None:
    with pytest.warns(fastprof.FastprofWarning, match="no active MLflow run"):
        rep = fastprof.report(run_dir, out_dir=tmp_path / "r", formats=("json",), mlflow=True)
    assert rep.files


def test_explicit_true_without_mlflow_is_a_config_error(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what Python does for a module it cannot import
    with pytest.raises(fastprof.ConfigError, match="mlflow"):
        fastprof.report(run_dir, out_dir=tmp_path / "r", mlflow=True)
    assert not (tmp_path / "r").exists()
    with pytest.raises(
        fastprof.ConfigError, match=r"mlflow is not installed \(.*\): pip install 'fastprof-torch\[mlflow\]'"
    ):
        log_report(run_dir, run_id="x")
    monkeypatch.setenv("FASTPROF_MLFLOW", "maybe")
    with pytest.raises(fastprof.ConfigError, match="FASTPROF_MLFLOW"):
        fastprof.report(run_dir, formats=())


def test_log_report_from_a_path_into_a_given_run(run_dir: Path, store: Path, tmp_path: Path) -> None:
    out = tmp_path / "reports"
    rep = fastprof.report(run_dir, out_dir=out, formats=("json", "csv"), mlflow=False)
    client = mlflow.MlflowClient()
    run_id = client.create_run(client.get_experiment_by_name("Default").experiment_id).info.run_id
    done = log_report(out, run_id=run_id, artifact_path="profiling/reports")
    metrics, _ = logged(run_id)
    assert metrics == done.metrics
    assert metrics["fastprof.step_p50_s"] == pytest.approx(rep["speed"]["step_time"]["p50_s"], rel=1e-12)
    top = [a.path for a in client.list_artifacts(run_id, "profiling/reports")]
    assert sorted(top) == sorted(done.artifacts) == sorted(f"profiling/reports/{f.name}" for f in rep.files)
    with pytest.raises(fastprof.ConfigError, match="no active MLflow run"):
        log_report(out)
    with pytest.raises(fastprof.FastprofFileNotFoundError):
        log_report(tmp_path / "nowhere", run_id=run_id)


def test_import_and_report_do_not_import_mlflow(run_dir: Path) -> None:
    code = (
        "import sys, fastprof\n"
        f"fastprof.report({str(run_dir)!r}, formats=())\n"
        "assert 'mlflow' not in sys.modules, 'mlflow imported'\n"
    )
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": str(PYTHON)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
