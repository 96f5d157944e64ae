"""The end of a Profiler's run, on each rank: ``rank{R}/profiler.json``, the
done marker (a file and a key in the process group's store), and rank 0's
wait for the other ranks and merge into ``<run>/trace.json.gz``; the
``fastprof merge`` command that redoes that merge from what is on disk.
Called by :meth:`fastprof.Profiler.stop` (``Profiler.close``) once the
recorder has stopped, with the Profiler as a
:class:`fastprof._loop_api.RunEndHost`."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from fastprof import _core, _dist
from fastprof._core import FastprofWarning
from fastprof._loop_api import LoopHost, RunEndHost
from fastprof.readers.merge import merge
from fastprof.recording.names import DONE_MARKER, PROFILER_JSON, RANK_DIR, UNIFIED_TRACE
from fastprof.storage.spool import Spool, bounded, say, upload_command

__all__ = ["finish", "merge_command", "update_rotation", "write_summary"]


def write_summary(prof: RunEndHost) -> None:
    """Write ``rank{R}/profiler.json``: the Profiler's account of the run."""
    summary = {
        "version": _core.__version__,
        **prof.account(),
        "rotation": _rotation(prof),
        # How the run ended: "stop", "exception: <type>", "exit" or "SIGTERM".
        "exit": prof.exit_reason or "stop",
    }
    spool = prof.recorder.spool
    if spool is not None:
        # So far; rewritten with the final account once every file is sent.
        summary["upload"] = spool.stats()
    _write_json(prof.rank_dir, summary)


def update_rotation(prof: LoopHost) -> None:
    """``fastprof run``'s Profiler, once its recorder stopped: the script's
    own Profiler wrote ``profiler.json`` while that recorder still recorded,
    so its ``rotation`` could not yet say what the disk cap deleted."""
    path = prof.rank_dir / PROFILER_JSON
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # none written (the script's Profiler failed): nothing to bring up to date
    if isinstance(summary, dict):
        summary["rotation"] = _rotation(prof)
        _write_json(prof.rank_dir, summary)


def _write_json(rank_dir: Path, summary: dict[str, Any]) -> None:
    rank_dir.mkdir(parents=True, exist_ok=True)
    tmp = rank_dir / f".{PROFILER_JSON}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(summary, indent=1, default=str))
        os.replace(tmp, rank_dir / PROFILER_JSON)
    finally:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file


def _rotation(prof: LoopHost) -> dict[str, Any]:
    """The disk cap and what it deleted of this rank's files: segments, and
    flight dumps and torch windows (``files_deleted``), known once the
    recorder has stopped (``recorder_stopped`` says whether it had)."""
    o = prof.recorder.options
    stats = prof.recorder.stats
    led = (stats.rotated if stats is not None else None) or {}
    return {
        "max_disk": o.max_disk,
        "keep_segments": o.keep_segments,
        "recorder_stopped": stats is not None,
        "segments_deleted": int(led.get("segments", 0)),
        "bytes_deleted": int(led.get("bytes", 0)),
        "events_deleted": int(led.get("events", 0)),
        "files_deleted": int(led.get("files", 0)),
        "files_bytes_deleted": int(led.get("files_bytes", 0)),
        # Trace time (µs from the segments' baseTimeNanoseconds) of what they held.
        "ts_start": led.get("ts_start"),
        "ts_end": led.get("ts_end"),
        "deleted": led.get("deleted", []),
    }


def finish(prof: RunEndHost, wait: bool = True, merged: bool = True) -> None:
    """Say this rank is done; rank 0 waits for the others and merges.
    ``wait=False`` (a way out that is not a normal end): rank 0 merges only
    when every rank is already done, else says how to merge later;
    ``merged=False``: nothing is merged.

    With ``out_dir`` a URL, this rank's files go to the store first (within
    ``upload_timeout``), then the rank says it is done (the done object in
    the store, and the process group's key), and rank 0 merges from the
    store and puts the unified trace there."""
    spool = prof.recorder.spool if prof.owns_recorder else None
    if spool is not None:
        result = spool.finish(amend=lambda account: _amend_upload(prof, account))
        if prof.recorder.stats is not None:
            prof.recorder.stats.upload = result
    if prof.rank_dir.is_dir():  # a URL run's rank folder is gone once all of it is in the store
        (prof.rank_dir / DONE_MARKER).write_text(str(os.getpid()))
    world = int(prof.recorder.options.world_size)
    store = _dist.default_store()
    key = f"fastprof/{prof.recorder.options.run_name}/done/"
    if store is not None:
        try:
            store.set(key + str(prof.rank), "1")
        except Exception:  # noqa: BLE001 - the store may already be gone; marker files remain
            store = None
    if not prof.merge_enabled or not prof.owns_recorder or prof.rank != 0 or not merged:
        return
    missing = _wait_for_ranks(prof, world, store, key, prof.merge_timeout if wait else 0.0)
    run_url = prof.recorder.options.run_url if spool is not None else None
    where: Path | str = prof.run_dir if run_url is None else run_url
    if missing and not wait:
        print(
            f"fastprof: rank(s) {', '.join(map(str, missing))} not done at {prof.exit_reason}; "
            f"build the unified trace when they are with: {merge_command(where)}",
            file=sys.stderr,
        )
        return
    if missing:
        warnings.warn(
            f"fastprof: rank(s) {', '.join(map(str, missing))} did not finish within "
            f"{prof.merge_timeout:g} s (merge_timeout); the unified trace holds the others. "
            f"Redo it later with: {merge_command(where)}",
            FastprofWarning,
            stacklevel=4,
        )
    if spool is not None and run_url is not None:
        _merge_in_store(prof, spool, run_url)
        return
    inputs = _merge_inputs(prof.run_dir)
    if not inputs:
        return
    out = prof.run_dir / UNIFIED_TRACE
    prof.merge_summary = merge(inputs, out, force=True)
    prof.trace_path = out


