"""Readable at any number of ranks (issue #38, item 3), at 1,024 ranks: the
terminal report's lines, report.html's size, and the page opened in headless
Chromium with the checks of
``tests/integration/reports/test_many_ranks_readable.py`` (no error, every
plot drawn, a rank x step heat map of every rank whose slowest rows are the
slow ranks', no trace per rank, the rank table's filter).

The run is built as ``bench_report.py --ranks`` builds it (two real ranks
recorded with the Profiler on CPU, the second's backward 3x as long; N ranks
from them, ~1% slow). Building 1,024 ranks and reporting them takes minutes
on a small machine, so this is a bench, not a test (the test does 64 ranks).

``--sample-hz HZ`` records the two ranks with the host sampler and builds
the run as the test does (each rank's resident memory its own, planted in
its readings), and the page's counter plots are checked to be bands across
every rank (the memory band's ends are rank 0's and the last rank's).
``--summaries`` first writes every rank's ``summary.fastprof`` (as each rank
does at its end), so that the report is made from them (issue #38, item 4).
``--full-triggers`` fills each rank's trigger record with the job's maximum
(200 slow steps, 60 captures, flight dumps and notes, as
``test_many_ranks_triggers_page.py`` plants them; a rank beside a CPU hog
records ~50 KB of slow steps), and prints what the page embeds of them.

    python benches/bench_report_readable.py [--ranks 1024] [--keep DIR] [--sample-hz 50 --summaries]
        [--full-triggers]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "reports"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_many_ranks_readable import MAX_LINES, build, check_counter_bands, check_page
from test_many_ranks_triggers_page import _plant, embedded_of

import fastprof
from _util import machine
from bench_report import build_ranks, record_rank, write_summaries
from fastprof.recording.names import RANK_SUMMARY_JSON
from fastprof.reports.terminal import render

MAX_HTML_BYTES = 15_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--rank-steps", type=int, default=2000, help="steps of the recorded ranks")
    ap.add_argument("--keep", help="build the run in this folder and keep it (reused when there)")
    ap.add_argument("--sample-hz", type=float, default=0.0, help="the recorded ranks' host sampler (0: none)")
    ap.add_argument("--summaries", action="store_true", help="every rank's summary first; the report from them")
    ap.add_argument("--full-triggers", action="store_true", help="each rank's trigger record at the job's maximum")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench_readable_") as tmp_s:
        tmp = Path(args.keep) if args.keep else Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        hz = args.sample_hz
        normal = record_rank(tmp, "template_normal", args.rank_steps, 1.0, hz)
        slow_t = record_rank(tmp, "template_slow", args.rank_steps, 3.0, hz)
        run = tmp / f"ranks{args.ranks}"
        slow_file = tmp / f"ranks{args.ranks}.slow.json"
        if not run.exists():
            t0 = time.perf_counter()
            if hz:  # as the test builds it: each rank's own resident memory
                planted = sorted(random.Random(38).sample(range(args.ranks), max(1, args.ranks // 100)))
                build(run, args.ranks, normal, slow_t, set(planted))
            else:
                planted = build_ranks(run, args.ranks, normal, slow_t)
            slow_file.write_text(json.dumps(planted))
            print(f"{args.ranks} ranks built in {time.perf_counter() - t0:.0f} s")
        slow = set(json.loads(slow_file.read_text()))
        if args.full_triggers:  # before the summaries: a rank's summary holds its triggers
            for r in range(args.ranks):
                _plant(run, r)
        if args.summaries and not all((run / f"rank{r}" / RANK_SUMMARY_JSON).is_file() for r in range(args.ranks)):
            t0 = time.perf_counter()
            each = write_summaries(run, args.ranks, dict(os.environ))
            print(f"{args.ranks} rank summaries written in {time.perf_counter() - t0:.0f} s ({each:.2f} s a rank)")
        out = tmp / f"readable{args.ranks}"
        t0 = time.perf_counter()
        rep = fastprof.report(run, out_dir=out, formats=("json", "html"), from_segments=not args.summaries)
        kinds = sorted({str(i["kind"]) for i in rep.data["source"]["inputs"]})
        print(f"report (json + html, from {', '.join(kinds)}): {time.perf_counter() - t0:.1f} s")
        buf = io.StringIO()
        render(rep.data, file=buf)
        lines = buf.getvalue().splitlines()
        page = out / "report.html"
        size = page.stat().st_size
        print(f"terminal report: {len(lines)} lines (at most {MAX_LINES})")
        print(f"report.html: {size / 1e6:.2f} MB (at most {MAX_HTML_BYTES / 1e6:.0f} MB)")
        if args.full_triggers:
            view = embedded_of(page)
            full = json.dumps(rep.data["triggers"], separators=(",", ":"))
            print(
                f"triggers: {len(full) / 1e6:.2f} MB in report.json (without spaces), "
                f"{len(json.dumps(view['triggers'], separators=(',', ':'))) / 1e6:.2f} MB embedded in the page"
            )
        print(f"slow ranks planted: {sorted(slow)}")
        t0 = time.perf_counter()
        got = check_page(page, Path(tempfile.mkdtemp(dir=tmp)), args.ranks, slow, timeout=300)
        if hz:
            check_counter_bands(got["bands"], args.ranks)
        print(
            f"Chromium: loaded and drawn in {got['load_s']:.1f} s, {got['plots']} plots, {got['rows']} rank rows, "
            f"{len(got['bands'])} counter plots as bands{' of every rank' if hz else ''}, "
            f"checks passed in {time.perf_counter() - t0:.1f} s"
        )
        assert len(lines) <= MAX_LINES and size <= MAX_HTML_BYTES


if __name__ == "__main__":
    main()
