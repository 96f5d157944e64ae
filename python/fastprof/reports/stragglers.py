"""Stragglers across ranks, named only beyond the run's own noise and only
when they cost the others a share of their time worth acting on (issue #36,
item 2; every slow rank named, issue #38, item 4).

The points where the ranks synchronise (the k-th collective from Python of
every rank; each step's backward, where the ranks leave it together as DDP's
gradient all-reduce holds them) are read from the clock-aligned timeline,
warm-up steps left out, each with every rank's arrival (the span's begin) and
release (its end). At backward the arrival is the rank's own gradients ready
where the anatomy marked it (``BACKWARD_GRADS_SPAN``'s end: a
post-accumulate-grad hook on the parameter accumulated last, before the
all-reduce holds the rank), else backward's begin: both ranks' backward
spans are the same under DDP, so without the mark a rank slow inside
backward is in no one's excess. The rank's own backward (begin to the mark)
is then a phase of its own for naming what made it late. A rank's *own time* before a sync point is its arrival
there less its release from the sync point before: the work it did between
the two. Its *excess* there is its own time less the other ranks' median own
time: how much longer the others waited for it than for a rank of their
pace. Own time, not the arrival alone: ranks are not released from a
collective at the same instant (gloo's two ranks leave an all-reduce ~0.8 ms
apart on a loaded host, the same rank later most of the time), and a rank
released later arrives later at the next point without being slow. Then,
from the run itself:

* the **jitter between ranks** is the robust spread (1.4826 x the median
  absolute deviation) of every rank's excess around that rank's own median
  excess at that kind of sync point: how far ranks that keep pace scatter;
* a rank's **excess a step** is its mean excess summed over the sync points
  of a step, with a 95% interval from the points' standard error;
* a rank is a **straggler** when all of these hold (:data:`MIN_POINTS`,
  :data:`MIN_Z`, :data:`MIN_JITTERS`, :data:`MIN_COST_SHARE`): enough sync
  points; its mean excess at least ``MIN_Z`` standard errors above zero (one
  preempted step does not make a straggler); its mean excess a sync point at
  least ``MIN_JITTERS`` times the jitter between ranks; and the others'
  waiting for it at least ``MIN_COST_SHARE`` of the job's time (the median
  rank's total step time over the same steps).

Every rank that passes is named, most costly first; ranks tied with the
others (equal arrivals) have no excess and are never blamed. Where none
passes, the report says the ranks kept pace, and within how much.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastprof.recording.names import BACKWARD_GRADS_SPAN, PHASE_SPANS, PHASES
from fastprof.reports.data import RunData, step_spans

#: Sync points needed before any rank is judged.
MIN_POINTS = 8
#: A straggler's mean excess over its standard error (one-sided normal
#: p ~ 3e-5 a rank: about 0.03 false names in 1,024 ranks of pure noise).
MIN_Z = 4.0
#: A straggler's mean excess a sync point over the jitter between ranks.
MIN_JITTERS = 3.0
#: The others' waiting for a straggler over the job's time: less is not
#: worth acting on.
MIN_COST_SHARE = 0.03
#: Phases that hold a rank's waiting for the others (never what made it late;
#: backward's own part, up to the rank's gradients ready, is: :func:`own_backward`).
WAITING_PHASES = ("backward", "communication")
#: Under DDP the ranks leave backward together: backward's end spread across
#: ranks at most this share of its begin spread, or at most the spread of
#: their release from a collective (:func:`backward_synced`).
SYNCED_SPREAD = 0.5
#: 1.4826 x MAD estimates a normal spread's standard deviation.
MAD_TO_SD = 1.4826

SYNC_KINDS = {
    "collective": "collectives (the k-th of each rank)",
    "backward": "backward entries (the ranks leave backward together)",
    "backward_grads": (
        "backwards (arrival: the rank's own gradients ready, before DDP's all-reduce; the ranks leave together)"
    ),
}

RULE = (
    f"a rank is named when, over at least {MIN_POINTS} sync points, its mean own time between sync points over "
    f"the other ranks' median is at least {MIN_Z:g} standard errors above zero and {MIN_JITTERS:g}x the jitter "
    "between ranks, "
    f"and the others' waiting for it is at least {100 * MIN_COST_SHARE:g}% of the job's time"
)


def loo_median(m: Any) -> Any:
    """For a ranks x points matrix, each entry's median of the *other* rows
    in its column (exact, vectorised: O(R log R) a column)."""
    r = m.shape[0]
    if r < 2:
        return np.full(m.shape, np.nan)
    order = np.argsort(m, axis=0, kind="stable")
    s = np.take_along_axis(m, order, axis=0)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(r)[:, None].repeat(m.shape[1], axis=1), axis=0)
    if r % 2 == 0:  # r - 1 others, odd: one middle value
        h = r // 2
        return np.where(pos < h, s[h], s[h - 1])
    h = (r - 1) // 2  # r - 1 others, even: the mean of the two middle ones
    lo = np.where(pos < h, s[h], s[h - 1])
    hi = np.where(pos > h, s[h], s[h + 1])
    return (lo.astype(np.float64) + hi.astype(np.float64)) / 2.0


def backward_synced(begin_spread: float, end_spread: float, release_spread: float | None) -> bool:
    """Whether backward's end is a sync point (DDP's gradient all-reduce
    holds the ranks): the ranks leave it at most as far apart as they leave
    a collective (``release_spread``, the median spread of the collectives'
    ends; None without one), or at most :data:`SYNCED_SPREAD` as far apart
    as they enter it (medians over the steps, ns). The second alone missed
    it where the ranks enter backward almost together (rank 1 sleeping
    inside backward, before the all-reduce: ends 0.42 ms apart, begins
    0.6-0.9 ms), and the ranks released later from that hidden sync point
    were then named stragglers at the next one."""
    if begin_spread <= 0 and end_spread <= 0:
        return False
    if release_spread is not None and end_spread <= release_spread:
        return True
    return begin_spread > 0 and end_spread <= SYNCED_SPREAD * begin_spread


def _after_warmup(data: RunData, ranks: list[int], warmup: int) -> list[int]:
    """The start (ns) of each rank's first step after the warm-up."""
    out = []
    for r in ranks:
        steps, _ = step_spans(data, r)
        out.append(int(steps.ts[warmup]) if len(steps.ts) > warmup else (int(steps.ts[0]) if len(steps.ts) else 0))
    return out


