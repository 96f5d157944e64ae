"""Profilers for training frameworks, each in its own module, imported on
demand (``import fastprof`` imports none of them, nor their framework):

* :mod:`fastprof.integrations.lightning`: ``FastprofProfiler`` for
  ``lightning.pytorch.Trainer(profiler=...)``.
* :mod:`fastprof.integrations.mlflow`: ``log_report`` (a report's files as
  MLflow artifacts, its headline numbers as metrics), which
  ``fastprof.report`` calls when an MLflow run is active.
"""
