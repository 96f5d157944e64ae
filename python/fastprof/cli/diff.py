"""``fastprof diff BASE NEW``: compare two runs (throughput, step time p50/p95,
breakdown parts, peak memory, energy per sample) and exit 1 when NEW crosses
a threshold: a CI performance gate.

BASE and NEW: run directories, traces, or report.json files written by
``fastprof report``. Exit status: 0 within the thresholds, 1 when one is
crossed, 2 on bad input.

Examples:
  fastprof diff runs/baseline runs/candidate --max-slowdown 10%
  fastprof diff base/reports/report.json new/reports/report.json --max-memory-growth 25%

A report.json is checked against the schema of its schema_version
(reports/schema/report.v{N}.json) first: an unknown version or a report
missing a section is bad input (exit 2), never compared. An input the
report had to salvage (a cut trace, a killed writer's segment) is compared
on what was kept, and said on stderr: ``fastprof diff: warning: FILE:
salvaged ...``, as ``fastprof report`` says it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from fastprof._core import FastprofError
from fastprof.cli.args import location
from fastprof.cli.errors import CommandError, describe, exit_code
from fastprof.cli.report import WARMUP_STEPS
from fastprof.recording.names import PHASES as ANATOMY_PHASES
from fastprof.recording.names import RSS_COUNTER
from fastprof.reports import report
from fastprof.reports.finite import number
from fastprof.reports.report import SCHEMA_DIR
from fastprof.storage.run_view import open_run

#: A threshold past 10,000x is no gate at all: a typo (1e308%), not a limit.
MAX_PCT = 1_000_000.0
#: A report.json is small (summaries; per-step rows go to CSV): a larger
#: .json is read as a trace, streamed, never loaded whole to look inside.
MAX_REPORT_BYTES = 64 << 20


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "diff",
        help="compare two runs' reports; exit 1 when a threshold is crossed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("base", type=location, help="baseline: run directory, trace, or report.json (or their URL)")
    p.add_argument("new", type=location, help="candidate: run directory, trace, or report.json (or their URL)")
    p.add_argument(
        "--max-slowdown",
        default="10%",
        help="fail when throughput drops or step time grows more (default 10%%); PHASE:PCT items, comma-separated "
        "(e.g. 10%%,backward:5%%), also fail when a step anatomy phase's time per step grows more "
        f"(phases: {', '.join(ANATOMY_PHASES)})",
    )
    p.add_argument(
        "--max-memory-growth",
        default=None,
        help="fail when peak memory grows more, e.g. 25%% (default: off; peak RSS of identical CPU runs varies ~10%%)",
    )
    p.add_argument("--warmup-steps", type=WARMUP_STEPS, help="steps left out of the rates (both runs)")
    p.set_defaults(run=run)


def parse_slowdowns(text: str) -> tuple[float, dict[str, float]]:
    """``--max-slowdown``: the overall limit (10% unless given) and the
    per-phase limits (``backward:5%``)."""
    overall, phases = 10.0, {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        phase, sep, pct = item.rpartition(":")
        if not sep:
            overall = parse_pct(item, "--max-slowdown")
        elif phase not in ANATOMY_PHASES:
            raise ValueError(
                f"--max-slowdown {item!r}: unknown phase {phase!r} (expected one of {', '.join(ANATOMY_PHASES)})"
            )
        else:
            phases[phase] = parse_pct(pct, f"--max-slowdown {phase}:")
    return overall, phases


def _anatomy_means(doc: dict[str, Any]) -> dict[str, float]:
    """Each phase's time per step (ms), over every rank (report v4)."""
    an = doc.get("anatomy")
    if not an:
        return {}
    ranks = an.get("per_rank") or []
    steps = sum(int(r["steps"]) for r in ranks)
    if not steps:
        return {}
    return {p: sum(float(number(r["phases"][p]["total_ns"])) for r in ranks) / steps / 1e6 for p in ANATOMY_PHASES}


def parse_pct(text: str, flag: str) -> float:
    t = text.strip()
    try:
        v = float(t[:-1]) if t.endswith("%") else float(t) * 100.0 if "." in t and float(t) < 1 else float(t)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a percentage, e.g. 10%") from None
    if not (math.isfinite(v) and 0 <= v <= MAX_PCT):
        raise ValueError(f"{flag} {text!r}: expected a percentage from 0 to {MAX_PCT:.0f}%, e.g. 10%")
    return v


