"""The anatomy's collectives keep one sequence per process group, however the
group is given (issue #35, item 6): ``all_reduce(t, op, group)`` passes it by
position, and was counted as the default group's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fastprof
from conftest import free_port

JOB = """
import sys
import torch
import torch.distributed as dist
import fastprof
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
sub = dist.new_group([0])
t = torch.ones(4)
prof = fastprof.Profiler(sys.argv[1], "g", torch=False, sample_hz=0)
with prof:
    for i in range(3):
        dist.all_reduce(t)                                   # the default group
        dist.all_reduce(t, dist.ReduceOp.SUM, sub)           # a group by position
        dist.broadcast(t, 0, group=sub)                      # a group by keyword
        prof.step()
dist.destroy_process_group()
"""


def test_a_group_given_by_position_has_its_own_sequence(pyscript: Any, tmp_path: Path) -> None:
    r = pyscript.run(JOB, str(tmp_path / "runs"), str(free_port()), timeout=120)
    assert r.returncode == 0, r.stderr
    doc = fastprof.read_trace(next((tmp_path / "runs" / "g" / "rank0").glob("fastprof.*.json.gz")))
    comms = [e for e in doc["traceEvents"] if e.get("name") == "phase.communication" and e.get("ph") == "X"]
    seqs = [(e["args"]["op"], e["args"]["seq"]) for e in sorted(comms, key=lambda e: e["ts"])]
    # Per step: the default group's all_reduce, then the subgroup's all_reduce and broadcast.
    assert seqs == [
        ("all_reduce", 1),
        ("all_reduce", 1),
        ("broadcast", 2),
        ("all_reduce", 2),
        ("all_reduce", 3),
        ("broadcast", 4),
        ("all_reduce", 3),
        ("all_reduce", 5),
        ("broadcast", 6),
    ], json.dumps(seqs)
