"""Log a fastprof report to MLflow: its files as artifacts, its headline
numbers as metrics.

::

    import mlflow, fastprof

    with mlflow.start_run():
        train()                              # under fastprof.Profiler
        fastprof.report("fastprof_runs/exp1")   # logged to the active run

:func:`fastprof.report` calls :func:`log_report` by itself when a run is
active (its ``mlflow`` option: ``None`` = then, ``True`` = always, ``False``
= never; ``FASTPROF_MLFLOW`` when the argument is ``None``), and a failure
there is one :class:`fastprof.FastprofWarning`, never an exception: the
report is on disk either way. Called directly, :func:`log_report` raises.

``import fastprof`` never imports mlflow (about a second and a half of
imports); this module does, on its first call. Install it with
``pip install 'fastprof-torch[mlflow]'`` (``mlflow-skinny`` is enough).

Metrics (each only when the report has the number; a metric name is
``fastprof.`` and the key below, which MLflow accepts as it is):

=========================== =====================================================
``train_iterations_per_s``  speed: steps per second, warm-up steps excluded
``train_samples_per_s``     speed: samples per second (batch size known)
``step_mean_s``, ``step_p50_s``, ``step_p95_s``, ``step_max_s``
                            speed: step-time distribution
``steps``                   speed: steps measured
``wall_s``                  the recording's wall time
``peak_rss_bytes``          system: peak process RSS, the largest rank's
``dataloader_share_pct``    the DataLoader's share of step time, as the
                            recommendation quotes it
``gpu_util_mean_pct``       system: mean GPU utilisation over the devices
``gpu_mem_peak_bytes``      system: peak GPU memory used, the largest device's
``energy_j``                system: GPU energy of the recording, all devices
``energy_per_sample_j``     system: GPU energy per sample, all devices
``recommendations``         the number of recommendations that fired
=========================== =====================================================
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastprof._core import ConfigError, FastprofFileNotFoundError, FastprofWarning
from fastprof._package import pip_install
from fastprof.recording.names import REPORT_JSON
from fastprof.reports.csvout import TABLES
from fastprof.reports.report import Report

#: The prefix of every metric name.
PREFIX = "fastprof."
#: The environment variable read when ``fastprof.report(mlflow=None)``.
ENV = "FASTPROF_MLFLOW"


@dataclass
class Logged:
    """What :func:`log_report` logged: the run, the metrics (full names) and
    the artifacts' paths inside the run."""

    run_id: str
    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [f for f in (_num(r.get(key)) for r in rows) if f is not None]


def headline(doc: Mapping[str, Any]) -> dict[str, float]:
    """The report document's headline numbers, keyed without the prefix
    (missing or non-finite numbers left out)."""
    out: dict[str, float | None] = {}
    speed, system = doc.get("speed") or {}, doc.get("system") or {}
    train, step = speed.get("train") or {}, speed.get("step_time") or {}
    out["train_iterations_per_s"] = _num(train.get("iterations_per_s"))
    out["train_samples_per_s"] = _num(train.get("samples_per_s"))
    for k in ("mean", "p50", "p95", "max"):
        out[f"step_{k}_s"] = _num(step.get(f"{k}_s"))
    out["steps"] = _num(step.get("count"))
    out["wall_s"] = _num((doc.get("wall") or {}).get("duration_s"))
    rss = _values(system.get("host") or [], "rss_peak_b")
    out["peak_rss_bytes"] = max(rss) if rss else None
    recs = doc.get("recommendations") or {}
    share = [c.get("measured") for c in recs.get("checks") or [] if c.get("rule") == "dataloader"]
    out["dataloader_share_pct"] = _num(share[0]) if share else None
    devices = (system.get("gpu") or {}).get("devices") or []
    util = _values(devices, "util_mean_pct")
    out["gpu_util_mean_pct"] = sum(util) / len(util) if util else None
    mem = _values(devices, "mem_used_peak_b")
    out["gpu_mem_peak_bytes"] = max(mem) if mem else None
    energy = _values(devices, "energy_j")
    out["energy_j"] = sum(energy) if energy else None
    per_sample = _values(devices, "energy_per_sample_j")
    out["energy_per_sample_j"] = sum(per_sample) if per_sample else None
    if "items" in recs:
        out["recommendations"] = float(len(recs["items"]))
    return {k: v for k, v in out.items() if v is not None}


