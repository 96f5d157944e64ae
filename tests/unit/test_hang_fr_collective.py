"""A collective torch runs in C++ inside backward (DDP's gradient
all-reduce) in a rank's summary (issue #37): not in the Python stack, taken
from torch's Flight Recorder entries (the last one scheduled and not
retired) when the training thread is in backward; never otherwise."""

from __future__ import annotations

import os
from typing import Any

from fastprof.profiler.drivers.hang.verdict import summarize

TORCH = os.path.join(os.sep, "venv", "site-packages", "torch")
USER = os.path.join(os.sep, "job", "train.py")


def _evidence(frames: list[dict[str, Any]], entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "threads": [{"ident": 1, "training": True, "frames": frames}],
        "flight_recorder": {"entries": entries},
    }


BACKWARD = [
    {"file": os.path.join(TORCH, "autograd", "graph.py"), "line": 1113, "function": "_engine_run_backward"},
    {"file": os.path.join(TORCH, "autograd", "__init__.py"), "line": 360, "function": "backward"},
    {"file": os.path.join(TORCH, "_tensor.py"), "line": 630, "function": "backward"},
    {"file": USER, "line": 24, "function": "<module>"},
]


def _entry(seq: int, retired: bool, name: str = "gloo:all_reduce") -> dict[str, Any]:
    return {"collective_seq_id": seq, "profiling_name": name, "retired": retired, "is_p2p": False}


def test_a_pending_entry_in_backward_is_the_ranks_collective() -> None:
    s = summarize(_evidence(BACKWARD, [_entry(10, True), _entry(11, False)]), 1)
    assert s["phase"] == "backward"
    assert s["collective"] == {
        "op": "all_reduce",
        "site": {"file": USER, "line": 24, "function": "<module>"},
        "seq": 11,
        "source": "flight_recorder",
    }


def test_no_pending_entry_or_not_in_backward_is_no_collective() -> None:
    assert summarize(_evidence(BACKWARD, [_entry(10, True)]), 1)["collective"] is None
    assert summarize(_evidence(BACKWARD, []), 1)["collective"] is None
    elsewhere = [{"file": USER, "line": 16, "function": "__getitem__"}]
    assert summarize(_evidence(elsewhere, [_entry(11, False)]), 1)["collective"] is None
