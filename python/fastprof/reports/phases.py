"""The step anatomy's split (issue #25, #36 item 4): each step's time by
phase, from each phase's spans, by one overlap rule (:data:`PRECEDENCE`;
:data:`fastprof.reports.anatomy.OVERLAP_RULE` says it in words). Pure numpy
on arrays, so that the report's anatomy (:mod:`fastprof.reports.anatomy`),
the step table (:mod:`fastprof.readers.steps`) and a long run's step pass
(:mod:`fastprof.reports.long_run`) split steps with the same code.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fastprof.recording.names import PHASE_SPANS, PHASES, TRAIN_NEXT

I64 = npt.NDArray[np.int64]

#: Span names per phase: fastprof's own first, then the user's (used only
#: where the rank has none of fastprof's).
NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "dataloader": ((TRAIN_NEXT,), ()),
    "forward": ((PHASE_SPANS["forward"],), ("forward",)),
    "backward": ((PHASE_SPANS["backward"],), ("backward",)),
    "optimizer": ((PHASE_SPANS["optimizer"],), ("optimizer", "optimizer_step")),
    "communication": ((PHASE_SPANS["communication"],), ()),
}
#: Every span name of :data:`NAMES`, fastprof's and the user's.
ALL_NAMES = frozenset(n for pair in NAMES.values() for group in pair for n in group)


def chosen(has: Callable[[tuple[str, ...]], bool]) -> tuple[dict[str, tuple[str, ...]], bool]:
    """Each phase's span names on a rank, fastprof's where the rank has any
    of them, else the user's (``has(names)``: whether the rank has a span of
    one of ``names``), and whether it has a phase beside the dataloader's
    (none: no anatomy). The anatomy, the step table and the step pass choose
    by this one rule."""
    use: dict[str, tuple[str, ...]] = {}
    found = False
    for phase, (ours, theirs) in NAMES.items():
        has_ours = has(ours)
        use[phase] = ours if has_ours else theirs
        found |= phase != "dataloader" and (has_ours or has(theirs))
    return use, found


#: Which phase an instant several phases cover belongs to: the first here.
#: In every nesting fastprof records this is the innermost phase (a
#: collective inside backward or forward, an optimizer step in a gradient
#: hook), except a forward inside backward: gradient checkpointing's
#: recomputed forward, which is backward's work and stays in backward.
PRECEDENCE = ("communication", "optimizer", "backward", "forward", "dataloader")


@dataclass
class PhaseSplit:
    """One rank's steps split by :data:`OVERLAP_RULE` (ns, arrays in step order)."""

    dur: Any
    #: Each phase's time in each step, the phases disjoint; ``other`` the rest.
    per_step: dict[str, Any]
    #: (phase, counted as): the time the phase's spans covered that the rule
    #: gave to another phase; ("forward", "backward") is backward's
    #: recomputed forward (gradient checkpointing).
    given: dict[tuple[str, str], Any]


#: Steps split at a time by :func:`split` (its temporaries are a block's, not the run's).
SPLIT_BLOCK = 1 << 16


def split(ts: Any, dur: Any, spans: dict[str, list[tuple[Any, Any]]], block: int = SPLIT_BLOCK) -> PhaseSplit:
    """Steps (``ts``, ``dur``, ns, sorted) split into phases by
    :data:`OVERLAP_RULE`, from each phase's spans (``spans[phase]``: (begin,
    end) arrays sorted by begin, one pair per span name, ``end`` an array or
    a function of a slice ``(i, j)`` of the begins that gives their ends; a
    phase absent has none); the step table (:mod:`fastprof.readers.steps`)
    splits its steps with it too.

    A span is its step's alone (it belongs to the step it starts in and is
    cut at the step's end), so the steps are split ``block`` at a time, cut
    where no step reaches past the next one's start: the same figures as all
    at once, in memory bounded by the block, not the run (the result itself
    is ~8 bytes per step and phase)."""
    ts = np.asarray(ts, dtype=np.int64)
    dur = np.asarray(dur, dtype=np.int64)
    n = len(ts)
    cuts = _cuts(ts, dur, block)
    if len(cuts) == 2:
        return _split(ts, dur, {p: [(b, _ends(e, 0, len(b))) for b, e in pairs or []] for p, pairs in spans.items()})
    # Each name's spans by begin, so that a block's are a slice.
    spans = {
        phase: [(b, e) if _ascending(b) else _by_begin(b, _ends(e, 0, len(b))) for b, e in pairs or []]
        for phase, pairs in spans.items()
    }
    # Each block's figures written into the run's arrays (no second copy of them).
    per_step = {p: np.zeros(n, np.int64) for p in PHASES}
    given: dict[tuple[str, str], Any] = {}
    for a, b in itertools.pairwise(cuts):
        lo, hi = ts[a], ts[b] if b < n else None
        mine: dict[str, list[tuple[Any, Any]]] = {}
        for phase, pairs in spans.items():
            mine[phase] = []
            for s_ts, s_end in pairs or []:
                i = int(np.searchsorted(s_ts, lo, side="left")) if a else 0
                j = int(np.searchsorted(s_ts, hi, side="left")) if hi is not None else len(s_ts)
                mine[phase].append((s_ts[i:j], _ends(s_end, i, j)))
        part = _split(ts[a:b], dur[a:b], mine)
        for p, v in part.per_step.items():
            per_step[p][a:b] = v
        for k, v in part.given.items():
            given.setdefault(k, np.zeros(n, np.int64))[a:b] = v
    return PhaseSplit(dur, per_step, given)


