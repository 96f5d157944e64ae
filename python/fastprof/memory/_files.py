"""Atomic text writes for the memory outputs: a temporary name, then a rename."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through ``.NAME.tmp-PID`` in the same folder.

    The rename is atomic on one file system, so a reader sees the old file or
    the whole new one; a failed write (full disk) leaves no half-written file.
    The temporary name follows every fastprof output's (``.tmp-PID`` last),
    which readers and merges skip.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
