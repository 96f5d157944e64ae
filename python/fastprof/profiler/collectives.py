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

**The steps' counts.** A step's first collective also appends ``(step,
{group: collectives it had before})`` to :data:`STEPS` (one entry per step
that has a collective, the last :data:`MAX_STEPS` kept): the verdict of a
skipped collective compares ranks' counts step by step and names the first
step where they differ
(:func:`fastprof.profiler.drivers.hang.verdict.first_diff`). Per collective
the anatomy reads the loop's ``batch`` and compares it with the last one's.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["COMPLETED", "ENTERED", "MAX_STEPS", "STEPS", "completed", "entered", "reset", "snapshot", "step_began"]

#: Steps kept per group in :data:`STEPS`.
MAX_STEPS = 4096

#: group key -> (op, seq, site): the last entered / completed collective.
ENTERED: dict[Any, tuple[str, int, Any]] = {}
COMPLETED: dict[Any, tuple[str, int, Any]] = {}
#: (step, {group key: collectives entered before the step's first}), per step with a collective.
STEPS: deque[tuple[Any, dict[Any, int]]] = deque(maxlen=MAX_STEPS)
_entered, _completed = ENTERED, COMPLETED


def entered(op: str, group: Any, seq: int, site: Any = None) -> None:
    """A collective ``op`` of process group ``group`` (a hashable key), its
    ``seq``-th there, called from ``site`` (``(file, line)`` or None), begins."""
    _entered[group] = (op, seq, site)


def completed(op: str, group: Any, seq: int, site: Any = None) -> None:
    """That collective returned (for an async one: its ``wait()``)."""
    _completed[group] = (op, seq, site)


def step_began(step: Any, before: dict[Any, int]) -> None:
    """Step ``step``'s first collective begins; each group had ``before``
    collectives until then (copied)."""
    STEPS.append((step, dict(before)))


def reset() -> None:
    _entered.clear()
    _completed.clear()
    STEPS.clear()


def _one(t: tuple[str, int, Any] | None) -> dict[str, Any] | None:
    if t is None:
        return None
    op, seq, site = t
    s = None
    if isinstance(site, tuple) and len(site) == 2:
        s = {"file": str(site[0]), "line": int(site[1])}
    return {"op": op, "seq": seq, "site": s}


def snapshot() -> dict[str, dict[str, Any]]:
    """``{group: {"entered": {op, seq, site}, "completed": {...}, "steps":
    [[step, before], ...]}}`` (JSON-ready)."""
    ent, com = dict(_entered), dict(_completed)
    steps = [(s, c) for s, c in list(STEPS) if isinstance(s, int)]
    return {
        str(g): {
            "entered": _one(ent.get(g)),
            "completed": _one(com.get(g)),
            "steps": [[s, c.get(g, 0)] for s, c in steps],
        }
        for g in ent.keys() | com.keys()
    }
