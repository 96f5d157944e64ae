"""Hang evidence on demand under ``torchrun -m fastprof run`` (issue #37):
a script with no Profiler, 2 ranks, gloo on CPU. Rank 1 sleeps in its
dataset's ``__getitem__`` while rank 0 waits in ``all_reduce``; the watchdog's
timeout is far away (600 s), so what is written comes from ``fastprof trigger
RUN --stacks`` and from a SIGTERM sent to rank 1, not from a stall. Every file
is read back with Python's json. The SIGTERM is the one a scheduler sends:
to torchrun, which passes it on to its workers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from hung_job import fastprof_run, hangs, job_env, kill, line_of, start, torchrun_cmd, wait_for, watched_pids

#: The first run's account when it is run again (see ``on_demand``): shown, not an error.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("always:a rank of the job was killed from outside it")]
pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = sys.argv[1]

    class Data(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            if rank == 1 and i == 6:
                open(os.path.join(out, "stuck"), "w").close()
                time.sleep(3600)  # STUCK
            return torch.ones(4)

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, x in enumerate(DataLoader(Data(), batch_size=1)):
        loss = model(x).sum()
        loss.backward()
        t = loss.detach()
        dist.all_reduce(t)  # WAIT
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    """
)


_line = partial(line_of, SCRIPT)


