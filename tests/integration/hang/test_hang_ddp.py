"""DDP's own collectives in a hang's verdict (issue #37): the gradients'
all-reduce that DDP's reducer runs in C++ inside backward does not go
through torch.distributed's Python API, so fastprof's wavefront does not see
it; torch's Flight Recorder does (on by default in torch 2.15 with 2000
entries; ``TORCH_FR_BUFFER_SIZE=0`` turns it off). Rank 1 sleeps in ``__getitem__``; rank 0 waits
in DDP's all-reduce at the end of its backward: the verdict names rank 1 in
the dataloader and rank 0 waiting in that all-reduce (Flight Recorder's
number) at its ``backward()`` line. A real ``torchrun --nproc-per-node 2``
job with gloo on CPU."""

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
    import sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class Data(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            if rank == 1 and i == 6:
                time.sleep(3600)  # STUCK-DATA
            return torch.ones(4)

    model = DDP(torch.nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=30) as prof:
        for x in prof.loader(DataLoader(Data(), batch_size=2)):  # LOOP
            loss = model(x).sum()
            loss.backward()  # BACKWARD
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()
    """
)


_line = partial(line_of, WORKER)


def _verdict(tmp_path: Path, env: dict[str, str]) -> tuple[str, Path]:
    (tmp_path / "worker.py").write_text(WORKER)
    base = job_env({"FASTPROF_HANG_TIMEOUT": "4", "FASTPROF_HANG_GRACE": "2", **env}, drop=("FASTPROF_", "TORCH_FR_"))
    p = start(torchrun_cmd(str(tmp_path / "worker.py"), str(tmp_path / "out")), tmp_path, base)
    run = tmp_path / "out" / "job"
    _seen, out, err = await_verdict(p, run)
    return one_verdict(out, err), run


def test_a_rank_waiting_in_ddps_all_reduce_is_named_from_the_flight_recorder(tmp_path: Path) -> None:
    v, run = _verdict(tmp_path, {})  # this torch records by default (2000 entries)
    m = re.search(
        rf"rank 1 never entered all_reduce #(\d+); it is in the dataloader: worker.py:{_line('STUCK-DATA')} in "
        rf"__getitem__\. Rank 0 waits in all_reduce #(\d+) \(DDP's or FSDP's, in backward: "
        rf"worker.py:{_line('BACKWARD')} in <module>\)",
        v,
    )
    assert m and m.group(1) == m.group(2), v
    (r0,) = hangs(run, 0)
    c = r0["summary"]["collective"]
    assert (c["op"], c["source"], c["site"]["line"]) == ("all_reduce", "flight_recorder", _line("BACKWARD")), c
    assert r0["summary"]["phase"] == "backward"


def test_without_the_flight_recorder_the_verdict_says_where_rank0_is(tmp_path: Path) -> None:
    """The Flight Recorder off (``TORCH_FR_BUFFER_SIZE=0``): no record of
    DDP's collective, rank 0 is named at its backward line, as a rank
    elsewhere (no collective to name)."""
    v, _ = _verdict(tmp_path, {"TORCH_FR_BUFFER_SIZE": "0"})
    assert f"worker.py:{_line('BACKWARD')}" in v and "DDP's" not in v, v
