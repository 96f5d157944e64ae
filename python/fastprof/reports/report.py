"""``fastprof.report``: every report of a run in one JSON-able document,
written as JSON (schema ``schema/report.v4.json``), CSV tables and one
self-contained HTML page."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from fastprof._core import ConfigError, __version__
from fastprof.recording.names import OPERATORS_JSON, REPORT_JSON
from fastprof.reports import data as _data
from fastprof.reports import long_run
from fastprof.reports import summaries as _summaries
from fastprof.reports.anatomy import anatomy_report
from fastprof.reports.breakdown import step_breakdown, steps_from
from fastprof.reports.csvout import TABLES, write_csv
from fastprof.reports.finite import encode, report_warning
from fastprof.reports.hangs import hangs_report
from fastprof.reports.jsonout import write_json
from fastprof.reports.memory import memory_report
from fastprof.reports.ranks import ranks_report
from fastprof.reports.recommendations import recommend
from fastprof.reports.resumed import resumed_report
from fastprof.reports.rotation import rotation_report
from fastprof.reports.speed import speed_report
from fastprof.reports.system import system_report
from fastprof.reports.time import time_report
from fastprof.reports.triggers import triggers_report
from fastprof.storage.run_view import LocalRun, RunView, open_run
from fastprof.storage.urls import check_location

SCHEMA_ID = "fastprof.report"
SCHEMA_VERSION = 4
FORMATS = ("json", "csv", "html")
#: One JSON Schema per schema_version: ``report.v{N}.json``.
SCHEMA_DIR = Path(__file__).with_name("schema")
#: The schema of the documents this fastprof writes.
SCHEMA_PATH = SCHEMA_DIR / f"report.v{SCHEMA_VERSION}.json"


@dataclass
class Report:
    """A run's reports: :attr:`data` is the document the JSON file holds
    (sections ``time``, ``speed``, ``system``, ``ranks``, ``breakdown``,
    ``memory``, ``recommendations``); :attr:`files` the files written."""

    data: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    #: A report of a run on object storage: the objects its files were put as.
    urls: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def recommendations(self) -> list[dict[str, Any]]:
        return list(self.data["recommendations"]["items"])

    def to_json(self) -> str:
        """The document as report.json holds it (non-finite numbers spelt as
        the trace spells them, see :mod:`fastprof.reports.finite`)."""
        return json.dumps(encode(self.data), indent=1, allow_nan=False)

    def print(self, verbose: bool = False, file: Any = None, title: str = "fastprof report") -> None:
        """Print the key tables (rich) to ``file`` (stdout by default), under ``title``."""
        from fastprof.reports.terminal import render  # lazy: heavy (rich), only for printing

        render(self.data, verbose=verbose, file=file, title=title)


class _Progress:
    def __init__(self, on: bool) -> None:
        self.on = on
        self.t0 = time.perf_counter()

    def __call__(self, what: str) -> None:
        if self.on:
            print(f"fastprof report: {time.perf_counter() - self.t0:6.2f} s  {what}", file=sys.stderr, flush=True)


def _nothing() -> None:
    """What a run read whole does between its sections."""


def _read_line(data: _data.RunData) -> str:
    """What the read gave, for the progress line."""
    line = f"read {len(data.cols.spans['ts'])} spans, {len(data.cols.counters['ts'])} counter samples"
    if data.long is not None:
        steps = sum(len(r.ts) for r in data.long.values())
        line += f" and {steps} steps through the step pass (a long run: its spans of every step are not kept as rows)"
    return line


def breakdown_section(data: _data.RunData) -> tuple[dict[str, Any] | None, str | None]:
    """The step-time breakdown section (``$defs/breakdown`` of the schema: per
    rank, role totals, step-time percentiles and GPU means), computed in Rust
    by ``fastprof._core.analyze_steps`` over the run's traces (unless
    :func:`report` did it already, writing breakdown.csv), or None and the
    reason. The summaries and bars stay on ``data.breakdown`` for the page."""
    b = data.breakdown
    if b is None:
        b = data.breakdown = step_breakdown(data.inputs, keep_rows=False)
    if len(b) == 0:
        return None, "no steps: neither ProfilerStep#N nor fastprof step spans were found"
    return b.to_section(), None


def build(
    path: str | os.PathLike[str],
    verbose: bool = False,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    tick = _Progress(progress)
    tick(f"reading {path}")
    data = _data.load(path, fold=not verbose)
    tick(_read_line(data))
    return build_from(data, verbose, warmup_steps, batch_size, tick)


def build_from(
    data: _data.RunData,
    verbose: bool = False,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
    tick: _Progress | None = None,
) -> dict[str, Any]:
    """The report document of a run already read (:func:`fastprof.reports.data.load`).

    Every value the recorder accepts goes through: a non-finite counter
    sample or an overflow leaves a non-finite float in the document (numpy
    says nothing of it here), and ``source.warnings`` names each one."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        doc = _build_from(data, verbose, warmup_steps, batch_size, tick or _Progress(False))
    said = report_warning(doc)
    if said is not None:
        doc["source"]["warnings"].append(said)
    return doc


