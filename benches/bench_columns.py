"""``fastprof.read_columns`` against ``json.load`` (and HolisticTraceAnalysis
when it is installed) on the same torch.profiler-shaped trace, in one run.

The input is one synthetic Kineto trace (torch >= 2.4 layout, gzip level 1;
the generator of ``bench_merge.py``) of ``--mb`` MB of JSON. Each case runs
in its own child process, interleaved over ``--rounds`` rounds; the figures
are the best wall time and the child's own peak RSS (``ru_maxrss`` from
``wait4`` under a fresh small parent, see ``bench_merge.SPAWN``):

- ``columns (all)``: every span, instant and counter as numpy columns;
- ``columns (cpu_op)``: only ``categories=["cpu_op"]``;
- ``columns (ProfilerStep#)``: a narrow name filter;
- ``json.load``: ``json.load(gzip.open(path))``, the usual Python way, then
  nothing else (its best case: no per-event work after parsing);
- ``hta``: ``hta.trace_analysis.TraceAnalysis(trace_dir=...)`` (parses the
  trace into pandas frames), or a line saying why it was skipped. It is slow:
  on the 2-vCPU VM one 300 MB trace took over 5 minutes (30 s of it JSON
  parsing) and 1.5 GB, so run it with a small ``--mb`` from an environment
  where ``pip install HolisticTraceAnalysis`` worked.

Ratios are against ``json.load``. Not run by CI.

Run: python benches/bench_columns.py [--mb 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import machine
from bench_merge import SPAWN, generate

CASES = {
    "columns (all)": """
        import fastprof, sys
        c = fastprof.read_columns(sys.argv[1])
        print(len(c.spans["ts"]) + len(c.instants["ts"]) + len(c.counters["ts"]))
    """,
    "columns (cpu_op)": """
        import fastprof, sys
        c = fastprof.read_columns(sys.argv[1], categories=["cpu_op"], kinds=["spans"])
        print(len(c.spans["ts"]))
    """,
    "columns (ProfilerStep#)": """
        import fastprof, sys
        c = fastprof.read_columns(sys.argv[1], name_prefix="ProfilerStep#")
        print(len(c.spans["ts"]))
    """,
    "json.load": """
        import gzip, json, sys
        with gzip.open(sys.argv[1], "rb") as f:
            doc = json.load(f)
        print(len(doc["traceEvents"]))
    """,
    "hta": """
        import os, sys, warnings
        warnings.simplefilter("ignore")
        from hta.trace_analysis import TraceAnalysis
        a = TraceAnalysis(trace_dir=os.path.dirname(sys.argv[1]))
        print(sum(len(a.t.get_trace(r)) for r in a.t.get_ranks()))
    """,
}


def measured(code: str, path: Path, log: Path) -> tuple[float, int, str]:
    """(wall s, peak RSS bytes, stdout) of one child running ``code``."""
    result = log.with_suffix(".rusage")
    cmd = [sys.executable, "-c", textwrap.dedent(code), str(path)]
    with open(log, "wb") as out:
        subprocess.run(
            [sys.executable, "-c", SPAWN, str(result), *cmd], stdout=out, stderr=subprocess.STDOUT, check=True
        )
    wall, rss, rc = result.read_text().split()
    text = log.read_text(errors="replace")
    if int(rc) != 0:
        raise RuntimeError(text[-2000:])
    return float(wall), int(rss), text.strip().splitlines()[-1]


def hta_available() -> str | None:
    probe = subprocess.run([sys.executable, "-c", "import hta.trace_analysis"], capture_output=True, text=True)
    if probe.returncode != 0:
        return (probe.stderr.strip().splitlines() or ["import failed"])[-1]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=300, help="MB of JSON in the trace")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(machine())
    cases = dict(CASES)
    why = hta_available()
    if why:
        print(f"hta: skipped, HolisticTraceAnalysis is not importable here ({why}); pip install HolisticTraceAnalysis")
        del cases["hta"]
    with tempfile.TemporaryDirectory(prefix="bench_columns_") as tmp:
        d = Path(tmp) / "rank0"
        d.mkdir()
        path = d / "node00_4242.1727000000000.pt.trace.json.gz"
        size, events = generate(str(path), 0, 1, args.mb)
        print(f"trace: {size / 1e6:.0f} MB of JSON, {events} events, {path.stat().st_size / 1e6:.0f} MB gzip")
        times: dict[str, list[float]] = {k: [] for k in cases}
        rss: dict[str, int] = {}
        rows: dict[str, str] = {}
        names = list(cases)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if name not in cases:
                    continue
                try:
                    wall, peak, out = measured(cases[name], path, Path(tmp) / "log")
                except RuntimeError as e:
                    if name != "hta":
                        raise
                    # HTA's own failure (e.g. a pandas it does not support): say so, go on.
                    print(f"hta: failed on this trace: {str(e).strip().splitlines()[-1]}")
                    del cases[name], times[name]
                    continue
                times[name].append(wall)
                rss[name] = max(rss.get(name, 0), peak)
                rows[name] = out
        ref_t, ref_m = min(times["json.load"]), rss["json.load"]
        print(f"\n{'case':26} {'best s':>8} {'MB/s':>7} {'peak RSS MB':>12} {'time ratio':>11} {'RSS ratio':>10}  rows")
        for name in cases:
            t = min(times[name])
            print(
                f"{name:26} {t:8.2f} {size / 1e6 / t:7.0f} {rss[name] / 1e6:12.0f} "
                f"{t / ref_t:11.2f} {rss[name] / ref_m:10.2f}  {rows[name]}"
            )
        print("\nratios: against json.load of the same file (lower is better); best of", args.rounds, "rounds")
        print(
            "file size for scale:",
            f"{size / 1e6:.0f} MB JSON",
            f"(RSS/JSON size of columns (all): {rss['columns (all)'] / size:.2f})",
        )


if __name__ == "__main__":
    main()
