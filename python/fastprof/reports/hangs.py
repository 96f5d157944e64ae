"""report.json's ``hangs[]`` (issue #37): the verdicts of
:mod:`fastprof.profiler.drivers.hang.verdict` over the ranks' evidence files
of a run (a run killed while hung included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastprof.profiler.drivers.hang.verdict import collect

__all__ = ["hangs_report"]


def hangs_report(data: Any) -> list[dict[str, Any]]:
    """report.json's ``hangs[]`` for a run's data (``data.run_dir``: where
    its side files are; none: no hang evidence to read)."""
    run_dir = getattr(data, "run_dir", None)
    if run_dir is None:
        return []
    return [{k: v for k, v in h.items() if k != "time"} | {"time_s": h["time"]} for h in collect(Path(run_dir))]
