"""Reports of a run: time, speed, system and energy, across ranks, the
step-time breakdown and recommendations, as JSON, CSV and terminal tables.

They read files (a run directory or a single trace) through the core's
columnar read-back, never a live session."""

from fastprof.reports.data import ReportInputError
from fastprof.reports.report import SCHEMA_PATH, SCHEMA_VERSION, Report, report

__all__ = ["SCHEMA_PATH", "SCHEMA_VERSION", "Report", "ReportInputError", "report"]
