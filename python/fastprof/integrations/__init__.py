"""Profilers for training frameworks, each in its own module, imported on
demand (``import fastprof`` imports none of them, nor their framework):

* :mod:`fastprof.integrations.lightning`: ``FastprofProfiler`` for
  ``lightning.pytorch.Trainer(profiler=...)``.
"""