def _build_from(
    data: _data.RunData, verbose: bool, warmup_steps: int | None, batch_size: int | None, tick: _Progress
) -> dict[str, Any]:
    # A long run's sections each free what they made before the next (long_run.trim).
    done = long_run.trim if data.long is not None else _nothing
    t = time_report(data, verbose=verbose)
    tick("time report")
    speed = speed_report(data, warmup_steps, batch_size)
    done()
    tick("speed report")
    system = system_report(data, speed["batch_size"]["value"])
    tick("system report")
    ranks = ranks_report(data, speed["warmup"]["steps_excluded"])
    done()
    breakdown, reason = breakdown_section(data)
    tick("breakdown")
    memory, memory_reason = memory_report(data, int(speed["warmup"]["steps_excluded"]))
    done()
    anatomy, anatomy_reason = anatomy_report(data, int(speed["warmup"]["steps_excluded"]))
    done()
    triggers = triggers_report(data)
    if breakdown is not None:
        # Its figures are quoted as what they are: which steps it covers (#36, item 3).
        breakdown["steps_from"] = steps_from(breakdown, triggers)
    recs = recommend(speed, system, breakdown, memory, anatomy)
    w0, w1 = data.wall()
    return {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "fastprof_version": __version__,
        "source": {
            "path": data.run.name,
            "run_dir": data.run.run_dir_name,
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
            "rotated": rotation_report(data),
            "resumed": resumed_report(data),
        },
        "wall": {"start_ns": w0, "end_ns": w1, "duration_s": (w1 - w0) / 1e9},
        "time": t,
        "speed": speed,
        "system": system,
        "ranks": ranks,
        "breakdown": breakdown,
        "breakdown_reason": reason,
        "memory": memory,
        "memory_reason": memory_reason,
        "anatomy": anatomy,
        "anatomy_reason": anatomy_reason,
        "triggers": triggers,
        "hangs": hangs_report(data),
        "recommendations": recs,
    }


