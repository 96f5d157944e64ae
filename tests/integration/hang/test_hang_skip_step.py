"""The step a skipped collective was left out of (issue #37): rank 1 leaves
out step 6's ``all_reduce``. gloo pairs the ranks' collectives by number, so
the job runs on, one collective apart, until rank 1 has ended every step and
rank 0 waits in its last ``all_reduce``, 33 steps later. Each rank's
wavefront keeps, per step, how many collectives its group had before that
step's first; the verdict compares the ranks' counts step by step and names
step 6. A real ``torchrun --nproc-per-node 2`` job with gloo on CPU."""

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

import psutil
import pytest

from conftest import TORCHRUN_VARS, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("torch")

WORKER = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=30) as prof:
        for i in range(40):
            t = torch.ones(4)
            if not (rank == 1 and i == 6):  # rank 1 leaves out step 6's all_reduce
                dist.all_reduce(t)  # WAIT-HERE
            prof.step()
    dist.destroy_process_group()
    """
)


def test_the_verdict_names_the_step_whose_collective_count_differs_first(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    base = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_") and k not in TORCHRUN_VARS}
    base.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", FASTPROF_SAMPLE_HZ="0", OMP_NUM_THREADS="1")
    base.update(FASTPROF_HANG_TIMEOUT="8", FASTPROF_HANG_GRACE="2")
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
    (v,) = lines
    assert re.search(r"rank 1 skipped a collective: it ended step 39 after 39 collectives", v), v
    assert (
        "the ranks took different code paths (a collective called on some ranks only), first in step 6: rank 1 entered "
        "0 collectives of the default group there where rank 0 entered 1; rank 1 has left its training loop" in v
    ), v
    (r0,) = [json.loads(f.read_text()) for f in (run / "rank0").glob("hang-*.json")]
    steps = r0["collectives"]["default"]["steps"]
    assert steps[:8] == [[i, i] for i in range(8)], steps  # step i's first all_reduce: i before it
