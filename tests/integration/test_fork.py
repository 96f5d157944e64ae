"""Recording across fork: DataLoader workers (fork, spawn, forkserver) and a
plain ``os.fork`` while another thread records.

A child never inherits an active recorder, never deadlocks, never writes into
the parent's trace, and the parent's trace stays complete.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

import fastprof

DATALOADER = """
import json, os, sys, threading, time
import torch
from torch.utils.data import DataLoader, Dataset
import fastprof


class Work(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, idx):
        # Workers try to record: this must be a no-op there.
        with fastprof.span("worker_item", idx=idx):
            fastprof.instant("worker_instant")
            fastprof.counter("worker_counter", idx)
            x = torch.arange(256, dtype=torch.float32).reshape(16, 16)
            s = float((x @ x).sum())
        return torch.tensor([idx, os.getpid(), int(fastprof.is_active()), int(s > 0)])


def main():
    ctx, out = sys.argv[1], sys.argv[2]
    rec = fastprof.start(out_dir=out, run_name=ctx, flush_interval=0.05)

    # Another thread records the whole time, so workers are forked while
    # the recorder is busy on more than one thread.
    stop = threading.Event()
    hammered = [0]

    def hammer():
        n = 0
        while not stop.is_set():
            for _ in range(20):
                with fastprof.span("hammer"):
                    pass
                n += 1
            # Stay busy in the recorder without starving the loader of CPU.
            time.sleep(0.001)
        hammered[0] = n

    t = threading.Thread(target=hammer, name="hammer")
    t.start()
    rows = []
    loader = DataLoader(Work(), batch_size=4, num_workers=2, multiprocessing_context=ctx)
    with fastprof.span("epoch"):
        for n, batch in enumerate(loader):
            with fastprof.span("batch", n=n):
                rows.extend(batch.tolist())
    stop.set()
    t.join()
    stats = fastprof.stop()
    print(json.dumps({
        "pid": os.getpid(),
        "trace_dir": str(rec.trace_dir),
        "rows": rows,
        "hammered": hammered[0],
        "dropped": stats.dropped,
    }))


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_do_not_record(context, tmp_path, pyscript, traces):
    proc = pyscript.run(DATALOADER, context, str(tmp_path / "runs"), timeout=100, name="loader.py")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    pid = result["pid"]
    rows = result["rows"]
    assert sorted(r[0] for r in rows) == list(range(32))
    worker_pids = {r[1] for r in rows}
    assert len(worker_pids) == 2 and pid not in worker_pids
    assert all(r[2] == 0 for r in rows), "fastprof.is_active() was True in a DataLoader worker"
    assert all(r[3] == 1 for r in rows)

    run = traces.read(result["trace_dir"])
    batches = run.of("X", "batch")
    assert sorted(e["args"]["n"] for e in batches) == list(range(8))
    assert all(e["pid"] == pid for e in batches)
    assert len(run.of("X", "epoch")) == 1
    assert result["dropped"] == 0
    assert len(run.of("X", "hammer")) == result["hammered"]
    assert {e["pid"] for e in run.events} == {pid}
    assert not any(e["name"].startswith("worker_") for e in run.events)
    assert not (set(e["pid"] for e in run.events) & worker_pids)
    traces.nesting(run)


def _wait(pid: int, timeout: float) -> int:
    """waitpid with a deadline; kills the child and fails if it hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return status
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child {pid} did not exit within {timeout} s (deadlock?)")


def _child() -> int:
    """Runs in the forked child; returns its exit code."""
    if fastprof.is_active():
        return 2
    with fastprof.span("child_span", x=1):
        fastprof.instant("child_instant")
        fastprof.counter("child_counter", 1.0)
    if fastprof.is_active():
        return 3
    if fastprof.stop() is not None:
        return 4
    return 0


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_os_fork_while_another_thread_records(tmp_path, traces):
    rec = fastprof.start(out_dir=tmp_path, run_name="fork", flush_interval=0.01)
    stop = threading.Event()
    issued = [0]

    def hammer() -> None:
        n = 0
        while not stop.is_set():
            with fastprof.span("hammer"):
                with fastprof.span("hammer_inner", n=n):
                    fastprof.instant("hammer_tick")
            n += 1
            if n > 50_000:  # keep the trace small on a slow machine
                time.sleep(0.001)
        issued[0] = n

    t = threading.Thread(target=hammer, name="hammer")
    t.start()
    try:
        time.sleep(0.05)
        for k in range(20):
            with fastprof.span("parent_fork", k=k):
                pid = os.fork()
                if pid == 0:  # child
                    code = 1
                    try:
                        code = _child()
                    finally:
                        os._exit(code)
            status = _wait(pid, 10)
            assert os.waitstatus_to_exitcode(status) == 0, f"child {k} exited with {status}"
            assert fastprof.is_active()
    finally:
        stop.set()
        t.join()
    stats = fastprof.stop()
    assert stats.dropped == 0

    run = traces.read(rec.trace_dir)
    n = issued[0]
    assert n > 0
    assert len(run.of("X", "hammer")) == n
    assert sorted(e["args"]["n"] for e in run.of("X", "hammer_inner")) == list(range(n))
    assert len(run.of("i", "hammer_tick")) == n
    assert sorted(e["args"]["k"] for e in run.of("X", "parent_fork")) == list(range(20))
    assert {e["pid"] for e in run.events} == {os.getpid()}
    assert not any(e["name"].startswith("child_") for e in run.events)
    traces.nesting(run)


FORK_AND_EXIT = """
import os, sys
import fastprof

rec = fastprof.start(out_dir=sys.argv[1], run_name="fx", flush_interval=0.01)
with fastprof.span("before_fork"):
    pass
pid = os.fork()
if pid == 0:
    # The child leaves through the normal interpreter exit: atexit handlers
    # run here and must not touch the parent's segment.
    with fastprof.span("child_span"):
        pass
    sys.exit(0 if not fastprof.is_active() else 5)
_, status = os.waitpid(pid, 0)
with fastprof.span("after_child", status=os.waitstatus_to_exitcode(status)):
    pass
stats = fastprof.stop()
print(os.getpid(), pid, stats.events_written)
"""


def test_forked_child_exiting_normally_leaves_parent_trace_intact(tmp_path, pyscript, traces):
    proc = pyscript.run(FORK_AND_EXIT, str(tmp_path / "runs"), timeout=60, name="fork_exit.py")
    assert proc.returncode == 0, proc.stderr
    parent, _child_pid, written = map(int, proc.stdout.split())
    trace_dir = tmp_path / "runs" / "fx" / "rank0"
    run = traces.read(trace_dir)
    assert [e["name"] for e in run.data_events()] == ["before_fork", "after_child"]
    assert run.of("X", "after_child")[0]["args"] == {"status": 0}
    assert written == 2
    assert {e["pid"] for e in run.events} == {parent}
    assert run.final["final"] is True
    assert len(run.segments) == 1
