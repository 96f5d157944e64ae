"""A hung DataLoader worker's own stack (issue #37): rank 1's worker sleeps
forever in ``__getitem__``; rank 1's training thread waits for the batch in
the loader. The evidence asks the live worker for its stack (``faulthandler``
on a real-time signal, registered by fastprof's ``worker_init_fn`` chain) and
the verdict names the worker's file:line. A real ``torchrun --nproc-per-node
2`` job with gloo on CPU; files read back with Python's json."""

from __future__ import annotations

import re
import textwrap
from functools import partial
from pathlib import Path

import pytest

from hung_job import await_verdict, hangs, job_env, line_of, one_verdict, start, torchrun_cmd

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


_line = partial(line_of, WORKER)


def test_a_hung_workers_own_line_is_in_the_evidence_and_the_verdict(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    base = job_env({"FASTPROF_HANG_TIMEOUT": "4", "FASTPROF_HANG_GRACE": "2"})
    p = start(torchrun_cmd(str(tmp_path / "worker.py"), str(tmp_path / "out")), tmp_path, base)
    run = tmp_path / "out" / "job"
    _seen, out, err = await_verdict(p, run, also=lambda: hangs(run, 1))
    docs = hangs(run, 1)
    assert docs, f"no evidence from rank 1\nstdout:\n{out}\nstderr:\n{err}"
    (r1,) = docs
    (w,) = [w for w in r1["workers"] if w.get("dataloader")]
    assert w["alive"] is True and w["worker_id"] == 0
    assert w["where"] == {
        "file": str(tmp_path / "worker.py"),
        "line": _line("STUCK-IN-WORKER"),
        "function": "__getitem__",
    }
    assert r1["summary"]["worker"]["where"]["line"] == _line("STUCK-IN-WORKER")
    v = one_verdict(out, err)
    assert re.search(
        rf"rank 1 never entered all_reduce #7; it is in the dataloader: worker.py:{_line('LOOP')} in <module>, "
        rf"where its DataLoader worker 0 \(pid {w['pid']}\) is in worker.py:{_line('STUCK-IN-WORKER')} in __getitem__",
        v,
    ), v
