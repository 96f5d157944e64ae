"""``fastprof.merge``: the Python face of the Rust merger."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastprof import _core

#: Most worker threads a merge takes (the core's ``merge::MAX_THREADS``).
MAX_THREADS = 256


def merge(
    inputs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    force: bool = False,
    ranks: Sequence[int] | None = None,
    start: float | None = None,
    end: float | None = None,
    steps: tuple[int, int] | None = None,
    include_categories: Sequence[str] = (),
    exclude_categories: Sequence[str] = (),
    max_bytes: int | None = None,
    threads: int = 0,
    compression_level: int = 1,
    progress: bool = False,
) -> dict[str, Any]:
    """Merge fastprof segments, torch.profiler traces and every rank into one
    timeline at ``output`` (gzip unless it ends in ``.json``).

    ``inputs``: files, directories (searched recursively) or glob patterns.
    ``start``/``end``: seconds from the start of the merged timeline;
    ``steps=(a, b)``: steps a..b inclusive by step markers (torch
    ``ProfilerStep#N`` or fastprof ``step`` spans). ``max_bytes`` bounds the
    uncompressed output by dropping low-value categories first
    (python_function first); what was dropped is in the output's
    ``otherData.max_bytes``. Runs in Rust with the GIL released, in constant
    memory; Ctrl-C interrupts it (``KeyboardInterrupt``, nothing written).
    Returns the summary; salvaged inputs and dropped malformed events emit a
    :class:`fastprof.FastprofWarning` naming the file and offset. Raises
    :class:`fastprof.NoEventsError` when no event is left to write (no trace
    files, only previous merge outputs, everything filtered out); no file is
    written then.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= MAX_THREADS:
        raise _core.ConfigError(f"threads={threads!r}: expected 0 (one per core) or 1..{MAX_THREADS}")
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    summary: dict[str, Any] = _core.merge(
        [os.fspath(p) for p in inputs],
        os.fspath(output),
        force=force,
        ranks=list(ranks) if ranks is not None else None,
        start=start,
        end=end,
        steps=steps,
        include_categories=list(include_categories),
        exclude_categories=list(exclude_categories),
        max_bytes=max_bytes,
        threads=threads,
        compression_level=compression_level,
        progress=progress,
    )
    for message in summary["warnings"]:
        warnings.warn(message, _core.FastprofWarning, stacklevel=2)
    return summary


def describe_rotated(e: Mapping[str, Any], timeline: str) -> str:
    """One line for a rank's deletions, as the report and the merge print
    them; ``start_s``/``end_s`` are seconds from the start of ``timeline``."""
    parts = []
    if e["segments"] or not e.get("files"):
        parts.append(f"{e['segments']} segment(s) ({e['bytes'] / 1e6:.1f} MB, {e['events']} events)")
    if e.get("files"):
        parts.append(f"{e['files']} flight dump(s) and torch window(s) ({e.get('files_bytes', 0) / 1e6:.1f} MB)")
    text = f"rank {e['rank']}: the disk cap deleted {' and '.join(parts)} while recording"
    if e["segments"] and e.get("start_s") is not None and e.get("end_s") is not None:
        text += (
            f"; the time the segments held, {e['start_s']:+.3f} s to {e['end_s']:+.3f} s from the start of "
            f"{timeline}, is missing"
        )
    return text
