"""``fastprof merge``: one aligned timeline from fastprof segments,
torch.profiler traces and every rank of a run, streamed in constant memory.

Examples:
  fastprof merge fastprof_runs/run-1                # every rank, written to fastprof_runs/run-1/trace.json.gz
  fastprof merge 'runs/*/rank*' -o all.json.gz --steps 10:12
  fastprof merge a.pt.trace.json.gz b.json.gz -o out.json --exclude-cat python_function
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

from fastprof import _core
from fastprof._core import FastprofError
from fastprof.cli.args import location, seconds
from fastprof.cli.errors import CommandError, describe, exit_code
from fastprof.readers.merge import MAX_THREADS, describe_rotated, merge
from fastprof.recording.names import OPEN_SUFFIX, SEGMENT_SUFFIX, UNIFIED_TRACE
from fastprof.recording.options import parse_size
from fastprof.storage.run_view import RunView, newest_ns, open_run

THREADS_ENV = "FASTPROF_MERGE_THREADS"

#: Ranks are u32 in the core; a range is expanded here, so it is bounded.
MAX_RANK = (1 << 20) - 1
#: Step numbers as the core reads them (ProfilerStep#N, u64; JSON-exact here).
MAX_STEP = (1 << 53) - 1
#: --start / --end: seconds from the start of the timeline (31 years).
WINDOW_S = seconds(0.0, 1e9, what="seconds from the start of the run")


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "merge",
        help="merge fastprof, torch.profiler and multi-rank traces into one timeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs", nargs="+", type=location, help="trace files, directories (searched recursively) or glob patterns"
    )
    p.add_argument(
        "-o",
        "--output",
        type=location,
        help="output file (.json.gz, or .json for plain); default: derived from the input",
    )
    p.add_argument("-f", "--force", action="store_true", help="overwrite the output if it exists")
    p.add_argument("--ranks", help="keep only these ranks, e.g. 0,2-3")
    p.add_argument("--start", type=WINDOW_S, help="window start, seconds from the start of the timeline")
    p.add_argument("--end", type=WINDOW_S, help="window end, seconds from the start of the timeline")
    p.add_argument("--steps", help="window by step markers, A:B inclusive (ProfilerStep#N or fastprof 'step' spans)")
    p.add_argument("--include-cat", action="append", default=[], help="keep only these categories (comma list)")
    p.add_argument("--exclude-cat", action="append", default=[], help="drop these categories (comma list)")
    p.add_argument("--max-bytes", help="bound the uncompressed output (e.g. 500MiB) by dropping low-value categories")
    p.add_argument(
        "-j",
        "--threads",
        default=None,
        help=f"worker threads, 1..{MAX_THREADS} or 0 = one per core (default: 0; env {THREADS_ENV})",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no summary")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also list fastprof's own non-trace files skipped in the inputs (profiler.json, reports)",
    )
    p.set_defaults(run=run)


def _number(text: str, hi: int) -> int | None:
    t = text.strip()
    return int(t) if t.isdecimal() and t.isascii() and len(t) < 20 and int(t) <= hi else None


def parse_ranks(text: str) -> list[int]:
    """``--ranks 0,2-3`` -> [0, 2, 3]."""
    bad = f"--ranks {text!r}: expected rank numbers 0..{MAX_RANK} and ranges A-B, e.g. 0,2-3"
    out: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            continue
        a, sep, b = part.partition("-")
        lo, hi = _number(a, MAX_RANK), _number(b, MAX_RANK) if sep else _number(a, MAX_RANK)
        if lo is None or hi is None:
            raise ValueError(bad)
        if hi < lo:
            raise ValueError(f"--ranks {text!r}: the range {part.strip()} is empty ({hi} is before {lo})")
        out.update(range(lo, hi + 1))
    if not out:
        raise ValueError(bad)
    return sorted(out)


def parse_steps(text: str) -> tuple[int, int]:
    """``--steps 10:12`` -> (10, 12)."""
    a, sep, b = text.partition(":")
    lo, hi = _number(a, MAX_STEP), _number(b, MAX_STEP)
    if not sep or lo is None or hi is None:
        raise ValueError(f"--steps {text!r}: expected A:B, step numbers from 0 (inclusive), e.g. 10:12")
    if hi < lo:
        raise ValueError(f"--steps {text!r}: step {hi} is before step {lo}")
    return lo, hi


def _max_bytes(text: str) -> int:
    try:
        n = parse_size(text.strip())
    except ValueError as e:
        raise ValueError(f"--max-bytes: {e}") from None
    if n >= 1 << 63:
        raise ValueError(f"--max-bytes {text!r}: expected a size below 8 EiB (e.g. 500MiB)")
    return n


def parse_threads(text: str, source: str) -> int:
    """A thread count from ``-j`` or the environment; ``source`` names it in the error."""
    try:
        n = int(text.strip())
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_THREADS:
        raise ValueError(f"{source}: {text!r} is not a thread count (0 = one per core, or 1..{MAX_THREADS})")
    return n


def check_window(start: float | None, end: float | None) -> None:
    for flag, v in (("--start", start), ("--end", end)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{flag} {v}: expected seconds >= 0 from the start of the run")
    if end is not None and end <= (start or 0.0):
        raise ValueError(f"--end {end} is not after --start {start or 0.0}: the window would be empty")


class _Terminated(Exception):
    """Raised by the SIGTERM handler while a merge runs, so the merge stops
    and removes its temporary file instead of the process dying mid-write."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def default_output(inputs: list[str]) -> Path | str:
    """A folder's ``trace.json.gz``; beside a trace, ``<name>.merged.json.gz``."""
    first = open_run(inputs[0])
    if first.names_folder():
        return first.inside(UNIFIED_TRACE)
    name = first.basename
    for suffix in (SEGMENT_SUFFIX + OPEN_SUFFIX, SEGMENT_SUFFIX, ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return first.beside(f"{name}.merged.json.gz")


#: The first event of a merge output (the core's merge::output): how many inputs it merged.
_MERGE_MARKER = re.compile(
    rb'^\{"baseTimeNanoseconds":.*?"name":"fastprof_merge","pid":0,"tid":0,"args":\{"inputs":(\d+)\}', re.S
)


def up_to_date(inputs: list[str], output: Path | str) -> int | None:
    """The number of inputs when ``output`` is the whole merge of ``inputs``
    as they are now (a merge output of that many inputs, none of them
    modified after it), else None: the caller merges, or refuses to
    overwrite. The inputs as the core's walker finds them (the merge's own);
    ``output`` and the inputs may be URLs (times from the store's listing)."""
    out = open_run(output, what="output")
    try:
        done = out.modified_ns()
        with out.open() as f:
            head = f.read(1 << 16)
            if head[:2] == b"\x1f\x8b":
                f.seek(0)
                with gzip.GzipFile(fileobj=f) as g:
                    head = g.read(1 << 16)
        files, _own, _removed, _warnings = _core.trace_inputs(list(inputs))
        found = [f for f in files if not out.same_file(f)]
        newest = newest_ns(inputs, found)
    except (OSError, EOFError, FastprofError, ValueError, KeyError):
        return None  # the merge itself says what is wrong
    m = _MERGE_MARKER.match(head)
    if m is None or done is None or newest is None or newest > done or int(m.group(1)) != len(found):
        return None
    return len(found)


def run(args: argparse.Namespace) -> int:

    try:
        ranks = parse_ranks(args.ranks) if args.ranks else None
        steps = parse_steps(args.steps) if args.steps else None
        max_bytes = _max_bytes(args.max_bytes) if args.max_bytes else None
        if args.threads is not None:
            threads = parse_threads(args.threads, "-j/--threads")
        else:
            threads = parse_threads(os.environ.get(THREADS_ENV, "0"), THREADS_ENV)
        check_window(args.start, args.end)
    except ValueError as e:
        raise CommandError(str(e), exit_code=2) from None
    if steps and (args.start is not None or args.end is not None):
        raise CommandError("--steps and --start/--end are exclusive", exit_code=2)
    target = args.output if args.output else default_output(args.inputs)
    out = open_run(target, what="output")
    output = out.local_path
    if output is None:
        # Not a path of this machine (an object in a store): merged into a
        # local file, then put there.
        return _merge_to_url(args, out)
    cats = [c.strip() for group in args.include_cat for c in group.split(",") if c.strip()]
    excl = [c.strip() for group in args.exclude_cat for c in group.split(",") if c.strip()]
    if _whole(args) and not args.force and output.is_file():
        n = up_to_date(args.inputs, output)
        if n is not None:
            # The README's `fastprof merge <run>` after a run that merged itself: nothing to do.
            print(output if args.quiet else f"{output} is up to date: the merge of its {n} inputs, newer than each")
            return 0
    t0 = time.perf_counter()
    # Ctrl-C raises KeyboardInterrupt inside the merge call (which cancels
    # the Rust merge); SIGTERM, which would kill the process outright, is
    # turned into an exception the same way while the merge runs.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
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
                threads=threads,
                progress=sys.stderr.isatty() and not args.quiet,
            )
    except KeyboardInterrupt:
        raise CommandError(f"interrupted; nothing written to {output}", exit_code=130) from None
    except _Terminated:
        raise CommandError(f"terminated (SIGTERM); nothing written to {output}", exit_code=143) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    dt = time.perf_counter() - t0
    for w in caught:
        print(f"fastprof merge: warning: {w.message}", file=sys.stderr)
    # A rotated run is missing its oldest part: said even with -q.
    for gone in s["rotated"]:
        print(f"fastprof merge: rotated away: {describe_rotated(gone, 'the merged trace')}", file=sys.stderr)
    if args.quiet:
        print(output)
        return 0
    filtered = s["filtered_window"] + s["filtered_category"] + s["filtered_rank"] + s["filtered_max_bytes"]
    span_s = (s["end_ns"] - s["start_ns"]) / 1e9
    mb = s["bytes_uncompressed"] / 1e6
    print(f"merged {s['files']} files, ranks {s['ranks']} -> {output}")
    print(
        f"  events: {s['events_in']} in, {s['events_out']} out, {s['events_dropped']} dropped as malformed JSON, "
        f"{filtered} filtered "
        f"(window {s['filtered_window']}, category {s['filtered_category']}, rank {s['filtered_rank']}, "
        f"max-bytes {s['filtered_max_bytes']}), {s['metadata_replaced']} sort indexes replaced, "
        f"{s['metadata_added']} metadata added"
    )
    if s["dropped_categories"]:
        print(f"  dropped categories to fit --max-bytes: {', '.join(s['dropped_categories'])}")
    if s["skipped_files"]:
        print(f"  skipped: {', '.join(s['skipped_files'])}")
    if s["own_files"] and args.verbose:
        print(f"  not traces, fastprof's own files: {', '.join(s['own_files'])}")
    if s["removed_temps"]:
        print(f"  removed temporary files of processes that are gone: {', '.join(s['removed_temps'])}")
    print(f"  salvaged bytes: {s['salvaged_bytes']}; time span {span_s:.3f} s")
    print(f"  alignment: baseTimeNanoseconds + per-rank offsets, uncertainty {s['uncertainty_ns']} ns")
    print(f"  {mb:.1f} MB of JSON -> {s['bytes_written'] / 1e6:.1f} MB in {dt:.2f} s ({mb / max(dt, 1e-9):.0f} MB/s)")
    print("\nopen it: drag the file into https://ui.perfetto.dev")
    return 0