def _load(report_or_path: Any) -> tuple[dict[str, Any], list[Path]]:
    """(document, files) of a Report, a report.json, or a directory holding
    one (a reports directory, or a run directory with ``reports/``)."""
    if isinstance(report_or_path, Report):
        return report_or_path.data, [Path(f) for f in report_or_path.files]
    if not isinstance(report_or_path, (str, os.PathLike)):
        raise ConfigError(
            "invalid argument report_or_path: expected a fastprof.Report or a path, "
            f"got {type(report_or_path).__name__}"
        )
    p = Path(report_or_path)
    for candidate in (p, p / REPORT_JSON, p / "reports" / REPORT_JSON):
        if candidate.is_file():
            break
    else:
        raise FastprofFileNotFoundError(
            f"{p}: no report.json there (write one with fastprof.report or fastprof report)"
        )
    try:
        doc = json.loads(candidate.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{candidate}: not a fastprof report ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "fastprof.report":
        raise ConfigError(f'{candidate}: not a fastprof report (no "schema": "fastprof.report")')
    d = candidate.parent
    names = [candidate.name, *(f"{t}.csv" for t in TABLES), "report.html"]
    return doc, [d / n for n in names if (d / n).is_file()]


def _mlflow() -> Any:
    """mlflow, with the entities a log is made of: imported here only, at
    the first call (``import fastprof`` never pays for it); ImportError
    without it."""
    import mlflow.entities

    return mlflow


def log_report(report_or_path: Any, *, run_id: str | None = None, artifact_path: str = "fastprof") -> Logged:
    """Log a report's files (``report.json``, the CSVs, ``report.html``) as
    artifacts under ``artifact_path`` and its headline numbers as
    ``fastprof.*`` metrics (see the module's table) into the MLflow run
    ``run_id``, by default the active run.

    ``report_or_path``: a :class:`fastprof.Report` (its written files are
    logged; none when it was built with ``formats=()``), a ``report.json``, or
    a directory holding one (``<run>/reports`` or the run directory).

    Raises :class:`fastprof.ConfigError` when mlflow is not installed or
    there is neither an active run nor a ``run_id``, and lets MLflow's own
    errors through (a run that does not exist, a store that cannot be
    written).
    """
    try:
        mlflow = _mlflow()
    except ImportError as e:
        raise ConfigError(f"mlflow is not installed ({e}): {pip_install('mlflow')}") from None
    if run_id is None:
        active = mlflow.active_run()
        if active is None:
            raise ConfigError("no active MLflow run and no run_id: call mlflow.start_run() first or pass run_id")
        run_id = str(active.info.run_id)
    doc, files = _load(report_or_path)
    client = mlflow.MlflowClient()
    now = int(time.time() * 1000)
    metrics = {PREFIX + k: v for k, v in headline(doc).items()}
    if metrics:
        client.log_batch(run_id, metrics=[mlflow.entities.Metric(k, v, now, 0) for k, v in metrics.items()])
    logged = Logged(run_id, metrics)
    for f in files:
        client.log_artifact(run_id, str(f), artifact_path or None)
        logged.artifacts.append(f"{artifact_path}/{f.name}" if artifact_path else f.name)
    return logged


def _setting(given: bool | None) -> bool | None:
    """``fastprof.report``'s ``mlflow`` option: the argument, else
    ``FASTPROF_MLFLOW`` (1/0, true/false, yes/no, on/off, auto), else None
    (auto)."""
    if given is not None:
        if not isinstance(given, bool):
            raise ConfigError(f"invalid option mlflow: expected None, True or False, got {given!r}")
        return given
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"invalid environment variable {ENV}={raw!r} (option mlflow): expected auto, 1/0, true/false")


def check_option(given: bool | None) -> bool | None:
    """Resolve and check ``fastprof.report``'s ``mlflow`` option before any
    work: ``True`` with mlflow missing is a :class:`fastprof.ConfigError`."""
    setting = _setting(given)
    if setting:
        try:
            _mlflow()
        except ImportError as e:
            raise ConfigError(f"invalid option mlflow=True: mlflow is not installed ({e})") from None
    return setting


def auto_log(report: Any, setting: bool | None) -> Logged | None:
    """What ``fastprof.report`` calls once the files are written: log when
    ``setting`` is True, or when it is None and mlflow is imported with an
    active run. Any failure is one FastprofWarning; returns what was logged."""
    if setting is False:
        return None
    if setting is None:
        # Only a process that imported mlflow can have an active run, so a
        # report never pays for importing it.
        mod = sys.modules.get("mlflow")
        try:
            if mod is None or mod.active_run() is None:
                return None
        except Exception as e:  # noqa: BLE001 - a broken mlflow must not fail the report
            warnings.warn(f"fastprof: report not logged to MLflow: {e}", FastprofWarning, stacklevel=3)
            return None
    try:
        return log_report(report)
    except Exception as e:  # noqa: BLE001 - the report is written; logging it is a bonus
        what = f"{type(e).__name__}: {e}".splitlines()[0]
        warnings.warn(f"fastprof: report not logged to MLflow: {what}", FastprofWarning, stacklevel=3)
        return None
