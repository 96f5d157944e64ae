"""The exit-path matrix: wherever the job's own exception, exit or signal
lands, in every loop shape fastprof supports, the job's outcome is what it is
without fastprof, and the run directory still merges and reports.

Each case runs the same training script twice as a real subprocess, once
profiled and once not (``bare``), and compares what the job shows: its exit
status, stdout (which lines ran, ``finally`` among them), and its traceback
(the script's own frames and the last line). Then ``fastprof merge`` and
``fastprof report`` run on what the profiled run wrote, and their outputs are
read back with Python's own ``gzip``/``json``.

- outcomes: a normal end, an exception, ``sys.exit(3)``, KeyboardInterrupt
  (a real SIGINT), SIGTERM, and a stream of SIGUSR2 (fastprof's trigger)
  from that point until the process is gone (compared with the bare run's
  normal end: the trigger never changes the job's outcome);
- where: before the first step, right after the step boundary of steps
  1-20, inside a step, in the train loader's ``next()``, in a validation
  loader's ``next()``, inside a step while a torch.profiler window is open,
  and in the Profiler's own exit (the job's SIGUSR1 handler does it while
  ``Profiler.__exit__`` runs);
- loop shapes: ``prof.loader`` + ``prof.step()``, ``prof.step()`` alone,
  steps inferred from ``optimizer.step()``, ``fastprof run`` of the
  unmodified script, and Lightning's ``Trainer.fit`` with ``FastprofProfiler``
  (and ``-light`` variants of the first two: no torch, ``torch=None``, for
  the cheap sweep over steps 1-20).

The cases of the selected tests run up front, a few at a time (each is
mostly an interpreter importing torch); each parametrised test then checks
its own. A quick subset runs by default; the rest is marked ``slow``, and CI
runs all of it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import importlib.util
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from fastprof.cli.main import main

# What the job does at the point a case names (both scripts): raise, exit,
# signal itself, or start a stream of fastprof's trigger signal.
ACT = r'''
# The trigger stream: SIGUSR2 every 2 ms to the job until it is gone.
STREAM = """
import os, signal, sys, time
pid, t = int(sys.argv[1]), time.monotonic()
while os.getppid() == pid and time.monotonic() - t < 120:
    try:
        os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        break
    time.sleep(0.002)
"""


def act():
    if OUTCOME == "exception":
        raise RuntimeError(f"the job failed: {WHERE} {STEP}")
    if OUTCOME == "exit":
        sys.exit(3)
    if OUTCOME == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    elif OUTCOME == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    elif OUTCOME == "sigusr2" and MODE == "fastprof":
        subprocess.Popen([sys.executable, "-c", STREAM, str(os.getpid())])
        time.sleep(0.05)


'''

# One script for every shape but Lightning. argv: mode (fastprof | bare),
# shape, outcome, where, step, out_dir. Under ``bare`` (and for the shape
# ``run``, which ``fastprof run`` wraps from outside) nothing of fastprof is
# imported: the same loop runs on its own.
JOB = r"""
import contextlib, os, signal, subprocess, sys, threading, time

MODE, SHAPE, OUTCOME, WHERE, STEP, OUT = sys.argv[1:7]
STEP = int(STEP)
LIGHT = SHAPE.endswith("-light")
SHAPE = SHAPE.removesuffix("-light")
PROFILE = MODE == "fastprof" and SHAPE != "run"
N = 10 if WHERE == "prof_exit" else 24

# (ACT)
# The Profiler's own exit: the job's SIGUSR1 handler acts while it runs.
signal.signal(signal.SIGUSR1, lambda signum, frame: act())


def data(n, where):
    for i in range(n):
        if WHERE == where and i == STEP:
            act()
        yield i


if not LIGHT:
    import torch

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)


def body(i):
    if LIGHT:
        sum(range(300))
        if WHERE in ("inside", "window") and i == STEP:
            act()
        return
    loss = model(torch.randn(8, 16)).sum()
    if WHERE in ("inside", "window") and i == STEP:
        act()
    loss.backward()
    opt.step()
    opt.zero_grad()


prof = None
if PROFILE:
    import fastprof

    options = {"torch": None, "sample_hz": 0} if LIGHT else {}
    prof = fastprof.Profiler(OUT, "m", **options)


