"""The gradients-ready mark sits on the parameter accumulated last in
backward (issue #36): a model that registers its head before its body
accumulates the head's gradients first, and the mark on the first
registered parameter ended before most of backward, so a slow part of
backward after it was missed by the straggler analysis. A real
``torchrun --nproc-per-node 2`` job (gloo, CPU, DDP), its trace read back."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import torchrun
from fastprof.recording.names import BACKWARD_GRADS_SPAN, PHASE_SPANS
from fastprof.reports.data import load

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

SLEEP_S = 0.03

WORKER = textwrap.dedent(
    f"""
    import sys, time
    import torch, torch.distributed as dist
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class Slow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)
        @staticmethod
        def backward(ctx, g):
            if rank == 1:
                time.sleep({SLEEP_S})  # between the head's gradients and the body's
            return g

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(64, 4)  # registered first, used last
            self.body = torch.nn.Linear(32, 64)
        def forward(self, x):
            return self.head(Slow.apply(torch.relu(self.body(x))))

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=60)
    with prof:
        for _ in range(12):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()
    """
)


def test_the_mark_follows_the_parameter_accumulated_last(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    torchrun(tmp_path / "worker.py", str(tmp_path / "out"), cwd=tmp_path, timeout=180)
    data = load(tmp_path / "out" / "job")
    marks = {}
    for r in (0, 1):
        bw = data.spans(PHASE_SPANS["backward"], r)
        g = data.spans(BACKWARD_GRADS_SPAN, r)
        # The first backward settles the modules, the second learns the order:
        # a mark in each one after.
        assert len(bw.ts) - 3 <= len(g.ts) <= len(bw.ts) - 2 and len(g.ts) >= 8, (r, len(bw.ts), len(g.ts))
        i = np.searchsorted(bw.ts, g.ts)
        assert (bw.ts[i] == g.ts).all() and (g.end <= bw.end[i]).all(), r
        marks[r] = (g.end - g.ts) / 1e9
    # Rank 1 sleeps in backward between the head's gradients and the body's:
    # its own gradients are ready only after the sleep, in every backward.
    assert (marks[1] >= SLEEP_S).all(), marks[1]
    # Rank 0 does not sleep: its gradients are ready long before that (DDP's
    # all-reduce, where it waits for rank 1, comes after its mark).
    assert np.median(marks[0]) < SLEEP_S / 2, marks[0]
