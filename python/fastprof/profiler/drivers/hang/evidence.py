"""One rank's evidence, gathered by the interpreter (the watchdog's event
was claimed): every thread's stack from ``sys._current_frames()`` with its
name, the step clock the watchdog measured, the collective wavefront, the
DataLoader workers and torch's Flight Recorder entries. Written as
``rank{R}/hang-<n>.json`` (see :mod:`.verdict`)."""

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
from pathlib import Path
from types import FrameType
from typing import Any

from fastprof.profiler import collectives
from fastprof.profiler.drivers.hang.verdict import summarize

__all__ = ["gather", "write"]

#: fastprof's own package folder: a signal handler's frames in it are not the job's.
FASTPROF_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep
#: A recorded DataLoader worker's folder: ``<loader>-w<id>-pid<pid>`` (profiler/workers.py).
_WORKER_DIR = re.compile(r"^(.*)-w(\d+)-pid(\d+)$")
#: Frames kept per thread (innermost first).
MAX_FRAMES = 200
#: Flight Recorder entries kept (the most recent).
MAX_FR_ENTRIES = 64


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


def _recorded_workers(rank_dir: Path | None) -> dict[int, tuple[str, int]]:
    """pid -> (loader, worker id) of the DataLoader workers this rank's
    Profiler recorded (``rank{R}/workers/<loader>-w<id>-pid<pid>/``): a
    started Process no longer says its target."""
    out: dict[int, tuple[str, int]] = {}
    if rank_dir is None:
        return out
    with contextlib.suppress(OSError):
        for d in (rank_dir / "workers").iterdir():
            m = _WORKER_DIR.match(d.name)
            if m:
                out[int(m.group(3))] = (m.group(1), int(m.group(2)))
    return out


def workers(rank_dir: Path | None = None) -> list[dict[str, Any]]:
    """This process's multiprocessing children, alive or not, the DataLoader
    workers among them marked (with their loader and id); a dead one still
    listed is one the DataLoader has not noticed yet."""
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