def validate():
    val = data(3, "val_loader")
    for _ in prof.loader(val, name="val") if prof is not None else val:
        pass


def exit_signal():
    # In the Profiler's exit (bare: where its exit would be).
    while prof is not None and prof._state != "stopping":
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGUSR1)


def main():
    try:
        with prof if prof is not None else contextlib.nullcontext():
            if WHERE == "before":
                act()
            train = data(N, "loader_next")
            for i in prof.loader(train) if prof is not None and SHAPE == "loader" else train:
                body(i)
                if prof is not None and SHAPE in ("loader", "step"):
                    prof.step()
                if WHERE == "after_step" and i == STEP:
                    act()
                if i == 6:
                    validate()
                print(f"step {i}", flush=True)
            if WHERE == "prof_exit":
                threading.Thread(target=exit_signal, daemon=True).start()
                if prof is None:
                    time.sleep(1.0)
        print("after the loop", flush=True)
    finally:
        print("finally ran", flush=True)


main()
""".replace("# (ACT)\n", ACT)

# Lightning's loop: argv as above (shape "lightning").
LIGHTNING = r"""
import os, signal, subprocess, sys, time, warnings

MODE, SHAPE, OUTCOME, WHERE, STEP, OUT = sys.argv[1:7]
STEP = int(STEP)
warnings.simplefilter("ignore")
import torch
import lightning.pytorch as pl

# (ACT)
class Data(torch.utils.data.Dataset):
    def __init__(self, n, where):
        self.n, self.where = n, where

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if WHERE == self.where and i == STEP:
            act()
        return torch.randn(8), torch.randn(1)


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if WHERE in ("inside", "window") and batch_idx == STEP:
            act()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if WHERE == "after_step" and batch_idx == STEP:
            act()
        print(f"step {batch_idx}", flush=True)

    def on_fit_start(self):
        if WHERE == "before":
            act()

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


profiler = None
if MODE == "fastprof":
    from fastprof.integrations.lightning import FastprofProfiler

    profiler = FastprofProfiler(OUT, "m")
trainer = pl.Trainer(
    max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
    enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=OUT,
    num_sanity_val_steps=0, val_check_interval=12, profiler=profiler,
)
loader = torch.utils.data.DataLoader(Data(24, "loader_next"), batch_size=1)
val = torch.utils.data.DataLoader(Data(3, "val_loader"), batch_size=1)
try:
    trainer.fit(Module(), loader, val)
    print("after the loop", flush=True)
finally:
    print("finally ran", flush=True)
