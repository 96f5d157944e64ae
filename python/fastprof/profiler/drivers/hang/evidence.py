"""One rank's evidence, gathered by the interpreter (the watchdog's event
was claimed): every thread's stack from ``sys._current_frames()`` with its
name, the step clock the watchdog measured, the collective wavefront, the
DataLoader workers (each live recorded worker asked for its own stack) and
torch's Flight Recorder entries. Written as ``rank{R}/hang-<n>.json`` (see
:mod:`.verdict`)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing.process
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from fastprof.profiler import collectives
from fastprof.profiler.drivers.hang.verdict import summarize, worker_where
from fastprof.profiler.workers import STACKS_FILE, WORKER_STACK_SIGNAL

__all__ = ["gather", "write"]

#: fastprof's own package folder: a signal handler's frames in it are not the job's.
FASTPROF_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep
#: A recorded DataLoader worker's folder: ``<loader>-w<id>-pid<pid>`` (profiler/workers.py).
_WORKER_DIR = re.compile(r"^(.*)-w(\d+)-pid(\d+)$")
#: Frames kept per thread (innermost first).
MAX_FRAMES = 200
#: Flight Recorder entries kept (the most recent).
MAX_FR_ENTRIES = 64
#: How long the evidence waits for the DataLoader workers' stacks, seconds.
WORKER_STACKS_WAIT_S = 2.0
#: faulthandler's text: a thread's header and a frame's line.
_DUMP_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_DUMP_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def _frames(frame: FrameType | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        out.append({"file": code.co_filename, "line": frame.f_lineno, "function": code.co_name})
        frame = frame.f_back
    return out


def threads(training: int | None, here: bool = False) -> list[dict[str, Any]]:
    """Every thread's stack, innermost frame first; the caller's own only
    with ``here`` (a signal handler on the training thread), without the
    handler's fastprof frames on top of what the signal interrupted."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        frames = _frames(frame)
        if ident == me:
            if not here:
                continue
            while frames and (FASTPROF_DIR in frames[0]["file"] or frames[0]["file"] == signal.__file__):
                frames.pop(0)
        out.append(
            {
                "id": f"0x{ident:016x}",
                "ident": ident,
                "name": names.get(ident),
                "training": ident == training,
                "frames": frames,
            }
        )
    return out


def _recorded_workers(rank_dir: Path | None) -> dict[int, tuple[str, int, Path]]:
    """pid -> (loader, worker id, folder) of the DataLoader workers this
    rank's Profiler recorded (``rank{R}/workers/<loader>-w<id>-pid<pid>/``):
    a started Process no longer says its target."""
    out: dict[int, tuple[str, int, Path]] = {}
    if rank_dir is None:
        return out
    with contextlib.suppress(OSError):
        for d in (rank_dir / "workers").iterdir():
            m = _WORKER_DIR.match(d.name)
            if m:
                out[int(m.group(3))] = (m.group(1), int(m.group(2)), d)
    return out


