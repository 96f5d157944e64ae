"""``fastprof summary``: the key tables of a run in the terminal (seconds),
nothing written.

Examples:
  fastprof summary fastprof_runs/run-1
  fastprof summary run-1/rank0/fastprof.0.json.gz
"""

from __future__ import annotations

import argparse
from typing import Any

from fastprof.cli.report import add_common, build


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "summary",
        help="print a run's key tables (nothing written)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    rep = build(args, None, (), progress=False)
    rep.print(verbose=args.verbose, title="fastprof summary")
    return 0
