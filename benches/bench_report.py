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
3. ``fastprof._core.analyze_steps`` alone (the breakdown's Rust pass, as
   a report runs it: rows to breakdown.csv, per-rank summaries kept);
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

Long runs (issue #15, item 11): ``--steps 100000,1000000`` instead writes, per
size, a lean trace of that many steps (each a ProfilerStep#N holding a
DataLoader ``__next__``, an ``aten::mm`` and the ``cudaLaunchKernel`` of a
kernel on the GPU stream: what the breakdown reads), reports it beside the
merge of the same file, and prints how time per step grows from the smallest
size to the largest (1.0 is linear).

    python benches/bench_report.py --steps 100000,1000000 --rounds 1 --no-hta

Many ranks (issue #38, items 1 and 6): ``--ranks 64,256,1024`` records one
real rank with the Profiler on CPU (``--rank-steps`` steps, default 2,000:
a train-loader wait, ``forward`` / ``backward`` / ``optimizer`` spans), and a
second one whose backward is 3x as long; it then builds a run directory of N
ranks from them, rewriting every place the rank appears (the folder, the
segments' ``rank`` / ``world_size`` / pid, the side documents' paths), each
rank's clock shifted by its own jitter (+-5 ms) and ~1% of the ranks (at
least one) the slow one. Each case runs in a fresh process: ``fastprof
merge`` of the run, then ``fastprof report -q`` of it (wall, CPU, peak RSS
from ``wait4``). ``--python DIR`` puts DIR first on the path of the cases
(a copy of an older ``fastprof`` package: before/after on the same runs).

Rank summaries (issue #38, item 2): once built, each rank's
``summary.fastprof`` is written as that rank's Profiler writes it at its end
(``fastprof.reports.rank_summary``, two ranks at a time here; on a cluster
each rank does its own), and the per-rank time is printed. The report is
then timed twice: ``report -q`` (from the summaries: report.json, every CSV,
breakdown.csv included, and report.html without reading a trace but the
page's 8 detail ranks) and ``report -q --from-segments`` (the traces read as
before). ``--no-summaries`` leaves them out.

    python benches/bench_report.py --ranks 64,256,1024 --rounds 1
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import machine, verdict
from bench_merge import BASE_NS, CPU_PID, DEVICE_PROPERTIES, generate, run_measured
from fastprof.recording.names import RANK_SUMMARY_JSON

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
import os, sys, tempfile, time
from fastprof import _core
t0 = time.perf_counter()
with tempfile.TemporaryDirectory() as tmp:
    # As a report runs it: rows straight to breakdown.csv, summaries kept.
    a = _core.analyze_steps([sys.argv[1]], csv=os.path.join(tmp, "breakdown.csv"), keep_rows=False)
print(f"analyze_steps: {a['step_count']} steps in {time.perf_counter() - t0:.2f} s")
"""

#: Each rank's summary, as its Profiler writes it at the end (argv: run, ranks...).
SUMMARIZE = """
import sys, time
from pathlib import Path
from fastprof.reports import rank_summary
run = Path(sys.argv[1])
t0 = time.perf_counter()
for r in sys.argv[2:]:
    rank_summary.main([str(run), r, "run"])
print(f"{(time.perf_counter() - t0) / max(1, len(sys.argv) - 2):.3f}")
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


def generate_steps(path: Path, steps: int) -> tuple[int, int]:
    """A Kineto trace of ``steps`` training steps, ~1 KB of JSON each; (JSON bytes, events)."""

    head = (
        f'{{"schemaVersion": 1, "deviceProperties": {DEVICE_PROPERTIES}, '
        f'"distributedInfo": {{"backend": "nccl", "rank": 0, "world_size": 1}}, '
        f'"baseTimeNanoseconds": {BASE_NS}, "traceEvents": [\n'
    )
    pid, tid = CPU_PID, CPU_PID
    step_t = (
        '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d", "pid": %d, "tid": %d, '
        '"ts": %.3f, "dur": %.3f, "args": {"External id": %d}},\n'
        '{"ph": "X", "cat": "user_annotation", "name": '
        '"enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "pid": %d, "tid": %d, '
        '"ts": %.3f, "dur": %.3f, "args": {"External id": %d}},\n'
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": %d, "tid": %d, "ts": %.3f, "dur": %.3f, '
        '"args": {"External id": %d, "Sequence number": %d}},\n'
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": %d, "tid": %d, '
        '"ts": %.3f, "dur": 4.231, "args": {"External id": %d, "correlation": %d}},\n'
        '{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, '
        '"ts": %.3f, "dur": %.3f, "args": {"External id": %d, "device": 0, "stream": 7, "correlation": %d, '
        '"grid": [128, 32, 1], "block": [384, 1, 1], "blocks per SM": 2.5, "est. achieved occupancy %%": 25}}'
    )
    size = len(head)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(head.encode())
        buf: list[str] = []
        t = 1000.0  # µs from the base
        for n in range(steps):
            dur = 900.0 + (n * 7919) % 400
            ext = 4 * n
            corr = (1 << 20) + n
            text = step_t % (
                n, pid, tid, t, dur, ext,
                pid, tid, t + 5, 120.0 + n % 50, ext + 1,
                pid, tid, t + 200, 300.0, ext + 2, n,
                pid, tid, t + 250, ext + 3, corr,
                t + 260, 500.0 + n % 300, ext + 3, corr,
            )  # fmt: skip
            buf.append(text if n == steps - 1 else text + ",\n")
            t += dur + 20
            if len(buf) >= 4096:
                chunk = "".join(buf).encode()
                size += len(chunk)
                f.write(chunk)
                buf.clear()
        chunk = ("".join(buf) + "\n]}\n").encode()
        size += len(chunk)
        f.write(chunk)
    return size, 5 * steps


def _cases(path: Path, out: Path, tmp: Path) -> dict[str, list[str]]:
    """The fastprof cases on one trace, each a fresh interpreter's command line."""
    py = sys.executable
    return {
        FULL: [py, "-c", REPORT, str(path), str(out), "json,csv,html"],
        JSON: [py, "-c", REPORT, str(path), str(out), "json"],
        ANALYZE_STEPS: [py, "-c", ANALYZE, str(path)],
        MERGED: [py, "-c", MERGE, str(path), str(tmp / "merged.json.gz")],
    }


def main_steps(sizes: list[int], rounds: int) -> None:
    """Report vs merge at each step count; time per step between sizes."""
    print(f"machine: {machine()}")
    per_size: dict[int, dict[str, tuple[float, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_report_steps_") as tmp_s:
        tmp = Path(tmp_s)
        for n in sizes:
            path = tmp / f"rank0_{n}" / "node00_4242.1727000000000.pt.trace.json.gz"
            path.parent.mkdir()
            t0 = time.perf_counter()
            size, events = generate_steps(path, n)
            print(
                f"{n} steps: {size / 1e6:.0f} MB of JSON, {events} events, {path.stat().st_size / 1e6:.0f} MB gzip "
                f"(generated in {time.perf_counter() - t0:.0f} s)"
            )
            out = tmp / "reports"
            cases = _cases(path, out, tmp)
            results: dict[str, list[tuple[float, int]]] = {k: [] for k in cases}
            names = list(cases)
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    shutil.rmtree(out, ignore_errors=True)
                    log = tmp / f"{n}_{len(results[name])}_{name.replace(' ', '_')}.log"
                    results[name].append(run_measured(cases[name], log))
                    t, m = results[name][-1]
                    first = log.read_text(errors="replace").strip().splitlines()[-1:]
                    print(f"  round {r + 1}: {name}: {t:.2f} s, {m / 1e6:.0f} MB  {first[0] if first else ''}")
            (tmp / "merged.json.gz").unlink(missing_ok=True)
            path.unlink()
            per_size[n] = {k: (statistics.median(t for t, _ in v), max(m for _, m in v)) for k, v in results.items()}
    print("\nmedian wall s, peak RSS MB (each in a fresh process):")
    for n, med in per_size.items():
        mg_t = med[MERGED][0]
        for k, (t, m) in med.items():
            ratio = f"{t / mg_t:5.2f}x merge" if k != MERGED else ""
            print(f"  {n:>9} steps  {k:32s} {t:8.2f} s  {m / 1e6:6.0f} MB  {ratio}")
        t, m = med[FULL]
        print(
            f"  {n:>9} steps  full report / merge {t / mg_t:.2f}x, target <= 2x: {verdict(t <= 2 * mg_t)}; "
            f"peak RSS {m / 1e6:.0f} MB, target <= 300 MB: {verdict(m <= 300e6)}"
        )
    if len(per_size) > 1:
        lo, hi = min(per_size), max(per_size)
        for k in (FULL, JSON, ANALYZE_STEPS, MERGED):
            growth = (per_size[hi][k][0] / hi) / (per_size[lo][k][0] / lo)
            print(f"  {k:32s} time per step at {hi} / at {lo}: {growth:.2f} (1.0 is linear)")


RECORD_RANK = """
import sys, time, fastprof
steps, out, slow = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
hz = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0  # the host sampler (0: none)
prof = fastprof.Profiler(out, "run", torch=False, sample_hz=hz, flush_interval=0.05)


def busy(s):
    t = time.perf_counter() + s
    while time.perf_counter() < t:
        pass


with prof:
    for i, _ in enumerate(prof.loader(range(steps))):
        with fastprof.span("forward"):
            busy(0.0002)
        with fastprof.span("backward"):
            busy(0.0004 * slow)
        with fastprof.span("optimizer"):
            busy(0.0001)
        prof.step()
"""

#: Run a command; write "wall_s cpu_s peak_rss_bytes exit_code" to argv[1].
SPAWN_CPU = """
import os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[2:])
_, status, ru = os.wait4(p.pid, 0)
with open(sys.argv[1], "w") as f:
    cpu = ru.ru_utime + ru.ru_stime
    f.write(f"{time.perf_counter() - t0} {cpu} {ru.ru_maxrss * 1024} {os.waitstatus_to_exitcode(status)}")
"""


@dataclass
class RankTemplate:
    """One real rank's recording, as text: its segments and side documents."""

    folder: str  #: the recorded run folder (absolute, as written in the documents)
    pid: int
    segments: dict[str, str]  #: file name -> decompressed JSON text
    documents: dict[str, str]  #: profiler.json, triggers.json


def record_rank(tmp: Path, name: str, steps: int, slow: float, sample_hz: float = 0.0) -> RankTemplate:
    """Record one real rank with the Profiler (a fresh process; the host
    sampler at ``sample_hz``, none at 0) and read it back."""
    out = tmp / name
    if not (out / "run" / "rank0").is_dir():  # kept (--keep): the same ranks for a later measure
        cmd = [sys.executable, "-c", RECORD_RANK, str(steps), str(out), str(slow), str(sample_hz)]
        subprocess.run(cmd, check=True)
    rank_dir = out / "run" / "rank0"
    segments = {p.name: gzip.decompress(p.read_bytes()).decode() for p in sorted(rank_dir.glob("fastprof.*.json.gz"))}
    documents = {n: (rank_dir / n).read_text() for n in ("profiler.json", "triggers.json") if (rank_dir / n).is_file()}
    first = next(iter(segments.values()))
    pid = int(re.search(r'"pid":\s*(\d+)', first).group(1))  # type: ignore[union-attr]
    return RankTemplate(str(out / "run"), pid, segments, documents)


_RANK_KEY = re.compile(r'("rank"\s*:\s*)0\b')
_WORLD_KEY = re.compile(r'("world_size"\s*:\s*)1\b')
_BASE_KEY = re.compile(r'("(?:baseTimeNanoseconds|realtime_ns)"\s*:\s*)(\d+)')


def _as_rank(text: str, t: RankTemplate, run: Path, rank: int, world: int, shift_ns: int) -> str:
    """The template's text as rank ``rank`` of ``world`` wrote it into ``run``,
    its wall clock ``shift_ns`` off."""
    text = _RANK_KEY.sub(lambda m: f"{m.group(1)}{rank}", text)
    text = _WORLD_KEY.sub(lambda m: f"{m.group(1)}{world}", text)
    text = text.replace("rank 0 (", f"rank {rank} (")
    text = re.sub(rf"(?<![\d.]){t.pid}(?![\d.])", str(100000 + rank), text)
    text = text.replace(t.folder + "/rank0", f"{run}/rank{rank}").replace(t.folder, str(run))
    if shift_ns:
        text = _BASE_KEY.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + shift_ns}", text)
    return text


def build_ranks(run: Path, n: int, normal: RankTemplate, slow: RankTemplate, seed: int = 38) -> list[int]:
    """A run directory of ``n`` ranks from the two recorded ones: each rank's
    clock off by its own jitter (+-5 ms), ~1% of them (at least one) the
    slow recording. Returns the slow ranks."""
    rng = random.Random(seed)
    slow_ranks = sorted(rng.sample(range(n), max(1, n // 100)))
    run.mkdir(parents=True)
    for rank in range(n):
        t = slow if rank in slow_ranks else normal
        shift = rng.randint(-5_000_000, 5_000_000)
        d = run / f"rank{rank}"
        d.mkdir()
        for name, text in t.segments.items():
            with open(d / name, "wb") as f:
                f.write(gzip.compress(_as_rank(text, t, run, rank, n, shift).encode(), compresslevel=1))
        for name, text in t.documents.items():
            (d / name).write_text(_as_rank(text, t, run, rank, n, 0))
        (d / ".fastprof-done").write_text("done\n")
    return slow_ranks


def measured_cpu(cmd: list[str], log: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Run ``cmd`` in a fresh process; (wall s, CPU s, peak RSS bytes)."""
    result = log.with_suffix(".rusage")
    with open(log, "wb") as out:
        subprocess.run(
            [sys.executable, "-c", SPAWN_CPU, str(result), *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            env=env,
        )
    wall, cpu, rss, code = result.read_text().split()
    if int(code) != 0:
        sys.stdout.write(log.read_text(errors="replace")[-4000:])
        raise SystemExit(f"{cmd[:3]}... failed with exit code {code}")
    return float(wall), float(cpu), int(rss)


def write_summaries(run: Path, n: int, env: dict[str, str], jobs: int = 2) -> float:
    """Every rank's summary.fastprof (``jobs`` processes, each a share of the
    ranks); the mean seconds per rank."""
    shares = [[str(r) for r in range(j, n, jobs)] for j in range(jobs)]
    procs = [
        subprocess.Popen([sys.executable, "-c", SUMMARIZE, str(run), *share], stdout=subprocess.PIPE, env=env)
        for share in shares
        if share
    ]
    per_rank = [float(p.communicate()[0].decode().strip().splitlines()[-1]) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("writing the rank summaries failed")
    return statistics.mean(per_rank)


def main_ranks(
    sizes: list[int], rounds: int, steps: int, python: str | None, keep: str | None, summaries: bool = True
) -> None:
    """merge and report -q of N-rank runs built from a real rank."""
    print(f"machine: {machine()}")
    env = dict(os.environ)
    if python:
        env["PYTHONPATH"] = python + os.pathsep + env.get("PYTHONPATH", "")
        print(f"fastprof from {python}")
    cli = [sys.executable, "-m", "fastprof"]
    rows: list[tuple[int, str, float, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="bench_report_ranks_") as tmp_s:
        tmp = Path(keep) if keep else Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        normal = record_rank(tmp, "template_normal", steps, 1.0)
        slow = record_rank(tmp, "template_slow", steps, 3.0)
        print(f"recorded two real ranks of {steps} steps in {time.perf_counter() - t0:.0f} s")
        for n in sizes:
            run = tmp / f"ranks{n}"
            if not run.exists():
                t0 = time.perf_counter()
                slow_ranks = build_ranks(run, n, normal, slow)
                print(f"{n} ranks built in {time.perf_counter() - t0:.0f} s (slow: {slow_ranks})")
            if summaries and not all((run / f"rank{r}" / RANK_SUMMARY_JSON).is_file() for r in range(n)):
                t0 = time.perf_counter()
                each = write_summaries(run, n, env)
                print(
                    f"  {n} rank summaries written in {time.perf_counter() - t0:.0f} s "
                    f"({each:.2f} s per rank, each rank's own work at its end)"
                )
            cases = {
                "merge": [*cli, "merge", str(run), "-f", "-q"],
                "report -q": [*cli, "report", str(run), "-q", "-o", str(tmp / f"report{n}")],
            }
            if summaries:
                seg_out = str(tmp / f"report{n}_segments")
                cases["report from_segments"] = [*cli, "report", str(run), "-q", "--from-segments", "-o", seg_out]
            for r in range(rounds):
                for name, cmd in cases.items():  # the report reads the merge's trace.json.gz
                    wall, cpu, rss = measured_cpu(cmd, tmp / f"{n}_{r}_{name.split()[0]}.log", env)
                    print(
                        f"  {n} ranks, round {r + 1}: {name}: {wall:.1f} s wall, {cpu:.1f} s CPU, {rss / 2**20:.0f} MiB"
                    )
                    rows.append((n, name, wall, cpu, rss))
            report_json = tmp / f"report{n}" / "report.json"
            if report_json.is_file():
                doc = json.loads(report_json.read_text())
                ranks_seen = len(doc["speed"]["train"]["per_rank"])
                print(f"  report.json: {ranks_seen} ranks, {report_json.stat().st_size / 1e6:.1f} MB")
    print("\nmedian over rounds (each case in a fresh process):")
    names = ("merge", "report -q", "report from_segments") if summaries else ("merge", "report -q")
    head = " (from summaries)" if summaries else ""
    print(
        f"| ranks | merge (wall / CPU / peak RSS) | `report -q`{head} (wall / CPU / peak RSS) "
        "| report CPU / merge CPU |"
        + (" report from segments (wall / CPU / peak RSS) | its CPU / merge CPU |" if summaries else "")
    )
    print("|---|---|---|---|" + ("---|---|" if summaries else ""))
    for n in sizes:
        med = {}
        for name in names:
            sel = [r for r in rows if r[0] == n and r[1] == name]
            med[name] = (
                statistics.median(r[2] for r in sel),
                statistics.median(r[3] for r in sel),
                max(r[4] for r in sel),
            )
        (mw, mc, mm), (rw, rc, rm) = med["merge"], med["report -q"]
        line = (
            f"| {n:,} | {mw:.1f} s / {mc:.1f} s / {mm / 2**20:.0f} MiB "
            f"| {rw:.1f} s / {rc:.1f} s / {rm / 2**20:.0f} MiB | {rc / mc:.1f}x |"
        )
        if summaries:
            sw, sc, sm = med["report from_segments"]
            line += f" {sw:.1f} s / {sc:.1f} s / {sm / 2**20:.0f} MiB | {sc / mc:.1f}x |"
        print(line)


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
    ap.add_argument("--steps", help="comma list of step counts: lean traces of that many steps (item 11)")
    ap.add_argument("--ranks", help="comma list of rank counts: runs of N ranks built from a real rank")
    ap.add_argument("--rank-steps", type=int, default=2000, help="steps of the recorded rank (--ranks)")
    ap.add_argument("--python", help="a folder put first on the cases' PYTHONPATH (an older fastprof, --ranks)")
    ap.add_argument("--keep", help="build the runs in this folder and keep them (--ranks)")
    ap.add_argument("--no-summaries", action="store_true", help="no rank summaries, one report case (--ranks)")
    args = ap.parse_args()
    if args.ranks:
        sizes = [int(x) for x in args.ranks.split(",")]
        main_ranks(sizes, args.rounds, args.rank_steps, args.python, args.keep, not args.no_summaries)
        return
    if args.steps:
        main_steps([int(float(x)) for x in args.steps.split(",")], args.rounds)
        return
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
        cases = _cases(path, out, tmp)
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
