"""The writer thread sleeps until its flush is due or a producer's ring has
filled another quarter: an idle recorder wakes about once per flush interval,
and a busy producer wakes it long before the flush so its ring never fills."""

from __future__ import annotations

import time
from pathlib import Path

import fastprof


def thread_tid(name: str) -> int:
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == name:
                return int(task.name)
        except OSError:
            continue
    raise AssertionError(f"no thread named {name!r}")


def voluntary_switches(tid: int) -> int:
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in status")


def test_idle_writer_wakes_about_once_per_flush(tmp_path):
    rec = fastprof.start(tmp_path, "idle", flush_interval=1.0)
    fastprof.instant("hello")
    time.sleep(0.2)
    tid = thread_tid("fastprof-writer")
    before = voluntary_switches(tid)
    time.sleep(3.0)
    after = voluntary_switches(tid)
    rec.stop()
    # Three flushes in 3 s (each wake-up is one voluntary switch when it sleeps
    # again); a writer polling every 5 ms would show ~600.
    assert after - before <= 8, after - before


def test_a_filling_ring_wakes_the_writer_before_the_flush(tmp_path, traces):
    # 4096-slot ring, flush only every 60 s: without the producers' nudges the
    # ring would fill after 4096 events and drop the other 16k.
    rec = fastprof.start(tmp_path, "nudge", buffer_size=4096, flush_interval=60.0)
    batches, per_batch = 40, 512
    for _ in range(batches):
        for _ in range(per_batch):
            fastprof.instant("tick")
        time.sleep(0.02)
    stats = rec.stop()
    assert stats.dropped == 0
    run = traces.read(rec.trace_dir)
    assert len(run.of("i", "tick")) == batches * per_batch
