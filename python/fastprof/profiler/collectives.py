"""Each process group's collective wavefront (issue #37, item 1): the last
collective a rank entered and the last it completed, with op, sequence
number and the user's call site. The anatomy's collective wrappers
(:mod:`fastprof.profiler.anatomy`) store into :data:`ENTERED` before a
collective and :data:`COMPLETED` after it (what :func:`entered` and
:func:`completed` do, without their calls: the record costs one dictionary
store each way); the hang evidence reads :func:`snapshot`.

Two dictionary stores a collective: no allocation beyond the tuple, no
clock, no lock (one writer, the training thread; the evidence reads a copy,
and a torn read of two dictionaries is at worst one collective behind).
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMPLETED", "ENTERED", "completed", "entered", "reset", "snapshot"]

#: group key -> (op, seq, site): the last entered / completed collective.
ENTERED: dict[Any, tuple[str, int, Any]] = {}
COMPLETED: dict[Any, tuple[str, int, Any]] = {}
_entered, _completed = ENTERED, COMPLETED


def entered(op: str, group: Any, seq: int, site: Any = None) -> None:
    """A collective ``op`` of process group ``group`` (a hashable key), its
    ``seq``-th there, called from ``site`` (``(file, line)`` or None), begins."""
    _entered[group] = (op, seq, site)


def completed(op: str, group: Any, seq: int, site: Any = None) -> None:
    """That collective returned (for an async one: its ``wait()``)."""
    _completed[group] = (op, seq, site)


def reset() -> None:
    _entered.clear()
    _completed.clear()


def _one(t: tuple[str, int, Any] | None) -> dict[str, Any] | None:
    if t is None:
        return None
    op, seq, site = t
    s = None
    if isinstance(site, tuple) and len(site) == 2:
        s = {"file": str(site[0]), "line": int(site[1])}
    return {"op": op, "seq": seq, "site": s}


def snapshot() -> dict[str, dict[str, Any]]:
    """``{group: {"entered": {op, seq, site}, "completed": {...}}}`` (JSON-ready)."""
    ent, com = dict(_entered), dict(_completed)
    return {str(g): {"entered": _one(ent.get(g)), "completed": _one(com.get(g))} for g in ent.keys() | com.keys()}
