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

An OOM the job catches itself (a retry with a smaller batch) never leaves
the Profiler; torch's OOM observer
(``torch._C._cuda_attach_out_of_memory_observer``, called by the allocator
before it raises) captures it too, with the phase and frames of the stack
that allocated. The observer is attached once per process, at the first
step's end after the job initialised CUDA (attaching earlier would create
a CUDA context for a job that may not use one), and routes to the running
Profilers. Captures are rate-limited: at most one per step (an exception
leaving the Profiler in a step the observer already captured only adds its
text to oom.json) and :data:`MAX_CAPTURES` per run; oom.json holds the
latest and lists the earlier ones.

:func:`add_oom_listener` registers ``fn(profiler, exc_or_None)``, called
after each capture (``None`` from the observer); a listener's exception is
a warning.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from fastprof import _core
from fastprof._core import FastprofWarning
from fastprof._loop_api import LoopHost
from fastprof._process import PROCESS
from fastprof.memory._files import atomic, write_atomic
from fastprof.memory.history import mark_since, now_ticks
from fastprof.recording.names import OOM_JSON

#: Top groups of live allocations kept in oom.json.
TOP_GROUPS = 10
#: User frames kept in ``where``.
WHERE_FRAMES = 5
#: Captures per run (one per step at most); later OOMs are only counted.
MAX_CAPTURES = 5

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


def phase_and_where(tb: TracebackType | list[traceback.FrameSummary] | None) -> tuple[str, list[str]]:
    """The training phase of a traceback's stack (or of a stack's frames,
    outermost first, as ``traceback.extract_stack`` gives them), and its
    innermost user frames (``file:line in function``, innermost first)."""
    frames = list(tb) if isinstance(tb, list) else traceback.extract_tb(tb)
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


def _is_python_file(name: str) -> bool:
    """A Python frame's file: a ``.py`` path or ``<string>``-like; C++ frames
    (``.cpp``, ``.h``, a shared object, ``??`` when unresolved) are not."""
    return name.endswith((".py", ".pyw")) or (name.startswith("<") and name.endswith(">"))


def _frame_key(frames: list[dict[str, Any]]) -> str | None:
    """The innermost Python frame of an allocation outside torch and
    fastprof. torch 2.11 puts C++ frames (``??:0 in torch::unwind::unwind()``)
    first even with Python stacks, so only Python files count."""
    for f in frames:
        name = str(f.get("filename", ""))
        if _is_python_file(name) and _TORCH_DIR not in name and not name.startswith(_FASTPROF_DIR):
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
    ticks = now_ticks()
    snap = torch.cuda.memory._snapshot()
    path = mem_dir / "oom_snapshot.pickle"
    with atomic(path) as f:
        pickle.dump(snap, f)
    part["snapshot"] = str(path)
    part["snapshot_bytes"] = path.stat().st_size
    part["snapshot_entries"] = sum(len(t) for t in snap.get("device_traces") or [])
    mark_since("memory.oom.dump", ticks, path=str(path), bytes=part["snapshot_bytes"], entries=part["snapshot_entries"])
    groups, with_frames = largest_live(snap)
    part["largest"] = groups
    part["largest_by"] = (
        "the Python frame that allocated them (allocator history was on)"
        if with_frames
        else "block only: allocator history was off, so no frames (Profiler(memory=fastprof.MemoryHistory()) "
        "or torch.cuda.memory._record_memory_history() records them)"
    )
    return part


def capture(
    prof: LoopHost, exc: BaseException | None, stack: list[traceback.FrameSummary] | None = None
) -> Path | None:
    """Write ``rank{R}/memory/oom.json`` (and the allocator snapshot) for an
    out-of-memory error: ``exc`` leaving the Profiler, or (``exc`` None)
    torch's OOM observer with the allocating ``stack``; say where on stderr;
    then call the listeners. Returns the oom.json path, None when nothing
    was written (a warning says why, or the rate limit held it). Never
    raises."""
    try:
        state = _state(prof)
        step = prof.batch
        mem_dir = Path(prof.rank_dir) / "memory"
        if state["step"] == step and state["doc"] is not None:
            # Captured in this step already (the observer, then the exception
            # it raised leaving the Profiler): the exception's text, no new snapshot.
            if exc is not None and state["doc"].get("exception") is None:
                state["doc"]["exception"] = _exception(exc)
                write_atomic(mem_dir / OOM_JSON, json.dumps(state["doc"], indent=1, default=str))
            return None
        if state["captures"] >= MAX_CAPTURES:
            state["skipped"] += 1
            return None
        phase, where = phase_and_where(stack if exc is None else exc.__traceback__)
        mem_dir.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "exception": None if exc is None else _exception(exc),
            "source": "observer" if exc is None else "exception",
            "time_ns": time.time_ns(),
            "rank": prof.rank,
            "step": step,
            "epoch": prof.epoch,
            "phase": phase,
            "where": where,
        }
        torch = sys.modules.get("torch")
        t0 = time.perf_counter()
        try:
            doc["cuda"] = _cuda_part(torch, mem_dir)
        except Exception as e:  # noqa: BLE001 - the rest of the capture still counts
            doc["cuda"] = {"available": False, "reason": f"allocator state unreadable: {type(e).__name__}: {e}"}
        doc["capture_s"] = time.perf_counter() - t0
        if state["doc"] is not None:
            earlier = state["doc"].pop("earlier", [])
            doc["earlier"] = [*earlier, {k: state["doc"].get(k) for k in ("step", "phase", "source", "exception")}]
        try:
            _core.instant("memory.oom", step=step, phase=phase, source=doc["source"])
        except Exception:  # noqa: BLE001 - the instant is a nicety
            pass
        path = write_atomic(mem_dir / OOM_JSON, json.dumps(doc, indent=1, default=str))
        state.update(step=step, doc=doc, captures=state["captures"] + 1)
        state["paths"] = {"oom": str(path), "snapshot": doc["cuda"].get("snapshot")}
        cuda = doc["cuda"]
        snap = cuda.get("snapshot") if cuda.get("available") else f"no allocator snapshot ({cuda.get('reason')})"
        at = f", {where[0]}" if where else ""
        caught = "" if exc is not None else " (seen by torch's OOM observer)"
        print(
            f"fastprof: out of memory at step {step} ({phase}{at}){caught}: {path}; allocator snapshot: {snap}",
            file=sys.stderr,
            flush=True,
        )
    except Exception as e:  # noqa: BLE001 - profiling never takes the job down, nor changes its error
        warnings.warn(
            f"fastprof: could not capture the out-of-memory state: {type(e).__name__}: {e}",
            FastprofWarning,
            stacklevel=2,
        )
        return None
    _notify(prof, exc)
    return path