def sync_points(data: RunData, ranks: list[int], warmup: int) -> list[tuple[str, Any, Any]]:
    """Sync points as (kind, arrival ns, release ns: ranks x points each) on
    the clock-aligned timeline, warm-up steps left out.

    * ``collective``: the k-th ``phase.communication`` span of each rank
      (ranks call the same collectives in the same order; the columns carry
      no args, so the order stands in for the per-group sequence);
    * ``backward``: each step's first ``phase.backward`` begin, used only
      where the ranks leave backward together (:func:`backward_synced`);
    * ``backward_grads``: the same backwards with the rank's own gradients
      ready as the arrival, where every rank has the mark: always used
      (backward's span past the mark is the wait for the others, or next to
      nothing)."""
    out: list[tuple[str, Any, Any]] = []
    starts = _after_warmup(data, ranks, warmup)
    comm = [data.spans(PHASE_SPANS["communication"], r) for r in ranks]
    skip = min(int(np.searchsorted(c.ts, s)) for c, s in zip(comm, starts, strict=True))
    n = min(len(c.ts) for c in comm) - skip
    release_spread = None
    if n > 0:
        c_end = np.stack([c.end[skip : skip + n] for c in comm])
        release_spread = float(np.median(c_end.max(axis=0) - c_end.min(axis=0)))
        out.append(
            (
                "collective",
                np.stack([c.ts[skip : skip + n] for c in comm]),
                c_end,
            )
        )
    begins, arrivals, ends = [], [], []
    marked = True
    for r in ranks:
        steps, _ = step_spans(data, r)
        bw = data.spans(PHASE_SPANS["backward"], r)
        if not len(steps.ts) or not len(bw.ts):
            return out
        i = np.searchsorted(bw.ts, steps.ts)
        ok = i < len(bw.ts)
        j = np.minimum(i, len(bw.ts) - 1)
        ok &= bw.ts[j] < steps.end
        begins.append(np.where(ok, bw.ts[j], -1)[warmup:])
        ends.append(np.where(ok, bw.end[j], -1)[warmup:])
        ready = grads_ready(data, r, bw.ts[j])
        marked &= bool((ready[ok] >= 0).any())
        arrivals.append(np.where(ok, ready, -1)[warmup:])
    n = min(len(b) for b in begins)
    if n < 3:
        return out
    b, e = np.stack([x[:n] for x in begins]), np.stack([x[:n] for x in ends])
    a = np.stack([x[:n] for x in arrivals])
    keep = (b >= 0).all(axis=0)
    if marked:  # every rank's own gradients marked: the arrival is the mark
        keep &= (a >= 0).all(axis=0)
        b = a
    b, e = b[:, keep], e[:, keep]
    if b.shape[1] >= 3:
        begin_spread = float(np.median(b.max(axis=0) - b.min(axis=0)))
        end_spread = float(np.median(e.max(axis=0) - e.min(axis=0)))
        # With the mark, what backward's span holds past it is the wait for
        # the others (DDP's all-reduce), or next to nothing: a sync point
        # whether or not the ranks leave together (a spread test missed it in
        # runs where the ranks arrive as together as they leave).
        if marked or backward_synced(begin_spread, end_spread, release_spread):
            out.append(("backward_grads" if marked else "backward", b, e))
    return out


