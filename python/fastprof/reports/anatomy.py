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

from fastprof.profiler.slow_phase import slow_phase
from fastprof.recording.names import (
    GPU_PHASE_COUNTER,
    GPU_PHASE_STEP_COUNTER,
    PHASE_SPANS,
    PHASES,
    STEP_SPAN,
    TRAIN_NEXT,
)
from fastprof.reports.data import RunData, step_spans, sum_inside

#: Span names per phase: fastprof's own first, then the user's (used only
#: where the rank has none of fastprof's).
NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "dataloader": ((TRAIN_NEXT,), ()),
    "forward": ((PHASE_SPANS["forward"],), ("forward",)),
    "backward": ((PHASE_SPANS["backward"],), ("backward",)),
    "optimizer": ((PHASE_SPANS["optimizer"],), ("optimizer", "optimizer_step")),
    "communication": ((PHASE_SPANS["communication"],), ()),
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
    if source != STEP_SPAN or len(steps.ts) <= skip:
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
    out = {
        "rank": rank,
        "steps": len(ts),
        "warmup_steps_excluded": skip,
        "step_total_ns": int(dur.sum()),
        "phases": phases,
        "slow_steps": slow_steps(dur, per_step, skip),
    }
    gpu = gpu_phases(data, rank, phases, float(np.percentile(dur, 50)))
    if gpu is not None:
        out["gpu"] = gpu
    return out


#: The phases timed on the GPU: those fastprof records a span for.
GPU_PHASES = tuple(PHASE_SPANS)


def gpu_steps(data: RunData, rank: int) -> tuple[Any, dict[str, Any]] | None:
    """A rank's timed steps on the GPU: their numbers and each series of
    ``phase.gpu [ms]`` (ms, arrays in the order recorded), None without them.
    Each ms event's step is the value of the ``phase.gpu.step`` counter
    recorded just before it (a trace from before that counter has the step
    as a series ``step`` of the ms counter)."""
    c = data.cols.counters
    nid = data.name_id(GPU_PHASE_COUNTER)
    if nid is None:
        return None
    m = (c["name"] == nid) & (c["rank"] == rank)
    if not m.any():
        return None
    by: dict[str, dict[int, float]] = {}
    for t, sid, v in zip(c["ts"][m].tolist(), c["series"][m].tolist(), c["value"][m].tolist(), strict=True):
        by.setdefault(data.cols.names[int(sid)], {})[int(t)] = float(v)
    events = np.array(sorted({t for series in by.values() for t in series}), dtype=np.int64)
    old = by.pop("step", None)
    if old is not None:
        steps = np.array([old.get(int(t), -1.0) for t in events])
    else:
        sid = data.name_id(GPU_PHASE_STEP_COUNTER)
        sm = (c["name"] == sid) & (c["rank"] == rank) if sid is not None else np.zeros(len(c["ts"]), dtype=bool)
        order = np.argsort(c["ts"][sm], kind="stable")
        step_ts, step_val = c["ts"][sm][order], c["value"][sm][order]
        at = np.searchsorted(step_ts, events, side="right") - 1
        steps = np.where(at >= 0, step_val[np.maximum(at, 0)], -1.0)
    keep = steps >= 0
    if not keep.any():
        return None
    series = {k: np.array([v.get(int(t), 0.0) for t in events[keep]]) for k, v in by.items()}
    return steps[keep].astype(np.int64), series


def gpu_phases(data: RunData, rank: int, host: dict[str, Any], step_p50_ns: float) -> dict[str, Any] | None:
    """A rank's phases on the GPU (CUDA events, the steps the budget timed)
    beside the host's, None without them. ``host`` is the rank's ``phases``."""
    got = gpu_steps(data, rank)
    if got is None:
        return None
    steps, by = got
    none = np.zeros(len(steps))
    phases: dict[str, Any] = {}
    for p in GPU_PHASES:
        v = by.get(p, none) * 1e6
        phases[p] = {"p50_ns": float(np.percentile(v, 50)), "host_p50_ns": float(host[p]["p50_ns"])}
    span = by.get("span", none) * 1e6
    summed = sum(by.get(p, none) * 1e6 for p in GPU_PHASES)
    # The stream's time between the phases (a loss outside any module, a copy, a gap).
    between = np.maximum(span - summed, 0.0)
    gpu = sum(phases[p]["p50_ns"] for p in GPU_PHASES)
    on_host = sum(phases[p]["host_p50_ns"] for p in GPU_PHASES)
    ratio = gpu / on_host if on_host > 0 else None
    if ratio is None:
        verdict = "no host phase time to compare with"
    elif ratio >= GPU_BOUND:
        verdict = (
            f"GPU-bound: the phases take {ratio:.1f}x as long on the GPU as on the host, which launches them and "
            "then waits (the host's 'other' time is the GPU finishing)"
        )
    elif ratio <= HOST_BOUND:
        verdict = (
            "host-bound: the GPU finishes each phase as the host launches it (Python, launches, data loading or "
            "synchronisation are the limit, not the GPU's work)"
        )
    else:
        verdict = f"balanced: the phases take {ratio:.1f}x as long on the GPU as on the host"
    return {
        "method": "CUDA events on the current stream at each phase's begin and end, in the steps a 1% budget timed",
        "timed_steps": len(steps),
        "phases": phases,
        "span_p50_ns": float(np.percentile(span, 50)),
        "between_p50_ns": float(np.percentile(between, 50)),
        "step_p50_ns": step_p50_ns,
        "gpu_to_host": ratio,
        "verdict": verdict,
    }


