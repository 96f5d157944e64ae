"""``fastprof export`` on a long run (issue #38, item 5): wall time and peak
RSS of writing the step table, beside ``fastprof merge`` of the same run,
each in a fresh process (peak RSS from ``wait4``).

The run is recorded by the real Profiler: a loop of tiny steps, each with a
train-loader wait and the user's ``forward`` / ``backward`` / ``optimizer``
spans (the anatomy's names where no torch hooks record), paced so that the
recorder drops nothing. Its segments are the recorder's own, rotated at
``--segment-size`` (the recorder's default 256 MiB when not given): the
export reads one segment at a time, so its memory follows the segment, not
the run.

    python benches/bench_export.py                       # 10^6 steps
    python benches/bench_export.py --steps 100000 --segment-size 4MiB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import PACED_RUN, SPAWN, machine

LOAD = """
import sys, fastprof
df = fastprof.load(sys.argv[1])
print(len(df), "rows")
"""


def measured(cmd: list[str], log: Path) -> tuple[float, int]:
    """(wall s, peak RSS bytes) of ``cmd`` in a fresh process."""
    result = log.with_suffix(".rusage")
    with open(log, "wb") as out:
        subprocess.run(
            [sys.executable, "-c", SPAWN, str(result), *cmd], stdout=out, stderr=subprocess.STDOUT, check=True
        )
    wall, _cpu, rss, code = result.read_text().split()
    if int(code) != 0:
        raise SystemExit(f"{cmd[:4]} failed ({code}):\n{log.read_text(errors='replace')[-3000:]}")
    return float(wall), int(rss)


def _size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[: -len(u)]) * m)
    return int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--segment-size", type=_size, default=0, help="the recorder's segment_size (default: its own)")
    ap.add_argument("--keep", help="keep the run in this folder")
    ap.add_argument("--no-load", action="store_true", help="leave fastprof.load out (it holds the whole table)")
    a = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench_export_") as tmp_s:
        tmp = Path(a.keep or tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", PACED_RUN, str(a.steps), str(tmp), "-", str(a.segment_size)], check=True, env=env
        )
        run = tmp / "run"
        segs = sorted((run / "rank0").glob("fastprof.*.json.gz"))
        gz = sum(s.stat().st_size for s in segs)
        print(
            f"recorded {a.steps} steps in {time.perf_counter() - t0:.0f} s: {len(segs)} segments, "
            f"{gz / 1e6:.0f} MB gzip"
        )
        last = (
            json.loads((run / "rank0" / "profiler.json").read_text())
            if (run / "rank0" / "profiler.json").is_file()
            else {}
        )
        if last:
            print(f"  profiler.json steps: {last.get('steps')}")
        fp = [sys.executable, "-m", "fastprof"]
        out = tmp / "steps.parquet"
        cases = {
            "fastprof export": [*fp, "export", str(run), "-o", str(out), "-f"],
            **({} if a.no_load else {"fastprof.load (pandas)": [sys.executable, "-c", LOAD, str(run)]}),
            "fastprof merge": [*fp, "merge", str(run), "-o", str(tmp / "merged.json.gz"), "-f", "-q"],
        }
        results = {}
        for name, cmd in cases.items():
            results[name] = measured(cmd, tmp / f"{name.split()[-1].strip('()')}.log")
            t, m = results[name]
            print(f"  {name:24s} {t:7.1f} s  peak RSS {m / 2**20:6.0f} MiB")
        t, m = results["fastprof export"]
        mt = results["fastprof merge"][0]
        print(
            f"export: {a.steps / t / 1e3:.0f} k steps/s, {m / a.steps:.0f} B of peak RSS per step, "
            f"{t / mt:.2f}x the merge's wall; {out.stat().st_size / 1e6:.1f} MB of Parquet"
        )


if __name__ == "__main__":
    main()
