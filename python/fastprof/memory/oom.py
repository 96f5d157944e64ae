"""Out of memory: capture, and name the culprit (issue #16).

When a ``torch.OutOfMemoryError`` leaves the ``with Profiler`` block (or
Lightning's fit with ``FastprofProfiler``), before the Profiler closes:

- the step, epoch and phase it happened in (``forward``, ``backward``,
  ``optimizer`` or ``other``, read from the exception's stack: torch's
  autograd, optimizer and module-call frames) and where in the user's code
  (the innermost frames outside torch and fastprof);
- where the job used CUDA: the allocator's statistics (allocated, reserved,
  the reserved-but-free bytes, i.e. fragmentation), its snapshot
  (``torch.cuda.memory._snapshot()``, what torch's ``memory_viz`` loads) as
  ``rank{R}/memory/oom_snapshot.pickle``, and the largest live allocations
  grouped by the Python frame that made them (file:line, function; frames
  exist where allocator history was on, else the groups are by block size
  alone, and the document says so);
- all of it in ``rank{R}/memory/oom.json`` (written atomically) and one
  stderr line saying where.

The exception then propagates unchanged (same object, same traceback).
Nothing here raises: a failure to capture is a warning.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from fastprof.memory._files import atomic, write_atomic

#: Top groups of live allocations kept in oom.json.
TOP_GROUPS = 10
#: User frames kept in ``where``.
WHERE_FRAMES = 5

_TORCH_DIR = os.sep + "torch" + os.sep
_FASTPROF_DIR = str(Path(__file__).resolve().parents[1])


def is_oom(exc: BaseException | None) -> bool:
    """Whether ``exc`` is torch's out-of-memory error (torch imported)."""
    torch = sys.modules.get("torch")
    if exc is None or torch is None:
        return False
    kinds = tuple(
        k
        for k in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
        if isinstance(k, type)
    )
    return bool(kinds) and isinstance(exc, kinds)


def phase_and_where(tb: TracebackType | None) -> tuple[str, list[str]]:
    """The training phase of a traceback's stack, and its innermost user
    frames (``file:line in function``, innermost first)."""
    frames = traceback.extract_tb(tb)
    files = [f.filename.replace("\\", "/") for f in frames]
    if any(
        "/torch/autograd/" in f or (f.endswith("/torch/_tensor.py") and fr.name == "backward")
        for f, fr in zip(files, frames, strict=True)
    ):
        phase = "backward"
    elif any("/torch/optim/" in f for f in files):
        phase = "optimizer"
    elif any(f.endswith("/torch/nn/modules/module.py") for f in files):
        phase = "forward"
    else:
        phase = "other"
    user = [
        f"{fr.filename}:{fr.lineno} in {fr.name}"
        for fr in reversed(frames)
        if _TORCH_DIR not in fr.filename and not fr.filename.startswith(_FASTPROF_DIR)
    ]
    return phase, user[:WHERE_FRAMES]


def _frame_key(frames: list[dict[str, Any]]) -> str | None:
    """The innermost Python frame of an allocation outside torch."""
    for f in frames:
        name = str(f.get("filename", ""))
        if name and _TORCH_DIR not in name and not name.endswith(".cpp") and not name.endswith(".h"):
            return f"{name}:{f.get('line')} in {f.get('name')}"
    return None


def largest_live(snapshot: dict[str, Any], top: int = TOP_GROUPS) -> tuple[list[dict[str, Any]], bool]:
    """Live (allocated) blocks of a ``torch.cuda.memory._snapshot()`` grouped
    by the frame that allocated them, largest total first; and whether any
    block had frames (allocator history on)."""
    groups: dict[str, dict[str, Any]] = {}
    any_frames = False
    for seg in snapshot.get("segments", []):
        for b in seg.get("blocks", []):
            if b.get("state") != "active_allocated":
                continue
            frames = b.get("frames") or []
            any_frames |= bool(frames)
            key = _frame_key(frames) or f"(no Python frame; block of {int(b.get('size', 0))} B)"
            g = groups.setdefault(key, {"where": key, "bytes": 0, "blocks": 0})
            g["bytes"] += int(b.get("size", 0))
            g["blocks"] += 1
    ranked = sorted(groups.values(), key=lambda g: (-g["bytes"], g["where"]))
    return ranked[:top], any_frames


def _cuda_part(torch: Any, mem_dir: Path) -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"available": False, "reason": "no CUDA device (torch.cuda.is_available() is False)"}
    if not torch.cuda.is_initialized():
        return {"available": False, "reason": "CUDA was never initialised in this process"}
    stats = torch.cuda.memory_stats()
    allocated = int(stats.get("allocated_bytes.all.current", 0))
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    part: dict[str, Any] = {
        "available": True,
        "device": int(torch.cuda.current_device()),
        "allocated_b": allocated,
        "reserved_b": reserved,
        "reserved_free_b": reserved - allocated,
        "peak_allocated_b": int(stats.get("allocated_bytes.all.peak", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
    }
    try:
        total = int(torch.cuda.get_device_properties(part["device"]).total_memory)
        part["device_total_b"] = total
    except Exception:  # noqa: BLE001 - a figure less, not a failure
        pass
    snap = torch.cuda.memory._snapshot()
    path = mem_dir / "oom_snapshot.pickle"
    with atomic(path) as f:
        pickle.dump(snap, f)
    part["snapshot"] = str(path)
    groups, with_frames = largest_live(snap)
    part["largest"] = groups
    part["largest_by"] = (
        "the Python frame that allocated them (allocator history was on)"
        if with_frames
        else "block only: allocator history was off, so no frames (Profiler(memory=fastprof.MemoryHistory()) "
        "or torch.cuda.memory._record_memory_history() records them)"
    )
    return part


def capture(prof: Any, exc: BaseException) -> Path | None:
    """Write ``rank{R}/memory/oom.json`` (and the allocator snapshot) for an
    out-of-memory error leaving the Profiler; say where on stderr. Returns
    the oom.json path, None when it could not be written (a warning says
    why). Never raises."""
    try:
        phase, where = phase_and_where(exc.__traceback__)
        mem_dir = Path(prof.rank_dir) / "memory"
        mem_dir.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "exception": f"{type(exc).__name__}: {str(exc)[:1000]}",
            "time_ns": time.time_ns(),
            "rank": prof.rank,
            "step": prof.batch,
            "epoch": prof.epoch,
            "phase": phase,
            "where": where,
        }
        torch = sys.modules.get("torch")
        try:
            doc["cuda"] = _cuda_part(torch, mem_dir)
        except Exception as e:  # noqa: BLE001 - the rest of the capture still counts
            doc["cuda"] = {"available": False, "reason": f"allocator state unreadable: {type(e).__name__}: {e}"}
        try:
            from fastprof import _core

            _core.instant("memory.oom", step=prof.batch, phase=phase)
        except Exception:  # noqa: BLE001 - the instant is a nicety
            pass
        path = write_atomic(mem_dir / "oom.json", json.dumps(doc, indent=1, default=str))
        cuda = doc["cuda"]
        snap = cuda.get("snapshot") if cuda.get("available") else f"no allocator snapshot ({cuda.get('reason')})"
        at = f", {where[0]}" if where else ""
        print(
            f"fastprof: out of memory at step {prof.batch} ({phase}{at}): {path}; allocator snapshot: {snap}",
            file=sys.stderr,
            flush=True,
        )
        return path
    except Exception as e:  # noqa: BLE001 - profiling never takes the job down, nor changes its error
        warnings.warn(f"fastprof: could not capture the out-of-memory state: {type(e).__name__}: {e}", stacklevel=2)
        return None
