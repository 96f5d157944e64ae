"""Signals around a Profiler's end keep the job's own outcome: a trigger
signal (SIGUSR2) arriving while the job finishes never kills it, and a
SIGTERM handler chain (the job's handler, fastprof's, a library's on top that
calls the one it replaced) still reaches the job's handler after the Profiler
stopped. Real subprocesses, real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

# A short profiled loop, then the job goes on without a Profiler for a while
# (``linger`` s) and exits; ``handler`` installs the job's own SIGUSR2 handler
# first. It says "started" once the Profiler runs.
FINISHING = """
import os, signal, sys, time
import torch
import fastprof

out, linger, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
seen = []
if mode == "handler":
    signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
model = torch.nn.Linear(8, 8)
with fastprof.Profiler(out, "r", torch=None, sample_hz=0) as prof:
    print("started", flush=True)
    for i in prof.loader(range(40)):
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
        time.sleep(0.005)
print("after:", signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL, flush=True)
t = time.monotonic()
while time.monotonic() - t < linger:
    model(torch.randn(4, 8)).sum().backward()
print("handler calls:", len(seen) > 0, flush=True)
open(os.path.join(out, "done"), "w").close()
"""


def _finish_under_a_signal_stream(
    tmp_path: Path, linger: float, mode: str, until_teardown: bool = True
) -> tuple[int, str, str]:
    script = tmp_path / "finishing.py"
    script.write_text(FINISHING)
    out = tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, str(script), str(out), str(linger), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    sent = 0
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first.strip() == "started", child.stderr.read() if child.stderr else ""
        # A stream of triggers from the loop's start until the process is
        # gone: through the Profiler's end, the rest of the job and the
        # interpreter's teardown (or until the job's last line).
        while child.poll() is None and (until_teardown or not (out / "done").exists()):
            try:
                os.kill(child.pid, signal.SIGUSR2)
                sent += 1
            except ProcessLookupError:
                break
            time.sleep(0.001)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert sent > 10
    return child.returncode, first + stdout, stderr


@pytest.mark.parametrize("linger", [0.0, 0.5])
def test_sigusr2_stream_while_the_job_finishes_never_kills_it(linger, tmp_path):
    rc, out, err = _finish_under_a_signal_stream(tmp_path, linger, "default")
    assert rc == 0, err[-3000:]
    rank = tmp_path / "out" / "r" / "rank0"
    summary = json.loads((rank / "profiler.json").read_text())
    assert summary["steps"] == 40
    assert not list(rank.glob("*.part")), sorted(p.name for p in rank.iterdir())
    # The process no longer needs the handler to save anything, yet a late
    # trigger still does nothing: the job's disposition reads as it was
    # not (a harmless handler stands in for the default, which kills).
    assert "handler calls: False" in out


def test_the_jobs_own_sigusr2_handler_is_given_back(tmp_path):
    # The stream stops at the job's last line: in the interpreter's teardown
    # Python itself puts a handler written in Python back to the default, as
    # it would without fastprof.
    rc, out, err = _finish_under_a_signal_stream(tmp_path, 0.5, "handler", until_teardown=False)
    assert rc == 0, err[-3000:]
    # After the Profiler: the job's handler is in place again and called.
    assert "after: True" in out
    assert "handler calls: True" in out


# The job handles SIGTERM (a checkpoint on preemption); a library started
# after the Profiler chains its own handler on top of fastprof's; the
# Profiler stops; then SIGTERM arrives. ``again`` starts a second Profiler
# after the first stopped (fastprof's handler on top of the library's).
CHAIN = """
import os, signal, sys
import fastprof

out, mode = sys.argv[1], sys.argv[2]


def job_handler(signum, frame):
    with open(os.path.join(out, "checkpoint"), "w") as f:
        f.write("saved")
    sys.exit(7)


signal.signal(signal.SIGTERM, job_handler)
prof = fastprof.Profiler(out, "r", torch=None, sample_hz=0).start()
below = signal.getsignal(signal.SIGTERM)


def library_handler(signum, frame):
    with open(os.path.join(out, "library"), "w") as f:
        f.write("ran")
    below(signum, frame)


signal.signal(signal.SIGTERM, library_handler)
for _ in range(3):
    prof.step()
prof.stop()
if mode == "again":
    with fastprof.Profiler(out, "r2", torch=None, sample_hz=0) as p2:
        p2.step()
    assert signal.getsignal(signal.SIGTERM) is library_handler
os.kill(os.getpid(), signal.SIGTERM)
print("not reached", flush=True)
"""


@pytest.mark.parametrize("mode", ["once", "again"])
def test_sigterm_chain_reaches_the_jobs_handler_after_the_profiler_stopped(mode, tmp_path, pyscript):
    out = tmp_path / "out"
    out.mkdir()
    proc = pyscript.run(CHAIN, str(out), mode, timeout=120)
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert (out / "library").read_text() == "ran"
    assert (out / "checkpoint").read_text() == "saved"
    assert "not reached" not in proc.stdout


# The job's own SIGUSR1 handler raises (a timeout, a stop request). It lands
# inside fastprof's code: in the Profiler's step callback (the job's schedule
# function, called from the core's step loop, sends it), or while the
# Profiler closes. The exception is the job's either way: it leaves the
# loop as it would without fastprof, and the run is still saved.
HANDLER_RAISES = """
import os, signal, sys
import fastprof
from fastprof.profiler.schedule import Action

out, where = sys.argv[1], sys.argv[2]


def handler(signum, frame):
    raise TimeoutError("the job's handler: out of time")


signal.signal(signal.SIGUSR1, handler)


def sched(step):
    if where == "callback" and step == 4:
        os.kill(os.getpid(), signal.SIGUSR1)
    return Action.WAIT


try:
    with fastprof.Profiler(out, "r", torch=None, sample_hz=0, schedule=sched) as prof:
        for i in prof.loader(range(10)):
            prof.step()
        if where == "exit":
            # The signal lands in the Profiler's own close (its first part).
            end_steps = prof._end_steps

            def first_part_of_the_close():
                os.kill(os.getpid(), signal.SIGUSR1)
                end_steps()

            prof._end_steps = first_part_of_the_close
    print("after", flush=True)
finally:
    print("finally ran", flush=True)
"""


@pytest.mark.parametrize("where", ["callback", "exit"])
def test_an_exception_of_the_jobs_handler_inside_fastprof_is_the_jobs(where, tmp_path, pyscript):
    proc = pyscript.run(HANDLER_RAISES, str(tmp_path / "out"), where, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.rstrip().splitlines()[-1] == "TimeoutError: the job's handler: out of time"
    assert "Exception ignored" not in proc.stderr and "Profiler.stop failed" not in proc.stderr
    assert proc.stdout == "finally ran\n"
    summary = json.loads((tmp_path / "out" / "r" / "rank0" / "profiler.json").read_text())
    assert summary["steps"] >= 4
