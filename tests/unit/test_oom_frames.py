"""Which frame names a live allocation in oom.json's ``largest`` groups.

Seen on an H200 with torch 2.11: even with Python stacks, a block's frames
begin with C++ frames (``??:0 in torch::unwind::unwind()``), and every block
was grouped under that one frame. Only Python files outside torch and
fastprof may name a group."""

from __future__ import annotations

from pathlib import Path

import fastprof
from fastprof.memory.oom import largest_live

FASTPROF_FILE = str(Path(fastprof.__file__).parent / "profiler" / "anatomy.py")


def block(size: int, frames: list[tuple[str, int, str]]) -> dict:
    return {
        "state": "active_allocated",
        "size": size,
        "frames": [{"filename": f, "line": ln, "name": n} for f, ln, n in frames],
    }


def test_cpp_torch_and_fastprof_frames_never_name_a_group() -> None:
    cpp = [("??", 0, "torch::unwind::unwind()"), ("/build/c10/cuda/CUDACachingAllocator.cpp", 1200, "malloc")]
    torch_py = ("/site-packages/torch/nn/modules/linear.py", 125, "forward")
    ours = (FASTPROF_FILE, 300, "_post")
    snap = {
        "segments": [
            {
                "blocks": [
                    block(256 << 20, [*cpp, torch_py, ("/job/train.py", 10, "forward"), ours]),
                    block(256 << 20, [*cpp, torch_py, ("/job/train.py", 10, "forward")]),
                    block(64 << 20, [*cpp, ours, ("<string>", 3, "<module>")]),
                    block(1 << 20, cpp),
                    {"state": "inactive", "size": 1 << 30, "frames": []},
                ]
            }
        ]
    }
    groups, with_frames = largest_live(snap)
    assert with_frames
    assert [(g["where"], g["bytes"], g["blocks"]) for g in groups] == [
        ("/job/train.py:10 in forward", 512 << 20, 2),
        ("<string>:3 in <module>", 64 << 20, 1),
        (f"(no Python frame; block of {1 << 20} B)", 1 << 20, 1),
    ]