def grads_ready(data: RunData, rank: int, begins: Any) -> Any:
    """For backwards beginning at ``begins`` (ns), when the rank's own
    gradients were ready in each (the last grads-ready span begun with it,
    its end; -1: none)."""
    g = data.spans(BACKWARD_GRADS_SPAN, rank)
    if not len(g.ts):
        return np.full(len(begins), -1, np.int64)
    k = np.searchsorted(g.ts, begins, side="right") - 1
    kk = np.maximum(k, 0)
    return np.where((k >= 0) & (g.ts[kk] == begins), g.end[kk], -1)


def own_backward(data: RunData, ranks: list[int]) -> dict[int, float] | None:
    """Each rank's own backward (its begin to its own gradients ready, not
    the wait for the others in DDP's all-reduce), total ns; None where a
    rank has no marks."""
    out: dict[int, float] = {}
    for r in ranks:
        bw = data.spans(PHASE_SPANS["backward"], r)
        ready = grads_ready(data, r, bw.ts)
        ok = ready >= 0
        if not ok.any():
            return None
        # Backwards without a mark (none under DDP) count whole.
        out[r] = float(np.where(ok, ready - bw.ts, bw.end - bw.ts).mean())
    return out


def _phase(
    by_rank: dict[int, dict[str, Any]],
    steps: dict[int, int],
    ranks: list[int],
    backward: dict[int, float] | None = None,
) -> dict[int, Any]:
    """Each rank's phase furthest above the others' (mean time a step, over
    the other ranks' median), with its excess a step and the factor;
    ``backward``: each rank's own backward (:func:`own_backward`), where
    known, a phase of its own too."""
    own = [p for p in PHASES if p not in WAITING_PHASES]
    rows = [[float(by_rank[r][p]["total_ns"]) / max(steps[r], 1) for r in ranks] for p in own]
    if backward is not None:
        own.append("backward")
        rows.append([backward[r] for r in ranks])
    m = np.array(rows, dtype=np.float64)  # phases x ranks
    others = loo_median(m.T).T
    out: dict[int, Any] = {}
    for i, r in enumerate(ranks):
        ex = m[:, i] - others[:, i]
        k = int(np.argmax(ex))
        if ex[k] <= 0:
            out[r] = (None, None, 0.0)
        else:
            out[r] = (own[k], float(m[k, i] / others[k, i]) if others[k, i] > 0 else None, float(ex[k]))
    return out


