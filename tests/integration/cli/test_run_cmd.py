"""``fastprof run``: an unmodified script profiled in real subprocesses, its
argv, output and exit status the same as under ``python`` itself (each
compared with a plain ``python`` run of the same code), real signals, real
DataLoader workers, and a real ``torchrun`` job."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

RUN = [sys.executable, "-m", "fastprof", "run"]

# An ordinary training script: no fastprof in it. Two epochs of 8 batches
# through a DataLoader with worker processes, validation under no_grad after
# each epoch, and the script's own output on stdout and stderr.
TRAIN = textwrap.dedent(
    """
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    workers = int(sys.argv[1])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    train = DataLoader(data, batch_size=8, num_workers=workers)
    val = DataLoader(TensorDataset(torch.randn(16, 16), torch.randint(0, 4, (16,))), batch_size=8)
    for epoch in range(2):
        model.train()
        for x, y in train:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            n = sum(len(x) for x, _ in val)
        print(f"epoch {epoch} validated {n}")
    print("training done", file=sys.stderr)
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    env.update(OMP_NUM_THREADS="1", FASTPROF_SAMPLE_HZ="0", **extra)
    return env


def _run(cmd: list[str], cwd: Path, stdin: str = "", timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=_env(), input=stdin, capture_output=True, text=True, timeout=timeout)


def _runs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


def _profile(out: Path) -> dict[str, Any]:
    (run,) = _runs(out)
    doc: dict[str, Any] = json.loads((run / "rank0" / "profiler.json").read_text())
    return doc


def _events(trace: Path) -> list[dict[str, Any]]:
    with gzip.open(trace, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return list(doc["traceEvents"])


def _fastprof_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("fastprof run:")]


# ------------------------------------------------------------ training


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("runcmd")
    (root / "train.py").write_text(TRAIN)
    out = root / "out"
    cmd = [*RUN, "-o", str(out), "--run-name", "job", "--sample-hz", "50", "train.py", "2"]
    r = _run(cmd, root, timeout=110)
    assert r.returncode == 0, r.stderr
    run = out / "job"
    rep = _run([sys.executable, "-m", "fastprof", "report", str(run), "-q"], root)
    assert rep.returncode == 0, rep.stderr
    return {"r": r, "root": root, "run": run, "report": json.loads((run / "reports" / "report.json").read_text())}


def test_unmodified_script_gets_steps_from_its_optimizer_and_epochs_from_its_loader(trained: dict[str, Any]) -> None:
    run = trained["run"]
    prof = json.loads((run / "rank0" / "profiler.json").read_text())
    assert (prof["steps"], prof["steps_by_optimizer"], prof["epochs"], prof["exit"]) == (16, 16, 2, "stop")
    events = _events(run / "trace.json.gz")
    steps = sorted((e for e in events if e.get("ph") == "X" and e["name"] == "step"), key=lambda e: e["ts"])
    assert [(s["args"]["epoch"], s["args"]["batch_in_epoch"]) for s in steps] == [
        (ep, b) for ep in range(2) for b in range(8)
    ]
    # Each step holds exactly one wait for the train loader's batch, at its
    # start; validation's batches fall outside every step.
    fetches = [e for e in events if e.get("ph") == "X" and e["name"] == "loader.train.next"]
    val = [e for e in events if e.get("ph") == "X" and e["name"] == "loader.val.next"]
    assert val, "the validation loader was not timed"

    def inside(e: dict[str, Any], s: dict[str, Any]) -> bool:
        return bool(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 0.002)

    for s in steps:
        assert sum(inside(f, s) for f in fetches) == 1, s
        assert not any(inside(v, s) for v in val), s
    waits = [e for e in events if e.get("ph") == "C" and e["name"] == "loader.train.wait_ms"]
    assert len(waits) == 16
    # The sampler ran (counters of this process and its children: the workers).
    names = {e["name"] for e in events if e.get("ph") == "C"}
    assert {"proc.rss [B]", "proc.cpu_user [%]", "children.count"} <= names, names


