"""The report of a long run on one rank (issue #38, items 1 and 6): wall,
CPU and peak RSS of ``fastprof merge``, ``fastprof report -q`` and the
report from segments of the same run, each in a fresh process (CPU and peak
RSS from ``wait4``), and where the report's memory goes, stage by stage.

The run is recorded by the real Profiler (``bench_export.py``'s loop: tiny
steps, each with a train-loader wait and ``forward`` / ``backward`` /
``optimizer`` spans, paced so that the recorder drops nothing; 10^6 steps
take ~20 s, 10^7 ~12 min here). ``--run DIR`` reports a run recorded before
(``--keep DIR`` keeps the one recorded).

The stages: in the process of the report from segments each section's
function is wrapped; before it the peak RSS is reset (``/proc/self/
clear_refs``), after it the RSS and the peak inside it are printed (Linux
only). A section whose peak stands far above what it leaves held keeps
whole-run temporaries.

    python benches/bench_long_run.py --steps 1000000 --keep /tmp/r1m
    python benches/bench_long_run.py --run /tmp/r1m/run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import PACED_RUN, SPAWN, machine

#: The report from segments, each section's RSS and peak printed (argv: run, out).
STAGES = """
import functools, importlib, sys, time, warnings
warnings.simplefilter("ignore")
R = importlib.import_module("fastprof.reports.report")
H = importlib.import_module("fastprof.reports.html")
D = importlib.import_module("fastprof.reports.data")
t0 = time.perf_counter()

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) / 1024
    return out

def wrap(mod, name):
    f = getattr(mod, name)

    @functools.wraps(f)
    def g(*a, **k):
        before = status()["VmRSS"]
        with open("/proc/self/clear_refs", "w") as c:
            c.write("5")
        t = time.perf_counter()
        out = f(*a, **k)
        s = status()
        print(f"  {name:18s} {time.perf_counter() - t:6.1f} s  RSS {before:6.0f} -> {s['VmRSS']:6.0f} MiB, "
              f"peak inside {s['VmHWM']:6.0f} MiB", flush=True)
        return out

    setattr(mod, name, g)

for n in ("_breakdown", "time_report", "speed_report", "system_report", "ranks_report", "memory_report",
          "anatomy_report", "triggers_report", "write_json", "write_csv"):
    wrap(R, n)
wrap(D, "load")
wrap(H, "write_html")
R.report(sys.argv[1], sys.argv[2], from_segments=True)
print(f"  total {time.perf_counter() - t0:.1f} s")
"""

FROM_SEGMENTS = """
import sys, warnings
warnings.simplefilter("ignore")
from fastprof.reports.report import report
report(sys.argv[1], sys.argv[2], from_segments=True)
"""


def measured(cmd: list[str], log: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of ``cmd`` in a fresh process."""
    result = log.with_suffix(".rusage")
    with open(log, "wb") as out:
        subprocess.run(
            [sys.executable, "-c", SPAWN, str(result), *cmd], stdout=out, stderr=subprocess.STDOUT, check=True
        )
    wall, cpu, rss, code = result.read_text().split()
    if int(code) != 0:
        raise SystemExit(f"{cmd[:4]} failed ({code}):\n{log.read_text(errors='replace')[-3000:]}")
    return float(wall), float(cpu), int(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--run", help="report this run (recorded before) instead of recording one")
    ap.add_argument("--keep", help="record into this folder and keep it")
    ap.add_argument("--summary", action="store_true", help="the rank writes its summary at its end")
    ap.add_argument("--no-stages", action="store_true", help="leave the stage-by-stage report out")
    a = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench_long_run_") as tmp_s:
        tmp = Path(a.keep or tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        if a.run:
            run = Path(a.run)
        else:
            env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
            t0 = time.perf_counter()
            record = [sys.executable, "-c", PACED_RUN, str(a.steps), str(tmp), "1" if a.summary else "0"]
            subprocess.run(record, check=True, env=env)
            run = tmp / "run"
            print(f"recorded {a.steps} steps in {time.perf_counter() - t0:.0f} s")
        fp = [sys.executable, "-m", "fastprof"]
        cases = {
            "fastprof merge": [*fp, "merge", str(run), "-o", str(tmp / "merged.json.gz"), "-f", "-q"],
            "fastprof report -q": [*fp, "report", str(run), "-q", "-o", str(tmp / "report_q")],
            "report from segments": [sys.executable, "-c", FROM_SEGMENTS, str(run), str(tmp / "report_seg")],
        }
        got = {}
        for name, cmd in cases.items():
            got[name] = measured(cmd, tmp / f"{name.split()[-1]}.log")
            wall, cpu, rss = got[name]
            print(f"  {name:22s} wall {wall:7.1f} s  CPU {cpu:7.1f} s  peak RSS {rss / 2**20:6.0f} MiB")
        m_cpu = got["fastprof merge"][1]
        for name in ("fastprof report -q", "report from segments"):
            print(f"{name}: CPU {got[name][1] / m_cpu:.2f}x the merge's (goal <= 2x), peak RSS goal <= 1 GiB")
        if not a.no_stages and sys.platform.startswith("linux"):
            print("the report from segments, stage by stage:")
            subprocess.run([sys.executable, "-c", STAGES, str(run), str(tmp / "report_stages")], check=True)


if __name__ == "__main__":
    main()
