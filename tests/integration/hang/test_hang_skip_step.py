"""The step a skipped collective was left out of (issue #37): rank 1 leaves
out step 6's ``all_reduce``. gloo pairs the ranks' collectives by number, so
the job runs on, one collective apart, until rank 1 has ended every step and
rank 0 waits in its last ``all_reduce``, 33 steps later. Each rank's
wavefront keeps, per step, how many collectives its group had before that
step's first; the verdict compares the ranks' counts step by step and names
step 6. A real ``torchrun --nproc-per-node 2`` job with gloo on CPU."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from hung_job import await_verdict, hangs, job_env, one_verdict, start, torchrun_cmd

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
    base = job_env({"FASTPROF_HANG_TIMEOUT": "8", "FASTPROF_HANG_GRACE": "2"})
    p = start(torchrun_cmd(str(tmp_path / "worker.py"), str(tmp_path / "out")), tmp_path, base)
    run = tmp_path / "out" / "job"
    _seen, out, err = await_verdict(p, run)
    v = one_verdict(out, err)
    assert re.search(r"rank 1 skipped a collective: it ended step 39 after 39 collectives", v), v
    assert (
        "the ranks took different code paths (a collective called on some ranks only), first in step 6: rank 1 entered "
        "0 collectives of the default group there where rank 0 entered 1; rank 1 has left its training loop" in v
    ), v
    (r0,) = hangs(run, 0)
    steps = r0["collectives"]["default"]["steps"]
    assert steps[:8] == [[i, i] for i in range(8)], steps  # step i's first all_reduce: i before it
