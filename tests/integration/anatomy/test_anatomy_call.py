"""How the anatomy times an outermost module once it has learnt them (issue
#35, the anatomy's cost): by the module's class's ``__call__``, which keeps
torch's fast call path (a forward hook sends every call of the module down
the slow one), and never changes what a module computes: not in a copy or a
DataParallel replica (which copy the module's ``__dict__``), not under
``torch.compile`` or ``torch.export``. Real torch on CPU, the real Profiler."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

import fastprof

torch = pytest.importorskip("torch")


def _forward_spans(trace: Path | None) -> int:
    assert trace is not None
    with gzip.open(trace, "rt") as f:
        return sum(1 for e in json.load(f)["traceEvents"] if e.get("name") == "phase.forward" and e.get("ph") == "X")


def _status(prof: fastprof.Profiler) -> str:
    return str(json.loads((prof.rank_dir / "profiler.json").read_text())["anatomy"])


def _train(prof: fastprof.Profiler, model: Any, steps: int, at: int, check: Any) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with prof:
        for i in prof.loader(range(steps)):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            if i == at:
                check()
            prof.step()


def test_a_replica_or_a_copy_of_an_outermost_module_computes_with_its_own_parameters(tmp_path: Path) -> None:
    """DataParallel's replicas share the module's ``__dict__`` entries but not
    its parameters: an attribute set on the instance would run the original's
    forward in each replica. The class's ``__call__`` is called with the
    replica itself."""
    model = torch.nn.Linear(4, 2)
    seen: dict[str, Any] = {}

    def check() -> None:
        assert "__call__" in vars(torch.nn.Linear)  # timed by its class's __call__
        x = torch.ones(1, 4)
        replica = model._replicate_for_data_parallel()  # what DataParallel makes for each device
        replica.weight = torch.zeros(2, 4)  # as replicate() gives each its device's parameters
        replica.bias = torch.full((2,), 7.0)
        seen["replica"] = replica(x)
        shallow = copy.copy(model)
        shallow.training = False
        seen["shallow"], seen["model"] = shallow(x), model(x)
        seen["deep"] = copy.deepcopy(model)(x)

    _train(fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0), model, 5, 2, check)
    assert torch.equal(seen["replica"], torch.full((1, 2), 7.0))
    assert torch.equal(seen["shallow"], seen["model"]) and torch.equal(seen["deep"], seen["model"])
    assert "__call__" not in vars(torch.nn.Linear)  # undone at stop


def test_a_class_with_instances_inside_its_outermost_module_is_timed_by_hooks(tmp_path: Path) -> None:
    """A Sequential of Sequentials: a ``__call__`` on the class would be paid
    by every inner one, so the outermost gets a hook pair instead."""
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.nn.Linear(4, 2))
    hooked: list[int] = []
    prof = fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0)
    _train(prof, model, 5, 2, lambda: hooked.append(len(model._forward_pre_hooks)))
    assert hooked == [1] and "__call__" not in vars(torch.nn.Sequential)
    assert "forward: 1 outermost modules timed (0 by their class's __call__, 1 by hooks)" in _status(prof)
    assert _forward_spans(prof.trace_path) == 5


def test_compile_and_export_after_the_learning_see_no_graph_break_from_the_timer(tmp_path: Path) -> None:
    """Dynamo reads ``torch.compiler.is_dynamo_compiling()`` as True: the
    class's ``__call__`` passes through while it traces, and the compiled
    module's calls are still timed from outside."""
    from torch._dynamo.utils import counters

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0)
    with prof:
        for i in prof.loader(range(6)):
            if i == 3:  # learnt (settled at the first optimizer step): compile in place, and export
                counters.clear()
                model.compile(backend="eager")
                exported = torch.export.export(model, (torch.ones(2, 4),), strict=True)
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
        breaks = sum(counters["graph_break"].values())
    assert breaks == 0, dict(counters["graph_break"])
    assert torch.equal(exported.module()(torch.ones(2, 4)), model(torch.ones(2, 4)))
    assert _forward_spans(prof.trace_path) == 6  # the compiled calls too