#: GPU phase time over host phase time from which a rank is GPU-bound / up to which host-bound.
GPU_BOUND = 1.3
HOST_BOUND = 1.1


def slow_steps(dur: Any, per_step: dict[str, Any], first: int) -> list[dict[str, Any]]:
    """The steps over :data:`SLOW_FACTOR` times the median step (at most
    :data:`MAX_SLOW`, slowest first), each with the phase that made it slow
    (:func:`fastprof.profiler.slow_phase.slow_phase`, the live anomaly
    trigger's answer too): the one furthest above its own median over the
    other steps ("backward 3.1x its median")."""
    if len(dur) < 4:
        return []
    median = float(np.median(dur))
    slow = np.flatnonzero(dur > SLOW_FACTOR * median)
    slow = slow[np.argsort(-dur[slow], kind="stable")][:MAX_SLOW]
    out = []
    for i in slow:
        step = {p: float(v[i]) for p, v in per_step.items()}
        got = slow_phase(step, {p: np.delete(v, i) for p, v in per_step.items()})
        if got is None:
            continue
        out.append(
            {
                "step": first + int(i),
                "dur_ns": int(dur[i]),
                "median_step_ns": median,
                "phase": got.phase,
                "phase_ns": int(per_step[got.phase][i]),
                "phase_median_ns": got.median,
                "phase_factor": got.factor,
            }
        )
    return out


#: Phases that hold a rank's waiting for the others (never what made a rank late).
WAITING_PHASES = ("backward", "communication")
#: A rank is a straggler when the others' waiting for it is at least this
#: share of their step time (less is the jitter of ranks in step: 4% in a
#: 2-rank gloo job with no slow rank, 82% with a slow dataset on one) and at
#: least half of all waiting.
MIN_WAIT_SHARE = 0.05
#: Under DDP the ranks leave backward together: backward's end spread across
#: ranks at most this share of its begin spread.
SYNCED_SPREAD = 0.5


def _arrivals(data: RunData, ranks: list[int], warmup: int) -> list[tuple[str, Any]]:
    """Sync points as (kind, arrival ns per rank: an array ranks x points), on
    the clock-aligned timeline.

    * ``collective``: the k-th ``phase.communication`` span of each rank
      (ranks call the same collectives in the same order: the report's
      columns carry no args, so the per-group sequence is the order);
    * ``backward``: each step's first ``phase.backward`` begin, used only
      where the ranks leave backward together (DDP's gradient all-reduce
      runs inside backward, so a rank late into backward holds the others
      there), checked from the spread of backward's end across ranks."""
    out: list[tuple[str, Any]] = []
    comm = [data.spans(PHASE_SPANS["communication"], r).ts for r in ranks]
    n = min(len(c) for c in comm)
    if n:
        out.append(("collective", np.stack([c[:n] for c in comm])))
    begins, ends = [], []
    for r in ranks:
        steps, _ = step_spans(data, r)
        bw = data.spans(PHASE_SPANS["backward"], r)
        if not len(steps.ts) or not len(bw.ts):
            return out
        # The first backward span starting inside each step (-1 where none).
        i = np.searchsorted(bw.ts, steps.ts)
        ok = i < len(bw.ts)
        ok[ok] &= bw.ts[i[ok]] < steps.end[ok]
        b = np.where(ok, bw.ts[np.minimum(i, len(bw.ts) - 1)], -1)
        e = np.where(ok, bw.end[np.minimum(i, len(bw.ts) - 1)], -1)
        begins.append(b[warmup:])
        ends.append(e[warmup:])
    n = min(len(b) for b in begins)
    if n < 3:
        return out
    b, e = np.stack([x[:n] for x in begins]), np.stack([x[:n] for x in ends])
    keep = (b >= 0).all(axis=0)
    b, e = b[:, keep], e[:, keep]
    if b.shape[1] >= 3:
        begin_spread = float(np.median(b.max(axis=0) - b.min(axis=0)))
        end_spread = float(np.median(e.max(axis=0) - e.min(axis=0)))
        if begin_spread > 0 and end_spread <= SYNCED_SPREAD * begin_spread:
            out.append(("backward", b))
    return out


