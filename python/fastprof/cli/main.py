"""Entry point of the ``fastprof`` command: parses the verb, runs it, and
turns known failures into one clear line and a non-zero exit (no traceback)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fastprof import __version__
from fastprof._core import FastprofError
from fastprof.cli import demo, diff, merge, report, summary


class CommandError(Exception):
    """A failure the CLI reports as one line with an exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    return parser


def describe(e: BaseException) -> str:
    """One line for an error: an OSError as "path: cause" (its str() reads
    "[Errno 2] ...: 'path'"), anything else as its message."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    return " ".join(str(e).split())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except CommandError as e:
        print(f"fastprof {args.verb}: error: {e}", file=sys.stderr)
        return e.exit_code
    except FastprofError as e:
        print(f"fastprof {args.verb}: error: {describe(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"fastprof {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
