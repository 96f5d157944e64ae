"""``fastprof.report``: every report of a run in one JSON-able document,
written as JSON (schema ``schema/report.v1.json``), CSV tables and one
self-contained HTML page."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastprof._core import ConfigError, __version__
from fastprof.reports import data as _data
from fastprof.reports.ranks import ranks_report
from fastprof.reports.recommendations import recommend
from fastprof.reports.speed import speed_report
from fastprof.reports.system import system_report
from fastprof.reports.time import time_report

SCHEMA_ID = "fastprof.report"
SCHEMA_VERSION = 1
FORMATS = ("json", "csv", "html")
SCHEMA_PATH = Path(__file__).with_name("schema") / "report.v1.json"


@dataclass
class Report:
    """A run's reports: :attr:`data` is the document the JSON file holds
    (sections ``time``, ``speed``, ``system``, ``ranks``, ``breakdown``,
    ``recommendations``); :attr:`files` the files written."""

    data: dict[str, Any]
    files: list[Path] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def recommendations(self) -> list[dict[str, Any]]:
        return list(self.data["recommendations"]["items"])

    def to_json(self) -> str:
        return json.dumps(self.data, indent=1, allow_nan=False)

    def print(self, verbose: bool = False, file: Any = None) -> None:
        """Print the key tables (rich) to ``file`` (stdout by default)."""
        from fastprof.reports.terminal import render

        render(self.data, verbose=verbose, file=file)


class _Progress:
    def __init__(self, on: bool) -> None:
        self.on = on
        self.t0 = time.perf_counter()

    def __call__(self, what: str) -> None:
        if self.on:
            print(f"fastprof report: {time.perf_counter() - self.t0:6.2f} s  {what}", file=sys.stderr, flush=True)


def breakdown_section(data: _data.RunData) -> tuple[dict[str, Any] | None, str | None]:
    """The step-time breakdown section (``$defs/breakdown`` of the schema: per
    (rank, step) role times in ns, GPU util, SM efficiency, occupancy, tensor
    core share, temporal / idle / kernel-type / overlap fields), computed in
    Rust by ``fastprof._core.analyze_steps`` over the run's traces, or None
    and the reason."""
    from fastprof.reports.breakdown import report_section

    return report_section(data.inputs)


def build(
    path: str | os.PathLike[str],
    verbose: bool = False,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    tick = _Progress(progress)
    tick(f"reading {path}")
    data = _data.load(path)
    tick(f"read {len(data.cols.spans['ts'])} spans, {len(data.cols.counters['ts'])} counter samples")
    return build_from(data, verbose, warmup_steps, batch_size, tick)


def build_from(
    data: _data.RunData,
    verbose: bool = False,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
    tick: _Progress | None = None,
) -> dict[str, Any]:
    """The report document of a run already read (:func:`fastprof.reports.data.load`)."""
    tick = tick or _Progress(False)
    t = time_report(data, verbose=verbose)
    tick("time report")
    speed = speed_report(data, warmup_steps, batch_size)
    tick("speed report")
    system = system_report(data, speed["batch_size"]["value"])
    tick("system report")
    ranks = ranks_report(data, speed["warmup"]["steps_excluded"])
    breakdown, reason = breakdown_section(data)
    tick("breakdown")
    recs = recommend(speed, system, breakdown)
    w0, w1 = data.wall()
    return {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "fastprof_version": __version__,
        "source": {
            "path": str(data.path),
            "run_dir": None if data.run_dir is None else str(data.run_dir),
            "inputs": [
                {
                    "path": str(f["path"]),
                    "kind": str(f["kind"]),
                    "rank": int(f["rank"]) if f["rank"] is not None else -1,
                }
                for f in data.cols.files
            ],
            "ranks": data.ranks,
            "warnings": list(data.cols.warnings),
        },
        "wall": {"start_ns": w0, "end_ns": w1, "duration_s": (w1 - w0) / 1e9},
        "time": t,
        "speed": speed,
        "system": system,
        "ranks": ranks,
        "breakdown": breakdown,
        "breakdown_reason": reason,
        "recommendations": recs,
    }


def default_out_dir(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p / "reports" if p.is_dir() else p.parent / "reports"


def report(
    path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    formats: tuple[str, ...] | list[str] = FORMATS,
    verbose: bool = False,
    progress: bool = False,
    *,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
) -> Report:
    """Build the reports of a run directory or a single trace and write them.

    ``out_dir``: where to write (default ``<run>/reports/``, or ``reports/``
    next to a trace given alone); ``formats``: any of ``"json"`` (one
    ``report.json``), ``"csv"`` (one file per table) and ``"html"`` (one
    self-contained ``report.html`` with plots); none writes nothing.
    ``verbose``: every span name in the time report, not only the loop's.
    ``warmup_steps``: steps left out of the rates (default: the schedule's
    skip_first, else 1). ``batch_size``: samples per step, for samples/s
    (default: a ``batch_size`` counter in the trace, else unknown).
    ``progress``: print each stage's time on stderr. Logging to MLflow is
    the caller's (:func:`fastprof.report` does it); reports never import an
    integration.

    Raises :class:`fastprof.FastprofFileNotFoundError` for a missing path,
    :class:`fastprof.TraceError` for a file that is not a trace, and
    :class:`fastprof.ConfigError` for a bad option.
    """
    fmts = [formats] if isinstance(formats, str) else list(formats)
    bad = [f for f in fmts if f not in FORMATS]
    if bad:
        raise ConfigError(f"invalid option formats: {bad} (choose from {', '.join(FORMATS)})")
    for opt, v in (("warmup_steps", warmup_steps), ("batch_size", batch_size)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < (0 if opt == "warmup_steps" else 1)):
            raise ConfigError(
                f"invalid option {opt}: expected an integer >= {0 if opt == 'warmup_steps' else 1}, got {v!r}"
            )
    tick = _Progress(progress)
    tick(f"reading {path}")
    data = _data.load(path)
    tick(f"read {len(data.cols.spans['ts'])} spans, {len(data.cols.counters['ts'])} counter samples")
    doc = build_from(data, verbose, warmup_steps, batch_size, tick)
    rep = Report(doc)
    if fmts:
        out = Path(out_dir) if out_dir is not None else default_out_dir(path)
        out.mkdir(parents=True, exist_ok=True)
        if "json" in fmts:
            from fastprof.reports.jsonout import write_json

            rep.files.append(write_json(doc, out))
        if "csv" in fmts:
            from fastprof.reports.csvout import write_csv

            rep.files.extend(write_csv(doc, out))
        if "html" in fmts:
            from fastprof.reports.html import write_html

            rep.files.append(write_html(doc, data, out))
            tick("report.html")
    return rep
