"""Atomic writes for the memory outputs: a temporary name, then a rename."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic(path: Path) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` when the block ends without error,
    written through ``.NAME.tmp-PID`` in the same folder (created if missing).

    The rename is atomic on one file system, so a reader sees the old file or
    the whole new one; a failed write (full disk) leaves no half-written file.
    The temporary name follows every fastprof output's (``.tmp-PID`` last),
    which readers and merges skip.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic`."""
    with atomic(path) as f:
        f.write(text.encode("utf-8"))
    return path
