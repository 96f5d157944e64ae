"""One path for a Profiler's options given from outside a script: Lightning's
``FastprofProfiler``, Transformers' ``FastprofCallback`` and ``fastprof run``
each keep what they were given as a :class:`ProfilerArgs`, checked when given
(a :class:`fastprof.ConfigError` before training), and make each run's
:class:`fastprof.Profiler` from it by one rule: where it records (the
user's ``out_dir``; else none while a recording runs or ``FASTPROF_OUT_DIR``
is set; else the framework's folder) and its name (the user's, else
``FASTPROF_RUN_NAME``, suffixed ``-2``, ``-3``... for a framework's later
runs)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fastprof.profiler.loop import Profiler
from fastprof.profiler.options import UNSET, framework_out_dir

__all__ = ["ProfilerArgs"]

Folder = str | os.PathLike[str] | Path


@dataclass(frozen=True)
class ProfilerArgs:
    out_dir: Folder | None
    run_name: str | None
    #: The Profiler's keyword options (schedule, torch, triggers...) and the recorder's.
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def checked(cls, out_dir: Folder | None, run_name: str | None, options: Mapping[str, Any]) -> ProfilerArgs:
        """``options`` as given (an option left at ``UNSET`` is not given), each
        checked now: a Profiler is made from them and never started."""
        given = {k: v for k, v in options.items() if v is not UNSET}
        args = cls(out_dir, run_name, MappingProxyType(given))
        args.make()
        return args

    def make(self, run: int = 1, folder: Callable[[], Folder] | None = None) -> Profiler:
        """The Profiler of a framework's ``run``-th run (1: the first), whose
        own folder for fastprof's runs is ``folder()`` (None: no framework)."""
        out_dir = self.out_dir if folder is None else framework_out_dir(self.out_dir, folder)
        run_name = self.run_name
        if folder is not None:
            run_name = run_name or os.environ.get("FASTPROF_RUN_NAME") or None
            if run_name is not None and run > 1:
                run_name = f"{run_name}-{run}"
        return Profiler(out_dir, run_name, **self.options)
