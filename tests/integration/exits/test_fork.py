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


FORK_WITH_SAMPLER = r"""
import json, os, sys, threading, time
import fastprof

out = sys.argv[1]
# The sampler ticks at 1 kHz with per-core tracks while a thread records:
# forks land while Rust threads intern names and hold the sampler's locks.
rec = fastprof.start(out, "parent", sample_hz=1000, sample_system_hz=1000, sample_per_cpu=True,
                     sample_gpus="none", flush_interval=0.01)
cached = fastprof.name_id("cached_in_parent")
stop = threading.Event()

def hammer():
    i = 0
    while not stop.is_set():
        with fastprof.span("hammer"):
            fastprof.counter("hammer_counter", i)
        i += 1

t = threading.Thread(target=hammer)
t.start()
bad = []
for k in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            # The parent's recorder is inert here: no hang, no data, no exception.
            assert not fastprof.is_active() and not rec.active
            assert rec.counters() == {} and rec.sampler_info() is None
            try:
                rec.stop()
                code = 3
            except fastprof.NotRunningError:
                pass
            child = fastprof.start(out, f"child{k}", sample_hz=200, sample_gpus="none", flush_interval=0.01)
            with cached:                          # an id interned by the parent, cached in Python
                with fastprof.span(f"fresh_{k}"):  # a name interned in the child
                    # Until the child's own sampler ticked (at once on an idle
                    # machine; a loaded one may not run its thread for a while).
                    t_end = time.monotonic() + 10
                    time.sleep(0.01)
                    while not len(child.counters().get("proc.rss [B]", ((),))[0]) and time.monotonic() < t_end:
                        time.sleep(0.005)
            child.stop()
        except BaseException as e:  # noqa: BLE001
            sys.stderr.write(f"child {k}: {e!r}\n")
            code = 2
        os._exit(code)
    # A child that hangs is a failure, not a stuck test.
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.waitstatus_to_exitcode(status) != 0:
                bad.append((k, os.waitstatus_to_exitcode(status)))
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            bad.append((k, "hung"))
            break
stop.set()
t.join()
stats = rec.stop()
info = rec.sampler_info()
print(json.dumps({"bad": bad, "state": info.get("state"), "ticks": info["self_cost"]["ticks"],
                  "rss_points": len(rec.counters()["proc.rss [B]"][0])}))
"""


def test_fork_with_the_sampler_on(pyscript, traces, tmp_path):
    forks = 40
    r = pyscript.run(FORK_WITH_SAMPLER, str(tmp_path / "runs"), str(forks), timeout=200, name="forks.py")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["bad"] == [], (got, r.stderr[-3000:])
    assert got["state"] != "failed" and got["ticks"] > 0 and got["rss_points"] > 0
    for k in range(forks):
        run = traces.read(tmp_path / "runs" / f"child{k}" / "rank0")
        spans = {e["name"] for e in run.of("X")}
        # Each name is the child's own, never another's id read through a stale table.
        assert spans == {"cached_in_parent", f"fresh_{k}"}, (k, spans)
        assert "<unknown>" not in {e.get("name") for e in run.events}
        assert run.of("C", "proc.rss [B]"), "the child's own sampler ran"
    parent = traces.read(tmp_path / "runs" / "parent" / "rank0")
    assert parent.of("X", "hammer") and not parent.of("X", "fresh_0")