def _whole(args: argparse.Namespace) -> bool:
    """Whether the merge asked for is the whole run (no filter): only then
    is an earlier whole merge what it would write."""
    return not (
        args.ranks
        or args.steps
        or any(g.strip(", ") for g in args.include_cat)
        or any(g.strip(", ") for g in args.exclude_cat)
        or args.max_bytes
        or args.start is not None
        or args.end is not None
    )


def _merge_to_url(args: argparse.Namespace, out: RunView) -> int:
    """``fastprof merge ... -o s3://.../trace.json.gz``: the merge goes to a
    local temporary file (the inputs are read in place, URLs or not), which
    is then put in the store; an object already there is replaced only with
    ``--force``."""
    out_url = out.name
    try:
        held = out.is_file()
    except (FastprofError, OSError, ValueError) as e:
        raise CommandError(describe(e), exit_code=exit_code(e)) from None
    if held and not args.force:
        n = up_to_date(args.inputs, out_url) if _whole(args) else None
        if n is not None:
            # `fastprof merge s3://.../run` after a run that merged itself: nothing to do.
            print(out_url if args.quiet else f"{out_url} is up to date: the merge of its {n} inputs, newer than each")
            return 0
        raise CommandError(f"{out_url} already exists; use --force to replace it", exit_code=1)
    with tempfile.TemporaryDirectory(prefix="fastprof-merge-") as tmp:
        local = Path(tmp) / UNIFIED_TRACE
        inner = argparse.Namespace(**{**vars(args), "output": str(local), "force": True})
        quiet_print = inner.quiet
        inner.quiet = True  # the local path is not what the user asked for
        with contextlib.redirect_stdout(io.StringIO()) as said:
            code = run(inner)
        if code != 0:
            return code
        try:
            out.put(local, "")
        except Exception as e:  # noqa: BLE001 - botocore, aiohttp, OSError: one line
            raise CommandError(
                f"{out_url}: could not put the merged trace ({type(e).__name__}: {' '.join(str(e).split())})",
                exit_code=1,
            ) from None
    del said
    print(out_url if quiet_print else f"merged {', '.join(args.inputs)} -> {out_url}")
    return 0