def straggler_section(data: RunData, per_rank: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """The anatomy section's ``stragglers``, ``straggler_method`` and
    ``ranks_in_pace`` (see the module)."""
    empty: dict[str, Any] = {"stragglers": [], "straggler_method": None, "ranks_in_pace": None}
    ranks = [int(a["rank"]) for a in per_rank]
    if len(ranks) < 2:
        return empty
    points = sync_points(data, ranks, warmup)
    if not points:
        return empty
    arr = np.concatenate([a for _, a, _ in points], axis=1).astype(np.float64)
    rel = np.concatenate([e for _, _, e in points], axis=1).astype(np.float64)
    kind_of = np.concatenate([np.full(a.shape[1], i) for i, (_, a, _) in enumerate(points)])
    # In time order (the ranks' median arrival), the kinds interleaved.
    order = np.argsort(np.median(arr, axis=0), kind="stable")
    arr, rel, kind_of = arr[:, order], rel[:, order], kind_of[order]
    own = arr[:, 1:] - rel[:, :-1]  # each rank's time from one sync point to the next
    arr, kind_of = arr[:, 1:], kind_of[1:]
    k = own.shape[1]
    if k < 1:
        return empty
    kinds = " and ".join(SYNC_KINDS[kind] for kind, _, _ in points)
    method = (
        f"own time (arrival less release from the sync point before) over the other ranks' median, "
        f"at {k} sync points on the clock-aligned timeline: {kinds}"
    )
    excess = own - loo_median(own)  # ranks x points
    # Around each rank's own median excess at each kind of sync point (a rank
    # slow in forward is late at every backward entry, not at the collective
    # after its optimizer: one median for both would count that as jitter).
    resid = np.empty_like(excess)
    for i in np.unique(kind_of):
        at = kind_of == i
        resid[:, at] = excess[:, at] - np.median(excess[:, at], axis=1, keepdims=True)
    jitter = MAD_TO_SD * float(np.median(np.abs(resid)))
    steps = {int(a["rank"]): int(a["steps"]) for a in per_rank}
    n_steps = max(min(steps.values()), 1)
    job_ns = float(np.median([float(a["step_total_ns"]) for a in per_rank])) or 1.0
    # A step's excess and its standard error, stratified by kind of sync
    # point (a rank slow in forward: the full lead at each backward entry,
    # none at the collective after it, and no spread within either).
    per_step = np.zeros(len(ranks))
    var = np.zeros(len(ranks))
    for i in np.unique(kind_of):
        x = excess[:, kind_of == i]
        w = x.shape[1] / n_steps  # points of this kind a step
        per_step += w * x.mean(axis=1)
        if x.shape[1] > 1:
            var += w * w * x.var(axis=1, ddof=1) / x.shape[1]
    se = np.sqrt(var)
    mean = per_step * n_steps / k  # a sync point
    total = np.maximum(excess.sum(axis=1), 0.0)
    share = total / job_ns
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, per_step / se, np.where(per_step > 0, np.inf, 0.0))
    # Last only where strictly after every other rank: ties are no one's.
    srt = np.sort(arr, axis=0)
    last = (arr == srt[-1]) & (srt[-1] > srt[-2])
    named = (k >= MIN_POINTS) & (z >= MIN_Z) & (mean >= MIN_JITTERS * jitter) & (mean > 0) & (share >= MIN_COST_SHARE)
    phases = _phase({int(a["rank"]): a["phases"] for a in per_rank}, steps, ranks, own_backward(data, ranks))
    out: list[dict[str, Any]] = []
    for i in np.flatnonzero(named):
        r = ranks[int(i)]
        phase, factor, phase_ex = phases[r]
        out.append(
            {
                "rank": r,
                "phase": phase,
                "phase_factor": factor,
                "phase_excess_ns": phase_ex,
                "last_arrival_share": float(last[i].mean()),
                "wait_caused_ns": int(total[i]),
                "wait_caused_share": float(share[i]),
                "sync_points": k,
                "excess_per_step_ns": float(per_step[i]),
                "excess_ci95_ns": float(1.96 * se[i]),
                "z": float(z[i]) if math.isfinite(z[i]) else None,
            }
        )
    out.sort(key=lambda s: (-s["wait_caused_ns"], s["rank"]))
    worst = int(np.argmax(mean))
    pace = {
        "jitter_ns": jitter,
        "sync_points": k,
        "steps": n_steps,
        "rule": RULE,
        "min_cost_share": MIN_COST_SHARE,
        "min_z": MIN_Z,
        "min_jitters": MIN_JITTERS,
        "most_behind": {
            "rank": ranks[worst],
            "excess_per_step_ns": float(max(per_step[worst], 0.0)),
            "excess_ci95_ns": float(1.96 * se[worst]),
            "cost_share": float(share[worst]),
            "z": float(z[worst]) if math.isfinite(z[worst]) else None,
        },
    }
    return {"stragglers": out, "straggler_method": method, "ranks_in_pace": pace}


def fmt_ns(ns: float) -> str:
    """A duration as the sentences print it: "41 ms", "6.21 ms", "30 µs"."""
    if abs(ns) >= 10e6:
        return f"{ns / 1e6:.0f} ms"
    return f"{ns / 1e6:.2f} ms" if abs(ns) >= 1e6 else f"{ns / 1e3:.0f} µs"


def straggler_line(s: dict[str, Any], jitter_ns: float | None = None) -> str:
    """One sentence for the terminal and the page: "rank 3, forward: 41 ms a
    step over the others (± 2 ms, 95%), 18% of the job's time; ..."."""
    where = "no phase of its own stands out" if s.get("phase") is None else s["phase"]
    if "excess_per_step_ns" not in s:  # a report written before the noise rule
        size = f"the others waiting {s['wait_caused_ns'] / 1e6:.1f} ms for it"
    else:
        size = f"{fmt_ns(s['excess_per_step_ns'])} a step over the others (± {fmt_ns(s['excess_ci95_ns'])}, 95%)"
    text = (
        f"rank {s['rank']}, {where}: {size}, {100 * s['wait_caused_share']:.0f}% of the job's time; "
        f"last at {100 * s['last_arrival_share']:.0f}% of {s['sync_points']} sync points"
    )
    return text if jitter_ns is None else f"{text}; jitter between ranks {fmt_ns(jitter_ns)}"


def pace_line(pace: dict[str, Any]) -> str:
    """The sentence where no rank is named: the ranks kept pace, within how much."""
    w = pace["most_behind"]
    return (
        f"the ranks kept pace: none took longer between sync points than the others by more than their "
        f"jitter and {100 * pace['min_cost_share']:g}% of the job's time (jitter between ranks "
        f"{fmt_ns(pace['jitter_ns'])} at {pace['sync_points']} sync points); the most behind, rank {w['rank']}, "
        f"{fmt_ns(w['excess_per_step_ns'])} a step (± {fmt_ns(w['excess_ci95_ns'])}), "
        f"{100 * w['cost_share']:.1f}% of the job's time"
    )
