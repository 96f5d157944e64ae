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


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(WORKER.splitlines(), 1) if marker in text)


def _hangs(run: Path, rank: int) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((run / f"rank{rank}").glob("hang-*.json"))]


def _verdict(tmp_path: Path, env: dict[str, str]) -> tuple[str, Path]:
    (tmp_path / "worker.py").write_text(WORKER)
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("FASTPROF_", "TORCH_FR_")) and k not in TORCHRUN_VARS
    }
    base.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", FASTPROF_SAMPLE_HZ="0", OMP_NUM_THREADS="1")
    base.update(FASTPROF_HANG_TIMEOUT="4", FASTPROF_HANG_GRACE="2", **env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(free_port()), str(tmp_path / "worker.py"), str(tmp_path / "out")]
    p = subprocess.Popen(
        cmd, cwd=tmp_path, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    run = tmp_path / "out" / "job"
    deadline = time.monotonic() + 150
    try:
        while time.monotonic() < deadline and p.poll() is None:
            if (run / ".hang-verdict").exists():
                time.sleep(1.0)  # the verdict's line reaches stderr
                break
            time.sleep(0.25)
    finally:
        for w in run.glob("rank*/.hang-watch.json"):
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                psutil.Process(int(json.loads(w.read_text())["pid"])).kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(p.pid), signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if "fastprof: hang at step" in ln]
    assert len(lines) == 1, f"stdout:\n{out}\nstderr:\n{err}"
    return lines[0], run


def test_a_rank_waiting_in_ddps_all_reduce_is_named_from_the_flight_recorder(tmp_path: Path) -> None:
    v, run = _verdict(tmp_path, {})  # this torch records by default (2000 entries)
    m = re.search(
        rf"rank 1 never entered all_reduce #(\d+); it is in the dataloader: worker.py:{_line('STUCK-DATA')} in "
        rf"__getitem__\. Rank 0 waits in all_reduce #(\d+) \(DDP's or FSDP's, in backward: "
        rf"worker.py:{_line('BACKWARD')} in <module>\)",
        v,
    )
    assert m and m.group(1) == m.group(2), v
    (r0,) = _hangs(run, 0)
    c = r0["summary"]["collective"]
    assert (c["op"], c["source"], c["site"]["line"]) == ("all_reduce", "flight_recorder", _line("BACKWARD")), c
    assert r0["summary"]["phase"] == "backward"


def test_without_the_flight_recorder_the_verdict_says_where_rank0_is(tmp_path: Path) -> None:
    """The Flight Recorder off (``TORCH_FR_BUFFER_SIZE=0``): no record of
    DDP's collective, rank 0 is named at its backward line, as a rank
    elsewhere (no collective to name)."""
    v, _ = _verdict(tmp_path, {"TORCH_FR_BUFFER_SIZE": "0"})
    assert f"worker.py:{_line('BACKWARD')}" in v and "DDP's" not in v, v
