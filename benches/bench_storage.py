"""Run directories on object storage against the same runs on local disk (issue #26).

A real S3 server (moto's, as a process on a free port; the standard AWS environment
points at it) stands in for the store. Two measures, each in interleaved rounds of
fresh subprocesses:

1. **Step time while uploading**: the same training job (a small MLP on CPU,
   fastprof.Profiler with its defaults, torch windows off) records ``--job-steps``
   steps to a local ``out_dir`` and to ``s3://``, with ``segment_seconds=1`` so that a
   segment closes and is uploaded every second. The S3 server runs on this machine's
   two cores, so a third case runs the local job beside another process sending the
   store the same kind of traffic (a 60 KB put and a HEAD a second): the S3 job
   against it is what the job's own process pays for uploading. Each job reports the
   median of its own step times (wall) and the training thread's CPU time per step;
   the verdict: the S3 job's median step within noise of the local one's.
2. **``fastprof report`` of a 10^6-step run** (``--report-steps``): a Profiler loop of
   that many empty steps records one run locally; it is put in the bucket as it is.
   ``fastprof report RUN -q`` (JSON, CSV and HTML) runs on the local directory and on
   its URL. Wall time and the process's peak RSS (its VmHWM); targets: the URL within
   1.5x of the local report, peak RSS <= 300 MB for both.

No peer reads a run from object storage: Composer uploads its traces but reads them
back only by downloading them whole, so it has no row here.

    python benches/bench_storage.py [--rounds 3] [--job-steps 400] [--report-steps 1000000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import machine, verdict
from moto_s3 import MotoServer

JOB = """
import sys, time, statistics
import torch, fastprof
torch.set_num_threads(1)
out, steps = sys.argv[1], int(sys.argv[2])
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
times, cpu = [], []
with fastprof.Profiler(out, f"job-{time.time_ns()}", torch=False, segment_seconds=1.0) as prof:
    for i in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
print(statistics.median(times[20:]) * 1e6, statistics.median(cpu[20:]) * 1e6)
"""

#: Another process's traffic to the store while a local job runs: the S3 server
#: shares this machine's two cores, so the local case carries the same server load
#: and the comparison isolates what the job's own process pays for uploading.
TRAFFIC = """
import os, sys, time, s3fs
bucket, stop = sys.argv[1], sys.argv[2]
fs = s3fs.S3FileSystem()
path = stop + ".blob"
with open(path, "wb") as f:
    f.write(os.urandom(60_000))
n = 0
while not os.path.exists(stop):
    fs.put_file(path, f"{bucket}/traffic/{n}")
    fs.info(f"{bucket}/traffic/{n}")
    n += 1
    time.sleep(1.0)
"""

LONG = """
import sys, fastprof
out, steps = sys.argv[1], int(sys.argv[2])
with fastprof.Profiler(out, "long", torch=False, sample_hz=10) as prof:
    for _ in range(steps):
        prof.step()
"""


#: Runs ``python -m fastprof ARGS`` and then prints the process's own peak RSS
#: (VmHWM: this program's memory alone; wait4's ru_maxrss would also count the
#: parent's memory at fork, here torch's ~600 MB, which exec keeps as a floor).
PEAK = """
import atexit, sys, runpy
def peak():
    with open("/proc/self/status") as f:
        kb = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    print(f"PEAK_KB {kb}", file=sys.stderr, flush=True)
