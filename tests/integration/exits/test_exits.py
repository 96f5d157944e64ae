"""Ways out of a profiled training job keep the job's exit code and the data
(:mod:`fastprof.profiler.exits`): real subprocesses with a real torch window
open, real ``sys.exit``/exceptions, real SIGTERM (with and without the job's
own handler), Lightning's exception path, torchrun, a run directory that
cannot be written, and a file size limit hit while a window is exported.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import fastprof  # noqa: E402

# A window opens at step 2 and stays open (its last step is far away), so
# every way out below leaves with torch's profiler running.
TRAIN = """
import os, signal, sys, time
import torch
import fastprof

out, mode = sys.argv[1], sys.argv[2]
use_fastprof = len(sys.argv) < 4


def handler(signum, frame):
    with open(os.path.join(out, "handler-ran"), "w") as f:
        f.write(str(signum))
    sys.exit(7)


if mode == "handler_before":
    signal.signal(signal.SIGTERM, handler)
prof = None
if use_fastprof:
    prof = fastprof.Profiler(out, "r", schedule=fastprof.schedule.steps([(2, 100000)], warmup=0), sample_hz=0)
    prof.start()
if mode == "handler_after":
    signal.signal(signal.SIGTERM, handler)
model = torch.nn.Linear(8, 8)
for i in range(100000):
    model(torch.randn(4, 8)).sum().backward()
    if prof is not None:
        prof.step()
    if i == 3:
        if mode == "exit":
            sys.exit(3)
        if mode == "raise":
            raise ValueError("the job failed at step 3")
        if mode == "never_stopped":
            break
        print("step 3", flush=True)
    if i > 3:
        time.sleep(0.01)
