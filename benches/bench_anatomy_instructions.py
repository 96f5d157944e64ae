"""The step anatomy's cost in instructions (issue #25), where timing cannot
show it: on this 2-vCPU VM the same tiny backward varies 98-140 µs from one
second to the next, so a 1% difference on a 3-5 ms step is below the noise
of any timed round (benches/bench_anatomy.py times it and says so).

Valgrind's callgrind counts the instructions a process executes, the same
every run whatever else the machine does. Each case runs in its own process
under ``callgrind --instr-atstart=no``: torch is imported and the loop warmed
up uninstrumented, then the script switches instrumentation on
(``callgrind_control -i on``) for N steps and off again. Two N per case
(the toggles' own cost cancels in the difference) give instructions per
step. Cases: the CPU MLP step of bench_anatomy (~3.5 ms here) with no
profiler, the Profiler with ``anatomy=False`` and with ``anatomy=True``;
and a one-layer step, where the hooks' own instructions stand out.

Each count is given for all threads and for the training (main) thread
alone (``--separate-threads=yes``): the writer thread's share (formatting
and compressing the phases' events) is off the step path, and its wakeups
follow wall time, not steps.

Instructions are a proxy for CPU time (a cache miss costs more than an add),
and the phases' work is Python and a few core calls, neither of which
misses more than torch's kernels do; the goal it checks is the issue's
"the anatomy adds <= 1% to a ~3-5 ms CPU step".

    .venv/bin/python benches/bench_anatomy_instructions.py [--jobs 2]

Needs valgrind (Debian's ``valgrind``); takes ~10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _util import machine

CASE = r"""
import os, subprocess, sys, tempfile
import torch
import fastprof

torch.set_num_threads(1)
torch.manual_seed(0)
n, profiler, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if kind == "mlp":
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
else:
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(1, 4), torch.randint(0, 2, (1,))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
prof = None
if profiler != "none":
    prof = fastprof.Profiler(
        tempfile.mkdtemp(), "r", torch=False, sample_hz=0, merge=False, triggers=False,
        anatomy=profiler == "anatomy", memory_stats=False,
    )


def run(k):
    for _ in prof.loader(range(k)) if prof else range(k):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if prof:
            prof.step()


def instrument(on):
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True)


def measured():
    run(20)
    instrument(True)
    run(n)
    instrument(False)


if prof is not None:
    with prof:
        measured()
else:
    measured()
"""

STEPS = {"mlp": (10, 40), "tiny": (50, 250)}
CASES = [("mlp", "none"), ("mlp", "profiler"), ("mlp", "anatomy"), ("tiny", "profiler"), ("tiny", "anatomy")]


def count(script: Path, kind: str, profiler: str, n: int, out: Path) -> tuple[int, int]:
    """Instructions callgrind counted while instrumentation was on: in all
    threads, and in the training (main) thread alone (the writer thread
    formats and compresses the phases' events off the step path)."""
    log = out / f"{kind}-{profiler}-{n}.log"
    prefix = out / f"cg-{kind}-{profiler}-{n}"
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"]
    cmd += [f"--callgrind-out-file={prefix}", f"--log-file={log}", sys.executable, str(script), str(n), profiler, kind]
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    m = re.search(r"Collected : (\d+)", log.read_text())
    if m is None:
        raise RuntimeError(f"callgrind printed no count in {log}")
    main = re.search(r"^totals: (\d+)", Path(f"{prefix}-01").read_text(), re.M)
    if main is None:
        raise RuntimeError(f"callgrind wrote no count for the main thread in {prefix}-01")
    return int(m.group(1)), int(main.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (apt-get install valgrind): no instruction counts")
        return
    out = Path(tempfile.mkdtemp(prefix="bench-anatomy-cg-"))
    script = out / "case.py"
    script.write_text(CASE)
    runs = [(kind, prof, n) for kind, prof in CASES for n in STEPS[kind]]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {r: pool.submit(count, script, *r, out) for r in runs}
        counts = {r: f.result() for r, f in futures.items()}
    print(f"machine: {machine()}; instructions per step from callgrind (the difference of two runs)")
    print(f"  {'':15s} {'all threads':>14s} {'training thread':>16s}")
    per: dict[tuple[str, str], tuple[float, float]] = {}
    for kind, prof in CASES:
        n1, n2 = STEPS[kind]
        a, b = counts[(kind, prof, n2)], counts[(kind, prof, n1)]
        per[(kind, prof)] = ((a[0] - b[0]) / (n2 - n1), (a[1] - b[1]) / (n2 - n1))
        print(f"  {kind:5s} {prof:9s} {per[(kind, prof)][0]:14,.0f} {per[(kind, prof)][1]:16,.0f}")
    for col, what in ((0, "all threads"), (1, "training thread")):
        step = per[("mlp", "profiler")][col]
        added = per[("mlp", "anatomy")][col] - step
        share = added / step
        print(
            f"  {what}: anatomy on the MLP step: {added:+,.0f} instructions ({100 * share:+.3f}%)  target <= 1%  "
            f"{'PASS' if share <= 0.01 else 'MISS'}"
        )
        bare = per[("mlp", "none")][col]
        loop = step - bare
        print(f"  {what}: the Profiler without the anatomy on the same step: {loop:+,.0f} ({100 * loop / bare:+.3f}%)")
        hooks = per[("tiny", "anatomy")][col] - per[("tiny", "profiler")][col]
        print(f"  {what}: the hooks' own instructions on a one-layer step: {hooks:+,.0f} per step")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