""".replace("# (ACT)\n", ACT)

OUTCOMES = ("exception", "exit", "sigint", "sigterm", "sigusr2")
# (where, step): the point in the loop each "where" names.
WHERES = {
    "before": 0,
    "after_step": 3,
    "inside": 12,  # outside any window of the default schedule
    "loader_next": 5,
    "val_loader": 1,
    "window": 3,  # the default schedule's window covers steps 0-9
    "prof_exit": 0,
}


@dataclass(frozen=True)
class Case:
    shape: str
    outcome: str
    where: str
    step: int

    @property
    def id(self) -> str:
        return f"{self.shape}-{self.outcome}-{self.where}{self.step if self.where == 'after_step' else ''}"

    def bare(self) -> tuple[str, str, str, int]:
        """What the same script without fastprof runs (the trigger stream
        is the profiled run's alone: without fastprof it would kill)."""
        script = "lightning" if self.shape == "lightning" else "job"
        light = self.shape.endswith("-light")
        return (script + ("-light" if light else ""), self.outcome, self.where, self.step)


def _cases() -> list[Any]:
    """Every outcome at every point where it can land, in every loop shape,
    within CI's time: the torch-free shapes (an interpreter without torch
    starts in a fraction of a second) take the whole product and the sweep
    of steps 1-20; the shapes that import torch (or Lightning) take each
    outcome at the points that differ for them."""
    out: list[Any] = []
    seen: set[str] = set()

    def add(case: Case, slow: bool) -> None:
        if case.id in seen:
            return
        seen.add(case.id)
        marks = [pytest.mark.slow] if slow else []
        out.append(pytest.param(case, id=case.id, marks=marks))

    light_wheres = [w for w in WHERES if w != "window"]  # no torch: no window
    for shape in ("loader-light", "step-light"):
        add(Case(shape, "normal", "none", 0), True)
        for outcome in OUTCOMES:
            for where in light_wheres:
                quick = shape == "loader-light" and (outcome == "exception" or where == "prof_exit")
                add(Case(shape, outcome, where, WHERES[where]), not quick)
        # Right after the boundary of each of the first 20 steps (the
        # schedule's callbacks run there: windows begin and end, quiet
        # stretches start).
        for step in range(1, 21):
            add(Case(shape, "exception", "after_step", step), step not in (3, 10))
    # The default options (torch.profiler windows on the default schedule).
    add(Case("loader", "normal", "none", 0), False)
    for outcome in OUTCOMES:
        for where in ("after_step", "window", "loader_next", "prof_exit"):
            quick = where in ("window", "prof_exit") and outcome in ("exception", "sigterm", "sigusr2")
            add(Case("loader", outcome, where, WHERES[where]), not quick)
    for step in (1, 4, 5, 9, 10):  # around the default schedule's window boundaries
        add(Case("loader", "exception", "after_step", step), True)
    for shape in ("step", "optimizer", "run"):
        add(Case(shape, "normal", "none", 0), True)
        for outcome in OUTCOMES:
            where = "after_step" if shape == "run" else "window"  # fastprof run opens no fixed window
            add(Case(shape, outcome, where, WHERES[where]), not (outcome == "exception" and shape != "step"))
        for where in ("before", "inside", "loader_next", "val_loader"):
            add(Case(shape, "exception", where, WHERES[where]), True)
    if _has_lightning():
        add(Case("lightning", "normal", "none", 0), True)
        for outcome in OUTCOMES:
            add(Case("lightning", outcome, "after_step", WHERES["after_step"]), outcome != "exception")
        for where in ("before", "inside", "loader_next", "val_loader"):
            add(Case("lightning", "exception", where, WHERES[where]), True)
        add(Case("lightning", "sigterm", "inside", WHERES["inside"]), True)
    return out


def _has_lightning() -> bool:
    return importlib.util.find_spec("lightning") is not None


CASES = _cases()

# A fork server for the runs that import torch (and Lightning): most of such a
# run is the interpreter importing them (3-7 s on CI's 2 cores), the same in
# every run. The server imports them once; each run is a child forked from it
# (as DataLoader's fork workers are) that becomes the job: its own cwd,
# environment, argv and stdout/stderr files, then the script run as
# ``__main__`` at the server's top level, so the job's exit is the
# interpreter's own (its traceback, exit status, signal, atexit and
# finalisation), as in ``python job.py`` (or ``python -m module``). fastprof
# is never imported before the fork. The runs without torch start a fresh
# interpreter. ``fastprof run`` forks too: it finds torch already imported
# and wraps it at once; its import hook (torch imported by the script) is
# test_run_cmd's, with fresh interpreters.
ZYGOTE = r"""
import importlib, json, os, select, signal, socket, sys

sock_path, preload = sys.argv[1], [m for m in sys.argv[2].split(",") if m]
for name in preload:
    importlib.import_module(name)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sock_path)
srv.listen(64)
print("ready", flush=True)
waiting, job = {}, None
while job is None:
    ready, _, _ = select.select([srv], [], [], 0.02)
    if ready:
        conn, _ = srv.accept()
        req = json.loads(conn.makefile().readline())
        pid = os.fork()
        if pid == 0:
            for c in [srv, conn, *waiting.values()]:
                c.close()
            job = req
            break
        conn.sendall(b"%d\n" % pid)
        waiting[pid] = conn
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        conn = waiting.pop(pid, None)
        if conn is not None:
            conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
            conn.close()

# The child: become `python <script> <args>`.
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(f, fd)
    os.close(f)
os.chdir(job["cwd"])
os.environ.clear()
os.environ.update(job["env"])
del waiting, srv, ready, req, conn, pid
import runpy

if job["argv"][0] == "-m":  # python -m module args
    sys.argv = job["argv"][1:]
    sys.path[0] = os.getcwd()
    runpy.run_module(job["argv"][1], run_name="__main__", alter_sys=True)
else:
    sys.argv = job["argv"]
    sys.path[0] = os.path.dirname(os.path.abspath(job["argv"][0]))
    runpy.run_path(job["argv"][0], run_name="__main__")
"""


class Zygote:
    """One fork server (see ZYGOTE) that has imported ``preload``."""

    def __init__(self, root: Path, name: str, preload: list[str], env: dict[str, str]) -> None:
        self.path = root / f"zygote-{name}.sock"
        script = root / "zygote.py"
        if not script.exists():
            script.write_text(ZYGOTE)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(self.path), ",".join(preload)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line == "ready\n", f"the fork server did not start: {line!r}"

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> Ran:
        """``python *argv`` (a script and its arguments) as a child of the server."""
        out, err = cwd / "zygote.stdout", cwd / "zygote.stderr"
        req = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(self.path))
            s.sendall(json.dumps(req).encode() + b"\n")
            with s.makefile() as f:
                pid = int(f.readline())
                s.settimeout(timeout)
                try:
                    rc = int(f.readline())
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    rc = -999
        text = [p.read_text(errors="replace") if p.exists() else "" for p in (out, err)]
        if rc == -999:
            text[1] += f"\n[timed out after {timeout} s]"
        return Ran(rc, text[0], text[1])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Ran:
    rc: int
    stdout: str
    stderr: str


