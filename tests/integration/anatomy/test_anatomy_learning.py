"""The anatomy's learning of the outermost modules ends on its own, and what
it leaves out is counted in its status (issue #35, item 6).

Global forward hooks learn which modules the training thread calls at depth
0; they send every module call down torch's slow path, so they must go. They
went at the first ``torch.optim`` step or after 64 depth-0 calls, but the
calls were counted only while fewer than 16 modules had been seen: a job with
16 or more outermost modules and no ``torch.optim`` step kept them for the
whole run. Real torch on CPU, the real Profiler; profiler.json read back."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fastprof

torch = pytest.importorskip("torch")


def _global_hooks() -> tuple[int, int]:
    from torch.nn.modules import module as m

    return len(m._global_forward_pre_hooks), len(m._global_forward_hooks)


def _forward_spans(trace: Path | None) -> list[dict[str, Any]]:
    assert trace is not None
    with gzip.open(trace, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("name") == "phase.forward" and e.get("ph") == "X"]


def _status(prof: fastprof.Profiler) -> str:
    return str(json.loads((prof.rank_dir / "profiler.json").read_text())["anatomy"])


def test_twenty_outermost_modules_and_no_optimizer_step_lose_the_global_hooks(tmp_path: Path) -> None:
    mods = [torch.nn.Linear(4, 4) for _ in range(20)]
    before = _global_hooks()
    during: list[tuple[int, int]] = []
    prof = fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0)
    with prof:
        for _ in prof.loader(range(8)):
            with torch.no_grad():  # a job that updates its weights by hand, with no torch.optim step
                for mod in mods:
                    mod(torch.ones(1, 4))
            during.append(_global_hooks())
            prof.step()
    # On for a bounded while (learning), then gone while the job still runs.
    assert during[0] != before and during[-1] == before, during
    status = _status(prof)
    assert "forward: 16 outermost modules timed" in status, status
    assert "4 outermost modules (4 over the 16 timed, 0 refusing a timer)" in status, status
    # Every depth-0 call is a span while learning; after, the 16 timed modules' only.
    assert len(_forward_spans(prof.trace_path)) < 8 * 20


def test_one_module_and_no_optimizer_step_settles_after_a_few_steps(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    before = _global_hooks()
    during: list[tuple[int, int]] = []
    prof = fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0)
    with prof:
        for _ in prof.loader(range(10)):
            model(torch.ones(1, 4)).sum().backward()
            during.append(_global_hooks())
            prof.step()
    assert during[-1] == before, during  # 10 depth-0 calls: fewer than the 64 that settled it before
    status = _status(prof)
    assert "forward: 1 outermost modules timed (" in status, status
    assert "settled after 3 steps without an optimizer step" in status, status
    assert len(_forward_spans(prof.trace_path)) == 10  # one per step, while learning and after


def test_a_run_that_ends_while_learning_says_so(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    before = _global_hooks()
    prof = fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0)
    with prof:
        for _ in prof.loader(range(1)):
            model(torch.ones(1, 4))
            prof.step()
    assert "forward: still learning the outermost modules" in _status(prof)
    assert _global_hooks() == before  # the global hooks go at stop, learning or not


BAD_GROUP = """
import sys, torch, torch.distributed as dist, fastprof
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
prof = fastprof.Profiler(sys.argv[1], "run", torch=False, sample_hz=0, sync_clocks=False)
with prof:
    for x in prof.loader([torch.ones(4)] * 3):
        dist.all_reduce(x)
        try:
            dist.all_reduce(x, group="not a group")  # the job's own mistake, which it catches
        except Exception as e:
            print("caught", type(e).__name__, flush=True)
        prof.step()
dist.destroy_process_group()
"""


def test_a_phase_the_host_could_not_record_is_counted_in_the_status(tmp_path: Path) -> None:
    """A collective given a bad group raises into the job, and the anatomy
    cannot read the group's size for its span: the span is left out and
    counted, with the first failure, where it was dropped in silence."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", BAD_GROUP, str(tmp_path), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("caught") == 3
    status = json.loads((tmp_path / "run" / "rank0" / "profiler.json").read_text())["anatomy"]
    assert "left out: 3 phases (host failures) (first: " in status, status
    with gzip.open(tmp_path / "run" / "trace.json.gz", "rt") as f:
        comm = [e for e in json.load(f)["traceEvents"] if e.get("name") == "phase.communication"]
    assert len(comm) == 3  # the good all_reduce of each step