"""


def _summary(run: Path, rank: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((run / f"rank{rank}" / "profiler.json").read_text())
    return doc


def _torch_traces(run: Path, rank: int = 0) -> list[dict[str, Any]]:
    out = []
    for p in sorted((run / f"rank{rank}" / "torch").glob("*.pt.trace.json.gz")):
        with gzip.open(p, "rt") as f:
            out.append(json.load(f))
    return out


def _assert_saved(run: Path, exit_reason: str) -> None:
    summary = _summary(run)
    assert summary["exit"] == exit_reason
    windows = summary["torch"]["windows"]
    assert len(windows) == 1 and windows[0]["saved"], windows
    traces = _torch_traces(run)
    assert len(traces) == 1
    assert any(str(e.get("name", "")).startswith("ProfilerStep#2") for e in traces[0]["traceEvents"])
    # The recording was closed: every segment is final and readable.
    assert not list((run / "rank0").glob("*.part"))
    doc = fastprof.read_trace(str(next((run / "rank0").glob("fastprof.*.json.gz"))))
    assert any(e.get("name") == "step" for e in doc["traceEvents"])


def _merge_as_hinted(stderr: str, run: Path) -> dict[str, Any]:
    """Run the command fastprof printed for building the unified trace (the
    last one it printed), and read its output back with Python's own gzip/json."""
    hints = re.findall(r"build the unified trace with: (.+)$", stderr, re.MULTILINE)
    assert hints, stderr[-3000:]
    argv = shlex.split(hints[-1])
    assert argv[:2] == ["fastprof", "merge"], argv
    r = subprocess.run([sys.executable, "-m", "fastprof", *argv[1:]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with gzip.open(run / "trace.json.gz", "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _traceback(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("ValueError"))
    return lines[start : end + 1]


@pytest.mark.parametrize(("mode", "code", "reason"), [("exit", 3, "exit"), ("never_stopped", 0, "exit")])
def test_exit_with_a_window_open_keeps_the_exit_code_and_the_trace(mode, code, reason, tmp_path, pyscript):
    proc = pyscript.run(TRAIN, str(tmp_path / "out"), mode, timeout=120)
    assert proc.returncode == code, proc.stderr[-3000:]
    _assert_saved(tmp_path / "out" / "r", reason)
    # A single process: the unified trace is merged at exit as at stop().
    assert (tmp_path / "out" / "r" / "trace.json.gz").is_file()


def test_exception_with_a_window_open_keeps_rc_and_traceback(tmp_path, pyscript):
    proc = pyscript.run(TRAIN, str(tmp_path / "out"), "raise", timeout=120)
    bare = pyscript.run(TRAIN, str(tmp_path / "bare"), "raise", "off", timeout=120)
    assert bare.returncode == 1
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert _traceback(proc.stderr) == _traceback(bare.stderr)
    assert _traceback(proc.stderr)[-1] == "ValueError: the job failed at step 3"
    _assert_saved(tmp_path / "out" / "r", "exit")


def _sigterm_at_step_3(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out = tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, str(script), str(out), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "step 3", child.stderr.read() if child.stderr else ""
        child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, line + stdout, stderr)


def test_sigterm_saves_the_run_then_dies_by_the_signal(tmp_path):
    proc = _sigterm_at_step_3(tmp_path, "plain")
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    run = tmp_path / "out" / "r"
    _assert_saved(run, "SIGTERM")
    # Nothing merged on a signal: the hint says how, and its command works.
    assert not (run / "trace.json.gz").exists()
    doc = _merge_as_hinted(proc.stderr, run)
    names = {str(e.get("name", "")) for e in doc["traceEvents"]}
    assert "step" in names and "ProfilerStep#2" in names


@pytest.mark.parametrize("mode", ["handler_before", "handler_after"])
def test_sigterm_runs_the_jobs_own_handler(mode, tmp_path):
    proc = _sigterm_at_step_3(tmp_path, mode)
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert (tmp_path / "out" / "handler-ran").read_text() == str(int(signal.SIGTERM))
    # Before fastprof's: fastprof saved, then called it. After: it replaced
    # fastprof's, and its sys.exit went through the exit hook.
    _assert_saved(tmp_path / "out" / "r", "SIGTERM" if mode == "handler_before" else "exit")


# The job's own schedule function runs inside the core's step loop (its
# callback into the Profiler): a SIGTERM that lands there, as a preemption
# can, must save the run and leave the job's handler in charge.
IN_SCHEDULE = """
import os, signal, sys
import torch
import fastprof
from fastprof.profiler.schedule import Action

out, mode = sys.argv[1], sys.argv[2]


def handler(signum, frame):
    sys.exit(7)


if mode == "handler":
    signal.signal(signal.SIGTERM, handler)


def sched(step):
    if step == 5:
        os.kill(os.getpid(), signal.SIGTERM)
    return Action.ACTIVE if step >= 2 else Action.WAIT


model = torch.nn.Linear(8, 8)
with fastprof.Profiler(out, "r", schedule=sched, sample_hz=0) as prof:
    for i in range(50):
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
print("trained on", flush=True)
"""


@pytest.mark.parametrize(("mode", "code"), [("plain", -signal.SIGTERM), ("handler", 7)])
def test_sigterm_inside_the_step_loop(mode, code, tmp_path, pyscript):
    proc = pyscript.run(IN_SCHEDULE, str(tmp_path / "out"), mode, timeout=120)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "trained on" not in proc.stdout  # the handler's exit was not swallowed
    assert "Profiler.stop failed" not in proc.stderr
    run = tmp_path / "out" / "r"
    summary = _summary(run)
    assert summary["exit"] == "SIGTERM"
    assert summary["steps"] == 5  # steps 0-4 ended; the signal came as step 5 began
    assert [(w["first_step"], w["last_step"], w["saved"]) for w in summary["torch"]["windows"]] == [(2, 4, True)]
    assert not list(run.rglob("*.part"))


IN_TORCH = """
import os, signal, sys
import torch
import torch.profiler as tprof
import fastprof

out, where = sys.argv[1], sys.argv[2]
hit = []


def land(when):
    # SIGTERM that Python delivers at the next bytecode: inside torch's call.
    if where == when and not hit:
        hit.append(when)
        os.kill(os.getpid(), signal.SIGTERM)


enter = tprof.record_function.__enter__
def record_enter(self):
    if self.name == "ProfilerStep#5":
        land("step")  # created by torch's step(), not entered yet
    return enter(self)
tprof.record_function.__enter__ = record_enter

start = tprof.profile.start
def profile_start(self):
    start(self)
    land("start")  # torch records; fastprof has not taken the object yet
tprof.profile.start = profile_start

stop = tprof.profile.stop
def profile_stop(self):
    land("stop")  # the window's last step, before torch stops
    stop(self)
tprof.profile.stop = profile_stop

model = torch.nn.Linear(8, 8)
sched = fastprof.schedule.steps([(2, 7), (9, 100000)], warmup=0)
with fastprof.Profiler(out, "r", schedule=sched, sample_hz=0) as prof:
    for i in range(100000):
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
print("trained on", flush=True)
"""


@pytest.mark.parametrize(
    ("where", "windows"),
    [("start", [(2, 2)]), ("step", [(2, 4)]), ("stop", [(2, 6)])],
)
def test_sigterm_inside_a_torch_profiler_call_saves_the_window(where, windows, tmp_path, pyscript):
    # Before: landing between torch's creating ProfilerStep#N and entering it
    # lost the window ("stop: AssertionError: Expected record to be set"), one
    # torchrun SIGTERM in 20; landing right after torch's start left torch
    # recording with no window on record. The handler now waits for the call.
    proc = pyscript.run(IN_TORCH, str(tmp_path / "out"), where, timeout=120)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    assert "trained on" not in proc.stdout
    assert "torch.profiler failed" not in proc.stderr, proc.stderr[-3000:]
    run = tmp_path / "out" / "r"
    summary = _summary(run)
    assert summary["exit"] == "SIGTERM"
    got = summary["torch"]["windows"]
    assert [(w["first_step"], w["last_step"]) for w in got] == windows, got
    assert all(w["saved"] for w in got), got
    assert len(_torch_traces(run)) == len(windows)


CLOSING = """
import os, signal, sys, threading, time
import torch
import fastprof

prof = fastprof.Profiler(sys.argv[1], "r", schedule=fastprof.schedule.steps([(2, 3)], warmup=0), sample_hz=0)


def terminate_while_closing():
    # A preemption that comes while stop() waits for the window's export.
    while prof._state != "stopping":
        time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGTERM)


model = torch.nn.Linear(8, 8)
with prof:
    for i in range(6):
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
    threading.Thread(target=terminate_while_closing, daemon=True).start()
print("closing", flush=True)
"""


def test_sigterm_while_stop_waits_for_exports_says_the_data_may_be_incomplete(tmp_path, pyscript):
    env = {**os.environ, "FASTPROF_TEST_EXPORT_DELAY_S": "30"}
    proc = pyscript.run(CLOSING, str(tmp_path / "out"), timeout=120, env=env)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    run = tmp_path / "out" / "r"
    assert f"rank 0's run was being closed; what is in {run / 'rank0'} may be incomplete" in proc.stderr
    assert "data is saved" not in proc.stderr
    assert "fastprof merge " in proc.stderr


# ------------------------------------------------------------------ Lightning

LIGHTNING = """
import sys, warnings
import torch
import lightning.pytorch as pl
import fastprof
from fastprof.integrations.lightning import FastprofProfiler

warnings.simplefilter("ignore")


class Failing(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == 3:
            raise RuntimeError("the module failed at batch 3")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


ds = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
trainer = pl.Trainer(
    max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
    enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=sys.argv[1],
    profiler=FastprofProfiler(sys.argv[1], "fit", schedule=fastprof.schedule.steps([(1, 1000)], warmup=0),
                              sample_hz=0),
)
trainer.fit(Failing(), torch.utils.data.DataLoader(ds, batch_size=2))
"""


def test_lightning_fit_raising_in_a_window(tmp_path, pyscript):
    pytest.importorskip("lightning")
    proc = pyscript.run(LIGHTNING, str(tmp_path / "out"), timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.rstrip().splitlines()[-1] == "RuntimeError: the module failed at batch 3"
    run = tmp_path / "out" / "fit"
    summary = _summary(run)
    # Closed by Lightning's on_exception, before the exception left fit().
    assert summary["exit"] == "exception: RuntimeError"
    assert [w["saved"] for w in summary["torch"]["windows"]] == [True]
    assert len(_torch_traces(run)) == 1
    assert (run / "trace.json.gz").is_file()


# -------------------------------------------------------------------- torchrun

DIST = """
import os, sys, time
import torch
import torch.distributed as dist
import fastprof

dist.init_process_group("gloo")
rank = dist.get_rank()
out, mode = sys.argv[1], sys.argv[2]
model = torch.nn.Linear(8, 8)
with fastprof.Profiler(out, "job", schedule=fastprof.schedule.steps([(2, 100000)], warmup=0)) as prof:
    for i in range(100000):
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
        if i == 3:
            if mode == "raise" and rank == 1:
                raise RuntimeError("rank 1 failed")
            open(os.path.join(out, f"step3.rank{rank}"), "w").close()
        if i > 3:
            time.sleep(0.01)
        if i > 3 and mode == "raise" and time.time() - t0 > 40:
            break
        if i == 0:
            t0 = time.time()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(tmp_path: Path, mode: str) -> tuple[list[str], dict[str, str], Path]:
    script = tmp_path / "worker.py"
    script.write_text(DIST)
    out = tmp_path / "out"
    out.mkdir()
    skip = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_") and k not in skip}
    env.update(GLOO_SOCKET_IFNAME="lo", FASTPROF_SAMPLE_HZ="0", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(_free_port()), str(script), str(out), mode]
    return cmd, env, out


@pytest.mark.slow
def test_torchrun_rank_raising_skips_the_closing_sync(tmp_path):
    cmd, env, out = _torchrun(tmp_path, "raise")
    # Before: rank 1 waited 60 s in the closing clock sync for rank 0, which
    # trains on; now it leaves at once, and torchrun stops rank 0 (SIGTERM).
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=40, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not end within 40 s\nstderr:\n{e.stderr}")
    assert r.returncode != 0
    assert "rank 1 failed" in r.stderr
    run = out / "job"
    rank1 = _summary(run, 1)
    assert rank1["exit"] == "exception: RuntimeError"
    assert rank1["clock_sync"]["end"] == {"skipped": "exception: RuntimeError"}
    assert "start" in rank1["clock_sync"]
    rank0 = _summary(run, 0)
    assert rank0["exit"] == "SIGTERM"
    assert rank0["clock_sync"]["end"] == {"skipped": "SIGTERM"}


@pytest.mark.slow
def test_torchrun_sigterm_to_the_launcher_saves_every_rank(tmp_path):
    cmd, env, out = _torchrun(tmp_path, "train")
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        import time

        deadline = time.monotonic() + 120
        while not all((out / f"step3.rank{r}").exists() for r in (0, 1)):
            assert launcher.poll() is None and time.monotonic() < deadline, "the ranks never reached step 3"
            time.sleep(0.1)
        launcher.send_signal(signal.SIGTERM)
        _stdout, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    run = out / "job"
    for rank in (0, 1):
        summary = _summary(run, rank)
        assert summary["exit"] == "SIGTERM"
        windows = summary["torch"]["windows"]
        assert [w["saved"] for w in windows] == [True], f"rank {rank}: {windows}\nstderr:\n{stderr}"
        assert len(_torch_traces(run, rank)) == 1
        assert f"rank {rank}'s data is saved in {run / f'rank{rank}'}" in stderr
    doc = _merge_as_hinted(stderr, run)
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len({e["pid"] for e in steps}) == 2  # both ranks' windows, one process track each


# ------------------------------------------------------- unwritable run dirs


def test_unwritable_out_dir_warns_and_trains_on(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the run directory's parent should be")
    out = blocker / "runs"
    prof = fastprof.Profiler(out, "r", sample_hz=0)
    with pytest.warns(fastprof.FastprofWarning, match=str(out)) as caught:
        with prof:
            seen = [x for x in prof.loader(range(5))]
            for _ in range(3):
                prof.step()
    assert seen == list(range(5))
    assert len([w for w in caught if issubclass(w.category, fastprof.FastprofWarning)]) == 1
    assert prof.batch == 0 and prof.trace_path is None
    assert fastprof.current() is None


FULL_DISK = """
import resource, signal, sys, warnings
import torch
import fastprof

warnings.simplefilter("always")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
windows = [(i, i + 1) for i in range(0, 40, 2)]
prof = fastprof.Profiler(sys.argv[1], "r", schedule=fastprof.schedule.steps(windows, warmup=0), sample_hz=0,
                         flush_interval=60)
model = torch.nn.Linear(8, 8)
with prof:
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
    for i in range(40):
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
print("trained", flush=True)
"""


def test_full_disk_in_window_exports_warns_once_and_leaves_nothing(tmp_path, pyscript):
    # Below a window's gzip (~3 KB here): torch's JSON never reaches the
    # disk, it is piped into the gzip (issue #34).
    proc = pyscript.run(FULL_DISK, str(tmp_path / "out"), "2048", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "trained"
    window_warnings = [line for line in proc.stderr.splitlines() if "writing torch window" in line]
    assert len(window_warnings) == 1, proc.stderr[-3000:]
    assert "FileNotFoundError" not in proc.stderr
    assert "disk full" in window_warnings[0] or "size limit" in window_warnings[0]
    leftovers = [p for p in (tmp_path / "out").rglob("*") if ".tmp" in p.name]
    assert leftovers == []
    assert not list((tmp_path / "out").rglob("*.pt.trace.json*"))