def _ends(end: Any, i: int, j: int) -> Any:
    """The ends of begins ``i:j`` (``end``: an array, or a function of the slice)."""
    return end(i, j) if callable(end) else end[i:j]


def _cuts(ts: Any, dur: Any, block: int) -> list[int]:
    """Where :func:`split` cuts the steps into blocks of about ``block``:
    ``[0, ..., n]``, each cut at a step that starts after every step before
    it ended (scanned a block at a time: no full-length temporary)."""
    n = len(ts)
    cuts = [0]
    reach, seen, c = None, 0, block
    while c < n:
        if c > seen:
            top = int((ts[seen:c] + dur[seen:c]).max())
            reach, seen = top if reach is None else max(reach, top), c
        if int(ts[c]) >= (reach or 0) and ts[c] > ts[c - 1]:
            cuts.append(c)
            c += block
        else:
            c += 1  # a step still running: the next one
    cuts.append(n)
    return cuts


def _ascending(a: Any) -> bool:
    """Whether ``a`` never decreases (checked a block at a time: no full-length temporary)."""
    for i in range(0, max(len(a) - 1, 0), SPLIT_BLOCK):
        x = a[i : i + SPLIT_BLOCK + 1]
        if not bool((x[1:] >= x[:-1]).all()):
            return False
    return True


def _by_begin(b: Any, e: Any) -> tuple[Any, Any]:
    order = np.argsort(b, kind="stable")
    return b[order], e[order]


def _split(ts: Any, dur: Any, spans: dict[str, list[tuple[Any, Any]]]) -> PhaseSplit:
    """:func:`split` of one block of steps, all at once."""
    end = ts + dur
    n = len(ts)
    unions: dict[str, tuple[Any, Any, Any]] = {}
    for phase in PRECEDENCE:
        parts = spans.get(phase) or []
        s_ts = np.concatenate([np.zeros(0, np.int64), *(b for b, _ in parts)]).astype(np.int64)
        s_end = np.concatenate([np.zeros(0, np.int64), *(e for _, e in parts)]).astype(np.int64)
        # A span belongs to the step it starts in, and ends with it at the latest.
        k = np.searchsorted(ts, s_ts, side="right") - 1
        ok = k >= 0
        ok[ok] &= s_ts[ok] < end[k[ok]]
        s_ts, k = s_ts[ok], k[ok]
        s_end = np.minimum(s_end[ok], end[k])
        u_ts, u_end = _union(s_ts, s_end)
        unions[phase] = (u_ts, u_end, np.searchsorted(ts, u_ts, side="right") - 1)
    per_step: dict[str, Any] = {}
    given: dict[tuple[str, str], Any] = {}
    # After each phase of PRECEDENCE: the union of its spans and those before it.
    claimed: list[tuple[str, Any, Any]] = []
    for phase in PRECEDENCE:
        u_ts, u_end, k = unions[phase]
        lost = np.zeros(len(u_ts), np.int64)
        for winner, c_ts, c_end in claimed:
            # Of this phase's time, what the phases up to `winner` cover, less those before it.
            upto = _covered(c_ts, c_end, u_ts, u_end)
            if (upto - lost).any():
                given[(phase, winner)] = np.bincount(k, weights=upto - lost, minlength=n).astype(np.int64)
            lost = upto
        per_step[phase] = np.bincount(k, weights=u_end - u_ts - lost, minlength=n).astype(np.int64)
        c_ts, c_end = claimed[-1][1:] if claimed else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        claimed.append((phase, *_union(np.concatenate([c_ts, u_ts]), np.concatenate([c_end, u_end]))))
    covered = sum(per_step[p] for p in PRECEDENCE)
    per_step["other"] = np.maximum(dur - covered, 0)
    return PhaseSplit(dur, {p: per_step[p] for p in PHASES}, given)


def _union(ts: Any, end: Any) -> tuple[Any, Any]:
    """Sorted disjoint intervals covering the ones given (touching ones kept
    apart, so that a union never joins two steps)."""
    if not len(ts):
        return ts, end
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    reach = np.maximum.accumulate(end)
    new = np.concatenate([[True], ts[1:] >= reach[:-1]])
    group = np.cumsum(new) - 1
    out_end = np.zeros(int(group[-1]) + 1, np.int64)
    np.maximum.at(out_end, group, end)
    return ts[new], out_end


def _covered(u_ts: Any, u_end: Any, a: Any, b: Any) -> Any:
    """For each [a, b), the time the disjoint sorted intervals ``u`` cover in it."""
    if not len(u_ts):
        return np.zeros(len(a), np.int64)
    before = np.concatenate([[0], np.cumsum(u_end - u_ts)])

    def upto(t: Any) -> Any:  # covered time before t
        k = np.searchsorted(u_ts, t, side="right")
        last = np.maximum(k - 1, 0)
        part = np.clip(t - u_ts[last], 0, u_end[last] - u_ts[last])
        return np.where(k > 0, before[last] + part, 0)

    return np.asarray(upto(b) - upto(a), dtype=np.int64)


def sum_inside(inner_ts: I64, inner_dur: I64, outer_ts: I64, outer_end: I64) -> I64:
    """Per outer interval, the summed duration of the inner spans that start
    inside it (both sorted by start)."""
    if not len(outer_ts):
        return np.zeros(0, np.int64)
    csum = np.concatenate([[0], np.cumsum(inner_dur, dtype=np.int64)])
    a = np.searchsorted(inner_ts, outer_ts, side="left")
    b = np.searchsorted(inner_ts, outer_end, side="left")
    return np.asarray(csum[b] - csum[a], dtype=np.int64)
