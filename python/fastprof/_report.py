"""``fastprof.report``: write a run's reports (:mod:`fastprof.reports`), then
log them to MLflow when asked (:mod:`fastprof.integrations.mlflow`).

The caller decides to log, so that reports never import an integration: the
dependency points one way, integrations -> reports."""

from __future__ import annotations

import os

from fastprof.reports.report import FORMATS, Report
from fastprof.reports.report import report as _write


def report(
    path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    formats: tuple[str, ...] | list[str] = FORMATS,
    verbose: bool = False,
    progress: bool = False,
    *,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
    mlflow: bool | None = None,
) -> Report:
    """Build the reports of a run directory or a single trace and write them
    (:func:`fastprof.reports.report`, whose arguments these are), then log
    them to MLflow.

    ``mlflow``: log the written files as artifacts and the headline numbers
    as metrics into the active MLflow run
    (:func:`fastprof.integrations.mlflow.log_report`): None (default) when
    mlflow is imported and a run is active, True always (a
    :class:`fastprof.ConfigError` when mlflow is not installed), False never;
    with None, ``FASTPROF_MLFLOW`` (auto, 1/0) decides. A failure to log is
    one :class:`fastprof.FastprofWarning`; the files are written.

    Raises :class:`fastprof.FastprofFileNotFoundError` for a missing path,
    :class:`fastprof.TraceError` for a file that is not a trace, and
    :class:`fastprof.ConfigError` for a bad option, and :class:`OSError`
    naming ``out_dir`` when the files cannot be written (then none is).
    """
    from fastprof.integrations import mlflow as _mlflow  # lazy: integrations load on demand (see their package)

    log_to_mlflow = _mlflow.check_option(mlflow)
    rep = _write(
        path,
        out_dir=out_dir,
        formats=formats,
        verbose=verbose,
        progress=progress,
        warmup_steps=warmup_steps,
        batch_size=batch_size,
    )
    _mlflow.auto_log(rep, log_to_mlflow)
    return rep