@dataclass
class Result:
    profiled: Ran
    bare: Ran
    run_dir: Path


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> Ran:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return Ran(-999, out, err + f"\n[timed out after {timeout} s]")
    return Ran(p.returncode, p.stdout, p.stderr)


class Runner:
    """Runs every selected case (profiled, its bare twin once per distinct
    bare script) on a small pool; tests wait for their own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.scripts = {"job": root / "job.py", "lightning": root / "lightning_job.py"}
        self.scripts["job"].write_text(JOB)
        self.scripts["lightning"].write_text(LIGHTNING)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
        # A job that dies by a signal (SIGSEGV, SIGABRT) prints every thread's
        # Python stack on stderr, the test's failure shows it: one such death
        # was seen once in ~1,300 runs of the profiled optimizer shape under a
        # SIGUSR2 stream (#34), and never again on demand. Nothing otherwise.
        self.env["PYTHONFAULTHANDLER"] = "1"
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2) + 1))
        self.lock = threading.Lock()
        self.bare: dict[tuple[str, str, str, int], concurrent.futures.Future[Ran]] = {}
        self.profiled: dict[Case, concurrent.futures.Future[tuple[Ran, Path]]] = {}
        self.zygotes: dict[str, Zygote] = {}

    def _zygote(self, kind: str) -> Zygote:
        """The fork server for ``kind`` ("torch", "lightning"), started once."""
        with self.lock:
            if kind not in self.zygotes:
                # torch._dynamo: the first optimizer imports it (torch.optim's
                # compile guard), ~3 s of CPU per job on CI's cores otherwise.
                preload = ["torch", "torch._dynamo", "torch.profiler", "torch.utils.data"]
                if kind == "lightning":
                    preload.append("lightning")
                self.zygotes[kind] = Zygote(self.root, kind, preload, self.env)
            return self.zygotes[kind]

    def _job(self, script: str, args: list[str], cwd: Path, env: dict[str, str]) -> Ran:
        """``python <script> <args>``: forked from a server that imported
        torch (and Lightning) when the job imports them, else a fresh
        interpreter."""
        kind = "lightning" if script == "lightning" else "job"
        argv = [str(self.scripts[kind]), *args]
        if args[1].endswith("-light"):
            return _run([sys.executable, *argv], cwd, env)
        return self._zygote("lightning" if kind == "lightning" else "torch").run(argv, cwd, env)

    def submit(self, case: Case) -> None:
        with self.lock:
            key = case.bare()
            if key not in self.bare:
                self.bare[key] = self.pool.submit(self._bare, key)
            if case not in self.profiled:
                self.profiled[case] = self.pool.submit(self._profiled, case)

    def _bare(self, key: tuple[str, str, str, int]) -> Ran:
        script, outcome, where, step = key
        out = self.root / ("bare-" + "-".join(map(str, key)))
        out.mkdir()
        return self._job(script, ["bare", script, outcome, where, str(step), str(out)], out, self.env)

    def _profiled(self, case: Case) -> tuple[Ran, Path]:
        out = self.root / case.id
        out.mkdir()
        env = dict(self.env)
        if case.where == "prof_exit":
            env["FASTPROF_TEST_EXPORT_DELAY_S"] = "1"  # the last window's export keeps the exit going
        args = [case.shape, case.outcome, case.where, str(case.step), str(out)]
        if case.shape == "run":
            argv = [
                "-m", "fastprof", "run", "-o", str(out), "--run-name", "m", str(self.scripts["job"]), "fastprof", *args,
            ]  # fmt: skip
            return self._zygote("torch").run(argv, out, env), out / "m"
        script = "lightning" if case.shape == "lightning" else "job"
        return self._job(script, ["fastprof", *args], out, env), out / "m"

    def result(self, case: Case) -> Result:
        self.submit(case)
        ran, run_dir = self.profiled[case].result()
        return Result(ran, self.bare[case.bare()].result(), run_dir)


@pytest.fixture(scope="module")
def runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    r = Runner(tmp_path_factory.mktemp("exit-matrix"))
    # Every selected case of this module starts now, a few at a time.
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None and "case" in callspec.params:
            r.submit(callspec.params["case"])
    yield r
    r.pool.shutdown(wait=False, cancel_futures=True)
    for z in r.zygotes.values():
        z.close()


def _script_frames(stderr: str) -> list[str]:
    """The last traceback's frames in the job's own script (function names:
    line numbers differ between the profiled and bare branches) and its last
    line."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return []
    tb = lines[starts[-1] :]
    frames = [m.group(1) for line in tb if (m := re.match(r'\s+File ".*job\.py", line \d+, in (\S+)', line))]
    last = next((line for line in tb[1:] if line and not line.startswith(" ")), "")
    return [*frames, last]


