"""Step-time breakdown on a large torch trace: fastprof vs HolisticTraceAnalysis.

One synthetic Kineto trace of ``--mb`` MB of JSON (default 300; the
generator of ``bench_merge.py``: ProfilerStep#N, python_function and cpu_op
trees, cudaLaunchKernel with its kernel, flows), written into a directory
per rank as HTA expects. Each round, in rotating order, runs in a fresh
subprocess (wall time and the process's own peak RSS from ``wait4``):

1. ``fastprof._core.analyze_steps`` on the file (the whole breakdown);
2. ``fastprof.merge`` of the same file (the issue's yardstick: a report
   takes at most 2x the merge, with peak RSS <= 300 MB);
3. HTA: ``TraceAnalysis(trace_dir=...)`` (the load) and
   ``get_temporal_breakdown(visualize=False)``.

Ratios are printed. HTA is slow and large on big traces (100+ s and ~2 GB
on 355 MB here): ``--no-hta`` leaves it out, ``--rounds`` sets the rounds.

    python benches/bench_report.py [--mb 300] [--rounds 2] [--no-hta]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import machine, verdict
from bench_merge import generate, run_measured

FASTPROF = """
import sys, time
from fastprof import _core
t0 = time.perf_counter()
a = _core.analyze_steps([sys.argv[1]])
print(f"fastprof: {len(a['steps']['step'])} steps in {time.perf_counter() - t0:.2f} s")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=300.0, help="JSON size of the trace (MB)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-hta", action="store_true", help="leave HolisticTraceAnalysis out")
    args = ap.parse_args()
    hta = not args.no_hta and importlib.util.find_spec("hta") is not None
    print(f"machine: {machine()}")
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
        cases = {
            "fastprof analyze_steps": [py, "-c", FASTPROF, str(path)],
            "fastprof merge": [py, "-c", MERGE, str(path), str(tmp / "merged.json.gz")],
        }
        if hta:
            cases["HTA load + temporal breakdown"] = [py, "-c", HTA, str(trace_dir)]
        results: dict[str, list[tuple[float, int]]] = {k: [] for k in cases}
        names = list(cases)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                log = tmp / f"{len(results[name])}_{name.split()[0]}.log"
                results[name].append(run_measured(cases[name], log))
                print(f"  round {r + 1}: {name}: {results[name][-1][0]:.2f} s, {results[name][-1][1] / 1e6:.0f} MB")
                for line in log.read_text(errors="replace").strip().splitlines()[:1]:
                    print("    " + line)
        print("\nmedian wall s, peak RSS MB (each in a fresh process):")
        med = {k: (statistics.median(t for t, _ in v), max(m for _, m in v)) for k, v in results.items()}
        for k, (t, m) in med.items():
            print(f"  {k:32s} {t:8.2f} s  {m / 1e6:8.0f} MB")
        fp_t, fp_m = med["fastprof analyze_steps"]
        mg_t, _ = med["fastprof merge"]
        print(f"\nanalyze / merge time: {fp_t / mg_t:.2f}x   target <= 2x: {verdict(fp_t <= 2 * mg_t)}")
        print(f"analyze peak RSS: {fp_m / 1e6:.0f} MB   target <= 300 MB: {verdict(fp_m <= 300e6)}")
        if hta:
            h_t, h_m = med["HTA load + temporal breakdown"]
            print(f"HTA / fastprof: time {h_t / fp_t:.1f}x, peak RSS {h_m / fp_m:.1f}x")


if __name__ == "__main__":
    main()
