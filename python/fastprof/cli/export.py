"""``fastprof export``: the step table of a run as Parquet, one row per rank
and step (start, duration, each phase of the step anatomy, the memory and GPU
figures where recorded), for DuckDB, polars, Spark or pandas. Written a row
group at a time, in memory bounded by a segment, not by the run's length.
Needs pyarrow (pip install 'fastprof-torch[parquet]').

Examples:
  fastprof export fastprof_runs/run-1                     # fastprof_runs/run-1/steps.parquet
  fastprof export fastprof_runs/run-1 -o steps.parquet
  fastprof export s3://bucket/runs/run-1 -o s3://bucket/tables/run-1.parquet
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from fastprof.cli.args import location
from fastprof.cli.errors import CommandError
from fastprof.readers.steps import DEFAULT_NAME, optional, write_parquet
from fastprof.storage.run_view import open_run


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "export",
        help="write a run's step table (one row per rank and step) as Parquet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", type=location, help="run directory or trace file (a local path or a storage URL)")
    p.add_argument(
        "-o",
        "--output",
        type=location,
        help=f"the Parquet file to write (a path or a URL); default: {DEFAULT_NAME} in the run directory",
    )
    p.add_argument("-f", "--force", action="store_true", help="overwrite the output if it exists")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")
    p.set_defaults(run=run)


def _default_output(path: str) -> str:
    view = open_run(path, "run")
    if view.is_file():
        return str(view.beside(view.basename.split(".", 1)[0] + "." + DEFAULT_NAME))
    return str(view.inside(DEFAULT_NAME))


def run(args: argparse.Namespace) -> int:
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ and "pyarrow" not in sys.modules:
        # The C allocator's pool gives a row group's buffers back once written;
        # pyarrow's mimalloc kept them (413 -> 375 MiB at 10^6 steps; chosen
        # after the import, 399). This command's process alone:
        # fastprof.load() leaves the caller's pool be.
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    optional("pyarrow.parquet")  # before anything is read: one line saying what to install
    output = args.output or _default_output(args.path)
    dest = open_run(output, "output")
    if not args.force and dest.is_file():
        raise CommandError(f"{dest.name}: already exists (use -f to overwrite)")
    t0 = time.perf_counter()
    table = write_parquet(args.path, output)
    for line in table.warnings:
        print(f"fastprof: {line}", file=sys.stderr)
    if not args.quiet:
        print(
            f"wrote {dest.name}: {table.rows} steps from {table.files} files in {time.perf_counter() - t0:.1f} s\n"
            f"  next: duckdb -c \"SELECT rank, max(duration_ns) FROM '{dest.name}' GROUP BY rank\""
        )
    return 0
