"""A report of a run on object storage (issue #26): ``fastprof report
s3://bucket/runs/run1``.

The traces are read where they are: the core's input walker lists the URL and
its scanner streams each object by ranged reads (``fastprof.storage.backend``), so a
report of a bucket run holds what a report of a local run holds, and nothing
is downloaded first. The run's side documents (``profiler.json``,
``triggers.json``, the memory profiling's small JSON files: kilobytes) are
copied into a temporary *view* folder laid out as the run directory is, so the
report reads them as it reads a local run's. The report's files are written
locally, then put in ``<url>/reports/`` (or left in ``--out-dir``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastprof._core import FastprofFileNotFoundError
from fastprof.recording.names import (
    LIVE_JSON,
    OOM_JSON,
    PROFILER_JSON,
    RANK_DIR,
    SEGMENT_SUFFIX,
    TRIGGERS_JSON,
    UNIFIED_TRACE,
    is_open_segment_name,
)
from fastprof.recording.names import SEGMENT as _SEGMENT
from fastprof.storage.store import Store, open_store

__all__ = ["SIDE_MAX_BYTES", "RemoteRun", "open_run", "put_reports"]

#: Side documents larger than this are not copied into the view (an allocator
#: snapshot, a torch memory timeline: no report section reads those).
SIDE_MAX_BYTES = 16 << 20


def _is_trace_name(name: str) -> bool:
    return name.endswith((".json", SEGMENT_SUFFIX)) or is_open_segment_name(name)


def _side(key: str) -> bool:
    """Whether object ``key`` (relative to the run) is a side document a
    report reads: not hidden, not the report folder, not a trace (but
    fastprof's own JSON, which has a trace's suffix, is)."""
    parts = key.split("/")
    name = parts[-1]
    if any(p.startswith(".") for p in parts) or parts[0] == "reports" or name.startswith("flight-"):
        return False
    if name in (PROFILER_JSON, TRIGGERS_JSON, LIVE_JSON, OOM_JSON):
        return True
    if "memory" in parts[:-1]:
        return name.endswith((".json", ".txt", ".yaml", ".csv"))
    return not _is_trace_name(name) and name.endswith((".json", ".txt", ".yaml"))


@dataclass
class RemoteRun:
    """A URL run: where its traces are read from (``target``: the unified
    trace when rank 0 wrote one, else the run URL), the local ``view`` of its
    side documents (None for a single trace), and its segments' URLs."""

    url: str
    store: Store
    target: str
    view: Path | None
    segments: list[str] = field(default_factory=list)


def put_reports(store: Store, folder: Path, names: list[str], base: str) -> list[str]:
    """Put a report's files (``folder/<name>``) in the store under ``base``
    (``reports`` of a run, "" for a URL given as the output), replacing an
    earlier report's; returns their URLs."""
    out = []
    for n in names:
        key = f"{base}/{n}" if base else n
        store.put(folder / n, key, rewritable=True)
        out.append(store.url_of(key))
    return out


@contextlib.contextmanager
def open_run(url: str) -> Iterator[RemoteRun]:
    """The :class:`RemoteRun` of ``url``, its view removed afterwards.
    Raises :class:`fastprof.FastprofFileNotFoundError` naming the URL when
    nothing is there, and the store's one-line :class:`fastprof.ConfigError`
    when its protocol's extra is missing."""
    url = url.rstrip("/")
    store = open_store(url, what="input")
    info = store.info("")
    if info is not None:  # one object: a trace read alone
        yield RemoteRun(url, store, url, None)
        return
    keys = store.list("")
    if not keys:
        raise FastprofFileNotFoundError(2, "no such file or directory (nothing stored under this URL)", url)
    view = Path(tempfile.mkdtemp(prefix="fastprof-view-"))
    try:
        segments = []
        for key in keys:
            parts = key.split("/")
            if _SEGMENT.match(parts[-1]) and RANK_DIR.match(parts[0]):
                segments.append(store.url_of(key))
            elif _side(key):
                meta = store.info(key)
                if meta is None:
                    continue  # gone since the listing (a live run's live.json, removed at its end)
                if int(meta.get("size") or 0) <= SIDE_MAX_BYTES:
                    dest = view / key
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        with store.open(key) as src, open(dest, "wb") as dst:
                            shutil.copyfileobj(src, dst, 1 << 20)
                    except FileNotFoundError:
                        dest.unlink(missing_ok=True)  # gone between the two requests: as if never listed
        # Rank folders with nothing copied still exist in the view (as locally).
        for key in keys:
            first = key.split("/")[0]
            if RANK_DIR.match(first) and "/" in key:
                (view / first).mkdir(exist_ok=True)
        target = store.url_of(UNIFIED_TRACE) if UNIFIED_TRACE in keys else url
        yield RemoteRun(url, store, target, view, segments)
    finally:
        shutil.rmtree(view, ignore_errors=True)


def open_url(url: str) -> Any:
    """A binary file object reading ``url`` by ranged reads."""
    return open_store(url, what="input").open("")