def test_torch_window_on_request_only(trained: dict[str, Any], tmp_path: Path) -> None:
    # The long-run default: no fixed torch.profiler window (the "never"
    # schedule), torch.profiler kept for the windows triggers ask for.
    assert not (trained["run"] / "rank0" / "torch").exists()
    summary = json.loads((trained["run"] / "rank0" / "profiler.json").read_text())
    assert summary["torch"]["windows"] == [] and "NeverSchedule" in summary["schedule"]
    assert summary["triggers"]["signal"] == "SIGUSR2"
    (tmp_path / "train.py").write_text(TRAIN)
    schedule = "cyclic:wait=1,warmup=1,active=2,repeat=1"
    r = _run([*RUN, "-o", "out", "--run-name", "w", "--schedule", schedule, "train.py", "0"], tmp_path)
    assert r.returncode == 0, r.stderr
    (window,) = (tmp_path / "out" / "w" / "rank0" / "torch").iterdir()
    with gzip.open(window, "rt") as f:
        marks = sorted(e["name"] for e in json.load(f)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert marks == ["ProfilerStep#2", "ProfilerStep#3"]


def test_dataloader_workers_still_work_and_record_their_fetches(trained: dict[str, Any]) -> None:
    workers = sorted(p.name for p in (trained["run"] / "rank0" / "workers").iterdir())
    assert len(workers) == 4 and all(w.startswith("train-w") for w in workers), workers  # 2 workers x 2 epochs
    events = _events(trained["run"] / "trace.json.gz")
    fetched = [e for e in events if e.get("ph") == "X" and e["name"] == "loader.train.fetch"]
    assert len(fetched) == 16


def test_output_is_the_scripts_and_the_next_command_is_on_stderr(trained: dict[str, Any]) -> None:
    r = trained["r"]
    assert r.stdout == "epoch 0 validated 16\nepoch 1 validated 16\n"
    lines = r.stderr.splitlines()
    assert "training done" in lines
    ours = _fastprof_lines(r.stderr)
    assert ours == lines[lines.index("training done") + 1 :], r.stderr
    assert ours[-1] == f"fastprof run: next: fastprof report {os.path.relpath(trained['run'], trained['root'])}"


def test_the_report_reads_the_run(trained: dict[str, Any]) -> None:
    rep = trained["report"]
    speed = rep["speed"]
    (rank,) = speed["train"]["per_rank"]
    assert rank["steps"] == 16
    assert speed["batch_size"]["value"] == 8
    loaders = {row["loader"]: row for row in speed["loaders"]}
    assert loaders["train"]["batches"] == 16 and loaders["val"]["batches"] == 4
    assert [v["passes"] for v in speed["validation"]] == [2]


# Loops written other ways, one epoch each: a pass over the validation
# loader with autograd on before training (a sanity check: not an epoch);
# epoch 0 steps two optimizers per batch (one step per batch); epoch 1 makes
# a new DataLoader and leaves it with break after 5 batches; epoch 2
# accumulates gradients over 2 batches per optimizer step. Validation after
# each epoch opens its pass with autograd on (no_grad inside the loop).
PATTERNS = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    g, d = torch.nn.Linear(8, 2), torch.nn.Linear(8, 2)
    opt_g = torch.optim.SGD(g.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(d.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(32, 8))
    val = DataLoader(TensorDataset(torch.randn(8, 8)), batch_size=4)

    def validate():
        for (x,) in val:
            with torch.no_grad():
                g(x)

    validate()
    train = DataLoader(data, batch_size=4)
    for (x,) in train:
        g(x).sum().backward()
        opt_g.step()
        d(x).sum().backward()
        opt_d.step()
    validate()
    train = DataLoader(data, batch_size=4, shuffle=True)
    for i, (x,) in enumerate(train):
        if i == 5:
            break
        g(x).sum().backward()
        opt_g.step()
    validate()
    for i, (x,) in enumerate(train):
        g(x).sum().backward()
        if i % 2 == 1:
            opt_g.step()
            opt_g.zero_grad()
    validate()
    """
)


def test_loop_patterns_give_one_step_per_optimizer_batch_and_one_epoch_per_training_pass(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "loops.py").write_text(PATTERNS)
    r = _run([*RUN, "-o", str(tmp_path / "out"), "--run-name", "loops", "loops.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "out" / "loops"
    prof = json.loads((run / "rank0" / "profiler.json").read_text())
    assert (prof["steps"], prof["epochs"]) == (17, 3)
    events = _events(run / "trace.json.gz")
    steps = sorted((e for e in events if e.get("ph") == "X" and e["name"] == "step"), key=lambda e: e["ts"])
    assert [(s["args"]["epoch"], s["args"]["batch_in_epoch"]) for s in steps] == [
        *((0, b) for b in range(8)),
        *((1, b) for b in range(5)),
        *((2, b) for b in range(4)),
    ]
    fetches = [e for e in events if e.get("ph") == "X" and e["name"] == "loader.train.next"]

    def fetched(s: dict[str, Any]) -> int:
        return sum(s["ts"] <= f["ts"] and f["ts"] + f["dur"] <= s["ts"] + s["dur"] + 0.002 for f in fetches)

    # The sanity pass before training may open step 0 (its batches are
    # fetched with autograd on); every later step holds its own batches.
    assert [fetched(s) for s in steps[1:]] == [1] * 12 + [2] * 4
    # The validation passes after training are val's; the sanity pass came
    # before any optimizer step, when any autograd pass might be training's.
    val = [e for e in events if e.get("ph") == "X" and e["name"] == "loader.val.iter"]
    assert len(val) == 3


# ------------------------------------------------- as python would run it

PROBE = textwrap.dedent(
    """
    import json, os, sys
    g = globals()
    main = sys.modules["__main__"]
    print(json.dumps({
        "argv": sys.argv,
        "name": __name__,
        "file": g.get("__file__"),
        "package": __package__,
        "spec": None if __spec__ is None else __spec__.name,
        "cached": g.get("__cached__"),
        "path0": sys.path[0],
        "main_is_me": main.__dict__ is g,
        "stdin": sys.stdin.read(),
        "annotations_future": bool(compile("x: int", "f", "exec").co_flags & 0x1000000),
    }))
    print("to stderr", file=sys.stderr)
    """
)


def _both(cmd: list[str], cwd: Path, stdin: str = "") -> tuple[subprocess.CompletedProcess[str], ...]:
    plain = _run([sys.executable, *cmd], cwd, stdin)
    ours = _run([*RUN, "-o", str(cwd / "out"), *cmd], cwd, stdin)
    return plain, ours


def test_script_argv_main_path_and_stdin_round_trip(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe.py").write_text(PROBE)
    plain, ours = _both(["sub/probe.py", "-m", "x", "--out", "y", "--", "z"], tmp_path, stdin="hello\n")
    assert plain.returncode == ours.returncode == 0, ours.stderr
    assert ours.stdout == plain.stdout
    got = json.loads(ours.stdout)
    assert got["argv"] == ["sub/probe.py", "-m", "x", "--out", "y", "--", "z"]
    assert (got["name"], got["path0"], got["main_is_me"]) == ("__main__", str(tmp_path / "sub"), True)
    assert got["stdin"] == "hello\n"
    assert ours.stderr.startswith(plain.stderr)
    assert _profile(tmp_path / "out")["exit"] == "stop"


@pytest.mark.parametrize("module", ["pkg.probe", "pkg"])
def test_module_argv_and_name_round_trip(tmp_path: Path, module: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "probe.py").write_text(PROBE)
    (tmp_path / "pkg" / "__main__.py").write_text(PROBE)
    plain, ours = _both(["-m", module, "a", "-o", "b"], tmp_path)
    assert plain.returncode == ours.returncode == 0, ours.stderr
    assert ours.stdout == plain.stdout
    got = json.loads(ours.stdout)
    assert got["argv"][1:] == ["a", "-o", "b"] and got["name"] == "__main__"
    assert got["spec"] == (module if module != "pkg" else "pkg.__main__")


# One optimizer step first: a run that failed after it began is recorded.
ONE_STEP = (
    "import torch\nm = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
    "m(torch.ones(1, 2)).sum().backward()\nopt.step()\n"
)

SCRIPTS = {
    # case: (source, exit status, profiler.json's exit; None: it failed
    # before its first step, and nothing is recorded)
    "normal end": ("print('ok')", 0, "stop"),
    "sys.exit(0)": ("import sys\nsys.exit(0)", 0, "stop"),
    "sys.exit(3)": ("import sys\nprint('bye')\nsys.exit(3)", 3, None),
    "sys.exit('msg')": ("import sys\nsys.exit('it went wrong')", 1, None),
    "uncaught exception": ("def f():\n    raise ValueError('bad value')\n\nf()", 1, None),
    "chained exception": ("try:\n    1 / 0\nexcept ZeroDivisionError:\n    raise KeyError(1)", 1, None),
    "KeyboardInterrupt": ("raise KeyboardInterrupt", -signal.SIGINT, None),
    "sys.exit(3) after a step": (ONE_STEP + "import sys\nsys.exit(3)", 3, "exception: SystemExit"),
    "exception after a step": (ONE_STEP + "raise ValueError('bad value')", 1, "exception: ValueError"),
}


@pytest.mark.parametrize("case", list(SCRIPTS))
def test_exit_status_and_traceback_are_pythons(tmp_path: Path, case: str) -> None:
    source, status, reason = SCRIPTS[case]
    (tmp_path / "s.py").write_text(source + "\n")
    plain, ours = _both(["s.py"], tmp_path)
    assert plain.returncode == ours.returncode == status, ours.stderr
    assert ours.stdout == plain.stdout
    # Python's own stderr (a traceback from the script's frame, the exit
    # message), then fastprof's lines, once the trace is safe.
    assert ours.stderr.startswith(plain.stderr), ours.stderr
    assert "fastprof/" not in ours.stderr.replace("fastprof report", "")
    last = _fastprof_lines(ours.stderr[len(plain.stderr) :])[-1]
    if reason is None:
        assert last.startswith("fastprof run: s.py: ") and last.endswith(" before its first step; nothing recorded")
        assert _runs(tmp_path / "out") == [] and not (tmp_path / "out").exists()
    else:
        assert last.startswith("fastprof run: next: fastprof report "), last
        assert _profile(tmp_path / "out")["exit"] == reason


ARGPARSE = textwrap.dedent(
    """
    import argparse
    import torch  # imported, as a training script does, before it reads its arguments

    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, required=True)
    args = p.parse_args()
    """
)


def test_a_script_that_fails_before_its_first_step_leaves_nothing(tmp_path: Path) -> None:
    """An argparse error (exit 2) made a run directory and said "0 steps
    recorded ... next: fastprof report ...": it makes nothing now, and says
    so; the script's own stderr and exit status are Python's."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(ARGPARSE)
    plain, ours = _both(["train.py", "--epochs", "3"], tmp_path)
    assert plain.returncode == ours.returncode == 2, ours.stderr
    assert ours.stderr.startswith(plain.stderr) and "the following arguments are required: --lr" in plain.stderr
    assert ours.stderr[len(plain.stderr) :] == (
        "fastprof run: train.py: exited with status 2 before its first step; nothing recorded\n"
    )
    assert not (tmp_path / "out").exists()
    # An out_dir that was there stays, with its earlier runs; only this run's files go.
    (tmp_path / "out" / "earlier").mkdir(parents=True)
    ours = _run([*RUN, "-o", str(tmp_path / "out"), "--run-name", "r", "train.py"], tmp_path)
    assert ours.returncode == 2 and ours.stderr.endswith("nothing recorded\n"), ours.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["earlier"]


def test_syntax_error_is_pythons_and_nothing_is_recorded(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text("print('never')\ndef (:\n")
    plain, ours = _both(["s.py"], tmp_path)
    assert plain.returncode == ours.returncode == 1
    assert ours.stderr == plain.stderr and ours.stdout == ""
    assert _runs(tmp_path / "out") == []


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (["missing.py"], 2, "can't open file"),
        (["-m", "no_such_module_here"], 1, "no module named 'no_such_module_here'"),
        (["-m", "json.no_such"], 1, "no module named 'json.no_such'"),
        ([], 2, "nothing to run"),
    ],
)
def test_missing_script_or_module_is_one_line(tmp_path: Path, args: list[str], status: int, says: str) -> None:
    r = _run([*RUN, "-o", str(tmp_path / "out"), *args], tmp_path)
    assert r.returncode == status
    assert r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("fastprof run: error: ") and says in line, line
    assert "Traceback" not in r.stderr
    assert _runs(tmp_path / "out") == []