def schema_for(version: Any) -> dict[str, Any] | None:
    """The checked-in JSON Schema of report ``schema_version`` ``version``
    (``reports/schema/report.v{N}.json``), None when this fastprof has none."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return None
    f = SCHEMA_DIR / f"report.v{version}.json"
    if not f.is_file():
        return None
    schema: dict[str, Any] = json.loads(f.read_text())
    return schema


def known_versions() -> list[int]:
    found = (f.name[len("report.v") : -len(".json")] for f in SCHEMA_DIR.glob("report.v*.json"))
    return sorted(int(v) for v in found if v.isdigit())


def validate(doc: Any, path: str) -> dict[str, Any]:
    """``doc`` checked against the schema of its own ``schema_version``: one
    line naming the file and the JSON path of the first violation, exit 2."""
    import jsonschema

    version = doc.get("schema_version") if isinstance(doc, dict) else None
    schema = schema_for(version)
    if schema is None:
        known = ", ".join(map(str, known_versions()))
        raise CommandError(
            f"{path}: unknown report schema_version {version!r} (this fastprof reads {known}): "
            "rewrite it with this fastprof's `fastprof report`",
            2,
        )
    validator = jsonschema.Draft202012Validator(schema)
    # The shallowest violation first (a missing section before a bad leaf), then the first in document order.
    try:
        errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), [str(x) for x in e.path]))
    except RecursionError:
        raise CommandError(f"{path}: not a valid fastprof report v{version}: nested too deeply to check", 2) from None
    if errors:
        e = errors[0]
        what = " ".join(e.message.split())
        if len(what) > 160:
            what = what[:157] + "..."
        raise CommandError(f"{path}: not a valid fastprof report v{version}: at {e.json_path}: {what}", 2)
    return dict(doc)


def load_doc(path: str, warmup: int | None) -> dict[str, Any]:
    """A report.json (read as one when it is a small file named ``.json``,
    not a torch trace) or a run or trace, reported in place; wherever it
    lives (a local path, a URL)."""
    run = open_run(path)
    try:
        run.must_exist("a run directory, trace or report.json")
        raw = run.read_small(MAX_REPORT_BYTES) if _report_name(run.basename) else None
    except FileNotFoundError as e:
        raise CommandError(describe(e), 2) from None
    except FastprofError as e:  # a store's one line (its protocol's extra missing)
        raise CommandError(describe(e), exit_code=exit_code(e)) from None
    except OSError as e:
        raise CommandError(f"{path}: not a fastprof report ({describe(e)})", 2) from None
    if raw is not None:
        try:
            doc = json.loads(raw)
        except RecursionError:
            doc = None  # nested deeper than any report: read as a trace, by the streaming reader
        except ValueError as e:
            raise CommandError(f"{path}: not a fastprof report ({describe(e)})", 2) from None
        if isinstance(doc, dict) and doc.get("schema") == "fastprof.report":
            return validate(doc, path)
    try:
        return dict(report(path, formats=(), warmup_steps=warmup).data)
    except (FastprofError, ValueError, OSError) as e:
        raise CommandError(describe(e), exit_code=exit_code(e)) from None


def _report_name(name: str) -> bool:
    """Whether a file of this name may be a report.json (a torch trace is not)."""
    return name.endswith(".json") and not name.endswith(".pt.trace.json")


def _memory_figures(doc: dict[str, Any]) -> dict[str, float | None]:
    """A report's peak-memory figures, steadiest first: the CUDA allocator's
    peak (per-step statistics, report v3), the GPU memory the sampler saw in
    use, the process's RSS."""

    def peak(values: list[Any]) -> float | None:
        got = [number(v) for v in values if v is not None]
        return float(max(got)) if got else None

    ranks = (doc.get("memory") or {}).get("per_rank") or []
    return {
        "CUDA allocated, peak": peak([r.get("cuda_allocated_peak_b") for r in ranks]),
        "GPU memory used, peak": peak([d.get("mem_used_peak_b") for d in doc["system"]["gpu"]["devices"]]),
        # The sampler's RSS track, and the per-step one (no sampler needed).
        "process RSS, peak": peak(
            [h.get("rss_peak_b") for h in doc["system"]["host"]]
            + [r.get("peak_b") for r in ranks if r.get("series") == RSS_COUNTER]
        ),
    }


def _peak_memory(base: dict[str, Any], new: dict[str, Any]) -> tuple[float | None, float | None, str]:
    """The steadiest peak-memory figure both reports have (its name says
    which was compared)."""
    b, n = _memory_figures(base), _memory_figures(new)
    for what in b:
        if b[what] is not None and n[what] is not None:
            return b[what], n[what], what
    return None, None, "peak memory"


def _energy_per_sample(doc: dict[str, Any]) -> float | None:
    vals = [
        number(d["energy_per_sample_j"])
        for d in doc["system"]["gpu"]["devices"]
        if d.get("energy_per_sample_j") is not None
    ]
    return float(sum(vals)) if vals else None


