"""A real ``torchrun`` job that hangs, for the hang tests (issue #37): its
environment, its command line, its start in a session of its own, the wait
for what it writes, and its end by SIGKILL. torchrun starts each rank in a
session of its own, so killing torchrun's process group leaves the ranks
running: :func:`kill` ends them by pid first (from the watch file each
rank's watchdog writes, :func:`watched_pids`, or any pids a test knows).

Imported by the tests as ``hung_job`` (``tests/`` is on ``sys.path``, as for
``conftest`` and ``moto_s3``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import TORCHRUN_VARS, free_port

#: The line rank 0 prints once per hang (its verdict).
VERDICT = "fastprof: hang at step"


def job_env(
    env: Mapping[str, str] | None = None,
    *,
    source: Mapping[str, str] | None = None,
    drop: tuple[str, ...] = ("FASTPROF_",),
) -> dict[str, str]:
    """The job's environment: ``source`` (this process's by default) without
    the variables starting with ``drop`` or torchrun's own, gloo on the
    loopback interface, no sampler, one OpenMP thread, then ``env``."""
    base = {
        k: v
        for k, v in (os.environ if source is None else source).items()
        if not k.startswith(drop) and k not in TORCHRUN_VARS
    }
    base.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", FASTPROF_SAMPLE_HZ="0", OMP_NUM_THREADS="1")
    base.update(env or {})
    return base


def torchrun_cmd(*args: str, nproc: int = 2, launcher: Iterable[str] = ()) -> list[str]:
    """``python -m torch.distributed.run`` on this host with ``nproc`` ranks and
    a free port, torchrun's own ``launcher`` options, then ``args`` (the
    script and its arguments, or ``-m fastprof run ...``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1"]
    return [*cmd, "--master-port", str(free_port()), *launcher, *args]


def fastprof_run(out: Path, *script: str) -> list[str]:
    """The arguments after torchrun's for ``-m fastprof run -o OUT --run-name
    job SCRIPT ARGS`` (the run is ``OUT/job``)."""
    return ["-m", "fastprof", "run", "-o", str(out), "--run-name", "job", *script]


def start(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start the job in a session of its own (so that :func:`kill` can end
    torchrun's process group), its stdout and stderr piped as text."""
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def watched_pids(run: Path) -> list[int]:
    """Each rank's pid, from the watch file its watchdog wrote
    (``rank*/.hang-watch.json``); a file not (yet) readable is left out."""
    pids = []
    for w in sorted(run.glob("rank*/.hang-watch.json")):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(json.loads(w.read_text())["pid"]))
    return pids


def workers(p: subprocess.Popen[str]) -> list[int]:
    """torchrun's children (its ranks), for a job whose watch files are not
    on this machine's disk."""
    with contextlib.suppress(psutil.Error):
        return [c.pid for c in psutil.Process(p.pid).children()]
    return []


def kill(p: subprocess.Popen[str], pids: Iterable[int]) -> tuple[str, str]:
    """SIGKILL the job: each of ``pids`` (the ranks) and its children
    (DataLoader workers), then torchrun's process group; its stdout and
    stderr."""
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            rank = psutil.Process(pid)
            for proc in [*rank.children(recursive=True), rank]:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(os.getpgid(p.pid), signal.SIGKILL)
    return p.communicate(timeout=60)


def run_to_end(p: subprocess.Popen[str], run: Path, limit: float, what: str) -> tuple[str, str]:
    """The job's stdout and stderr once it has ended by itself; past ``limit``
    seconds it is killed and the test fails with ``what`` and its output."""
    try:
        return p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        out, err = kill(p, watched_pids(run))
        pytest.fail(f"{what}\nstdout:\n{out}\nstderr:\n{err}")


def wait_for(pred: Callable[[], Any], limit: float, p: subprocess.Popen[str]) -> bool:
    """Whether ``pred()`` held within ``limit`` seconds, looked at every
    0.25 s while the job runs, and once more when it has ended or the time
    is up."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if pred():
            return True
        if p.poll() is not None:
            break
        time.sleep(0.25)
    return bool(pred())


def await_verdict(
    p: subprocess.Popen[str], run: Path, limit: float = 150, also: Callable[[], Any] = lambda: True
) -> tuple[bool, str, str]:
    """Wait up to ``limit`` s for rank 0's ``.hang-verdict`` in ``run`` (and
    ``also()``), 1 s more for the verdict's line to reach stderr, then kill
    the job: whether it came, and the job's stdout and stderr."""
    seen = False
    try:
        seen = wait_for(lambda: (run / ".hang-verdict").exists() and also(), limit, p)
        if seen:
            time.sleep(1.0)  # the verdict's line reaches stderr
    finally:
        out, err = kill(p, watched_pids(run))
    return seen, out, err


def verdicts(err: str) -> list[str]:
    """The verdict lines of a job's stderr."""
    return [ln for ln in err.splitlines() if VERDICT in ln]


def one_verdict(out: str, err: str) -> str:
    """The job's one verdict line, asserted to be the only one."""
    lines = verdicts(err)
    assert len(lines) == 1, f"stdout:\n{out}\nstderr:\n{err}"
    return lines[0]


def hangs(run: Path, rank: int) -> list[dict[str, Any]]:
    """``rank{rank}/hang-*.json`` of the run, in order, read with json."""
    return [json.loads(p.read_text()) for p in sorted((run / f"rank{rank}").glob("hang-*.json"))]


def line_of(text: str, marker: str) -> int:
    """The 1-based number of the first line of ``text`` that holds ``marker``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)