def test_unwritable_run_directory_runs_the_script_unprofiled(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text("import sys\nprint('ran')\nsys.exit(4)\n")
    (tmp_path / "taken").write_text("a file where the run directory should go")
    r = _run([*RUN, "-o", "taken", "s.py"], tmp_path)
    assert (r.returncode, r.stdout) == (4, "ran\n")
    # One line of fastprof's own, no Python warning header or source line (#34).
    (said,) = r.stderr.splitlines()
    assert said.startswith("fastprof: cannot write the run directory ") and "training goes on without profiling" in said
    assert _fastprof_lines(r.stderr) == []


# ------------------------------------------------------------- signals

LOOP = textwrap.dedent(
    """
    import signal, sys
    import torch

    # Python's own SIGINT handler (as in a terminal, even where the test
    # runner started this process with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.argv[1] == "handler":
        def on_term(signum, frame):
            print("script's handler", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_term)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while True:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        step += 1
        if step == 5:
            print("ready", flush=True)
    """
)


@pytest.mark.parametrize("mode", ["default", "handler", "sigint"])
def test_signals_end_the_run_as_the_script_decides_after_it_is_saved(tmp_path: Path, mode: str) -> None:
    pytest.importorskip("torch")
    (tmp_path / "loop.py").write_text(LOOP)
    out = tmp_path / "out"
    p = subprocess.Popen(
        [*RUN, "-o", str(out), "loop.py", mode],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGINT if mode == "sigint" else signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        p.kill()
    prof = _profile(out)
    assert prof["steps"] >= 5
    if mode == "default":
        assert p.returncode == -signal.SIGTERM, stderr
        assert prof["exit"] == "SIGTERM"
        assert "fastprof: SIGTERM: rank 0's data is saved" in stderr
    elif mode == "handler":
        assert p.returncode == 7, stderr
        assert stdout == "script's handler\n"
        assert prof["exit"] == "exception: SystemExit"
    else:
        # Ctrl-C: Python's traceback from the script's frame, then death by
        # SIGINT (a shell shows 130), once the run is saved.
        assert p.returncode == -signal.SIGINT, stderr
        assert prof["exit"] == "exception: KeyboardInterrupt"
        tb = stderr[stderr.index("Traceback (most recent call last):") :]
        assert tb.splitlines()[1].startswith(f'  File "{tmp_path / "loop.py"}", line ')
        assert "\nKeyboardInterrupt\n" in tb and "fastprof run: next: fastprof report " in tb


# Trains until the test says "done" (a file): no fastprof in it.
UNTIL_DONE = textwrap.dedent(
    """
    import os, time, torch

    m = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for i in range(100_000):
        m(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        if os.path.exists("done"):
            break
        time.sleep(0.002)
    print("trained", os.environ.get("KINETO_LOG_LEVEL"))
    """
)
#: A Kineto log line: "USDT:2026-11-27 01:45:30 11926:11926 SyncActivityProfilerHandler.cpp:39] profiler_start".
KINETO_LINE = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\]")


def test_a_triggered_torch_window_writes_nothing_into_the_scripts_stderr(tmp_path: Path) -> None:
    """Kineto logs each window's start and stop, and on a machine without a
    GPU an ERROR ("gpuGetDeviceCount failed with code 35"): three lines in
    the stderr of a script that asked for no window, as the demo never showed."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(UNTIL_DONE)
    env = {k: v for k, v in _env().items() if k != "KINETO_LOG_LEVEL"}
    p = subprocess.Popen(
        [*RUN, "-o", "out", "--run-name", "k", "train.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        live = tmp_path / "out" / "k" / "rank0" / "live.json"
        deadline = time.monotonic() + 90
        while not live.is_file() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live.is_file(), p.communicate(timeout=60)
        cli = subprocess.run(
            [sys.executable, "-m", "fastprof", "trigger", "out/k", "--steps", "2", "--wait", "120"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        (tmp_path / "done").write_text("")
        stdout, stderr = p.communicate(timeout=90)
    finally:
        p.kill()
    assert cli.returncode == 0, cli.stdout + cli.stderr
    window = [line.split(": ", 1)[1] for line in cli.stdout.splitlines() if line.endswith(".pt.trace.json.gz")]
    assert len(window) == 1 and Path(window[0]).is_file(), cli.stdout  # the window was taken
    # The script's environment is its own: no KINETO_LOG_LEVEL left in it.
    assert p.returncode == 0 and stdout == "trained None\n", stderr
    assert [line for line in stderr.splitlines() if KINETO_LINE.match(line)] == [], stderr
    assert "gpuGetDeviceCount" not in stderr and "profiler_start" not in stderr, stderr


# A script that already profiles itself: its own Profiler (with an out_dir
# and run_name of its own) started after some setup steps of its own.
OWN = textwrap.dedent(
    """
    import sys
    import torch
    import fastprof
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = DataLoader(TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,))), batch_size=8)

    def batch(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for i, (x, y) in enumerate(train):  # a warm-up pass before the script's Profiler: 3 steps
        batch(x, y)
        if i == 2:
            break
    with fastprof.Profiler("elsewhere", run_name="mine", torch=False) as prof:
        for epoch in range(2):
            for x, y in prof.loader(train):
                batch(x, y)
    print("script steps", prof.batch)
    """
)


def test_a_scripts_own_profiler_takes_the_loop_and_nothing_is_recorded_twice(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "own.py").write_text(OWN)
    r = _run([*RUN, "-o", str(tmp_path / "out"), "--run-name", "own", "own.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["script steps 16"]
    assert not (tmp_path / "elsewhere").exists()  # the command line decides where the run records
    run = tmp_path / "out" / "own"
    assert _fastprof_lines(r.stderr) == [
        "fastprof run: this Profiler's options out_dir, run_name are not used: the run records in "
        f"{run} (fastprof run's options decide)",
        "fastprof run: the script starts its own fastprof.Profiler: its steps are the run's (3 inferred before it)",
        "fastprof run: own.py: 16 steps recorded in out/own",
        "fastprof run: next: fastprof report out/own",
    ]
    prof = json.loads((run / "rank0" / "profiler.json").read_text())  # the script's Profiler's
    assert (prof["steps"], prof["epochs"], prof["exit"]) == (16, 2, "stop")
    events = _events(run / "trace.json.gz")
    steps = sorted((e for e in events if e.get("ph") == "X" and e["name"] == "step"), key=lambda e: e["ts"])
    # The 3 inferred warm-up steps, then the script's 16, each once: none overlaps another.
    assert len(steps) == 3 + 16
    assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in itertools.pairwise(steps))
    assert [(s["args"]["epoch"], s["args"]["batch_in_epoch"]) for s in steps[3:]] == [
        (e, b) for e in range(2) for b in range(8)
    ]
    passes = [e for e in events if e.get("ph") == "X" and e["name"] == "loader.train.iter"]
    assert len(passes) == 3  # the warm-up pass (fastprof run's), then the script's two
    rep = _run([sys.executable, "-m", "fastprof", "report", str(run), "-q"], tmp_path)
    assert rep.returncode == 0, rep.stderr


# A script that records with the bare Recorder API, started and stopped twice.
OWN_RECORDER = textwrap.dedent(
    """
    import time
    import fastprof

    rec = fastprof.start("elsewhere", "mine", sample_hz=0)
    with fastprof.span("work", n=1):
        time.sleep(0.01)
    stats = fastprof.stop()  # the script's own, never the run's
    print("stopped", stats.events_written, rec.active)
    with fastprof.span("after.stop"):  # still recorded: the run goes on
        time.sleep(0.01)
    with fastprof.Recorder("elsewhere", "again") as rec2:
        with fastprof.span("work", n=2):
            time.sleep(0.01)
    print("done", rec2.active)
    """
)


def test_a_scripts_own_recorder_joins_the_runs_recording(tmp_path: Path) -> None:
    (tmp_path / "rec.py").write_text(OWN_RECORDER)
    r = _run([*RUN, "-o", str(tmp_path / "out"), "--run-name", "rec", "rec.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["stopped 0 False", "done False"]
    assert not (tmp_path / "elsewhere").exists()
    run = tmp_path / "out" / "rec"
    joined = [line for line in _fastprof_lines(r.stderr) if "the script's Recorder records in the run" in line]
    assert len(joined) == 2 and all(str(run / "rank0") in line for line in joined), r.stderr
    names = [e["name"] for e in _events(run / "trace.json.gz") if e.get("ph") == "X"]
    assert names.count("work") == 2 and names.count("after.stop") == 1


# ------------------------------------------------------------- torchrun

# One DDP job on gloo: setup, a train loop (unmodified, or inside the
# script's own Profiler), then the end.
_DIST_SETUP = """
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(48, 8), torch.randint(0, 2, (48,)))
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data))
"""
_DIST_END = """
print(f"rank {dist.get_rank()} done")
dist.destroy_process_group()
"""
DIST = (
    _DIST_SETUP
    + """
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""
    + _DIST_END
)
DIST_OWN = (
    _DIST_SETUP
    + """
import fastprof
with fastprof.Profiler(torch=False) as prof:
    for x, y in prof.loader(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""
    + _DIST_END
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("script", ["unmodified", "own profiler"])
def test_torchrun_two_ranks_each_write_their_rank(tmp_path: Path, script: str) -> None:
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(DIST if script == "unmodified" else DIST_OWN)
    out = tmp_path / "out"
    env = _env(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    # No run name, and torchrun's rendezvous id is its default 'none': the
    # ranks still agree on one run directory.
    cmd += ["--master-port", str(_free_port()), "-m", "fastprof", "run", "-o", str(out), "train.py"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stderr
    # (the ranks' prints interleave: unbuffered, the text and its newline are two writes)
    assert "rank 0 done" in r.stdout and "rank 1 done" in r.stdout, r.stdout
    (run,) = _runs(out)
    for rank in (0, 1):
        prof = json.loads((run / f"rank{rank}" / "profiler.json").read_text())
        assert (prof["rank"], prof["world_size"], prof["steps"], prof["exit"]) == (rank, 2, 6, "stop")
        # The clocks were synced once the script made its process group (the
        # Profiler started before it; the script destroys it before the end).
        start = prof["clock_sync"]["start"]
        assert start["uncertainty_ns"] == 0 and start["offset_ns"] == 0, start  # one host: one clock
    # Rank 0 merged both ranks, and only rank 0 printed the next command.
    steps = [e for e in _events(run / "trace.json.gz") if e.get("ph") == "X" and e["name"] == "step"]
    assert len(steps) == 12 and len({e["pid"] for e in steps}) == 2
    assert _fastprof_lines(r.stderr)[-1] == f"fastprof run: next: fastprof report {os.path.relpath(run, tmp_path)}"
    assert len([line for line in r.stderr.splitlines() if "fastprof run: next:" in line]) == 1


# The script's own Profiler, whose steps record enough to rotate under a small disk cap.
OWN_ROTATING = textwrap.dedent(
    """
    import torch
    import fastprof

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    with fastprof.Profiler("elsewhere", run_name="mine", torch=False) as prof:
        for step in range(30):
            for i in range(2000):
                fastprof.instant("tick", i=i, noise=f"{((step * 2000 + i) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFF:x}")
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    print("script steps", prof.batch)
    """
)


def test_a_scripts_own_profiler_says_what_the_runs_disk_cap_deleted(tmp_path: Path) -> None:
    """The script's Profiler writes profiler.json while fastprof run's
    recorder still records: its ``rotation`` said nothing was deleted
    (recorder_stopped false) while the merge counted the segments gone. Once
    the run's recorder stops, ``rotation`` says what the merge says."""
    pytest.importorskip("torch")
    (tmp_path / "own.py").write_text(OWN_ROTATING)
    r = subprocess.run(
        [*RUN, "-o", "out", "--run-name", "rot", "own.py"],
        cwd=tmp_path,
        env=_env(FASTPROF_SEGMENT_SIZE="64KiB", FASTPROF_MAX_DISK="256KiB"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout == "script steps 30\n", r.stderr
    run = tmp_path / "out" / "rot"
    prof = json.loads((run / "rank0" / "profiler.json").read_text())
    assert prof["steps"] == 30  # the script's Profiler's account of the loop
    rot = prof["rotation"]
    assert rot["recorder_stopped"] and rot["max_disk"] == 256 << 10, rot
    with gzip.open(run / "trace.json.gz", "rt") as f:
        (merged,) = json.load(f)["otherData"]["rotated"]
    assert rot["segments_deleted"] == merged["segments"] > 0, (rot, merged)
    assert (rot["bytes_deleted"], rot["events_deleted"]) == (merged["bytes"], merged["events"])
    assert [d["segment"] for d in rot["deleted"]] == list(range(merged["segments"]))
