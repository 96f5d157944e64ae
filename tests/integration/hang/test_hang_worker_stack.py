"""A hung DataLoader worker's own stack (issue #37): rank 1's worker sleeps
forever in ``__getitem__``; rank 1's training thread waits for the batch in
the loader. The evidence asks the live worker for its stack (``faulthandler``
on a real-time signal, registered by fastprof's ``worker_init_fn`` chain) and
the verdict names the worker's file:line. A real ``torchrun --nproc-per-node
2`` job with gloo on CPU; files read back with Python's json."""

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
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import TORCHRUN_VARS, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("torch")

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class Data(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            if rank == 1 and i == 6:
                time.sleep(3600)  # STUCK-IN-WORKER
            return torch.ones(4)

    def seed(worker_id):
        torch.manual_seed(worker_id)  # the job's own worker_init_fn still runs

    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=30)
    with prof:
        loader = DataLoader(Data(), batch_size=1, num_workers=1, worker_init_fn=seed)
        for x in prof.loader(loader):  # LOOP
            t = x.sum()
            dist.all_reduce(t)  # WAIT-HERE
            prof.step()
    dist.destroy_process_group()
    """
)


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(WORKER.splitlines(), 1) if marker in text)


def _hangs(run: Path, rank: int) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((run / f"rank{rank}").glob("hang-*.json"))]


def test_a_hung_workers_own_line_is_in_the_evidence_and_the_verdict(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    base = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_") and k not in TORCHRUN_VARS}
    base.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", FASTPROF_SAMPLE_HZ="0", OMP_NUM_THREADS="1")
    base.update(FASTPROF_HANG_TIMEOUT="4", FASTPROF_HANG_GRACE="2")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(free_port()), str(tmp_path / "worker.py"), str(tmp_path / "out")]
    p = subprocess.Popen(
        cmd, cwd=tmp_path, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    run = tmp_path / "out" / "job"
    deadline = time.monotonic() + 150
    try:
        while time.monotonic() < deadline and p.poll() is None:
            if (run / ".hang-verdict").exists() and _hangs(run, 1):
                time.sleep(1.0)  # the verdict's line reaches stderr
                break
            time.sleep(0.25)
    finally:
        for w in run.glob("rank*/.hang-watch.json"):
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                rank = psutil.Process(int(json.loads(w.read_text())["pid"]))
                for proc in [*rank.children(recursive=True), rank]:
                    proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(p.pid), signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    hangs = _hangs(run, 1)
    assert hangs, f"no evidence from rank 1\nstdout:\n{out}\nstderr:\n{err}"
    (r1,) = hangs
    (w,) = [w for w in r1["workers"] if w.get("dataloader")]
    assert w["alive"] is True and w["worker_id"] == 0
    assert w["where"] == {
        "file": str(tmp_path / "worker.py"),
        "line": _line("STUCK-IN-WORKER"),
        "function": "__getitem__",
    }
    assert r1["summary"]["worker"]["where"]["line"] == _line("STUCK-IN-WORKER")
    (v,) = [ln for ln in err.splitlines() if "fastprof: hang at step" in ln]
    assert re.search(
        rf"rank 1 never entered all_reduce #7; it is in the dataloader: worker.py:{_line('LOOP')} in <module>, "
        rf"where its DataLoader worker 0 \(pid {w['pid']}\) is in worker.py:{_line('STUCK-IN-WORKER')} in __getitem__",
        v,
    ), v
