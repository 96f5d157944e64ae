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
"""

from __future__ import annotations

import functools
import json
import os
import resource
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from fastprof._dist import dist_info
from fastprof.memory._files import write_atomic
from fastprof.memory.step_stats import CUDA_COUNTERS

#: ``torch.cuda.memory_stats()`` keys kept per entry where CUDA is in use:
#: those the per-step statistics record.
CUDA_KEYS = tuple(key for key, _ in CUDA_COUNTERS)

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_entries: dict[str, dict[str, Any]] = {}
_PAGE = resource.getpagesize()


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


def collect(name: str | None = None, *, iterations: Iterable[int] = (1,)) -> Callable[[F], F]:
    """Decorate a function so that its calls numbered ``iterations`` are
    collected (see the module documentation). ``name``: the key's function
    part (default: the function's ``__name__``)."""
    wanted = frozenset(int(i) for i in iterations)
    if any(i < 0 for i in wanted):
        from fastprof._core import ConfigError

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
            try:
                state = _start(label, it)
            except Exception as e:  # noqa: BLE001 - the job's function runs whatever happens here
                warnings.warn(f"fastprof: memory collection of {label} skipped: {e}", stacklevel=2)
                return fn(*args, **kwargs)
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
                    warnings.warn(f"fastprof: memory collection of {label} incomplete: {e}", stacklevel=2)

        return wrapper  # type: ignore[return-value]

    return wrap


def _key(label: str, it: int, when: str) -> str:
    return f"{dist_info().rank}.{label}.{it}.{when}"


def _start(label: str, it: int) -> tuple[int, int, Any, Any, Any]:
    torch = sys.modules.get("torch")
    rss, vms = _statm()
    entry: dict[str, Any] = {"rss": rss, "vms": vms, **_cuda(torch)}
    with _lock:
        _entries[_key(label, it, "start")] = entry
    _record(label, rss, 0)
    packed = hooks = None
    if torch is not None:
        packed = _Packed(torch)
        hooks = torch.autograd.graph.saved_tensors_hooks(packed.pack, packed.unpack)
    return rss, vms, torch, packed, hooks


def _end(label: str, it: int, rss0: int, vms0: int, torch: Any, packed: _Packed | None) -> None:
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
    with _lock:
        _entries[_key(label, it, "end")] = entry
    _record(label, rss, npp or 0)


def _record(label: str, rss: int, npp: int) -> None:
    from fastprof import _core

    _core.counter(f"mem.collect.{label}.rss [B]", float(rss))
    _core.counter(f"mem.collect.{label}.npp [B]", float(npp))


def collected() -> dict[str, dict[str, Any]]:
    """Every entry so far, by key (a copy)."""
    with _lock:
        return {k: dict(v) for k, v in _entries.items()}


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


def reset() -> None:
    """Forget the entries (a new run in the same process)."""
    with _lock:
        _entries.clear()