def _exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:1000]}"


def _state(prof: LoopHost) -> dict[str, Any]:
    """A Profiler's capture state (one per run, as long as it lives)."""
    captures = PROCESS.oom.captures
    st = captures.get(prof)
    if st is None:
        st = captures[prof] = {"step": None, "doc": None, "captures": 0, "skipped": 0, "paths": None}
    return st


def summary(prof: LoopHost) -> dict[str, Any]:
    """``profiler.json``'s ``memory.oom``: the captures, and the observer."""
    st = _state(prof)
    return {
        "captures": st["captures"],
        "skipped_over_limit": st["skipped"],
        "last": st["paths"],
        "observer": PROCESS.oom.observer["status"],
    }


# ------------------------------------------------------------------ listeners
# The listeners, torch's OOM observer and the Profilers it reports to: PROCESS.oom.


def add_oom_listener(fn: Callable[[Any, BaseException | None], Any]) -> None:
    """Call ``fn(profiler, exc_or_None)`` after each out-of-memory capture
    (``exc`` None when torch's OOM observer saw it). A listener's exception
    is a warning; the job and the other listeners go on."""
    listeners = PROCESS.oom.listeners
    if fn not in listeners:
        listeners.append(fn)


def remove_oom_listener(fn: Callable[[Any, BaseException | None], Any]) -> None:
    """Stop calling ``fn``; nothing when it was not registered."""
    listeners = PROCESS.oom.listeners
    if fn in listeners:
        listeners.remove(fn)


def _notify(prof: LoopHost, exc: BaseException | None) -> None:
    for fn in list(PROCESS.oom.listeners):
        try:
            fn(prof, exc)
        except Exception as e:  # noqa: BLE001 - a listener never takes the job down
            warnings.warn(
                f"fastprof: out-of-memory listener {getattr(fn, '__qualname__', fn)!r} failed: {type(e).__name__}: {e}",
                FastprofWarning,
                stacklevel=2,
            )


# ------------------------------------------------------------------ torch's OOM observer


def watch(prof: LoopHost) -> bool:
    """``prof`` started: route the observer's calls to it. Returns True when
    the observer is still to be attached (at a step's end once the job has
    initialised CUDA: call :func:`poll` then), False when it is attached or
    cannot be (the reason is the observer's status)."""
    state = PROCESS.oom
    observer = state.observer
    with state.lock:
        state.watched.append(prof)
    if observer["attached"]:
        return False
    torch = sys.modules.get("torch")
    if torch is None:
        observer["status"] = "unavailable: torch is not imported"
        return False
    if not hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
        observer["status"] = f"unavailable: torch {torch.__version__} has no OOM observer"
        return False
    try:
        available = bool(torch.cuda.is_available())
    except Exception as e:  # noqa: BLE001
        available, observer["status"] = False, f"unavailable: torch.cuda.is_available() raised {e}"
    if not available:
        observer["status"] = "unavailable: no CUDA device (torch.cuda.is_available() is False)"
        return False
    observer["status"] = "waiting for the job to initialise CUDA"
    return True


def unwatch(prof: LoopHost) -> None:
    """``prof`` stopped."""
    state = PROCESS.oom
    with state.lock:
        if prof in state.watched:
            state.watched.remove(prof)


def poll() -> bool:
    """At a step's end: attach the observer once the job has initialised
    CUDA. Returns True while still waiting."""
    observer = PROCESS.oom.observer
    if observer["attached"]:
        return False
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return True
        torch._C._cuda_attach_out_of_memory_observer(_on_oom)
    except Exception as e:  # noqa: BLE001 - the exception path still captures
        observer["status"] = f"unavailable: attaching failed: {type(e).__name__}: {e}"
        return False
    observer.update(attached=True, status="attached")
    return False


def _on_oom(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    """torch's allocator is about to raise an OOM (on the allocating thread)."""
    stack = traceback.extract_stack(sys._getframe(1))
    state = PROCESS.oom
    with state.lock:
        profs = [p for p in state.watched if p.running]
    for prof in profs:
        capture(prof, None, stack)
