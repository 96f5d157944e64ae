"""Memory at the start and end of chosen functions, for chosen iterations
(issue #16; the Fine-Tuning Scheduler's MemProfiler collects the same).

``@fastprof.memory.collect("training_step", iterations=(1,))`` wraps a
function; on its collected calls (0-based: the first call is iteration 0)
it records, at ``start`` and at ``end``:

- the process's ``rss`` and ``vms`` (``/proc/self/statm``), and at ``end``
  their ``rss_pre`` / ``rss_post`` / ``rss_diff`` and ``vms_*`` over the call;
- the activation proxy: bytes of the non-parameter tensors autograd saved
  for backward during the call (a ``saved_tensors_hooks`` pack hook that
  counts ``nbytes``, installed only during collected calls):
  ``npp_pre_forward`` (0), ``npp_post_forward`` and ``npp_diff``;
- where CUDA is initialised, :data:`CUDA_KEYS` of ``torch.cuda.memory_stats()``
  under their torch names.

Entries are keyed ``"{rank}.{function}.{iteration}.{start|end}"``; they are
counters in the trace (``mem.collect.<function>.rss [B]`` and ``.npp [B]``)
and, when the Profiler stops (or :func:`write` is called),
``rank{R}/memory/collected.yaml`` and ``collected.json``. Collection never
raises into the wrapped function: a failure is a warning and the call runs
unmeasured.

``snapshots=True`` also takes the CUDA allocator's snapshot
(``torch.cuda.memory._snapshot()``, what ``memory_viz`` loads; with its
history where allocator history is on) at the start and end of each
collected call, on the calling thread (the stall is measured), and pickles
it off that thread as ``cuda_alloc_rank{R}.{function}.{iteration}.{start|end}.pickle``
(FTS's names) into the running Profiler's ``rank{R}/memory/`` (or
``snapshot_dir``). Without CUDA (or before the job used it) no snapshot is
taken and the reason is kept once; :func:`summary` (``profiler.json``'s
``memory.collect``) lists the snapshots or says why there are none.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import resource
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from fastprof import _core
from fastprof._core import ConfigError, FastprofWarning
from fastprof._dist import dist_info
from fastprof._process import PROCESS
from fastprof.memory._files import atomic, write_atomic
from fastprof.memory.history import CudaAllocator, mark_since, now_ticks
from fastprof.recording.names import CUDA_COUNTERS

#: ``torch.cuda.memory_stats()`` keys kept per entry where CUDA is in use:
#: those the per-step statistics record.
CUDA_KEYS = tuple(key for key, _ in CUDA_COUNTERS)

F = TypeVar("F", bound=Callable[..., Any])

_PAGE = resource.getpagesize()
# The entries, the snapshots and where they go (set by :func:`reset`): PROCESS.collect.


def _statm() -> tuple[int, int]:
    """(rss, vms) bytes of this process."""
    with open("/proc/self/statm", "rb") as f:
        fields = f.read().split()
    return int(fields[1]) * _PAGE, int(fields[0]) * _PAGE


def _cuda(torch: Any) -> dict[str, int]:
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in CUDA_KEYS}


class _Packed:
    """The pack hook: bytes of non-parameter tensors saved for backward."""

    def __init__(self, torch: Any) -> None:
        self.param = torch.nn.Parameter
        self.bytes = 0

    def pack(self, t: Any) -> Any:
        if not isinstance(t, self.param):
            self.bytes += int(t.nbytes)
        return t

    @staticmethod
    def unpack(t: Any) -> Any:
        return t


def collect(
    name: str | None = None,
    *,
    iterations: Iterable[int] = (1,),
    snapshots: bool = False,
    snapshot_dir: str | os.PathLike[str] | None = None,
) -> Callable[[F], F]:
    """Decorate a function so that its calls numbered ``iterations`` are
    collected (see the module documentation). ``name``: the key's function
    part (default: the function's ``__name__``); ``snapshots``: the CUDA
    allocator's snapshot at the start and end of each collected call, into
    ``snapshot_dir`` (default: the running Profiler's ``rank{R}/memory/``)."""
    wanted = frozenset(int(i) for i in iterations)
    if any(i < 0 for i in wanted):
        raise ConfigError(f"invalid option iterations: expected integers >= 0, got {sorted(wanted)}")

    def wrap(fn: F) -> F:
        label = name or fn.__name__
        calls = [0]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            it = calls[0]
            calls[0] += 1
            if it not in wanted:
                return fn(*args, **kwargs)
            if snapshots:
                _snapshot(label, it, "start", snapshot_dir)
            try:
                state = _start(label, it)
            except Exception as e:  # noqa: BLE001 - the job's function runs whatever happens here
                warnings.warn(f"fastprof: memory collection of {label} skipped: {e}", FastprofWarning, stacklevel=2)
                try:
                    return fn(*args, **kwargs)
                finally:
                    if snapshots:
                        _snapshot(label, it, "end", snapshot_dir)
            torch, packed, hooks = state[2], state[3], state[4]
            try:
                if hooks is not None:
                    with hooks:
                        return fn(*args, **kwargs)
                return fn(*args, **kwargs)
            finally:
                try:
                    _end(label, it, state[0], state[1], torch, packed)
                except Exception as e:  # noqa: BLE001
                    warnings.warn(
                        f"fastprof: memory collection of {label} incomplete: {e}", FastprofWarning, stacklevel=2
                    )
                if snapshots:
                    _snapshot(label, it, "end", snapshot_dir)

        return wrapper  # type: ignore[return-value]

    return wrap


def _key(label: str, it: int, when: str) -> str:
    return f"{dist_info().rank}.{label}.{it}.{when}"


def _start(label: str, it: int) -> tuple[int, int, Any, Any, Any]:
    st = PROCESS.collect
    torch = sys.modules.get("torch")
    rss, vms = _statm()
    entry: dict[str, Any] = {"rss": rss, "vms": vms, **_cuda(torch)}
    with st.lock:
        st.entries[_key(label, it, "start")] = entry
    _record(label, rss, 0)
    packed = hooks = None
    if torch is not None:
        packed = _Packed(torch)
        hooks = torch.autograd.graph.saved_tensors_hooks(packed.pack, packed.unpack)
    return rss, vms, torch, packed, hooks


def _end(label: str, it: int, rss0: int, vms0: int, torch: Any, packed: _Packed | None) -> None:
    st = PROCESS.collect
    rss, vms = _statm()
    npp = packed.bytes if packed is not None else None
    entry: dict[str, Any] = {
        "rss": rss,
        "vms": vms,
        "rss_pre": rss0,
        "rss_post": rss,
        "rss_diff": rss - rss0,
        "vms_pre": vms0,
        "vms_post": vms,
        "vms_diff": vms - vms0,
        "npp_pre_forward": 0 if npp is not None else None,
        "npp_post_forward": npp,
        "npp_diff": npp,
        **_cuda(torch),
    }
    with st.lock:
        st.entries[_key(label, it, "end")] = entry
    _record(label, rss, npp or 0)


def _allocator() -> Any:
    """The allocator snapshots come from (a stand-in in tests)."""
    return CudaAllocator(sys.modules.get("torch"))


def snapshot_name(label: str, it: int, when: str) -> str:
    """FTS's file name of an allocator snapshot."""
    return f"cuda_alloc_rank{dist_info().rank}.{label}.{it}.{when}.pickle"


def _snapshot(label: str, it: int, when: str, directory: str | os.PathLike[str] | None) -> None:
    """Take the allocator's snapshot now (measured) and pickle it off this
    thread; or keep, once, why none can be taken. Never raises."""
    st = PROCESS.collect
    try:
        alloc = _allocator()
        why = alloc.available()
        if why is None and not alloc.initialized():
            why = "CUDA was not initialised by the job when the collected call ran"
        d = Path(directory) if directory is not None else st.directory
        if why is None and d is None:
            why = (
                f"the memory folder cannot be written ({st.unwritable})"
                if st.unwritable
                else "no Profiler running and no snapshot_dir given"
            )
        if why is not None:
            with st.lock:
                if why not in st.snapshot_reason:
                    st.snapshot_reason.append(why)
            return
        assert d is not None
        ticks = now_ticks()
        t0 = time.perf_counter()
        snap = alloc.snapshot()
        stall = time.perf_counter() - t0
        key = f"{dist_info().rank}.{label}.{it}.{when}"
        mark_since("memory.collect.snapshot", ticks, key=key)
        entry: dict[str, Any] = {"key": key, "path": str(d / snapshot_name(label, it, when)), "snapshot_s": stall}
        with st.lock:
            st.snapshots.append(entry)
        t = threading.Thread(target=_write_snapshot, args=(snap, entry), name="fastprof-collect-snapshot", daemon=True)
        t.start()
        st.writers.append(t)
    except Exception as e:  # noqa: BLE001 - the job's function runs whatever happens here
        warnings.warn(f"fastprof: no allocator snapshot at the {when} of {label}: {e}", FastprofWarning, stacklevel=3)


def _write_snapshot(snap: dict[str, Any], entry: dict[str, Any]) -> None:
    st = PROCESS.collect
    path = Path(entry["path"])
    try:
        with atomic(path) as f:
            pickle.dump(snap, f, protocol=pickle.HIGHEST_PROTOCOL)
        size = path.stat().st_size
        with st.lock:
            entry["bytes"] = size
    except Exception as e:  # noqa: BLE001 - listed in profiler.json, one warning at the end
        with st.lock:
            entry["error"] = f"write failed: {type(e).__name__}: {e}"


def wait(timeout: float = 60.0) -> None:
    """Let the snapshot writers finish (the Profiler calls this as it stops)."""
    st = PROCESS.collect
    deadline = time.monotonic() + timeout
    for t in list(st.writers):
        t.join(max(0.0, deadline - time.monotonic()))


def summary() -> dict[str, Any]:
    """``profiler.json``'s ``memory.collect``: the entries' keys, the
    allocator snapshots taken, and why none were where they were asked for."""
    st = PROCESS.collect
    with st.lock:
        return {
            "entries": list(st.entries),
            "snapshots": [dict(e) for e in st.snapshots],
            "snapshot_reason": "; ".join(st.snapshot_reason) or None,
        }


def _record(label: str, rss: int, npp: int) -> None:
    _core.counter(f"mem.collect.{label}.rss [B]", float(rss))
    _core.counter(f"mem.collect.{label}.npp [B]", float(npp))


def collected() -> dict[str, dict[str, Any]]:
    """Every entry so far, by key (a copy)."""
    st = PROCESS.collect
    with st.lock:
        return {k: dict(v) for k, v in st.entries.items()}


def _yaml(entries: dict[str, dict[str, Any]]) -> str:
    """Entries as a YAML mapping of mappings (keys quoted, values numbers
    or null): what FTS writes, without a YAML dependency."""
    lines = []
    for key, entry in entries.items():
        lines.append(f"{json.dumps(key)}:")
        for k, v in entry.items():
            lines.append(f"  {json.dumps(k)}: {'null' if v is None else v}")
    return "\n".join(lines) + ("\n" if lines else "")


def write(directory: str | os.PathLike[str]) -> list[Path]:
    """Write the entries as ``collected.yaml`` and ``collected.json`` into
    ``directory`` (each through a temporary name); none when there are none."""
    entries = collected()
    if not entries:
        return []
    d = Path(directory)
    return [
        write_atomic(d / "collected.yaml", _yaml(entries)),
        write_atomic(d / "collected.json", json.dumps(entries, indent=1)),
    ]


def reset(directory: str | os.PathLike[str] | None = None, unwritable: str | None = None) -> None:
    """Forget the entries and snapshots (a new run in the same process);
    ``directory``: where allocator snapshots go by default (the Profiler's
    ``rank{R}/memory/``); ``unwritable``: why it cannot be written (then
    snapshots go nowhere by default)."""
    st = PROCESS.collect
    with st.lock:
        st.entries.clear()
        st.snapshots.clear()
        st.snapshot_reason.clear()
        st.writers.clear()
        st.directory = None if directory is None or unwritable else Path(directory)
        st.unwritable = unwritable
