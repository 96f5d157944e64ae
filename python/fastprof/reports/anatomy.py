"""The step anatomy (issue #25): every step of each rank split into
``dataloader``, ``forward``, ``backward``, ``optimizer``, ``communication``
and ``other``, from the spans the Profiler records at every step
(:mod:`fastprof.profiler.anatomy`), with no torch.profiler window.

A phase's time in a step is the time its spans cover inside the step:
fastprof's own ``phase.*`` spans, or, on a rank that has none of them for
the phase, the user's own spans named for it (``forward``, ``backward``,
``optimizer``); ``dataloader`` is the train loader's wait
(``loader.train.next``). ``other`` is the rest of the step. Where phases
overlap (a collective called inside backward), ``other`` is floored at 0 and
the shares are of the phases' sum, so that they sum to 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastprof.reports.data import RunData, step_spans, sum_inside

#: The phases, in report order.
PHASES = ("dataloader", "forward", "backward", "optimizer", "communication", "other")
#: Span names per phase: fastprof's own first, then the user's (used only
#: where the rank has none of fastprof's).
NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "dataloader": (("loader.train.next",), ()),
    "forward": (("phase.forward",), ("forward",)),
    "backward": (("phase.backward",), ("backward",)),
    "optimizer": (("phase.optimizer",), ("optimizer", "optimizer_step")),
    "communication": (("phase.communication",), ()),
}
#: A step this many times the median step is slow.
SLOW_FACTOR = 2.0
#: Slow steps listed per rank.
MAX_SLOW = 10
NO_ANATOMY = (
    "no step anatomy in this trace: no fastprof step spans with phase spans in them (the Profiler records "
    "them at every step unless anatomy=False, and fastprof run does too)"
)


def _phase_ns(data: RunData, rank: int, names: tuple[str, ...], ts: Any, end: Any) -> Any:
    """Each step's time (ns) covered by spans ``names`` inside it."""
    out = np.zeros(len(ts), dtype=np.int64)
    for name in names:
        s = data.spans(name, rank)
        if len(s.ts):
            out += sum_inside(s.ts, s.dur, ts, end)
    return out


def _has(data: RunData, rank: int, names: tuple[str, ...]) -> bool:
    return any(len(data.spans(n, rank).ts) for n in names)


def per_step_phases(data: RunData, rank: int, skip: int = 0) -> tuple[Any, dict[str, Any]] | None:
    """Each step's duration and its time in each phase (ns, arrays in step
    order from step ``skip``), None without fastprof steps or phase spans."""
    steps, source = step_spans(data, rank)
    if source != "step" or len(steps.ts) <= skip:
        return None
    ts, dur = steps.ts[skip:], steps.dur[skip:]
    end = ts + dur
    per_step: dict[str, Any] = {}
    found = False
    for phase, (ours, theirs) in NAMES.items():
        has_ours = _has(data, rank, ours)
        names = ours if has_ours else theirs
        found |= phase != "dataloader" and (has_ours or _has(data, rank, theirs))
        per_step[phase] = _phase_ns(data, rank, names, ts, end)
    if not found:
        return None
    covered = sum(per_step[p] for p in NAMES)
    per_step["other"] = np.maximum(dur - covered, 0)
    return dur, per_step


def rank_anatomy(data: RunData, rank: int, warmup_steps: int = 0) -> dict[str, Any] | None:
    """One rank's anatomy (steps after the warm-up), None without steps or phases."""
    steps, _ = step_spans(data, rank)
    skip = warmup_steps if len(steps.ts) > warmup_steps else 0
    got = per_step_phases(data, rank, skip)
    if got is None:
        return None
    dur, per_step = got
    ts = steps.ts[skip:]
    whole = float(sum(float(v.sum()) for v in per_step.values())) or 1.0
    phases = {}
    for p in PHASES:
        v = per_step[p]
        phases[p] = {
            "total_ns": int(v.sum()),
            "p50_ns": float(np.percentile(v, 50)),
            "p95_ns": float(np.percentile(v, 95)),
            "share": float(v.sum()) / whole,
        }
    return {
        "rank": rank,
        "steps": len(ts),
        "warmup_steps_excluded": skip,
        "step_total_ns": int(dur.sum()),
        "phases": phases,
        "slow_steps": slow_steps(dur, per_step, skip),
    }


def slow_steps(dur: Any, per_step: dict[str, Any], first: int) -> list[dict[str, Any]]:
    """The steps over :data:`SLOW_FACTOR` times the median step (at most
    :data:`MAX_SLOW`, slowest first), each with the phase that made it slow:
    the one furthest above its own median ("backward 3.1x its median")."""
    if len(dur) < 4:
        return []
    median = float(np.median(dur))
    slow = np.flatnonzero(dur > SLOW_FACTOR * median)
    slow = slow[np.argsort(-dur[slow], kind="stable")][:MAX_SLOW]
    medians = {p: float(np.median(v)) for p, v in per_step.items()}
    out = []
    for i in slow:
        excess = {p: float(v[i]) - medians[p] for p, v in per_step.items()}
        phase = max(excess, key=lambda p: excess[p])
        base = medians[phase]
        out.append(
            {
                "step": first + int(i),
                "dur_ns": int(dur[i]),
                "median_step_ns": median,
                "phase": phase,
                "phase_ns": int(per_step[phase][i]),
                "phase_median_ns": base,
                "phase_factor": float(per_step[phase][i]) / base if base > 0 else None,
            }
        )
    return out


def anatomy_report(data: RunData, warmup_steps: int) -> tuple[dict[str, Any] | None, str | None]:
    """The report's ``anatomy`` section, or None and the reason."""
    per_rank = [a for r in data.ranks if (a := rank_anatomy(data, r, warmup_steps)) is not None]
    if not per_rank:
        return None, NO_ANATOMY
    return {
        "method": (
            "each step's time covered by its phase spans (phase.*, else the user's forward/backward/optimizer "
            "spans; dataloader: the train loader's wait), other the rest of the step; warm-up steps left out"
        ),
        "phases": list(PHASES),
        "per_rank": per_rank,
    }, None