def report(
    path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    formats: tuple[str, ...] | list[str] = FORMATS,
    verbose: bool = False,
    progress: bool = False,
    *,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
    from_segments: bool = False,
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

    A local run directory whose every rank wrote its summary at its end
    (``rank{R}/summary.fastprof``, see :mod:`fastprof.reports.summaries`) is
    reported from those summaries, without reading its traces, when the
    options are the defaults (not ``verbose``, no ``warmup_steps`` or
    ``batch_size``); ``from_segments=True`` reads the traces whatever
    there is. From summaries, breakdown.csv (a row per step and rank) and
    the page's breakdown bars are each rank's, kept in its summary (the
    same bytes and figures as from the traces), and the page reads the
    segments of the ranks it shows in detail.

    Raises :class:`fastprof.FastprofFileNotFoundError` for a missing path,
    :class:`fastprof.TraceError` for a file that is not a trace, and
    :class:`fastprof.ConfigError` for a bad option, and :class:`OSError`
    naming ``out_dir`` when the files cannot be written (then none is: the
    folder is as it was before).
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
    if out_dir is not None:
        check_location(out_dir, "output")
    tick(f"opening {path}")
    # The run read where it lives (a store's traces by ranged reads); its
    # files written in a local folder, then put where they go when that is
    # in a store (<url>/reports/, or the output URL given).
    with open_run(path) as run, run.output(out_dir) as out:
        sums = None
        if not (from_segments or verbose or warmup_steps is not None or batch_size is not None):
            sums = _rank_summaries(run, tick)
        if sums is not None:
            rep = _staged(out.folder, fmts, tick, partial(_from_summaries, run, sums))
        else:
            rep = _staged(out.folder, fmts, tick, partial(_from_segments, run, verbose, warmup_steps, batch_size))
        urls = out.deliver(rep.files, tick)
        if urls:
            rep.urls, rep.files = urls, []
        return rep


#: What makes a report's document: given the staging folder (None when no
#: file is asked for), the output folder, the formats and the progress line,
#: the document and the data its files are written from.
_Build = Callable[[Path | None, Path, list[str], _Progress], tuple[dict[str, Any], _data.RunData]]


def _staged(out: Path, fmts: list[str], tick: _Progress, build: _Build) -> Report:
    """The report that ``build`` makes, its files written into a staging
    folder and moved into ``out`` (:func:`_write`); the staging folder is
    removed whatever happens."""
    staging: Path | None = None
    try:
        if fmts:
            staging = _staging(out)
        doc, data = build(staging, out, fmts, tick)
        rep = Report(doc)
        if staging is not None:
            rep.files = _write(doc, data, staging, out, fmts, tick)
        return rep
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _from_segments(
    run: RunView,
    verbose: bool,
    warmup_steps: int | None,
    batch_size: int | None,
    staging: Path | None,
    out: Path,
    fmts: list[str],
    tick: _Progress,
) -> tuple[dict[str, Any], _data.RunData]:
    """The report of a run from its traces (a :data:`_Build`)."""
    # The breakdown first, its rows straight into breakdown.csv: its pass
    # over the traces is the report's largest memory, so it runs before
    # the columns are read, and keeps a few numbers per rank.
    tick(f"step-time breakdown of {run.name}")
    breakdown = _breakdown(run.target, staging if "csv" in fmts else None, out)
    tick(f"breakdown: {len(breakdown)} steps")
    data = _data.load(run.location, fold=not verbose, run=run)
    data.breakdown = breakdown
    tick(_read_line(data))
    return build_from(data, verbose, warmup_steps, batch_size, tick), data


def _rank_summaries(run: RunView, tick: _Progress) -> list[dict[str, Any]] | None:
    """The ranks' summaries of a local run directory, when every rank has
    one of its segments as they are now (else None: read the segments)."""
    folder = run.folder
    if not isinstance(run, LocalRun) or folder is None or not run.names_folder():
        return None  # a store run, a trace read alone, the unified trace named itself
    sums, why = _summaries.read_all(folder)
    tick(f"rank summaries: {len(sums)} read" if sums is not None else f"rank summaries not used: {why}")
    return sums


def _from_summaries(
    run: RunView, sums: list[dict[str, Any]], staging: Path | None, out: Path, fmts: list[str], tick: _Progress
) -> tuple[dict[str, Any], _data.RunData]:
    """The report of a run from its ranks' summaries, no trace read (a
    :data:`_Build`)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        doc, data = _summaries.combine(run, sums)
    said = report_warning(doc)
    if said is not None:
        doc["source"]["warnings"].append(said)
    tick("combined the rank summaries")
    if "html" in fmts and run.folder is not None:
        # The page's detail: the first ranks' segments (summaries.DETAIL_RANKS).
        shown = data.ranks[: _summaries.DETAIL_RANKS]
        data = _summaries.with_detail(data, _data.load_ranks(run.folder, shown), sums)
        tick(f"read the segments of rank(s) {shown[0]}-{shown[-1]} for the page's detail")
    if staging is not None and ("csv" in fmts or "html" in fmts):
        # breakdown.csv, one row per step and rank, and the page's
        # breakdown bars: each rank's, from its summary (no trace read).
        data.breakdown = _breakdown(partial(_summaries.breakdown_of, sums), staging if "csv" in fmts else None, out)
        tick(f"breakdown: {len(data.breakdown)} steps")
    return doc, data


def _breakdown(target: Path | str | Callable[[Path | None], Any], staging: Path | None, out: Path) -> Any:
    """:func:`fastprof.reports.breakdown.step_breakdown` of ``target`` (what
    :func:`fastprof.reports.data.load` reads; or a callable that makes the
    breakdown, given the CSV's path), writing breakdown.csv into
    ``staging`` (none without steps); a failure to write it names ``out``,
    the folder asked for."""
    csv_path = None if staging is None else staging / "breakdown.csv"
    try:
        if callable(target):
            b = target(csv_path)
        else:
            b = step_breakdown(target, csv=csv_path, keep_rows=False)
    except OSError as e:
        if staging is None or not str(e.filename or "").startswith(str(staging)):
            raise
        # A write error in the staging folder is the report folder's.
        raise OSError(e.errno, f"{e.strerror or e} (nothing written)", str(out)) from e
    if csv_path is not None and len(b) == 0:
        csv_path.unlink(missing_ok=True)
    return b


def _copy_model_summary(doc: dict[str, Any], data: _data.RunData, tmp: Path) -> list[str]:
    """The model summary the memory section names, beside report.json."""
    model = (doc.get("memory") or {}).get("model")
    if not model:
        return []
    src = data.model_summary[int(model["rank"])]
    names = []
    for f in (src, src.with_suffix(".txt")):
        if f.is_file():
            shutil.copyfile(f, tmp / f.name)
            names.append(f.name)
    return names


#: The operator tables a report writes: ``operators.json``/``.csv`` and one
#: ``operators.rank{R}.<window>.json``/``.csv`` per torch window.
_OPERATOR_FILE = re.compile(r"^operators(\.rank\d+\..+)?\.(json|csv)$")


def _staging(out: Path) -> Path:
    """A hidden folder beside ``out`` that the report is written into and
    then moved from (named as every fastprof temporary, ``.tmp-PID`` last)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.{secrets.token_hex(4)}.tmp-{os.getpid()}"
        tmp.mkdir()
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror or e} (nothing written)", str(out)) from e
    return tmp


def _write(
    doc: dict[str, Any], data: _data.RunData, tmp: Path, out: Path, fmts: list[str], tick: _Progress
) -> list[Path]:
    """Write the files into the staging folder ``tmp`` (breakdown.csv is
    there already), then move them in: a failure leaves ``out`` as it was
    (not created, or holding the last complete report), never an empty or
    half-written reports folder."""
    from fastprof.reports.html import write_html  # lazy: heavy (plotly), only for report.html

    try:
        names: list[str] = []
        if "json" in fmts:
            names.append(write_json(doc, tmp).name)
            names.extend(_copy_model_summary(doc, data, tmp))
            if data.operator_table is not None:
                (tmp / OPERATORS_JSON).write_text(json.dumps(data.operator_table.to_dict(), indent=1) + "\n")
                names.append(OPERATORS_JSON)
            for stem, table in data.operator_tables:  # one table per torch window
                (tmp / f"{stem}.json").write_text(json.dumps(table.to_dict(), indent=1) + "\n")
                names.append(f"{stem}.json")
        if "csv" in fmts:
            names.extend(p.name for p in write_csv(doc, tmp, data.breakdown))
            if data.operator_table is not None:
                (tmp / "operators.csv").write_text(data.operator_table.csv_text())
                names.append("operators.csv")
            for stem, table in data.operator_tables:
                (tmp / f"{stem}.csv").write_text(table.csv_text())
                names.append(f"{stem}.csv")
        if "html" in fmts:
            if data.long is not None:
                long_run.trim()
            names.append(write_html(doc, data, tmp, link_from=out).name)
            tick("report.html")
        if not out.exists():
            os.rename(tmp, out)
            return [out / n for n in names]
        # ``out`` may hold other files (``-o .``): replace ours one by one, and
        # in an earlier report's folder drop a table this one has no rows for.
        earlier = (out / REPORT_JSON).is_file()
        for n in names:
            os.replace(tmp / n, out / n)
        if "csv" in fmts and earlier:
            for t in TABLES:
                if f"{t}.csv" not in names:
                    (out / f"{t}.csv").unlink(missing_ok=True)
        if earlier:
            # Operator tables of windows this report has none for (their
            # traces gone, or past the latest MAX_OPERATOR_WINDOWS) are stale.
            kinds = tuple(f".{k}" for k in ("json", "csv") if k in fmts)
            for p in out.iterdir():
                if p.name not in names and p.name.endswith(kinds) and _OPERATOR_FILE.match(p.name):
                    p.unlink(missing_ok=True)
        return [out / n for n in names]
    except OSError as e:
        # Named by the folder asked for (a write error has no file name, and
        # the temporary one is gone): "<out>: File too large (nothing written)".
        left = "the earlier report there is left as it was" if out.exists() else "nothing written"
        raise OSError(e.errno, f"{e.strerror or e} ({left})", str(out)) from e
