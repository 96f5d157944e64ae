"""Entry point of the ``fastprof`` command: parses the verb, runs it, and
turns known failures into one clear line and a non-zero exit (no traceback)."""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from collections.abc import Sequence

from fastprof import __version__
from fastprof._core import FastprofError
from fastprof.cli import demo, diff, doctor, export, merge, report, run, summary, trigger, upload
from fastprof.cli.args import Parser, plain
from fastprof.cli.errors import CommandError, describe, exit_code
from fastprof.storage.store import store_failure

__all__ = ["CommandError", "build_parser", "describe", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fastprof",
        description="fastprof: low-overhead profiler for PyTorch training jobs.",
    )
    parser.add_argument("--version", action="version", version=f"fastprof {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    demo.add_parser(verbs)
    merge.add_parser(verbs)
    report.add_parser(verbs)
    summary.add_parser(verbs)
    diff.add_parser(verbs)
    export.add_parser(verbs)
    doctor.add_parser(verbs)
    run.add_parser(verbs)
    trigger.add_parser(verbs)
    upload.add_parser(verbs)
    for p in verbs.choices.values():
        p.description = plain(p.description)  # the verbs' docstrings, read in a terminal
    return parser


#: Verbs that read whole runs into columns, in a process of their own.
_READERS = frozenset({"report", "summary", "diff", "merge", "export"})


def _map_large_allocations() -> None:
    """glibc: allocations of 4 MiB and more are mapped pages of their own.
    Its default raises that threshold to 32 MiB as large blocks are freed, so
    a report's columns (8 MB each per million rows) grew in the heap, where a
    grown vector is copied and the old block is not given back: ~10 MB more
    at the peak of a 10^6-step report. Only in these commands' own process,
    never in a training job's; nothing happens where it is not glibc."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 4 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    if args.verb in _READERS:
        _map_large_allocations()
    try:
        return int(args.run(args) or 0)
    except CommandError as e:
        print(f"fastprof {args.verb}: error: {e}", file=sys.stderr)
        return e.exit_code
    except FastprofError as e:
        print(f"fastprof {args.verb}: error: {describe(e)}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt as e:
        if getattr(e, "fastprof_script", False):
            raise  # `fastprof run`: the script's own Ctrl-C ends the process as Python would (SIGINT)
        print(f"fastprof {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `fastprof merge ... | head`: the reader is gone, as with any Unix
        # tool: no traceback, and no second error when Python flushes stdout.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13  # SIGPIPE
    except Exception as e:
        # A store that is down or refuses us (botocore, aiohttp, ...): one
        # line, whatever verb and code path met it, not the library's traceback.
        # Never under `fastprof run`: the script's own exception is its own.
        line = store_failure(e) if args.verb != "run" else None
        if line is None:
            raise
        print(f"fastprof {args.verb}: error: {line}; try again when it is reachable", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