def stragglers(data: RunData, per_rank: list[dict[str, Any]], warmup: int) -> tuple[list[dict[str, Any]], str | None]:
    """Which ranks the others waited for (see :data:`MIN_WAIT_SHARE`), and
    the phase that made each late (the issue's ``anatomy.stragglers[]``),
    ordered by the waiting caused;
    and how the sync points were found (None with fewer than 2 ranks or
    none found)."""
    ranks = [int(a["rank"]) for a in per_rank]
    if len(ranks) < 2:
        return [], None
    points = _arrivals(data, ranks, warmup)
    if not points:
        return [], None
    last = np.zeros(len(ranks), np.int64)
    caused = np.zeros(len(ranks), np.float64)
    total = 0
    for _, arr in points:
        latest = arr.argmax(axis=0)
        wait = arr.max(axis=0)[None, :] - arr
        total += arr.shape[1]
        for i in range(len(ranks)):
            mine = latest == i
            last[i] += int(mine.sum())
            caused[i] += float(wait[:, mine].sum())
    by_rank = {int(a["rank"]): a["phases"] for a in per_rank}
    step_ns = {int(a["rank"]): float(a["step_total_ns"]) for a in per_rank}
    all_waiting = float(caused.sum())
    out: list[dict[str, Any]] = []
    for i, r in enumerate(ranks):
        others_ns = sum(step_ns[o] for o in ranks if o != r) or 1.0
        share = float(caused[i]) / others_ns
        if not last[i] or share < MIN_WAIT_SHARE or caused[i] < 0.5 * all_waiting:
            continue
        best, factor, excess = None, None, 0.0
        for p in PHASES:
            if p in WAITING_PHASES:
                continue
            mine = float(by_rank[r][p]["p50_ns"])
            others = float(np.median([by_rank[o][p]["p50_ns"] for o in ranks if o != r]))
            if mine - others > excess:
                best, excess = p, mine - others
                factor = mine / others if others > 0 else None
        out.append(
            {
                "rank": r,
                "phase": best,
                "phase_factor": factor,
                "last_arrival_share": float(last[i]) / total,
                "wait_caused_ns": int(caused[i]),
                "wait_caused_share": share,
                "sync_points": total,
            }
        )
    out.sort(key=lambda x: (-x["wait_caused_ns"], x["rank"]))
    kinds = " and ".join(SYNC_KINDS[k] for k, _ in points)
    return out, f"last arrival at {total} sync points on the clock-aligned timeline: {kinds}"


SYNC_KINDS = {
    "collective": "collectives (the k-th of each rank)",
    "backward": "backward entries (the ranks leave backward together)",
}


def straggler_line(s: dict[str, Any]) -> str:
    """One sentence for the terminal and the page."""
    phase = (
        "no phase of its own stands out"
        if s["phase"] is None
        else f"its {s['phase']} phase is "
        + (f"{s['phase_factor']:.1f}x the others'" if s["phase_factor"] else "absent on the others")
    )
    return (
        f"rank {s['rank']} arrives last at {100 * s['last_arrival_share']:.0f}% of {s['sync_points']} sync points, "
        f"the others waiting {s['wait_caused_ns'] / 1e6:.1f} ms for it "
        f"({100 * s['wait_caused_share']:.0f}% of their step time); {phase}"
    )


def anatomy_report(data: RunData, warmup_steps: int) -> tuple[dict[str, Any] | None, str | None]:
    """The report's ``anatomy`` section, or None and the reason."""
    per_rank = [a for r in data.ranks if (a := rank_anatomy(data, r, warmup_steps)) is not None]
    if not per_rank:
        return None, NO_ANATOMY
    warm = min(int(a["warmup_steps_excluded"]) for a in per_rank)
    strag, method = stragglers(data, per_rank, warm)
    return {
        "method": (
            "each step's time covered by its phase spans (phase.*, else the user's forward/backward/optimizer "
            "spans; dataloader: the train loader's wait), other the rest of the step; warm-up steps left out"
        ),
        "phases": list(PHASES),
        "per_rank": per_rank,
        "stragglers": strag,
        "straggler_method": method,
    }, None