def _amend_upload(prof: RunEndHost, account: dict[str, Any]) -> Path | None:
    """``profiler.json`` with the final upload account (sent again)."""
    path = prof.rank_dir / PROFILER_JSON
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    summary["upload"] = {k: v for k, v in account.items() if k != "spool"}
    _write_json(prof.rank_dir, summary)
    return path


def _merge_in_store(prof: RunEndHost, spool: Spool, run_url: str) -> None:
    """Rank 0 of a URL run: merge every rank's files from the store (ranged
    reads, not downloads) into the spool, put ``<run_url>/trace.json.gz``,
    and free the spool of it. A store that fails leaves the trace in the
    spool, said with the command that sends it."""
    store = spool.open()
    if store is None:
        return
    run_name = prof.recorder.options.run_name
    try:
        keys = bounded(lambda: store.list(run_name), spool.upload_timeout, f"listing {run_url}")
    except Exception as e:  # noqa: BLE001 - profiling never takes the job down
        warnings.warn(
            f"fastprof: could not list {run_url} to merge it ({type(e).__name__}: {e}); "
            f"merge it later with: {merge_command(run_url)}",
            FastprofWarning,
            stacklevel=5,
        )
        return
    ranks = sorted({k.split("/")[1] for k in keys if k.count("/") >= 2 and RANK_DIR.match(k.split("/")[1])})
    if not ranks:
        return
    prof.run_dir.mkdir(parents=True, exist_ok=True)
    out = prof.run_dir / UNIFIED_TRACE
    prof.merge_summary = merge([f"{run_url}/{r}" for r in ranks], out, force=True)
    why = spool.put(out, f"{run_name}/{UNIFIED_TRACE}", rewritable=True)
    if why is None:
        out.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            prof.run_dir.rmdir()  # only when empty: other local ranks' folders stay
        prof.trace_url = f"{run_url}/{UNIFIED_TRACE}"
        prof.trace_path = None
        return
    prof.trace_path = out
    say(
        f"the unified trace could not be sent to {run_url} ({why}); it is in {out}; send it with: "
        f"{upload_command(prof.run_dir, spool.out_url)}"
    )


def _wait_for_ranks(prof: LoopHost, world: int, store: Any, key: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    pending = set(range(world)) - {prof.rank}
    spool = prof.recorder.spool
    remote = spool.open() if spool is not None else None
    run_name = prof.recorder.options.run_name
    next_look = 0.0  # the store's done objects: looked at once a second, not every 50 ms
    while pending:
        look = remote is not None and time.monotonic() >= next_look
        if look:
            next_look = time.monotonic() + 1.0
        for r in sorted(pending):
            done = (prof.run_dir / f"rank{r}" / DONE_MARKER).exists()
            if not done and store is not None:
                try:
                    done = bool(store.check([key + str(r)]))
                except Exception:  # noqa: BLE001
                    store = None
            if not done and look and remote is not None:
                key_r = f"{run_name}/rank{r}/{DONE_MARKER}"
                try:
                    done = bounded(functools.partial(remote.exists, key_r), 5.0, "the done object")
                except Exception:  # noqa: BLE001 - the store is down: the wait ends at its timeout
                    done = False
            if done:
                pending.discard(r)
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return sorted(pending)


def _merge_inputs(run_dir: Path) -> list[str]:
    """Every trace under the run's rank directories, as the core's input
    walker finds them (the CLI merge, the columns and the reports use the
    same): fastprof segments (also a crashed rank's open ``.part``), torch
    windows, DataLoader workers; never ``profiler.json``, memory timelines,
    hidden or temporary files."""
    ranks = [str(d) for d in sorted(run_dir.glob("rank*")) if d.is_dir()]
    if not ranks:
        return []
    files, _own, _removed, _warnings = _core.trace_inputs(ranks)
    return list(files)


def merge_command(run_dir: Path | str) -> str:
    """The ``fastprof merge`` command line that builds ``run_dir``'s unified
    trace from what is there now, or later once other ranks add theirs (the
    core's input walker skips ``profiler.json``, reports and temporary files).
    A URL run's (``s3://.../run``) reads and writes the store."""
    q = shlex.quote
    out = f"{str(run_dir).rstrip('/')}/{UNIFIED_TRACE}" if isinstance(run_dir, str) else str(run_dir / UNIFIED_TRACE)
    return f"fastprof merge {q(str(run_dir))} -o {q(out)} --force"