@pytest.mark.parametrize("case", CASES)
def test_exit_path_keeps_the_jobs_outcome(case: Case, runner: Runner) -> None:
    if case.shape == "lightning":
        pytest.importorskip("lightning")
    r = runner.result(case)
    p, b = r.profiled, r.bare
    context = f"\n--- profiled stderr:\n{p.stderr[-4000:]}\n--- bare stderr:\n{b.stderr[-2000:]}"
    assert p.rc == b.rc, f"exit status {p.rc}, without fastprof {b.rc}{context}"
    assert p.stdout == b.stdout, f"stdout differs:\n{p.stdout}\n--- without fastprof:\n{b.stdout}{context}"
    if case.outcome not in ("sigterm",):
        # SIGTERM's default action ends the process without a finally, with or without fastprof.
        assert ("finally ran" in p.stdout) == ("finally ran" in b.stdout)
    if case.where == "prof_exit":
        # Raised from the job's handler wherever the exit was: only the last line can agree.
        assert _script_frames(p.stderr)[-1:] == _script_frames(b.stderr)[-1:], context
    else:
        assert _script_frames(p.stderr) == _script_frames(b.stderr), context
    for bad in ("Exception ignored", "Fatal Python error", "Segmentation fault", "panicked"):
        assert bad not in p.stderr, context

    # What was recorded merges and reports (as a user would run them next).
    if case.shape != "run":
        assert (r.run_dir / "rank0" / "profiler.json").is_file(), context
    elif not r.run_dir.exists():
        # fastprof run of a script that ended before its first step records nothing.
        assert case.where == "before", f"no run directory {r.run_dir}{context}"
        return
    # A run the Profiler merged as it ended is "up to date" (exit 0, no work:
    # that merge is what is checked); one cut short is merged here.
    for argv in (["merge", str(r.run_dir), "-q"], ["report", str(r.run_dir), "-q"]):
        rc, _, err = _cli(argv)
        assert rc == 0, f"fastprof {' '.join(argv)} exited {rc}:\n{err[-3000:]}{context}"
        assert "Traceback" not in err, err
    with gzip.open(r.run_dir / "trace.json.gz", "rt") as f:
        doc = json.load(f)
    assert isinstance(doc["traceEvents"], list)
    report = json.loads((r.run_dir / "reports" / "report.json").read_text())
    assert report["schema"] == "fastprof.report" and report["source"], report.get("source")
    assert not list(r.run_dir.rglob("*.part")), sorted(str(x) for x in r.run_dir.rglob("*.part"))


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """The fastprof CLI in this process (its warnings said, not raised)."""
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.simplefilter("default")
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()
