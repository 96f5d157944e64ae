"""Memory that grows step over step (issue #16): a robust slope over the run.

The per-step series (the CUDA allocator's bytes allocated at each step's end
where the job used CUDA, else the process's resident memory) is judged by
its Theil–Sen slope: the median of the slopes between every pair of steps
(at most :data:`MAX_POINTS` steps, evenly spaced, on long runs; the slope
and its interval over at most :data:`SLOPE_POINTS` of them, evenly spaced
again: the pairs are quadratic in the points, and 1,000 points' 500 k pairs
were most of a 1,024-rank report's time, #38). Unlike a
least-squares fit, a few outliers (a checkpoint's buffers, an allocator that
grows its pool once) cannot tilt it. Its 95% confidence interval is Sen's:
the pairwise slopes ranked ``(N ∓ C) / 2``, with ``N`` the number of pairs
and ``C = 1.96 * sqrt(n (n - 1) (2n + 5) / 18)`` (Kendall's S under no
trend).

A leak is growth that is still going on at the end of the run. It is
reported when an interval lies above zero *and* the growth adds at least
:data:`MIN_GROWTH_BYTES` and :data:`MIN_GROWTH_SHARE` of the series' median
(the floor): the whole run's interval, or that of the rising part at its end
(a leak that began late, whose run is mostly flat, so that most pairs of
steps differ by nothing), when that part takes the series at least the floor
above anything it held before (not one more tooth of a saw). A steady run
has a slope of zero inside an interval that holds zero. Where the growth
began is the step that best splits the run (or the part judged) into a flat
part and a rising one (a hinge ``a + b * max(0, step - k)`` fitted by least
squares at up to :data:`MAX_HINGES` candidate ``k``).

Growth that ended is not a leak: a cache that fills, a pool that grows once,
then stays. The step where it ended is the one that best splits the run into
a rising part and a flat one (the mirrored hinge ``a + b * min(step, k)``);
when the part after it is long enough to judge (at least :data:`MIN_STEPS`
steps and :data:`MIN_FLAT_SHARE` of the run), does not grow at a rate that
would add the floor over the run, and the series rose by at least the floor
before it, the verdict is "grew until step N, flat since" and nothing fires,
however long the fill took (a fill over most of the run has a Theil-Sen
slope above zero over the whole run).

Steps that a profiler makes grow are not the job's: a ``torch.profiler``
window (its warm-up and active steps, and the step after it, while its
export runs on a thread) keeps its events and the profiler's buffers in
host memory, hundreds of MB on a small CNN. Such ``excluded`` steps are cut
out of the series: the series is rebuilt from the step-over-step changes of
the steps kept (a window's jump is not carried over), the slope is per
judged step, and at least :data:`MIN_STEPS` steps must remain.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

#: Steps kept for the pairwise slopes (N = n (n - 1) / 2 pairs: ~500 k here).
MAX_POINTS = 1000
#: Points the pairwise slopes are taken over (evenly spaced among those
#: given: N = n (n - 1) / 2 pairs, ~32 k here), and Sen's interval with them.
SLOPE_POINTS = 256
#: Candidate starts of the growth tried.
MAX_HINGES = 200
#: The fewest steps judged.
MIN_STEPS = 8
#: Growth over the run below this is never a leak...
MIN_GROWTH_BYTES = 16 * 2**20
#: ... nor below this share of the series' median.
MIN_GROWTH_SHARE = 0.05
#: The flat part after growth that ended, as a share of the steps judged.
MIN_FLAT_SHARE = 0.1
Z95 = 1.959963984540054


def theil_sen(x: npt.ArrayLike, y: npt.ArrayLike) -> tuple[float, float, float]:
    """(slope, low, high): the Theil–Sen slope of ``y`` over ``x`` and Sen's
    95% interval (NaNs with fewer than 2 points), over at most
    :data:`SLOPE_POINTS` of the points, evenly spaced (the first and the
    last always among them)."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if len(xa) > SLOPE_POINTS:
        pick = np.unique(np.linspace(0, len(xa) - 1, SLOPE_POINTS).astype(np.int64))
        xa, ya = xa[pick], ya[pick]
    n = len(xa)
    if n < 2:
        return math.nan, math.nan, math.nan
    i, j = np.triu_indices(n, 1)
    dx = xa[j] - xa[i]
    keep = dx != 0
    slopes = (ya[j] - ya[i])[keep] / dx[keep]
    del i, j, dx, keep
    pairs = len(slopes)
    if not pairs:
        return math.nan, math.nan, math.nan
    c = Z95 * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    lo = max(0, math.floor((pairs - c) / 2))
    hi = min(pairs - 1, math.ceil((pairs + c) / 2))
    mid = pairs // 2
    ranks = sorted({lo, hi, mid, (pairs - 1) // 2})
    part = np.partition(slopes, ranks)
    slope = float(part[mid]) if pairs % 2 else float((part[mid] + part[(pairs - 1) // 2]) / 2)
    return slope, float(part[lo]), float(part[hi])


def hinge_start(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> int:
    """Index into ``x`` where a flat-then-rising fit puts the start of the rise."""
    n = len(x)
    if n < 4:
        return 0
    cand = np.unique(np.linspace(0, n - 3, min(MAX_HINGES, n - 2)).astype(np.int64))
    return _best_hinge(cand, np.maximum(0.0, x[None, :] - x[cand][:, None]), y)


def plateau_start(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> int:
    """Index into ``x`` where a rising-then-flat fit puts the end of the
    rise (``len(x) - 1`` when a straight line fits best)."""
    n = len(x)
    if n < 4:
        return n - 1
    cand = np.unique(np.linspace(2, n - 1, min(MAX_HINGES, n - 2)).astype(np.int64))
    return _best_hinge(cand, np.minimum(x[None, :], x[cand][:, None]), y)


def _best_hinge(cand: npt.NDArray[np.int64], z: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> int:
    """The candidate whose hinged regressor ``z`` (one row per candidate)
    fits ``y`` with the least squared error, by a straight line on it."""
    zc = z - z.mean(axis=1, keepdims=True)
    yc = y - y.mean()
    szz = (zc * zc).sum(axis=1)
    szy = zc @ yc
    with np.errstate(invalid="ignore", divide="ignore"):
        sse = (yc @ yc) - np.where(szz > 0, szy * szy / szz, 0.0)
    return int(cand[int(np.argmin(sse))])


def _ended(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], n: int, floor: float) -> int | None:
    """Index into ``x`` where growth of at least ``floor`` ended, the rest
    of the run flat (see the module documentation); None when it did not."""
    k = plateau_start(x, y)
    # A flat stretch before the rise pulls the one-hinge fit late: fit again
    # from where the rise began.
    b = hinge_start(x[: k + 1], y[: k + 1])
    k = b + plateau_start(x[b:], y[b:])
    tail = x >= x[k]
    if n - x[k] < max(MIN_STEPS, MIN_FLAT_SHARE * n) or tail.sum() < MIN_STEPS:
        return None
    slope, lo, _ = theil_sen(x[tail], y[tail])
    if lo > 0 and slope * (n - 1) >= floor:
        return None  # still growing
    q1, q3 = np.percentile(y[tail], [25, 75])
    if _rise(y, k, tail) < max(floor, 2 * float(q3 - q1)):
        return None  # no growth worth the name before it (or a saw, not a plateau)
    return k


def _rise(y: npt.NDArray[np.float64], k: int, tail: npt.NDArray[np.bool_]) -> float:
    """How far the series rose before its flat part (``tail``, from ``k``):
    the flat part's median over that of the run's first steps."""
    return float(np.median(y[tail]) - np.median(y[: max(2, min(k, MIN_STEPS))]))


def _late(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], floor: float) -> int | None:
    """Index into ``x`` where growth still going on at the end began, when
    the rising part at the end of the run is a leak on its own (see the
    module documentation)."""
    k = hinge_start(x, y)
    part = x >= x[k]
    if part.sum() < MIN_STEPS:
        return None
    slope, lo, _ = theil_sen(x[part], y[part])
    end = float(np.median(y[-max(2, MIN_STEPS // 2) :]))
    if lo > 0 and slope * (x[-1] - x[k]) >= floor and end - float(y[: k + 1].max()) >= floor:
        return k
    return None


def growth(
    values: npt.ArrayLike,
    first_step: int = 0,
    excluded: Iterable[int] = (),
    not_judged: str | None = None,
    steps: npt.ArrayLike | None = None,
) -> dict[str, Any]:
    """The growth of one per-step series (bytes at steps' ends, in step
    order), judged on the steps not ``excluded`` (run step numbers; see the
    module documentation). ``steps``: the run step each reading was taken at
    the end of (increasing; short steps share a reading, so steps may be
    missing); by default reading ``k`` is step ``first_step + k``. The slope
    is per judged step whatever the readings' spacing. ``not_judged``: why
    the series cannot be judged (the steps to leave out are unknown); it is
    described, and that is its verdict."""
    raw = np.asarray(values, dtype=np.float64)
    n_all = len(raw)
    at = first_step + np.arange(n_all) if steps is None else np.asarray(steps, dtype=np.int64)
    if len(at) != n_all:
        raise ValueError(f"growth: {n_all} readings but {len(at)} step numbers")
    excl = np.unique(np.fromiter((int(s) for s in excluded), dtype=np.int64))
    drop = np.isin(at, excl)
    kept = np.flatnonzero(~drop)
    # Each reading's position among the judged steps (an excluded step
    # before it does not count): consecutive for a reading at every step.
    pos = (at - np.searchsorted(excl, at)).astype(np.float64)
    if n_all and drop.any():
        # Stitch: the kept steps' changes only, from the first value on.
        d = np.diff(raw, prepend=raw[0])
        y = raw[0] + np.cumsum(np.where(drop, 0.0, d))[kept]
    else:
        y = raw
    n = len(y)
    out: dict[str, Any] = {
        "steps": n_all,
        "steps_judged": n,
        "start_b": float(raw[0]) if n_all else None,
        "end_b": float(raw[-1]) if n_all else None,
        "peak_b": float(raw.max()) if n_all else None,
        "growth_b_per_step": None,
        "growth_ci_b_per_step": None,
        "growth_total_b": None,
        "began_at_step": None,
        "ended_at_step": None,
        "leak": False,
        "verdict": f"too few steps (fewer than {MIN_STEPS})",
    }
    if not_judged is not None:
        out["verdict"] = not_judged
        return out
    if n < MIN_STEPS <= n_all:
        out["verdict"] = (
            f"too few steps outside the profiler's windows ({n} of {n_all}; fewer than {MIN_STEPS}): not judged"
        )
    if n < MIN_STEPS or not np.isfinite(y).all():
        if n >= MIN_STEPS:
            out["verdict"] = "not judged: the series holds non-finite values"
        return out
    idx = np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).astype(np.int64))
    judged = pos[kept] - pos[kept[0]]
    x = judged[idx]
    ys = y[idx]
    slope, lo, hi = theil_sen(x, ys)
    span = int(judged[-1]) + 1  # judged steps from the first reading to the last
    total = slope * (span - 1)
    floor = max(MIN_GROWTH_BYTES, MIN_GROWTH_SHARE * float(np.median(y)))

    def step_of(i: int) -> int:
        return int(at[kept[idx[i]]])

    out.update(growth_b_per_step=slope, growth_ci_b_per_step=[lo, hi], growth_total_b=total)
    ended = _ended(x, ys, span, floor)
    if ended is not None:
        began = hinge_start(x[: ended + 1], ys[: ended + 1])
        rise = _rise(ys, ended, x >= x[ended])
        out.update(
            began_at_step=step_of(began),
            ended_at_step=step_of(ended),
            verdict=(
                f"grew until step {step_of(ended)}, flat since "
                f"(+{rise / 2**20:.1f} MiB from step {step_of(began)}; not a leak)"
            ),
        )
        return out
    start: int | None = None
    if lo > 0 and total >= floor:
        start = hinge_start(x, ys)
    else:
        start = _late(x, ys, floor)
    if start is not None:
        out.update(leak=True, verdict="grows", began_at_step=step_of(start))
        return out
    out["verdict"] = (
        "steady: the 95% interval of the slope holds zero"
        if lo <= 0
        else f"grows less than {floor / 2**20:.1f} MiB over the run"
    )
    return out