def _breakdown_means(doc: dict[str, Any]) -> dict[str, float]:
    bd = doc.get("breakdown")
    parts = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
    if not bd:
        return {}
    # Report v2: per-rank totals; v1: one row per step.
    rows = bd.get("per_rank") or bd.get("steps") or []
    count = sum(int(r["steps"]) for r in bd["per_rank"]) if bd.get("per_rank") else len(rows)
    if not count:
        return {}
    return {f"breakdown {p} (s/step)": sum(float(number(r[f"{p}_ns"])) for r in rows) / count / 1e9 for p in parts}


def compare(
    base: dict[str, Any],
    new: dict[str, Any],
    max_slowdown: float,
    max_mem: float | None,
    phase_limits: dict[str, float] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Rows (measure, base, new, change %, limit, verdict) and the exit code."""
    rows: list[dict[str, Any]] = []

    def add(name: str, b: Any, n: Any, worse_if_higher: bool, limit: float | None) -> None:
        # A report.json spells a non-finite figure as the trace does ("Infinity").
        b, n = number(b), number(n)
        change = None if b is None or n is None or b == 0 else 100.0 * (n - b) / abs(b)
        if change is not None and math.isnan(change):
            change = None
        worse = None if change is None else (change if worse_if_higher else -change)
        failed = limit is not None and worse is not None and worse > limit
        rows.append({"measure": name, "base": b, "new": n, "change_pct": change, "limit_pct": limit, "failed": failed})

    add(
        "train iterations/s",
        base["speed"]["train"]["iterations_per_s"],
        new["speed"]["train"]["iterations_per_s"],
        False,
        max_slowdown,
    )
    add(
        "train samples/s",
        base["speed"]["train"]["samples_per_s"],
        new["speed"]["train"]["samples_per_s"],
        False,
        max_slowdown,
    )
    add(
        "step time p50 (s)", base["speed"]["step_time"]["p50_s"], new["speed"]["step_time"]["p50_s"], True, max_slowdown
    )
    add("step time p95 (s)", base["speed"]["step_time"]["p95_s"], new["speed"]["step_time"]["p95_s"], True, None)
    bb, nb = _breakdown_means(base), _breakdown_means(new)
    for k in bb:
        if k in nb:
            add(k, bb[k], nb[k], True, None)
    ab, an = _anatomy_means(base), _anatomy_means(new)
    limits = phase_limits or {}
    for p in ANATOMY_PHASES:
        if p in ab and p in an:
            add(f"anatomy {p} (ms/step)", ab[p], an[p], True, limits.get(p))
        elif p in limits:
            rows.append(
                {"measure": f"anatomy {p} (ms/step): not in both reports", "base": ab.get(p), "new": an.get(p),
                 "change_pct": None, "limit_pct": limits[p], "failed": False}
            )  # fmt: skip
    bm, nm, what = _peak_memory(base, new)
    add(what + " (B)", bm, nm, True, max_mem)
    add("energy per sample (J)", _energy_per_sample(base), _energy_per_sample(new), True, None)
    return rows, 1 if any(r["failed"] for r in rows) else 0


def _source_warnings(doc: dict[str, Any]) -> list[str]:
    """The report's ``source.warnings``: which input file was salvaged, and
    what was kept of it."""
    source = doc.get("source")
    found = source.get("warnings") if isinstance(source, dict) else None
    return [" ".join(str(w).split()) for w in found] if isinstance(found, list) else []


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def run(args: argparse.Namespace) -> int:

    try:
        max_slowdown, phase_limits = parse_slowdowns(args.max_slowdown)
        max_mem = parse_pct(args.max_memory_growth, "--max-memory-growth") if args.max_memory_growth else None
    except ValueError as e:
        raise CommandError(str(e), exit_code=2) from None
    base = load_doc(args.base, args.warmup_steps)
    new = load_doc(args.new, args.warmup_steps)
    # What a report could not take at face value (a cut file salvaged, hostile
    # numbers): said as `fastprof report` says it, one line each; the
    # comparison stands on what was kept.
    for w in dict.fromkeys(_source_warnings(base) + _source_warnings(new)):
        print(f"fastprof diff: warning: {w}", file=sys.stderr)
    rows, code = compare(base, new, max_slowdown, max_mem, phase_limits)
    t = Table(title=f"fastprof diff: {args.base} -> {args.new}")
    for col in ("measure", "base", "new", "change", "limit", ""):
        t.add_column(col, justify="left" if col == "measure" else "right")
    for r in rows:
        t.add_row(
            r["measure"],
            fmt(r["base"]),
            fmt(r["new"]),
            "-" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%",
            "-" if r["limit_pct"] is None else f"{r['limit_pct']:g}%",
            "FAIL" if r["failed"] else "",
        )
    Console(width=140, highlight=False).print(t)
    failed = [r["measure"] for r in rows if r["failed"]]
    if failed:
        print(f"fastprof diff: threshold crossed: {', '.join(failed)}")
    return code
