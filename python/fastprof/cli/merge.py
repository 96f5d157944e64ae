"""``fastprof merge``: one aligned timeline from fastprof segments,
torch.profiler traces and every rank of a run, streamed in constant memory.

Examples:
  fastprof merge fastprof_runs/run-1                # every rank, written to fastprof_runs/run-1/trace.json.gz
  fastprof merge 'runs/*/rank*' -o all.json.gz --steps 10:12
  fastprof merge a.pt.trace.json.gz b.json.gz -o out.json --exclude-cat python_function
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from fastprof._merge import merge
from fastprof._options import parse_size


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "merge",
        help="merge fastprof, torch.profiler and multi-rank traces into one timeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", help="trace files, directories (searched recursively) or glob patterns")
    p.add_argument("-o", "--output", help="output file (.json.gz, or .json for plain); default: derived from the input")
    p.add_argument("-f", "--force", action="store_true", help="overwrite the output if it exists")
    p.add_argument("--ranks", help="keep only these ranks, e.g. 0,2-3")
    p.add_argument("--start", type=float, help="window start, seconds from the start of the timeline")
    p.add_argument("--end", type=float, help="window end, seconds from the start of the timeline")
    p.add_argument("--steps", help="window by step markers, A:B inclusive (ProfilerStep#N or fastprof 'step' spans)")
    p.add_argument("--include-cat", action="append", default=[], help="keep only these categories (comma list)")
    p.add_argument("--exclude-cat", action="append", default=[], help="drop these categories (comma list)")
    p.add_argument("--max-bytes", help="bound the uncompressed output (e.g. 500MiB) by dropping low-value categories")
    p.add_argument(
        "-j",
        "--threads",
        type=int,
        default=int(os.environ.get("FASTPROF_MERGE_THREADS", "0")),
        help="worker threads (default: every core; env FASTPROF_MERGE_THREADS)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no summary")
    p.set_defaults(run=run)


def parse_ranks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def parse_steps(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    if not sep or not a.strip() or not b.strip():
        raise ValueError("expected A:B, e.g. 10:12")
    lo, hi = int(a), int(b)
    if hi < lo:
        raise ValueError(f"{hi} is before {lo}")
    return lo, hi


def default_output(inputs: list[str]) -> Path:
    first = Path(inputs[0])
    if first.is_dir():
        return first / "trace.json.gz"
    name = first.name
    for suffix in (".json.gz.part", ".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return first.with_name(f"{name}.merged.json.gz")


def run(args: argparse.Namespace) -> int:
    from fastprof.cli.main import CommandError

    try:
        ranks = parse_ranks(args.ranks) if args.ranks else None
        steps = parse_steps(args.steps) if args.steps else None
        max_bytes = parse_size(args.max_bytes) if args.max_bytes else None
    except ValueError as e:
        raise CommandError(str(e), exit_code=2) from None
    if steps and (args.start is not None or args.end is not None):
        raise CommandError("--steps and --start/--end are exclusive", exit_code=2)
    output = Path(args.output) if args.output else default_output(args.inputs)
    cats = [c.strip() for group in args.include_cat for c in group.split(",") if c.strip()]
    excl = [c.strip() for group in args.exclude_cat for c in group.split(",") if c.strip()]
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = merge(
            args.inputs,
            output,
            force=args.force,
            ranks=ranks,
            start=args.start,
            end=args.end,
            steps=steps,
            include_categories=cats,
            exclude_categories=excl,
            max_bytes=max_bytes,
            threads=args.threads,
            progress=sys.stderr.isatty() and not args.quiet,
        )
    dt = time.perf_counter() - t0
    for w in caught:
        print(f"fastprof merge: warning: {w.message}", file=sys.stderr)
    if args.quiet:
        print(output)
        return 0
    filtered = s["filtered_window"] + s["filtered_category"] + s["filtered_rank"] + s["filtered_max_bytes"]
    span_s = (s["end_ns"] - s["start_ns"]) / 1e9
    mb = s["bytes_uncompressed"] / 1e6
    print(f"merged {s['files']} files, ranks {s['ranks']} -> {output}")
    print(
        f"  events: {s['events_in']} in, {s['events_out']} out, {filtered} filtered "
        f"(window {s['filtered_window']}, category {s['filtered_category']}, rank {s['filtered_rank']}, "
        f"max-bytes {s['filtered_max_bytes']}), {s['metadata_replaced']} sort indexes replaced, "
        f"{s['metadata_added']} metadata added"
    )
    if s["dropped_categories"]:
        print(f"  dropped categories to fit --max-bytes: {', '.join(s['dropped_categories'])}")
    if s["skipped_files"]:
        print(f"  skipped: {', '.join(s['skipped_files'])}")
    print(f"  salvaged bytes: {s['salvaged_bytes']}; time span {span_s:.3f} s")
    print(f"  alignment: baseTimeNanoseconds + per-rank offsets, uncertainty {s['uncertainty_ns']} ns")
    print(f"  {mb:.1f} MB of JSON -> {s['bytes_written'] / 1e6:.1f} MB in {dt:.2f} s ({mb / max(dt, 1e-9):.0f} MB/s)")
    print("\nopen it: drag the file into https://ui.perfetto.dev")
    return 0