@pytest.fixture(scope="module")
def on_demand(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job, stuck: ``--stacks`` once rank 1 is stuck, then SIGTERM to
    torchrun once rank 1 has made no progress for more than 10 s (the
    handler's threshold); the job then ends (killed if it has not within
    60 s).

    Run again, once, when a rank's process was gone before the test sent
    any signal: nothing in fastprof ends a process that received no signal
    (the watchdog's SIGTERM path and the exit handlers re-raise a signal
    received; ``hang_action=abort`` is off here), so a rank ended by SIGTERM
    or SIGKILL (torchrun's summary says which) was killed from outside the
    job (seen once in CI: torchrun said "Signal 15
    (SIGTERM) received" by a rank before the request was answered; never
    here in 7 runs). The first run's account is a warning of the test."""
    first = _job_once(tmp_path_factory.mktemp("hang-run-demand"))
    gone = {r: s for r, s in first["after"].items() if s.endswith((" gone", " zombie", " dead"))}
    if not gone or _root_cause(first["stderr"]) not in (-signal.SIGTERM, -signal.SIGKILL):
        return first  # a crash (SIGSEGV, an exit status) is the test's failure
    warnings.warn(f"a rank of the job was killed from outside it ({gone}); run again{_job(first)}", stacklevel=1)
    return _job_once(tmp_path_factory.mktemp("hang-run-demand-again"))


def _job_once(root: Path) -> dict[str, Any]:
    (root / "train.py").write_text(SCRIPT)
    (root / "out").mkdir()
    base = job_env({"FASTPROF_HANG_TIMEOUT": "600", "FASTPROF_HANG_GRACE": "2"})
    p = start(torchrun_cmd(*fastprof_run(root / "out", "train.py", str(root / "out"))), root, base)
    run = root / "out" / "job"
    stacks = None
    after: dict[int, str] = {}
    sigterm_at: float | None = None
    stuck_at: float | None = None
    try:
        stuck = wait_for(lambda: (root / "out" / "stuck").exists(), 100, p)
        stuck_at = time.monotonic()
        if stuck:
            time.sleep(1.0)  # rank 0 is in its all_reduce
            stacks = subprocess.run(
                [sys.executable, "-m", "fastprof", "trigger", str(run), "--stacks", "--wait", "30"],
                capture_output=True,
                text=True,
                timeout=90,
            )
            after = _ranks_now(run)
            # More than 10 s without a step on rank 1 (the handler writes nothing before).
            time.sleep(max(0.0, 12.0 - (time.monotonic() - stuck_at)))
            sigterm_at = time.time()
            os.kill(p.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=60)
    finally:
        ended = p.poll() is not None
        out, err = kill(p, watched_pids(run))
    assert stuck, f"rank 1 never reached its stuck read\nstdout:\n{out}\nstderr:\n{err}"
    rep = root / "rep"
    report = subprocess.run(
        [sys.executable, "-m", "fastprof", "report", str(run), "-o", str(rep)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    doc = json.loads((rep / "report.json").read_text())
    return {
        "run": run,
        "stacks": stacks,
        "stderr": err,
        "sigterm_at": sigterm_at,
        "ended": ended,
        "report": doc,
        "after": after,
    }


def _root_cause(err: str) -> int | None:
    """The exit code torchrun's summary gives the first rank that failed
    (a signal as its negative), None when it names none."""
    _, _, cause = err.partition("Root Cause (first observed failure)")
    m = re.search(r"exitcode\s*:\s*(-?\d+)", cause)
    return int(m.group(1)) if m else None


def _ranks_now(run: Path) -> dict[int, str]:
    """Each rank's process (pid from its watch file): running, a zombie, or gone."""
    out = {}
    for w in sorted(run.glob("rank*/.hang-watch.json")):
        try:
            pid = int(json.loads(w.read_text())["pid"])
            out[int(w.parent.name[4:])] = f"pid {pid} {psutil.Process(pid).status()}"
        except psutil.NoSuchProcess:
            out[int(w.parent.name[4:])] = f"pid {pid} gone"
        except (OSError, ValueError, KeyError):
            continue
    return out


def _job(on_demand: dict[str, Any]) -> str:
    """What a failure needs to be understood: the trigger's output, each
    rank's process once it answered, and the end of torchrun's stderr (its
    summary names a rank that failed first, and how)."""
    r = on_demand["stacks"]
    said = f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}" if r is not None else "not run"
    return (
        f"\ntrigger --stacks (exit {r.returncode if r else None}):\n{said}\n"
        f"ranks after it: {on_demand['after']}\njob's stderr (end):\n{on_demand['stderr'][-4000:]}"
    )


def test_trigger_stacks_answers_from_every_rank_of_a_fastprof_run_job(on_demand: dict[str, Any]) -> None:
    r = on_demand["stacks"]
    assert r is not None and r.returncode == 0, _job(on_demand)
    run = on_demand["run"]
    docs = {}
    for rank in (0, 1):
        asked = [d for d in hangs(run, rank) if d["reason"] == "request"]
        assert len(asked) == 1 and asked[0]["request"] and asked[0]["rank"] == rank, asked
        docs[rank] = asked[0]
    assert docs[0]["request"] == docs[1]["request"]
    # The evidence: rank 1's training thread in __getitem__ (the dataloader phase),
    # rank 0's in all_reduce called from the script's line.
    s0, s1 = docs[0]["summary"], docs[1]["summary"]
    assert (s1["where"]["line"], s1["where"]["function"], s1["phase"]) == (_line("STUCK"), "__getitem__", "dataloader")
    assert s1["collective"] is None
    assert s0["collective"]["op"] == "all_reduce" and s0["collective"]["site"]["line"] == _line("WAIT"), s0
    # What the command prints: each rank's place, and the verdict.
    out = r.stdout
    assert f"rank 1: {run}/rank1/hang-" in out or f"rank 1: {run / 'rank1'}" in out, out
    assert re.search(rf"rank 1: \S*train.py:{_line('STUCK')} in __getitem__ \(dataloader\)", out), out
    assert re.search(rf"rank 0: \S*train.py:{_line('WAIT')} in <module> \([a-z]+, in all_reduce\)", out), out
    v = next(ln for ln in out.splitlines() if ln.startswith("fastprof trigger: hang"))
    assert "rank 1 never entered all_reduce #" in v and f"train.py:{_line('STUCK')} in __getitem__" in v, v
    assert "Rank 0 waits in all_reduce #" in v and f"(train.py:{_line('WAIT')} in <module>)" in v, v
    # Asked for, not stalled: no verdict on the job's stderr.
    assert "fastprof: hang at step" not in on_demand["stderr"]


def test_sigterm_to_a_stuck_rank_of_a_fastprof_run_job_writes_its_evidence(on_demand: dict[str, Any]) -> None:
    run = on_demand["run"]
    docs = [d for d in hangs(run, 1) if d["reason"] == "sigterm"]
    assert len(docs) == 1, f"{[(d['reason'], d['n']) for d in hangs(run, 1)]}{_job(on_demand)}"
    (doc,) = docs
    assert doc["rank"] == 1 and doc["stalled_s"] >= 10.0 and doc["step"] == 5, doc
    assert doc["time"] >= on_demand["sigterm_at"]
    s = doc["summary"]
    assert (s["where"]["line"], s["where"]["function"], s["phase"]) == (_line("STUCK"), "__getitem__", "dataloader")
    training = [t for t in doc["threads"] if t["training"]]
    assert len(training) == 1 and training[0]["frames"][0]["function"] != "on_sigterm", training
    # The job's outcome: torchrun ended it on the signal, and rank 1 saved its run.
    assert on_demand["ended"], on_demand["stderr"][-3000:]
    assert f"fastprof: SIGTERM: rank 1's data is saved in {run / 'rank1'}" in on_demand["stderr"]


def test_the_report_of_a_job_ended_by_sigterm_while_stuck_has_the_hang(on_demand: dict[str, Any]) -> None:
    """The scheduler's SIGTERM came before the watchdog's 600 s: the ranks'
    SIGTERM evidence is the hang's, and report.json's ``hangs[]`` says it
    (the request's evidence, asked while the job ran, is no hang)."""
    hangs = on_demand["report"]["hangs"]
    assert len(hangs) == 1, f"{hangs}{_job(on_demand)}"
    (h,) = hangs
    assert h["step"] == 6 and h["seconds"] >= 10.0 and 1 in h["suspect_ranks"], h
    (w,) = [w for w in h["where"] if w["rank"] == 1]
    assert (w["line"], w["function"], w["phase"]) == (_line("STUCK"), "__getitem__", "dataloader"), w
    assert f"train.py:{_line('STUCK')} in __getitem__" in h["text"], h["text"]
