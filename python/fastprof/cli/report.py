"""``fastprof report``: time, speed, system, ranks and recommendations of a
run, written as report.json (versioned schema), CSV tables and report.html
(one self-contained page with plots; it opens offline).

Examples:
  fastprof report fastprof_runs/run-1              # writes fastprof_runs/run-1/reports/
  fastprof report run-1/trace.json.gz -o out --verbose
  fastprof report fastprof_runs/run-1 --from-segments   # the ranks' traces, not their summaries
  fastprof report rank0/torch/ep0-ba4.pt.trace.json.gz --batch-size 32
  fastprof report s3://bucket/runs/run-1           # read in place; writes s3://bucket/runs/run-1/reports/
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastprof import report  # the public wrapper: it logs to MLflow when asked
from fastprof._core import FastprofError
from fastprof.cli.args import integer, location
from fastprof.cli.errors import CommandError, describe, exit_code
from fastprof.reports.csvout import tables
from fastprof.storage.run_view import open_run

WARMUP_STEPS = integer(0, 10**9, "a number of steps")
BATCH_SIZE = integer(1, 10**9, "a number of samples")


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        type=location,
        help="a run directory written by fastprof.Profiler (or its URL: s3://, gs://, az://, file://), "
        "or one fastprof / torch.profiler trace",
    )
    p.add_argument(
        "--warmup-steps", type=WARMUP_STEPS, help="steps left out of the rates (default: schedule skip_first, else 1)"
    )
    p.add_argument(
        "--batch-size", type=BATCH_SIZE, help="samples per step, for samples/s (default: a batch_size counter)"
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="every span name in the time table, not only the loop's"
    )
    p.add_argument(
        "--from-segments",
        action="store_true",
        help="read the run's traces (its unified trace, else every rank's segments), not the summaries the ranks "
        "wrote at their end (rank{R}/summary.fastprof)",
    )


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "report",
        help="write a run's reports (JSON, CSV, HTML) and print the key tables",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p)
    p.add_argument("-o", "--output", type=location, help="output directory or storage URL (default: <run>/reports/)")
    p.add_argument("-q", "--quiet", action="store_true", help="no tables, no progress; print the files written")
    p.set_defaults(run=run)


def build(args: argparse.Namespace, out_dir: str | None, formats: tuple[str, ...], progress: bool) -> Any:
    """Run :func:`fastprof.report` for a verb, bad input as one line, exit 2."""
    try:
        open_run(args.path).must_exist("a run directory or a trace")
        rep = report(
            args.path,
            out_dir=out_dir,
            formats=formats,
            verbose=args.verbose,
            progress=progress,
            warmup_steps=args.warmup_steps,
            batch_size=args.batch_size,
            from_segments=args.from_segments,
        )
    except (FastprofError, ValueError, OSError) as e:
        raise CommandError(describe(e), exit_code=exit_code(e)) from None
    # What the report could not take at face value (a salvaged file, spans or
    # counter samples with hostile numbers): one line each, even with -q.
    for w in rep.data["source"]["warnings"]:
        print(f"fastprof {args.verb}: warning: {w}", file=sys.stderr)
    return rep


def run(args: argparse.Namespace) -> int:
    rep = build(args, args.output, ("json", "csv", "html"), progress=sys.stderr.isatty() and not args.quiet)
    if args.quiet:
        for f in rep.files or rep.urls:
            print(f)
        return 0
    rep.print(verbose=args.verbose)
    if rep.urls:
        folder = rep.urls[0].rsplit("/", 1)[0]
        print(f"\nput {len(rep.urls)} files in {folder}/ (report.json, report.html, one CSV per table)")
        print(f"compare two runs: fastprof diff {args.path} OTHER_RUN")
    elif rep.files:
        print(f"\nwrote {len(rep.files)} files to {rep.files[0].parent} (report.json, report.html, one CSV per table)")
        empty = [f"{name}.csv" for name, rows in tables(rep.data).items() if not rows]
        if empty:
            gpu = rep.data["system"]["gpu"]["reason"]
            print(f"no rows, so not written: {', '.join(empty)}" + (f" ({gpu})" if "gpus.csv" in empty else ""))
        print(f"compare two runs: fastprof diff {args.path} OTHER_RUN")
    return 0
