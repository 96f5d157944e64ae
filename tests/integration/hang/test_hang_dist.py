"""Hangs across ranks (issue #37) with a real ``torchrun --nproc-per-node 2``
job (gloo, CPU): the watchdog notices without the training thread, each rank
writes ``rank{R}/hang-<n>.json``, rank 0 prints one verdict naming the stuck
rank and its line while the job is still hung, and the report of the run,
killed while hung, has it in ``hangs[]``. A rank spinning in a C call with
the GIL held still gives its stack; a job that is merely slow reports nothing.
Every file is read back with Python's json."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import fastprof
from fastprof.profiler.drivers.hang.verdict import summarize
from hung_job import (
    await_verdict,
    fastprof_run,
    hangs,
    job_env,
    kill,
    line_of,
    run_to_end,
    start,
    torchrun_cmd,
    verdicts,
    wait_for,
    watched_pids,
)

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

WORKER = textwrap.dedent(
    """
    import os, re, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mode = sys.argv[2]

    class Data(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            if mode in ("data", "sigterm", "worker") and rank == 1 and i == 6:
                open(os.path.join(sys.argv[1], "stuck"), "w").close()
                time.sleep(3600)  # STUCK-DATA
            return torch.ones(4)

    def reload_state():
        open(os.path.join(sys.argv[1], "stuck"), "w").close()
        while True:
            time.sleep(0.05)  # STUCK-OWN

    def save_checkpoint(seconds):
        time.sleep(seconds)  # SAVE

    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=30)
    with prof:
        loader = DataLoader(Data(), batch_size=1, num_workers=1 if mode == "worker" else 0)
        for i, x in enumerate(prof.loader(loader)):  # LOOP
            if mode == "gil" and rank == 1 and i == 6:
                re.match(r"(a+)+$", "a" * 40 + "b")  # STUCK-GIL
            if mode == "slow" and i >= 8:
                time.sleep(2.0)  # slower than usual, under the timeout
            if mode == "own" and rank == 1 and i == 6:
                reload_state()
            if mode == "kill" and rank == 1 and i == 6:
                open(os.path.join(sys.argv[1], "stuck"), "w").close()
                time.sleep(3600)  # the test SIGKILLs this rank here
            if mode == "ckpt" and i == 6:
                if rank == 0:
                    save_checkpoint(float(sys.argv[3]))
                dist.barrier()  # BARRIER
            t = x.sum()
            if mode == "mismatch" and rank == 1 and i == 6:
                dist.broadcast(t, src=0)  # MISMATCH
            elif mode == "skip" and rank == 1 and i == 6:
                pass  # SKIP: rank 1 leaves out this step's all_reduce
            else:
                dist.all_reduce(t)  # WAIT-HERE
            prof.step()
    dist.destroy_process_group()
    """
)


_line = partial(line_of, WORKER)


def _start(
    root: Path,
    mode: str,
    env: dict[str, str],
    nproc: int = 2,
    args: tuple[str, ...] = (),
    launcher: tuple[str, ...] = (),
) -> subprocess.Popen[str]:
    (root / "worker.py").write_text(WORKER)
    cmd = torchrun_cmd(str(root / "worker.py"), str(root / "out"), mode, *args, nproc=nproc, launcher=launcher)
    return start(cmd, root, job_env(env))


TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def data_hang(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Rank 1 sleeps in ``__getitem__``; rank 0 waits in ``all_reduce``. The
    job stays hung until the fixture kills it (after ``--stacks`` ran)."""
    root = tmp_path_factory.mktemp("hang-data")
    p = _start(root, "data", {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"})
    run = root / "out" / "job"
    t0 = time.monotonic()
    try:
        seen = wait_for(lambda: hangs(run, 0) and hangs(run, 1) and (run / ".hang-verdict").exists(), 150, p)
        took = time.monotonic() - t0
        stacks = None
        if seen:
            time.sleep(1.0)  # the verdict's line reaches stderr
            stacks = subprocess.run(
                [sys.executable, "-m", "fastprof", "trigger", str(run), "--stacks", "--wait", "30"],
                capture_output=True,
                text=True,
                timeout=90,
            )
    finally:
        out, err = kill(p, watched_pids(run))
    assert seen, f"no hang evidence within 150 s\nstdout:\n{out}\nstderr:\n{err}"
    rep = root / "rep"
    cli = subprocess.run(
        [sys.executable, "-m", "fastprof", "report", str(run), "-o", str(rep)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    doc = json.loads((rep / "report.json").read_text())
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    page = (rep / "report.html").read_text()
    return {
        "run": run,
        "stderr": err,
        "took": took,
        "stacks": stacks,
        "report": doc,
        "terminal": cli.stdout,
        "html": page,
    }


def test_each_rank_writes_its_evidence_with_the_stuck_line(data_hang: dict[str, Any]) -> None:
    run = data_hang["run"]
    r0, r1 = hangs(run, 0)[0], hangs(run, 1)[0]
    for doc, rank in ((r0, 0), (r1, 1)):
        assert doc["kind"] == "fastprof.hang" and doc["rank"] == rank and doc["reason"] == "stalled"
        assert doc["answered_by"] == "python"
        assert doc["stalled_s"] >= TIMEOUT_S
        assert doc["step"] == 5  # steps 0-5 ended; step 6 is the stuck one
    # Rank 1's training thread is in the dataset's __getitem__, at the sleep.
    assert r1["summary"]["where"]["line"] == _line("STUCK-DATA")
    assert r1["summary"]["where"]["function"] == "__getitem__"
    assert r1["summary"]["phase"] == "dataloader"
    assert r1["summary"]["collective"] is None
    # Rank 0 waits in all_reduce, called from the loop's line.
    assert r0["summary"]["collective"]["op"] == "all_reduce"
    assert r0["summary"]["collective"]["site"]["line"] == _line("WAIT-HERE")
    # The anatomy's wavefront (issue #37, item 1): rank 0 entered its 7th
    # all_reduce of the default group (one a step, steps 0-6) and completed
    # the 6th; rank 1 completed all it entered (6). The line is the stack's.
    wave0, wave1 = r0["collectives"]["default"], r1["collectives"]["default"]
    assert wave0["entered"] == {"op": "all_reduce", "seq": 7, "site": None}
    assert wave0["completed"]["seq"] == 6 and wave1["entered"]["seq"] == wave1["completed"]["seq"] == 6
    # Every thread has a stack; the training thread is marked.
    assert sum(t["training"] for t in r1["threads"]) == 1
    assert isinstance(r1["workers"], list)


def test_rank0_prints_one_verdict_naming_the_stuck_rank_while_hung(data_hang: dict[str, Any]) -> None:
    lines = verdicts(data_hang["stderr"])
    assert len(lines) == 1, data_hang["stderr"]
    v = lines[0]
    # The collective's number is the default group's in the anatomy's
    # wavefront (rank 0 entered it, not completed); rank 1 completed the one
    # before it.
    m = re.search(r"rank 1 never entered all_reduce #(\d+); it is in the dataloader: ", v)
    assert m, v
    assert f"worker.py:{_line('STUCK-DATA')} in __getitem__" in v
    assert f"Rank 0 waits in all_reduce #{m.group(1)} (worker.py:{_line('WAIT-HERE')} in <module>)." in v
    r1 = hangs(data_hang["run"], 1)[0]
    assert r1["collectives"]["default"]["completed"]["seq"] == int(m.group(1)) - 1
    # Within the timeout and the join's bounded wait of the stall (startup included).
    assert data_hang["took"] < 150


def test_trigger_stacks_asks_every_rank_on_demand(data_hang: dict[str, Any]) -> None:
    r = data_hang["stacks"]
    assert r is not None and r.returncode == 0, (r.stdout, r.stderr) if r else None
    run = data_hang["run"]
    for rank in (0, 1):
        docs = [d for d in hangs(run, rank) if d["reason"] == "request"]
        assert len(docs) == 1 and docs[0]["request"], docs
    assert "rank 1" in r.stdout and f"worker.py:{_line('STUCK-DATA')}" in r.stdout, r.stdout


def test_report_of_the_killed_run_has_the_hang(data_hang: dict[str, Any]) -> None:
    hangs = data_hang["report"]["hangs"]
    assert len(hangs) == 1, hangs
    h = hangs[0]
    assert h["step"] == 6 and h["seconds"] >= TIMEOUT_S
    assert h["suspect_ranks"] == [1] and h["waiting_ranks"] == [0]
    assert h["collective"]["op"] == "all_reduce"
    (w,) = h["where"]
    assert (w["rank"], w["line"], w["function"], w["phase"]) == (1, _line("STUCK-DATA"), "__getitem__", "dataloader")
    # The terminal and the page say it in one paragraph, the same sentence.
    assert f"Hang: {h['text']}" in " ".join(data_hang["terminal"].split()), data_hang["terminal"]
    assert f"<h2>Hang</h2><p>{html.escape(h['text'])}</p>" in data_hang["html"]


def test_a_rank_spinning_with_the_gil_held_gives_its_stack_and_abort_ends_the_job(tmp_path: Path) -> None:
    env = {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2", "FASTPROF_HANG_ACTION": "abort"}
    p = _start(tmp_path, "gil", env)
    _out, err = run_to_end(p, tmp_path / "out" / "job", 150, "the aborting job did not end within 150 s")
    run = tmp_path / "out" / "job"
    assert p.returncode != 0
    (r1,) = hangs(run, 1)
    # Python could not answer: the watchdog wrote the stacks, read without the GIL.
    assert r1["answered_by"] == "watchdog", r1
    frames = [f for t in r1["threads"] for f in t["frames"]]
    assert any(f["file"].endswith("worker.py") and f["line"] == _line("STUCK-GIL") for f in frames), frames
    lines = verdicts(err)
    assert len(lines) == 1, err
    assert "rank 1 never entered all_reduce" in lines[0] and "spins with the GIL held" in lines[0]
    assert f"worker.py:{_line('STUCK-GIL')}" in lines[0]
    assert "exitcode: 124" in err or "exit code: 124" in err, err[-3000:]


def test_a_slow_job_reports_no_hang(tmp_path: Path) -> None:
    p = _start(tmp_path, "slow", {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"})
    _out, err = run_to_end(p, tmp_path / "out" / "job", 200, "the slow job did not end")
    assert p.returncode == 0, err
    run = tmp_path / "out" / "job"
    assert hangs(run, 0) == [] and hangs(run, 1) == []
    assert "fastprof: hang" not in err
    acct = json.loads((run / "rank0" / "profiler.json").read_text())["hang"]
    assert acct["enabled"] and acct["reports"] == []


def test_a_mismatched_collective_is_named_as_different_code_paths(tmp_path: Path) -> None:
    """Rank 1 calls broadcast where rank 0 calls all_reduce: gloo waits
    forever on both; the verdict names rank 1's call and line."""
    p = _start(tmp_path, "mismatch", {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"})
    run = tmp_path / "out" / "job"
    seen, out, err = await_verdict(p, run)
    assert seen, f"no verdict within 150 s\nstdout:\n{out}\nstderr:\n{err}"
    lines = verdicts(err)
    assert len(lines) == 1, err
    assert f"rank 1 is in broadcast (worker.py:{_line('MISMATCH')} in <module>" in lines[0]
    assert "the ranks took different code paths" in lines[0]
    assert re.search(rf"Rank 0 waits in all_reduce #\d+ \(worker.py:{_line('WAIT-HERE')} in <module>\)", lines[0])


def test_sigterm_on_a_stuck_rank_writes_its_evidence(tmp_path: Path) -> None:
    """No watchdog timeout yet (600 s): a SIGTERM that reaches rank 1 after
    more than 10 s without a step (and ten typical steps) writes the evidence
    from the handler, before the job's own handling of the signal goes on."""
    p = _start(tmp_path, "sigterm", {"FASTPROF_HANG_TIMEOUT": "600"})
    run = tmp_path / "out" / "job"
    try:
        stuck = wait_for(lambda: (tmp_path / "out" / "stuck").exists(), 150, p)
        assert stuck, "rank 1 never reached its stuck read"
        time.sleep(12.0)
        pid = int(json.loads((run / "rank1" / ".hang-watch.json").read_text())["pid"])
        os.kill(pid, signal.SIGTERM)
        seen = wait_for(lambda: bool(hangs(run, 1)), 60, p)
    finally:
        out, err = kill(p, watched_pids(run))
    assert seen, f"no evidence after SIGTERM\nstdout:\n{out}\nstderr:\n{err}"
    (doc,) = hangs(run, 1)
    assert doc["reason"] == "sigterm" and doc["stalled_s"] >= 10.0
    assert doc["summary"]["where"]["line"] == _line("STUCK-DATA")
    assert hangs(run, 0) == []  # rank 0 got no signal and its watchdog has 600 s


def test_a_hung_dataloader_worker_is_named_alive_with_its_rank_in_the_dataloader(tmp_path: Path) -> None:
    """Rank 1's DataLoader worker sleeps in ``__getitem__``: rank 1's training
    thread waits for the batch in the loader; the evidence lists the worker
    alive, and the verdict names rank 1 in the dataloader at the loop's line."""
    p = _start(tmp_path, "worker", {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"})
    run = tmp_path / "out" / "job"
    seen, out, err = await_verdict(p, run, also=lambda: hangs(run, 1))
    assert seen, f"no verdict within 150 s\nstdout:\n{out}\nstderr:\n{err}"
    (r1,) = hangs(run, 1)
    assert r1["summary"]["phase"] == "dataloader"
    assert r1["summary"]["where"]["line"] == _line("LOOP")
    workers = [w for w in r1["workers"] if w.get("dataloader")]
    assert len(workers) == 1 and workers[0]["alive"] is True, r1["workers"]
    lines = verdicts(err)
    assert len(lines) == 1, err
    loop = _line("LOOP")
    assert re.search(rf"rank 1 never entered all_reduce #\d+; it is in the dataloader: worker.py:{loop} ", lines[0])


def _verdict_of(root: Path, mode: str, env: dict[str, str], nproc: int = 2) -> tuple[str, Path]:
    """Start the job, wait for the verdict, kill it: the one verdict line on
    stderr and the run directory."""
    p = _start(root, mode, env, nproc)
    run = root / "out" / "job"
    seen, out, err = await_verdict(p, run)
    assert seen, f"no verdict within 150 s\nstdout:\n{out}\nstderr:\n{err}"
    lines = verdicts(err)
    assert len(lines) == 1, err
    return lines[0], run


def test_a_skipped_all_reduce_is_named_as_a_skipped_collective(tmp_path: Path) -> None:
    """Rank 1 leaves out step 6's all_reduce. gloo pairs the ranks'
    collectives by number, so the job runs on, one collective apart, until
    rank 1 has ended every step and rank 0 waits in its last all_reduce: the
    verdict names rank 1 as having skipped one, with both numbers. Rank 1's
    watchdog stopped with its Profiler (8 s is longer than the closing clock
    sync's 5 s): its last step and wavefront come from ``.hang-closed.json``."""
    v, run = _verdict_of(tmp_path, "skip", {"FASTPROF_HANG_TIMEOUT": "8", "FASTPROF_HANG_GRACE": "2"})
    m = re.search(
        r"rank 1 skipped a collective: it ended step 39 after (\d+) collectives of the default group \(the last "
        r"all_reduce #(\d+)\) where rank 0 entered all_reduce #(\d+) in that step: the ranks took different code "
        r"paths",
        v,
    )
    assert m, v
    assert int(m.group(1)) == int(m.group(2)) == 39 and int(m.group(3)) == 40, v
    assert "rank 1 has left its training loop (its Profiler closed after step 39)" in v
    assert f"Rank 0 waits in all_reduce #40 (worker.py:{_line('WAIT-HERE')} in <module>)." in v
    assert hangs(run, 1) == []
    (r0,) = hangs(run, 0)
    assert r0["step"] == 38  # rank 0 ended steps 0-38 and waits in step 39's all_reduce


def test_a_rank_stuck_in_its_own_function_is_named_with_its_line(tmp_path: Path) -> None:
    v, run = _verdict_of(tmp_path, "own", {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"})
    assert f"rank 1 never entered all_reduce #7; it is in other: worker.py:{_line('STUCK-OWN')} in reload_state" in v
    assert f"Rank 0 waits in all_reduce #7 (worker.py:{_line('WAIT-HERE')} in <module>)." in v
    (r1,) = hangs(run, 1)
    assert r1["summary"]["where"]["function"] == "reload_state" and r1["summary"]["collective"] is None


def test_one_stuck_rank_among_four_is_named_and_the_three_others_wait(tmp_path: Path) -> None:
    env = {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"}
    v, run = _verdict_of(tmp_path, "data", env, nproc=4)
    assert f"rank 1 never entered all_reduce #7; it is in the dataloader: worker.py:{_line('STUCK-DATA')} in " in v
    assert f"Ranks 0, 2-3 wait in all_reduce #7 (worker.py:{_line('WAIT-HERE')} in <module>)." in v
    for rank in range(4):
        (doc,) = hangs(run, rank)
        assert doc["rank"] == rank and doc["step"] == 5


def _finish(root: Path, mode: str, env: dict[str, str], args: tuple[str, ...]) -> tuple[str, float]:
    """Run the job to its end: its stderr and wall seconds."""
    p = _start(root, mode, env, args=args)
    t0 = time.monotonic()
    _out, err = run_to_end(p, root / "out" / "job", 200, "the job did not end")
    assert p.returncode == 0, err
    return err, time.monotonic() - t0


def test_a_checkpoint_shorter_than_the_timeout_is_no_hang(tmp_path: Path) -> None:
    """Rank 0 saves a checkpoint for 3 s (thousands of steps' time) while
    rank 1 waits at a barrier; the timeout is 6 s: nothing is reported."""
    env = {"FASTPROF_HANG_TIMEOUT": "6", "FASTPROF_HANG_GRACE": "2"}
    err, _ = _finish(tmp_path, "ckpt", env, ("3",))
    run = tmp_path / "out" / "job"
    assert hangs(run, 0) == [] and hangs(run, 1) == []
    assert "fastprof: hang" not in err


def test_a_checkpoint_past_the_timeout_is_reported_as_waiting_for_rank0_in_save(tmp_path: Path) -> None:
    """The same save for 8 s against a 4 s timeout: reported once, while it
    lasts, as rank 1 waiting in the barrier for rank 0 in save_checkpoint;
    the job then goes on and ends well (hang_action report)."""
    env = {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"}
    err, _ = _finish(tmp_path, "ckpt", env, ("8",))
    lines = verdicts(err)
    assert len(lines) == 1, err
    assert f"rank 0 never entered barrier #7; it is in other: worker.py:{_line('SAVE')} in save_checkpoint" in lines[0]
    assert f"Rank 1 waits in barrier #7 (worker.py:{_line('BARRIER')} in <module>)." in lines[0]
    run = tmp_path / "out" / "job"
    assert [d["reason"] for d in hangs(run, 0)] == ["stalled"]


def test_a_sigkilled_rank_makes_the_others_fail_not_hang_and_is_named_gone(tmp_path: Path) -> None:
    """Rank 1 is SIGKILLed by hand (outside torchrun) while rank 0 waits in
    all_reduce: with gloo, the kernel closes the dead rank's sockets and rank
    0's collective raises at once ("Connection closed by peer"): no hang, so
    no hang evidence; the job ends failed. Rank 0 names rank 1's process as
    gone, on stderr and in profiler.json."""
    # torchrun looks at its workers every 20 s here, not every 0.1 s: rank 0's
    # collective fails on its own before the launcher ends it for rank 1's
    # death (a race the launcher won under load).
    env = {"FASTPROF_HANG_TIMEOUT": "60", "FASTPROF_HANG_GRACE": "2"}
    p = _start(tmp_path, "kill", env, launcher=("--monitor-interval", "20"))
    run = tmp_path / "out" / "job"
    try:
        stuck = wait_for(lambda: (tmp_path / "out" / "stuck").exists(), 150, p)
        assert stuck, "rank 1 never reached its stop"
        time.sleep(1.0)  # rank 0 is in its all_reduce
        pid = int(json.loads((run / "rank1" / ".hang-watch.json").read_text())["pid"])
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        _out, err = p.communicate(timeout=60)
        ended = time.monotonic() - t0
    finally:
        if p.poll() is None:
            kill(p, watched_pids(run))
    assert p.returncode != 0
    assert "Connection closed by peer" in err, err[-3000:]
    assert ended < 60  # the job ended on its own (within a launcher look), before the 60 s hang timeout
    assert hangs(run, 0) == [] and hangs(run, 1) == []
    line = next((ln for ln in err.splitlines() if "fastprof: rank 0 stops on RuntimeError" in ln), None)
    assert line is not None, err[-3000:]
    assert f"the process of rank 1 (pid {pid}) is gone, ended outside the launcher" in line
    acct = json.loads((run / "rank0" / "profiler.json").read_text())["hang"]
    assert acct["peers_gone"] == [{"rank": 1, "pid": pid}]


# The same hangs in a script with no Profiler, under ``torchrun -m fastprof
# run`` (steps end at ``optimizer.step()``): the options come from the
# variables, and the script's lines, phases and collectives are named as with
# an explicit Profiler. Rank 1 spins with the GIL held inside its model's
# forward.
PLAIN = textwrap.dedent(
    """
    import os, re, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out, mode = sys.argv[1], sys.argv[2]

    def mark():
        open(os.path.join(out, "stuck"), "w").close()

    class Data(Dataset):
        def __init__(self, n=40):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            if mode in ("data", "worker") and rank == 1 and i == 6 and self.n == 40:
                mark()
                time.sleep(3600)  # STUCK-PLAIN
            return torch.ones(4)

    class Model(torch.nn.Linear):
        calls = 0
        def forward(self, x):
            Model.calls += 1
            if mode == "gil" and rank == 1 and Model.calls == 7:
                mark()
                re.match(r"(a+)+$", "a" * 40 + "b")  # STUCK-GIL
            return super().forward(x)

    def reload_state():
        mark()
        while True:
            time.sleep(0.05)  # STUCK-OWN

    def save_checkpoint(seconds):
        time.sleep(seconds)  # SAVE

    def evaluate(seconds):
        with torch.no_grad():
            for x in DataLoader(Data(4), batch_size=1):
                model(x)
                time.sleep(seconds / 4)  # EVAL

    model = Model(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Data(), batch_size=1, num_workers=1 if mode == "worker" else 0)
    for i, x in enumerate(loader):  # PLAIN-LOOP
        if mode == "own" and rank == 1 and i == 6:
            reload_state()
        if mode == "kill" and rank == 1 and i == 6:
            mark()
            time.sleep(3600)  # the test SIGKILLs this rank here
        if mode == "calm" and 8 <= i < 11:
            time.sleep(2.0)  # slower than usual, under the timeout
        if mode == "calm" and i == 14:
            if rank == 0:
                save_checkpoint(3.0)
            dist.barrier()
        if mode == "calm" and i == 20:
            evaluate(3.0)
        loss = model(x).sum()
        loss.backward()
        t = loss.detach()
        if mode == "mismatch" and rank == 1 and i == 6:
            dist.broadcast(t, src=0)  # PLAIN-MISMATCH
        elif mode == "skip" and rank == 1 and i == 6:
            pass  # rank 1 leaves out this step's all_reduce
        else:
            dist.all_reduce(t)  # PLAIN-WAIT
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    """
)


_plain = partial(line_of, PLAIN)


def _start_run(
    root: Path, mode: str, env: dict[str, str], nproc: int = 2, launcher: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    """``torchrun -m fastprof run train.py OUT MODE``: the script has no Profiler."""
    (root / "train.py").write_text(PLAIN)
    (root / "out").mkdir(exist_ok=True)
    cmd = torchrun_cmd(*fastprof_run(root / "out", "train.py", str(root / "out"), mode), nproc=nproc, launcher=launcher)
    return start(cmd, root, job_env(env))


#: mode -> ranks.
RUN_CASES = {"data": 4, "own": 2, "mismatch": 2, "worker": 2}


@pytest.mark.parametrize("mode", list(RUN_CASES))
def test_fastprof_run_names_the_stuck_rank_its_line_phase_and_collective(tmp_path: Path, mode: str) -> None:
    """Each hang of the explicit Profiler's tests, in a script with no
    Profiler under ``torchrun -m fastprof run``: FASTPROF_HANG_TIMEOUT
    reaches its Profiler through ProfilerArgs (the start-up, which under
    fastprof run includes the script's ``import torch``, is no hang), and one
    verdict names rank 1, its line, its phase and the collective the others
    wait in."""
    nproc = RUN_CASES[mode]
    env = {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"}
    p = _start_run(tmp_path, mode, env, nproc=nproc)
    run = tmp_path / "out" / "job"
    seen, out, err = await_verdict(p, run, 100, also=lambda: hangs(run, 0))
    assert seen, f"no verdict within 100 s\nstdout:\n{out}\nstderr:\n{err}"
    lines = verdicts(err)
    assert len(lines) == 1, err
    (v,) = lines
    wait = f"all_reduce #(\\d+) \\(train.py:{_plain('PLAIN-WAIT')} in <module>\\)"
    (r0,) = hangs(run, 0)
    assert r0["timeout_s"] == TIMEOUT_S and r0["summary"]["collective"]["op"] == "all_reduce", r0["summary"]
    if mode == "mismatch":
        assert f"rank 1 is in broadcast (train.py:{_plain('PLAIN-MISMATCH')} in <module>" in v, v
        assert "the ranks took different code paths" in v and re.search(f"Rank 0 waits in {wait}", v), v
        return
    where = {
        "data": f"the dataloader: train.py:{_plain('STUCK-PLAIN')} in __getitem__",
        "own": f"other: train.py:{_plain('STUCK-OWN')} in reload_state",
        # the worker's own line too, from its stack (issue #37, item 2)
        "worker": f"the dataloader: train.py:{_plain('PLAIN-LOOP')} in <module>, where its DataLoader worker 0 "
        f"(pid PID) is in train.py:{_plain('STUCK-PLAIN')} in __getitem__",
    }[mode]
    m = re.search(r"rank 1 never entered all_reduce #(\d+); it is in (.*?)\. (Ranks? [-, 0-9]+) waits? in " + wait, v)
    assert m and re.sub(r"\(pid \d+\)", "(pid PID)", m.group(2)) == where and m.group(1) == m.group(4), v
    assert m.group(3) == ("Ranks 0, 2-3" if nproc == 4 else "Rank 0"), v
    (r1,) = hangs(run, 1)
    assert r1["step"] == 5 and r1["summary"]["collective"] is None, r1["summary"]
    assert r1["summary"]["phase"] == ("other" if mode == "own" else "dataloader"), r1["summary"]
    assert r1["collectives"]["default"]["completed"]["seq"] == int(m.group(1)) - 1, r1["collectives"]
    for rank in range(nproc):
        assert [d["rank"] for d in hangs(run, rank)] == [rank]
    if mode == "worker":
        workers = [w for w in r1["workers"] if w.get("dataloader")]
        assert len(workers) == 1 and workers[0]["alive"] is True, r1["workers"]


def test_fastprof_run_a_rank_spinning_in_forward_with_the_gil_held_and_abort(tmp_path: Path) -> None:
    """Rank 1 spins in ``re`` inside its model's forward, the GIL held: the
    watchdog writes its stacks itself, the verdict names the line, and
    FASTPROF_HANG_ACTION=abort ends the job with 124."""
    env = {"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2", "FASTPROF_HANG_ACTION": "abort"}
    p = _start_run(tmp_path, "gil", env)
    run = tmp_path / "out" / "job"
    _out, err = run_to_end(p, run, 100, "the aborting job did not end within 100 s")
    assert p.returncode != 0
    (r1,) = hangs(run, 1)
    assert r1["answered_by"] == "watchdog", r1
    # The watchdog's file has the stacks only: where they say rank 1 is.
    s1 = summarize(r1, json.loads((run / "rank1" / ".hang-watch.json").read_text())["training_thread"])
    assert s1["phase"] == "forward" and s1["where"]["line"] == _plain("STUCK-GIL"), s1
    lines = verdicts(err)
    assert len(lines) == 1, err
    assert "rank 1 never entered all_reduce" in lines[0] and "spins with the GIL held" in lines[0], lines[0]
    assert f"train.py:{_plain('STUCK-GIL')}" in lines[0], lines[0]
    assert "exitcode: 124" in err or "exit code: 124" in err, err[-3000:]


def test_fastprof_run_a_skipped_all_reduce_fails_the_job_and_is_named_a_skip(tmp_path: Path) -> None:
    """Rank 1 leaves out step 6's all_reduce; gloo pairs the ranks'
    collectives by number, so the job runs on, one apart, until rank 1 has
    ended every step. Under fastprof run rank 1's process then ends at once
    (its script ends; no Profiler of its own keeps it), the kernel closes its
    sockets and rank 0's last all_reduce raises ("Connection closed by peer")
    long before the 60 s timeout: no hang. Rank 0 names rank 1 as having
    skipped a collective, from rank 1's ``.hang-closed.json``; its process
    ended after its loop, not outside the launcher."""
    env = {"FASTPROF_HANG_TIMEOUT": "60", "FASTPROF_HANG_GRACE": "2"}
    p = _start_run(tmp_path, "skip", env)
    run = tmp_path / "out" / "job"
    _out, err = run_to_end(p, run, 100, "the job did not end")
    assert p.returncode != 0
    assert "Connection closed by peer" in err, err[-3000:]
    assert hangs(run, 0) == [] and hangs(run, 1) == []
    line = next((ln for ln in err.splitlines() if "fastprof: rank 0 stops on RuntimeError" in ln), None)
    assert line is not None, err[-3000:]
    m = re.search(
        r"rank 1 skipped a collective: it ended step 39 after (\d+) collectives of the default group \(the last "
        r"all_reduce #(\d+)\) where rank 0 entered all_reduce #(\d+) in that step: the ranks took different "
        r"code paths",
        line,
    )
    assert m and int(m.group(1)) == int(m.group(2)) == int(m.group(3)) - 1, line
    assert "rank 1 has left its training loop (its Profiler closed after step 39)" in line, line
    assert "is gone" not in line, line
    acct = json.loads((run / "rank0" / "profiler.json").read_text())["hang"]
    assert acct["peers_gone"] == [] and acct["peers_left"] == [{"rank": 1, "step": 39, "skipped": True}], acct


def test_fastprof_run_a_sigkilled_rank_is_named_gone(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed by hand while rank 0 waits in all_reduce: rank 0's
    collective fails at once, no hang evidence, and rank 0's fastprof run
    names rank 1's process gone, on stderr and in profiler.json."""
    env = {"FASTPROF_HANG_TIMEOUT": "60", "FASTPROF_HANG_GRACE": "2"}
    p = _start_run(tmp_path, "kill", env, launcher=("--monitor-interval", "20"))
    run = tmp_path / "out" / "job"
    try:
        stuck = wait_for(lambda: (tmp_path / "out" / "stuck").exists(), 100, p)
        assert stuck, "rank 1 never reached its stop"
        time.sleep(1.0)  # rank 0 is in its all_reduce
        pid = int(json.loads((run / "rank1" / ".hang-watch.json").read_text())["pid"])
        os.kill(pid, signal.SIGKILL)
        _out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            kill(p, watched_pids(run))
    assert p.returncode != 0
    assert "Connection closed by peer" in err, err[-3000:]
    assert hangs(run, 0) == [] and hangs(run, 1) == []
    line = next((ln for ln in err.splitlines() if "fastprof: rank 0 stops on RuntimeError" in ln), None)
    assert line is not None, err[-3000:]
    assert f"the process of rank 1 (pid {pid}) is gone, ended outside the launcher" in line
    acct = json.loads((run / "rank0" / "profiler.json").read_text())["hang"]
    assert acct["peers_gone"] == [{"rank": 1, "pid": pid}]


def test_fastprof_run_slow_steps_a_checkpoint_and_an_evaluation_are_no_hang(tmp_path: Path) -> None:
    """The false alarms in one job under fastprof run, each shorter than the
    6 s timeout but tens of steps long: three 2 s steps, rank 0 saving for
    3 s while rank 1 waits at a barrier, a 3 s evaluation pass with no
    optimizer step. Nothing is reported and the job ends well."""
    env = {"FASTPROF_HANG_TIMEOUT": "6", "FASTPROF_HANG_GRACE": "2"}
    p = _start_run(tmp_path, "calm", env)
    run = tmp_path / "out" / "job"
    _out, err = run_to_end(p, run, 110, "the job did not end")
    assert p.returncode == 0, err
    assert hangs(run, 0) == [] and hangs(run, 1) == []
    assert "fastprof: hang" not in err
    for rank in (0, 1):
        acct = json.loads((run / f"rank{rank}" / "profiler.json").read_text())["hang"]
        assert acct["enabled"] and acct["timeout"] == 6.0 and acct["reports"] == [], acct
