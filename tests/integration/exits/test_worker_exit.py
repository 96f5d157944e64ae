"""A DataLoader worker that leaves through ``sys.exit``: the job ends on
torch's own "DataLoader worker ... exited unexpectedly", with fastprof as
without it (#34, item 10).

torch learns of a dead worker from SIGCHLD: its handler raises that
RuntimeError in the main thread, wherever it is. On a loaded machine the
parent often fails first, on the batch the worker sent before it died
(``FileNotFoundError``: the worker's fd-passing socket is gone while the
worker is still exiting), and the SIGCHLD handler raises while the
exception leaves the job. Under fastprof that is inside the Profiler's
exit: its flight dump took torch's error for a failed dump, and the job
ended on the ``FileNotFoundError``. ``test_worker_death_during_exit_dump``
puts the worker's death there every time; ``test_same_exception_as_without``
compares the job's end with and without fastprof, as a user would see it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

JOB = r"""
import multiprocessing.util, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

mode, out = sys.argv[1], sys.argv[2]
HOLD = os.environ.get("HOLD")  # a folder: the failing worker waits there to die
MAIN = os.getpid()
EXIT_AT = 37  # in batch 9, worker 1's: it has sent batch 7, which the parent has not read


def linger():
    # After multiprocessing's finalizers of priority 0: the socket that passes
    # the tensors' fds is gone, and the worker is still alive.
    open(os.path.join(HOLD, f"worker-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(HOLD, "go")) and time.monotonic() < deadline:
        time.sleep(0.005)


class Data(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == EXIT_AT:
            if HOLD:
                multiprocessing.util.Finalize(None, linger, exitpriority=-50)
            sys.exit(3)
        return torch.randn(16), torch.randn(1)


def on_audit(event, args):
    # The first thing fastprof does on disk once the job's exception reaches
    # it: the flight dump's folder. The worker dies now, and this waits until
    # it is gone (not reaped: torch reads its exit code), so its SIGCHLD comes
    # while fastprof handles the exception, as a loaded machine has it.
    if event != "os.mkdir" or os.getpid() != MAIN or not str(args[0]).endswith("flight"):
        return
    held = [n for n in os.listdir(HOLD) if n.startswith("worker-")]
    if not held or os.path.exists(os.path.join(HOLD, "go")):
        return
    open(os.path.join(HOLD, "go"), "w").close()
    os.waitid(os.P_PID, int(held[0].split("-")[1]), os.WEXITED | os.WNOWAIT)


if HOLD:
    sys.addaudithook(on_audit)

model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Data(), batch_size=4, num_workers=2)


def train(batches):
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.1)  # the parent is the slow side: the workers run ahead


if mode == "profiler":
    import fastprof

    with fastprof.Profiler(out, "w", sample_hz=0) as prof:
        train(prof.loader(loader))
else:  # no fastprof, or `fastprof run` around this script
    train(loader)
"""

# torch's two messages for a worker found dead: the SIGCHLD handler's and the
# one of the check after a failed read from the workers' queue.
TORCH_END = re.compile(r"^RuntimeError: DataLoader worker \(pid(\(s\))? \d+\) exited unexpectedly")


def _run(tmp_path: Path, mode: str, *, hold: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / f"out-{mode}"
    env = dict(os.environ)
    if hold:
        folder = tmp_path / f"hold-{mode}"
        folder.mkdir()
        env["HOLD"] = str(folder)
    if mode == "run":
        cmd = [sys.executable, "-m", "fastprof", "run", "-o", str(out), "--run-name", "w", "--sample-hz", "0"]
        cmd += [str(script), mode, str(out)]
    else:
        cmd = [sys.executable, str(script), mode, str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{mode}: the job did not end within 150 s\nstderr:\n{e.stderr}")
    return proc, out


def _exceptions(stderr: str) -> list[str]:
    """The final lines of the tracebacks in ``stderr``, in order."""
    return [line for line in stderr.splitlines() if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit)\b.*:", line)]


@pytest.mark.parametrize("mode", ["profiler", "run"])
def test_worker_death_during_exit_dump(tmp_path: Path, mode: str) -> None:
    proc, out = _run(tmp_path, mode, hold=True)
    ends = _exceptions(proc.stderr)
    assert proc.returncode == 1, proc.stderr
    # The worker died while the parent failed on its last batch: what torch
    # raises first is its own business; the job's last word is torch's.
    assert ends and TORCH_END.match(ends[-1]), proc.stderr
    assert "exit code 3" in ends[-1], proc.stderr
    # The dump itself went on and holds no error that was the job's.
    (state,) = out.glob("w/rank0/triggers.json")
    dumps = json.loads(state.read_text())["flight_dumps"]
    assert [d["reason"] for d in dumps] == ["exception"], dumps
    assert "error" not in dumps[0] and Path(dumps[0]["path"]).is_file(), dumps


def test_same_exception_as_without(tmp_path: Path) -> None:
    ends = {}
    for mode in ("plain", "profiler", "run"):
        proc, _ = _run(tmp_path, mode, hold=False)
        assert proc.returncode == 1, f"{mode}:\n{proc.stderr}"
        found = _exceptions(proc.stderr)
        assert found, f"{mode}:\n{proc.stderr}"
        ends[mode] = found[-1]
    assert TORCH_END.match(ends["plain"]), ends
    for mode in ("profiler", "run"):
        # Same type and message (the pid aside).
        assert re.sub(r"\d+", "N", ends[mode]) == re.sub(r"\d+", "N", ends["plain"]), ends
