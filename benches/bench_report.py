"""The whole report on a large torch trace, next to ``fastprof merge`` and
HolisticTraceAnalysis (issue #11, "Scale").

One synthetic Kineto trace of ``--mb`` MB of JSON (default 1000; the
generator of ``bench_merge.py``: ProfilerStep#N, python_function and cpu_op
trees, cudaLaunchKernel with its kernel, flows), written into a directory
per rank as HTA expects. Each round, in rotating order, runs every case in a
fresh subprocess (wall time and the process's own peak RSS from ``wait4``):

1. ``fastprof.report(trace)`` writing JSON, CSV and HTML (everything the
   report does: read the columns, time / speed / system / ranks reports,
   the breakdown, recommendations, plotly page);
2. ``fastprof.report(trace, formats=("json",))``;
3. ``fastprof._core.analyze_steps`` alone (the breakdown's Rust pass);
4. ``fastprof.merge`` of the same file: the yardstick. Targets: a report
   takes at most 2x the merge, with peak RSS <= 300 MB;
5. HTA: ``TraceAnalysis(trace_dir=...)`` (the load) and
   ``get_temporal_breakdown(visualize=False)``.

HTA takes minutes and GBs on large traces (100+ s and ~2 GB on 355 MB here),
so it runs only up to ``--hta-max-mb`` (default 400 MB; ``--hta`` runs it at
any size, ``--no-hta`` never); the output says when it was left out. The
reports' own stage timings (``progress=True``) are printed for the first
round.

    python benches/bench_report.py [--mb 1000] [--rounds 2] [--hta | --no-hta] [--hta-max-mb 400]
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import machine, verdict
from bench_merge import generate, run_measured

REPORT = """
import sys, time, warnings
warnings.simplefilter("ignore")
import fastprof
t0 = time.perf_counter()
fmts = tuple(sys.argv[3].split(","))
rep = fastprof.report(sys.argv[1], out_dir=sys.argv[2], formats=fmts, progress=True)
sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.1f} MB" for p in rep.files if p.suffix != ".csv")
print(f"report ({sys.argv[3]}): {time.perf_counter() - t0:.2f} s; {sizes}", file=sys.stderr)
"""

ANALYZE = """
import sys, time
from fastprof import _core
t0 = time.perf_counter()
a = _core.analyze_steps([sys.argv[1]])
print(f"analyze_steps: {len(a['steps']['step'])} steps in {time.perf_counter() - t0:.2f} s")
"""

MERGE = """
import sys
import fastprof
fastprof.merge([sys.argv[1]], sys.argv[2], force=True)
"""

HTA = """
import sys, time, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
df = ta.get_temporal_breakdown(visualize=False)
print(f"HTA: load {t1 - t0:.1f} s, temporal breakdown {time.perf_counter() - t1:.1f} s")
print(df.to_string())
"""

FULL = "fastprof report json+csv+html"
JSON = "fastprof report json"
ANALYZE_STEPS = "fastprof analyze_steps"
MERGED = "fastprof merge"
HTA_CASE = "HTA load + temporal breakdown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=1000.0, help="JSON size of the trace (MB)")
    ap.add_argument("--rounds", type=int, default=2)
    hta_opt = ap.add_mutually_exclusive_group()
    hta_opt.add_argument("--no-hta", action="store_true", help="leave HolisticTraceAnalysis out")
    hta_opt.add_argument("--hta", action="store_true", help="run HTA whatever the size (minutes, GBs)")
    ap.add_argument("--hta-max-mb", type=float, default=400.0, help="skip HTA above this size (default 400)")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    hta = False
    if args.no_hta:
        print("HTA: left out (--no-hta)")
    elif importlib.util.find_spec("hta") is None:
        print("HTA: not installed, left out")
    elif args.mb > args.hta_max_mb and not args.hta:
        print(f"HTA: left out above {args.hta_max_mb:.0f} MB (it takes minutes and GBs there; --hta runs it)")
    else:
        hta = True
    with tempfile.TemporaryDirectory(prefix="bench_report_") as tmp_s:
        tmp = Path(tmp_s)
        trace_dir = tmp / "rank0"
        trace_dir.mkdir()
        # Kineto's own naming (HTA reads ranks from the files' distributedInfo).
        path = trace_dir / "node00_4242.1727000000000.pt.trace.json.gz"
        t0 = time.perf_counter()
        # Correlation ids past int16: HTA 0.5 downcasts the column and then
        # fails to store row indices above 32767 into it.
        size, events = generate(str(path), 0, 1, args.mb, corr_start=1 << 20)
        print(
            f"trace: {size / 1e6:.0f} MB of JSON, {events} events, {path.stat().st_size / 1e6:.0f} MB gzip "
            f"(generated in {time.perf_counter() - t0:.0f} s)"
        )
        py = sys.executable
        out = tmp / "reports"
        cases = {
            FULL: [py, "-c", REPORT, str(path), str(out), "json,csv,html"],
            JSON: [py, "-c", REPORT, str(path), str(out), "json"],
            ANALYZE_STEPS: [py, "-c", ANALYZE, str(path)],
            MERGED: [py, "-c", MERGE, str(path), str(tmp / "merged.json.gz")],
        }
        if hta:
            cases[HTA_CASE] = [py, "-c", HTA, str(trace_dir)]
        results: dict[str, list[tuple[float, int]]] = {k: [] for k in cases}
        names = list(cases)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                shutil.rmtree(out, ignore_errors=True)
                log = tmp / f"{len(results[name])}_{name.replace(' ', '_')}.log"
                results[name].append(run_measured(cases[name], log))
                print(f"  round {r + 1}: {name}: {results[name][-1][0]:.2f} s, {results[name][-1][1] / 1e6:.0f} MB")
                lines = log.read_text(errors="replace").strip().splitlines()
                for line in lines if r == 0 and name in (FULL, JSON) else lines[:1]:
                    print("    " + line)
        print("\nmedian wall s, peak RSS MB (each in a fresh process):")
        med = {k: (statistics.median(t for t, _ in v), max(m for _, m in v)) for k, v in results.items()}
        for k, (t, m) in med.items():
            print(f"  {k:32s} {t:8.2f} s  {m / 1e6:8.0f} MB")
        mg_t, mg_m = med[MERGED]
        print(f"\nyardstick: fastprof merge {mg_t:.2f} s ({mg_m / 1e6:.0f} MB)")
        for k in (FULL, JSON, ANALYZE_STEPS):
            t, m = med[k]
            print(
                f"  {k:32s} / merge time {t / mg_t:5.2f}x  target <= 2x: {verdict(t <= 2 * mg_t)};  "
                f"peak RSS {m / 1e6:4.0f} MB  target <= 300 MB: {verdict(m <= 300e6)}"
            )
        if hta:
            h_t, h_m = med[HTA_CASE]
            f_t, f_m = med[FULL]
            print(f"HTA / full fastprof report: time {h_t / f_t:.1f}x, peak RSS {h_m / f_m:.1f}x")


if __name__ == "__main__":
    main()
