"""The job's traceback is its own (issue #36, item 5): an exception in
forward, in backward or in the optimizer's step or ``zero_grad``, and a
Ctrl-C (a real SIGINT) in forward, backward or the step, shows the same
frames with the anatomy on as without fastprof, since the core's wrappers
and hooks are C calls. Real torch on CPU, the real Profiler, a real
subprocess per run; the frames are compared by file and function."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

JOB = r"""
import json, os, signal, sys, time, traceback
import torch

where, profiled, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
ctrl_c = where.endswith("-sigint")
where = where.removesuffix("-sigint")


def fail(what):
    if ctrl_c:  # a real Ctrl-C: SIGINT, raised as KeyboardInterrupt where Python next runs
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    raise ValueError(what)


class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        fail("in backward")


class Opt(torch.optim.SGD):
    def step(self, closure=None):
        if where == "step":
            fail("in step")
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        if where == "zero_grad":
            fail("in zero_grad")
        return super().zero_grad(set_to_none)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = self.l(x)
        if where == "forward" and self.raise_now:
            fail("in forward")
        return Boom.apply(y) if where == "backward" and self.raise_now else y


model = Model()
model.raise_now = False
opt = Opt(model.parameters(), lr=0.1)


def train(steps):
    for i in steps:
        model.raise_now = i == 3
        opt.zero_grad() if where != "zero_grad" or i == 3 else None
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        yield i


frames = None
try:
    if profiled:
        import fastprof

        prof = fastprof.Profiler(out + "/run", "r", torch=False, sample_hz=0, merge=False)
        with prof:
            for _ in train(prof.loader(range(6))):
                prof.step()
    else:
        for _ in train(range(6)):
            pass
except (ValueError, KeyboardInterrupt) as e:
    frames = [(f.filename.split("site-packages/")[-1], f.name) for f in traceback.extract_tb(e.__traceback__)]
json.dump(frames, open(out + "/frames.json", "w"))
"""


def _frames(tmp: Path, where: str, profiled: bool) -> list[list[str]]:
    out = tmp / f"{where}-{int(profiled)}"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", JOB, where, "1" if profiled else "0", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    frames = json.loads((out / "frames.json").read_text())
    assert frames, f"no exception was raised in {where}"
    return frames


@pytest.mark.parametrize(
    "where", ["forward", "backward", "step", "zero_grad", "forward-sigint", "backward-sigint", "step-sigint"]
)
def test_an_exception_in_a_phase_shows_the_same_frames_as_without_fastprof(tmp_path: Path, where: str) -> None:
    without = _frames(tmp_path, where, profiled=False)
    with_anatomy = _frames(tmp_path, where, profiled=True)
    # The job's own frames and torch's, and none of fastprof's.
    assert not any("fastprof" in f for f, _ in with_anatomy), with_anatomy
    assert with_anatomy == without