atexit.register(peak)
sys.argv = ["fastprof", *sys.argv[1:]]
runpy.run_module("fastprof", run_name="__main__")
"""


def run_child(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS in MB (of ``-m fastprof`` runs; else 0) and stdout of a subprocess."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    peaks = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("PEAK_KB ")]
    return wall, (peaks[-1] / 1024 if peaks else 0.0), p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--job-steps", type=int, default=1000)
    ap.add_argument("--report-steps", type=int, default=1_000_000)
    a = ap.parse_args()
    print(f"machine: {machine()}")
    server = MotoServer()
    server.start()
    work = Path(tempfile.mkdtemp(prefix="fastprof-bench-storage-"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FASTPROF_"))}
        env.update(server.env())
        env["FASTPROF_SPOOL_DIR"] = str(work / "spool")
        os.environ.update(server.env())
        import s3fs

        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3fs.S3FileSystem().mkdir(bucket)
        url = f"s3://{bucket}/runs"
        py = sys.executable

        # 1. Step time while uploading.
        job = work / "job.py"
        job.write_text(JOB)
        traffic = work / "traffic.py"
        traffic.write_text(TRAFFIC)
        names = ("local", "local + traffic", "s3")
        steps: dict[str, list[float]] = {k: [] for k in names}
        cpus: dict[str, list[float]] = {k: [] for k in names}
        for r in range(a.rounds):
            for case in names[r % 3 :] + names[: r % 3]:
                out = url if case == "s3" else str(work / "local")
                side, stop = None, work / f"stop-{r}"
                if case == "local + traffic":
                    side = subprocess.Popen([py, str(traffic), bucket, str(stop)], env=env)
                try:
                    _w, _rss, text = run_child([py, str(job), out, str(a.job_steps)], env)
                finally:
                    if side is not None:
                        stop.touch()
                        side.wait(60)
                med, cpu = (float(v) for v in text.split())
                steps[case].append(med)
                cpus[case].append(cpu)
        print(f"\n1. step time while uploading ({a.job_steps} steps, segment_seconds=1, {a.rounds} rounds)")
        print(f"{'case':16s} {'median step µs':>15s} {'thread CPU µs':>14s}   per round")
        for case in steps:
            print(
                f"{case:16s} {statistics.median(steps[case]):15.1f} {statistics.median(cpus[case]):14.1f}   "
                + " ".join(f"{v:.0f}" for v in steps[case])
            )
        ratio = statistics.median(steps["s3"]) / statistics.median(steps["local + traffic"])
        raw = statistics.median(steps["s3"]) / statistics.median(steps["local"])
        spread = max(steps["local + traffic"]) / min(steps["local + traffic"])
        print(
            f"s3 / (local + the same store traffic from another process) median step: {ratio:.3f} "
            f"(its rounds spread {spread:.2f}x) {verdict(ratio <= max(1.05, spread))} (within noise); "
            f"s3 / local alone: {raw:.3f} (the S3 server shares these 2 cores)"
        )

        # 2. A report of a 10^6-step run, local and from the bucket.
        long = work / "long.py"
        long.write_text(LONG)
        t_rec, _rss, _ = run_child([py, str(long), str(work / "runs"), str(a.report_steps)], env)
        run_dir = work / "runs" / "long"
        size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
        fs = s3fs.S3FileSystem()
        for p in sorted(run_dir.rglob("*")):
            rel = p.relative_to(run_dir).as_posix()
            if p.is_file() and not rel.startswith((".", "reports/")) and "/." not in rel:
                fs.put_file(str(p), f"{bucket}/runs/long/{rel}")
        print(
            f"\n2. fastprof report of a {a.report_steps}-step run ({size / 1e6:.1f} MB on disk, recorded in "
            f"{t_rec:.1f} s), {a.rounds} rounds"
        )
        cases = {"local": str(run_dir), "s3": f"{url}/long"}
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for r in range(a.rounds):
            for case in ("local", "s3") if r % 2 == 0 else ("s3", "local"):
                shutil.rmtree(run_dir / "reports", ignore_errors=True)
                res[case].append(run_child([py, "-c", PEAK, "report", cases[case], "-q"], env)[:2])
        print(f"{'case':8s} {'median s':>9s} {'peak RSS MB':>12s}")
        for case, xs in res.items():
            print(f"{case:8s} {statistics.median(x[0] for x in xs):9.2f} {max(x[1] for x in xs):12.0f}")
        t_ratio = statistics.median(x[0] for x in res["s3"]) / statistics.median(x[0] for x in res["local"])
        peak = max(x[1] for xs in res.values() for x in xs)
        print(
            f"s3 / local report time: {t_ratio:.2f} {verdict(t_ratio <= 1.5)} (<= 1.5x); "
            f"peak RSS {peak:.0f} MB {verdict(peak <= 300)} (<= 300 MB)"
        )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
