"""The core's ``__call__`` and Dynamo (issue #35, the anatomy's cost; #36,
item 5): an outermost module is timed by a C function that Dynamo cannot
trace, so Dynamo is given a Python stand-in that passes through. A
function compiled with ``fullgraph=True`` around the timed model compiles
in one graph; where Dynamo is first imported after the modules were
learnt, the class's ``__call__`` becomes the Python one, which Dynamo
traces. Real torch on CPU, a fresh interpreter per case (whether Dynamo is
imported is the point)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

JOB = r"""
import json, sys
import torch
import fastprof

out, optimizer = sys.argv[1], sys.argv[2] == "1"
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
# torch.optim's optimizers import Dynamo when made.
opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer else None
seen = {}
prof = fastprof.Profiler(out + "/run", "r", torch=False, sample_hz=0, merge=False)
with prof:
    for i in prof.loader(range(8)):
        if i == 4:
            seen["dynamo_before"] = "torch._dynamo" in sys.modules
            seen["call"] = type(vars(torch.nn.Sequential).get("__call__")).__name__
            import torch._dynamo
            from torch._dynamo.utils import counters

            counters.clear()
            step = torch.compile(lambda x: model(x).sum() * 2, backend="eager", fullgraph=True)
            seen["compiled"] = float(step(torch.ones(2, 4)))
            seen["eager"] = float(model(torch.ones(2, 4)).sum() * 2)
            seen["breaks"] = sum(counters["graph_break"].values())
            seen["call_after"] = type(vars(torch.nn.Sequential).get("__call__")).__name__
        loss = model(torch.ones(2, 4)).sum()
        if optimizer:
            loss.backward()
            opt.step()
            opt.zero_grad()
        prof.step()
seen["status"] = json.load(open(prof.rank_dir / "profiler.json"))["anatomy"]
json.dump(seen, open(out + "/seen.json", "w"))
"""


def _run(tmp: Path, optimizer: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp), "1" if optimizer else "0"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "graph break" not in p.stderr.lower(), p.stderr[-3000:]
    seen: dict[str, object] = json.loads((tmp / "seen.json").read_text())
    return seen


def test_with_dynamo_loaded_the_core_call_compiles_in_one_graph(tmp_path: Path) -> None:
    # torch's optimizer step imports Dynamo: by the learning's end it is loaded.
    seen = _run(tmp_path, optimizer=True)
    assert seen["dynamo_before"] is True
    assert seen["call"] == "instancemethod"  # the core's C function, bound like a method
    assert seen["breaks"] == 0 and seen["compiled"] == seen["eager"]
    assert "1 by their class's __call__" in str(seen["status"]), seen["status"]


def test_dynamo_imported_after_the_learning_gets_the_python_call(tmp_path: Path) -> None:
    # No optimizer (making one imports Dynamo): the learning ends after 3
    # steps, before Dynamo is imported.
    seen = _run(tmp_path, optimizer=False)
    assert seen["dynamo_before"] is False
    assert seen["call"] == "instancemethod"
    assert seen["call_after"] == "function"  # swapped as Dynamo was imported
    assert seen["breaks"] == 0 and seen["compiled"] == seen["eager"]


COMPILED_FIRST = r"""
import json, sys
import torch
import fastprof
from torch._dynamo.utils import counters

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model, backend="eager")
prof = fastprof.Profiler(sys.argv[1] + "/run", "r", torch=False, sample_hz=0, merge=False)
with prof:
    for i in prof.loader(range(6)):
        compiled(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
json.dump(
    {"breaks": dict(counters["graph_break"]), "status": json.load(open(prof.rank_dir / "profiler.json"))["anatomy"]},
    open(sys.argv[1] + "/seen.json", "w"),
)
"""


def test_a_model_compiled_before_the_learning_traces_no_learning_hook(tmp_path: Path) -> None:
    """The learning's global hooks fire inside Dynamo's trace of a compiled
    module's first call; they step aside there (no graph break), and the
    compiled module is learnt and timed from outside its compiled call."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", COMPILED_FIRST, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["breaks"] == {}, seen["breaks"]
    assert "1 outermost modules timed" in seen["status"], seen["status"]


USER_HOOK = r"""
import sys
import torch
if sys.argv[2] == "1":  # the job's own global hook: torch's warning is the job's to see
    torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
"""


@pytest.mark.parametrize("own_hook", [False, True], ids=["anatomy-only", "the-jobs-own-global-hook"])
def test_torch_warns_of_global_hooks_only_for_the_jobs_own(tmp_path: Path, own_hook: bool) -> None:
    """torch warns at each call of a ``torch.compile(module)`` while a global
    module hook exists; the anatomy's learning hooks are not the job's: no
    warning for them (issue #36, item 5). A global hook of the job's own
    still gets torch's warning."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    job = USER_HOOK + COMPILED_FIRST
    p = subprocess.run(
        [sys.executable, "-W", "default", "-c", job, str(tmp_path), "1" if own_hook else "0"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert ("when there are global hooks" in p.stderr) is own_hook, p.stderr[-3000:]
    assert "1 outermost modules timed" in json.loads((tmp_path / "seen.json").read_text())["status"]