def parse_dump(text: str) -> list[dict[str, Any]]:
    """``faulthandler``'s text as threads (``id``, ``current``, ``frames``
    innermost first: ``file``, ``line``, ``function``); lines it does not
    know are skipped."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _DUMP_THREAD.match(line.strip())
        if m:
            out.append({"id": m.group(2), "current": m.group(1) == "Current thread", "frames": []})
            continue
        f = _DUMP_FRAME.match(line)
        if f and out:
            out[-1]["frames"].append({"file": f.group(1), "line": int(f.group(2)), "function": f.group(3).strip()})
    return out


def ask_stacks(folders: dict[int, Path], wait: float = WORKER_STACKS_WAIT_S) -> dict[int, list[dict[str, Any]]]:
    """Each worker's threads (:func:`parse_dump`), by pid: the worker is
    sent :data:`WORKER_STACK_SIGNAL` and its ``faulthandler`` appends the
    stacks to its folder's :data:`STACKS_FILE` (only a worker that made the
    file registered the signal: any other is not sent it). At most ``wait``
    seconds for all."""
    start: dict[int, tuple[Path, int]] = {}
    for pid, folder in folders.items():
        path = folder / STACKS_FILE
        try:
            size = path.stat().st_size
            os.kill(pid, WORKER_STACK_SIGNAL)
        except OSError:
            continue
        start[pid] = (path, size)
    out: dict[int, list[dict[str, Any]]] = {}
    seen: dict[int, int] = {}
    deadline = time.monotonic() + wait
    while start and time.monotonic() < deadline:
        time.sleep(0.05)
        for pid, (path, size) in list(start.items()):
            try:
                now = path.stat().st_size
            except OSError:
                del start[pid]
                continue
            if now > size and seen.get(pid) == now:  # written, and no longer growing
                with contextlib.suppress(OSError), open(path, "rb") as f:
                    f.seek(size)
                    out[pid] = parse_dump(f.read(now - size).decode("utf-8", "replace"))
                del start[pid]
            seen[pid] = now
    return out


def workers(rank_dir: Path | None = None) -> list[dict[str, Any]]:
    """This process's multiprocessing children, alive or not, the DataLoader
    workers among them marked (with their loader and id); a dead one still
    listed is one the DataLoader has not noticed yet. Each live recorded
    worker is asked for its stack (:func:`ask_stacks`): ``threads`` and
    ``where`` (its main thread's innermost frame of the job's code, None
    when it is in torch's loop: idle)."""
    recorded = _recorded_workers(rank_dir)
    out = []
    for p in list(getattr(multiprocessing.process, "_children", ())):
        try:
            loader = recorded.get(p.pid) if p.pid is not None else None
            out.append(
                {
                    "pid": p.pid,
                    "name": p.name,
                    "alive": p.is_alive(),
                    "exitcode": p.exitcode,
                    "dataloader": loader is not None,
                    "loader": loader and loader[0],
                    "worker_id": loader and loader[1],
                }
            )
        except Exception as e:  # noqa: BLE001 - one child's state, never the evidence
            out.append({"pid": getattr(p, "pid", None), "error": f"{type(e).__name__}: {e}"})
    try:
        ask = {w["pid"]: recorded[w["pid"]][2] for w in out if w.get("dataloader") and w.get("alive")}
        stacks = ask_stacks(ask) if ask else {}
    except Exception:  # noqa: BLE001 - the workers' stacks are a bonus, never the evidence
        stacks = {}
    for w in out:
        if w.get("pid") in stacks:
            w["threads"] = stacks[w["pid"]]
            w["where"] = worker_where(w["threads"])
    return out


def flight_recorder() -> dict[str, Any] | None:
    """torch's Flight Recorder entries, when torch.distributed runs and
    records them (None: torch.distributed not in use)."""
    dist = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch._C._distributed_c10d")
    if dist is None or c10d is None or not dist.is_available() or not dist.is_initialized():
        return None
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return {"error": "this torch has no Flight Recorder dump (_dump_fr_trace_json)"}
    try:
        doc = json.loads(dump())
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    entries = doc.get("entries") if isinstance(doc, dict) else None
    if not entries:
        return {"entries": [], "note": "no entries (set TORCH_FR_BUFFER_SIZE to record them)"}
    keep = entries[-MAX_FR_ENTRIES:]
    return {"entries": keep, "total": len(entries)}


def gather(
    event: dict[str, Any],
    rank: int,
    world_size: int,
    training: int | None,
    here: bool = False,
    rank_dir: Path | None = None,
) -> dict[str, Any]:
    """The full evidence for watchdog ``event`` (``_HangWatch.next``'s dict);
    ``here``: the caller's thread too (see :func:`threads`)."""
    doc: dict[str, Any] = {
        "kind": "fastprof.hang",
        "version": 1,
        "rank": rank,
        "world_size": world_size,
        "n": event["n"],
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": event["time"],
        "reason": event["reason"],
        "request": event.get("request"),
        "step": event["step"],
        "stalled_s": event["stalled_s"],
        "timeout_s": event["timeout_s"],
        "typical_step_s": event.get("typical_step_s"),
        "answered_by": "python",
        "training_thread": training,
        "threads": threads(training, here),
        "collectives": collectives.snapshot() or None,
        "workers": workers(rank_dir),
        "flight_recorder": flight_recorder(),
    }
    doc["summary"] = summarize(doc, training)
    return doc


def write(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically (a temporary name, renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, default=str))
    os.replace(tmp, path)
