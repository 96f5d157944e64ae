"""Speed report: training and validation iterations/s and samples/s, loader
throughput, and the step-time distribution with its trend (the median of the
last tenth of the measured steps against the first tenth's: :func:`step_trend`).

Warm-up steps (one-time costs: lazy init, worker start, allocator growth) are
left out of the rates and of the distribution, and the report says how many
and why: the ``warmup_steps`` given, else the schedule's ``skip_first``, else
the first step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastprof.recording.names import TRAIN_LOADER, TRAIN_NEXT, loader_batch_size, loader_iter, loader_next, loader_wait
from fastprof.reports.data import RunData, loader_names, step_spans, warmup_from_schedule
from fastprof.reports.phases import sum_inside


def warmup_steps(data: RunData, given: int | None) -> tuple[int, str]:
    if given is not None:
        return max(0, int(given)), "given (warmup_steps)"
    skip = max((warmup_from_schedule(p) for p in data.profiler.values()), default=0)
    if skip > 0:
        return skip, "the schedule's skip_first"
    return 1, "default: the first step (one-time setup costs)"


#: The largest batch size a counter may give: past 2**53 a float64 no longer
#: holds every whole number, so the value cannot be a count of samples.
MAX_BATCH = 2**53


def batch_size(data: RunData, given: int | None) -> tuple[int | None, str]:
    if given is not None:
        return int(given), "given (batch_size)"
    unknown = "unknown: pass batch_size= (or --batch-size), or record a 'batch_size' counter"
    for name in ("batch_size", loader_batch_size(TRAIN_LOADER)):
        for r in data.ranks:
            _ts, v = data.counter(name, r)
            if not len(v) or not v[-1] > 0:
                continue
            last = float(v[-1])
            if last > MAX_BATCH or not last.is_integer():
                # NaN and inf fail both tests too (inf > MAX_BATCH; NaN is not > 0 above).
                why = f"counter {name!r} on rank {r} ends at {last:g}, not a whole number from 1 to 2**53"
                data.cols.warnings.append(f"{why}: not used as the batch size")
                return None, f"{unknown} ({why})"
            return int(last), f"counter {name!r}"
    return None, unknown


def _dist(x: np.ndarray[Any, np.dtype[np.float64]]) -> dict[str, Any]:
    if not len(x):
        return {"count": 0, "mean_s": None, "p50_s": None, "p95_s": None, "max_s": None}
    return {
        "count": len(x),
        "mean_s": float(x.mean()),
        "p50_s": float(np.percentile(x, 50)),
        "p95_s": float(np.percentile(x, 95)),
        "max_s": float(x.max()),
    }


#: The trend needs this many measured steps (warm-up left out) on a rank: with
#: fewer, a tenth of them is one step or none, and one step's time is noise.
TREND_MIN_STEPS = 10
#: Each end of the run the trend compares holds a tenth of the measured steps,
#: and never fewer than this (a 30-step run: 3 at each end), so that its
#: median can pass over one odd step.
TREND_MIN_WINDOW = 3

#: The trend's definition (report.json's schema describes
#: ``speed.step_time.trend`` in the same words; :func:`trend_note` says it
#: with a run's own numbers).
TREND_DEFINITION = (
    "the median step time of the last tenth of the measured steps against the first tenth's "
    f"(at least {TREND_MIN_WINDOW} steps each; the warm-up steps the rates leave out are left out; "
    f"every rank's steps pooled); none under {TREND_MIN_STEPS} measured steps"
)


def trend_window(n: int) -> int:
    """How many steps at each end of ``n`` measured steps the trend compares."""
    return max(TREND_MIN_WINDOW, math.ceil(n / 10))


def step_trend(per_rank: Sequence[np.ndarray[Any, np.dtype[np.float64]]]) -> dict[str, float | None]:
    """The step-time trend over the run from each rank's measured step
    durations (seconds, warm-up already left out): the median of the last
    :func:`trend_window` steps of every rank against the median of their
    first ones, so that a user can check it by hand in the step table.

    A fitted slope extrapolated over the run read -157% on the demo (slow
    first steps) and +250% on a flat run with one 0.5 s step near its end;
    two medians of real steps cannot fall by more than 100% and pass over
    one odd step. Ranks with fewer than :data:`TREND_MIN_STEPS` steps take
    no part; with none left both figures are None. ``slope_s_per_step`` is
    the change of the median over the steps between the two windows'
    middles (the longest rank's)."""
    first: list[np.ndarray[Any, np.dtype[np.float64]]] = []
    last: list[np.ndarray[Any, np.dtype[np.float64]]] = []
    between = 0
    for d in per_rank:
        n = len(d)
        if n < TREND_MIN_STEPS:
            continue
        k = trend_window(n)
        first.append(d[:k])
        last.append(d[n - k :])
        between = max(between, n - k)
    if not first:
        return {"slope_s_per_step": None, "change_pct_over_run": None}
    a = float(np.median(np.concatenate(first)))
    b = float(np.median(np.concatenate(last)))
    return {
        "slope_s_per_step": (b - a) / between,
        "change_pct_over_run": 100.0 * (b - a) / a if a > 0 else None,
    }


def trend_text(speed: dict[str, Any]) -> str:
    """The trend's value as the terminal and the page show it: the change,
    or why there is none."""
    pct = speed["step_time"]["trend"]["change_pct_over_run"]
    if pct is not None:
        return f"{pct:+.1f}%"
    measured = max((int(r["steps_measured"]) for r in speed["train"]["per_rank"]), default=0)
    if measured < TREND_MIN_STEPS:
        return f"none ({measured} measured steps, fewer than {TREND_MIN_STEPS})"
    return "none (the first steps' median is 0 s)"


def trend_note(speed: dict[str, Any]) -> str:
    """How the trend was taken, with this run's numbers: what a user needs
    to check it by hand. The definition alone where the ranks' counts
    differ or no rank has enough steps."""
    counts = {int(r["steps_measured"]) for r in speed["train"]["per_rank"]}
    if len(counts) != 1 or min(counts) < TREND_MIN_STEPS:
        return f"Step time trend: {TREND_DEFINITION}."
    n = counts.pop()
    k = trend_window(n)
    ranks = ", every rank's pooled" if len(speed["train"]["per_rank"]) > 1 else ""
    warm = int(speed["warmup"]["steps_excluded"])
    return (
        f"Step time trend: the median of the last {k} of the {n} measured steps against the median of the "
        f"first {k}{ranks} (a tenth of them at each end, at least {TREND_MIN_WINDOW}; {warm} warm-up step(s) "
        f"left out, as for the rates; no trend under {TREND_MIN_STEPS} measured steps)."
    )


def speed_report(data: RunData, warmup: int | None = None, batch: int | None = None) -> dict[str, Any]:
    n_warm, warm_src = warmup_steps(data, warmup)
    bs, bs_src = batch_size(data, batch)
    per_rank: list[dict[str, Any]] = []
    kept: list[np.ndarray[Any, np.dtype[np.float64]]] = []
    step_source = "none"
    excluded = 0
    for r in data.ranks:
        steps, src = step_spans(data, r)
        if src != "none":
            step_source = src
        n = len(steps.dur)
        skip = n_warm if n > n_warm else 0
        excluded = max(excluded, skip)
        dur = steps.dur[skip:].astype(np.float64) / 1e9
        kept.append(dur)
        total = float(dur.sum())
        ips = len(dur) / total if total > 0 else None
        # Time blocked in the train loader's next() inside the measured steps.
        long = (data.long or {}).get(r)
        if long is not None:
            waited, has_next = long.loader[skip:], long.has_loader
        elif data.long is not None:
            waited, has_next = np.zeros(0, np.int64), False
        else:
            nxt = data.spans(TRAIN_NEXT, r)
            waited, has_next = sum_inside(nxt.ts, nxt.dur, steps.ts[skip:], steps.end[skip:]), bool(len(nxt.ts))
        share = 100.0 * float(waited.sum()) / 1e9 / total if total > 0 and has_next else None
        per_rank.append(
            {
                "rank": r,
                "steps": n,
                "steps_measured": len(dur),
                "seconds": total,
                "iterations_per_s": ips,
                "samples_per_s": ips * bs if ips is not None and bs else None,
                "loader_share_pct": share,
            }
        )
    alld = np.concatenate(kept) if kept else np.zeros(0)
    rates = [p["iterations_per_s"] for p in per_rank if p["iterations_per_s"] is not None]
    ips_all = float(np.mean(rates)) if rates else None
    samples = [p["samples_per_s"] for p in per_rank if p["samples_per_s"] is not None]
    trend = step_trend(kept)
    return {
        "warmup": {
            "steps_excluded": excluded,
            "source": warm_src,
            "note": f"the first {excluded} step(s) of each rank are left out of rates and distributions"
            if excluded
            else "no step left out (too few steps)",
        },
        "batch_size": {"value": bs, "source": bs_src},
        "step_source": step_source,
        "train": {
            "iterations_per_s": ips_all,
            "samples_per_s": float(np.sum(samples)) if samples else None,
            "note": "iterations/s: mean over ranks; samples/s: sum over ranks (data parallel)",
            "per_rank": per_rank,
        },
        "step_time": {**_dist(alld), "trend": trend},
        "loaders": _loaders(data, bs),
        "validation": _validation(data, bs),
    }


def _loaders(data: RunData, bs: int | None) -> list[dict[str, Any]]:
    rows = []
    for r in data.ranks:
        for name in loader_names(data):
            if data.long is not None and name == TRAIN_LOADER:
                # The step pass's counts and sums (no rows of the train loader's next() or waits).
                long = data.long.get(r)
                st = long.stats.get(TRAIN_NEXT) if long is not None else None
                if long is None or st is None or not st.count:
                    continue
                waits, wait_sum = long.wait_count, long.wait_sum
                n_next, next_ns = st.count, st.total
            else:
                _ts, wait_ms = data.counter(loader_wait(name), r)
                nxt = data.spans(loader_next(name), r)
                waits, wait_sum = len(wait_ms), float(wait_ms.sum())
                n_next, next_ns = len(nxt.ts), int(nxt.dur.sum())
            if not n_next:
                continue
            # One wait_ms sample per batch delivered (the exhausting next() has none).
            batches = waits if waits else n_next
            wait = wait_sum / 1e3 if waits else float(next_ns) / 1e9
            per_batch = wait / batches if batches else None
            rows.append(
                {
                    "rank": r,
                    "loader": name,
                    "batches": batches,
                    "wait_total_s": wait,
                    "wait_per_batch_s": per_batch,
                    "wait_per_sample_s": per_batch / bs if per_batch is not None and bs else None,
                    "batches_per_s_waited": batches / wait if wait > 0 else None,
                }
            )
    return rows


def _validation(data: RunData, bs: int | None) -> list[dict[str, Any]]:
    rows = []
    for name in loader_names(data):
        if name == TRAIN_LOADER:
            continue
        for r in data.ranks:
            it = data.spans(loader_iter(name), r)
            nxt = data.spans(loader_next(name), r)
            _ts, wait_ms = data.counter(loader_wait(name), r)
            if not len(it.ts) or not len(nxt.ts):
                continue
            # A pass runs from its iter() to the end of its last next().
            bounds = np.concatenate([it.ts[1:], [np.iinfo(np.int64).max]])
            last = np.searchsorted(nxt.ts, bounds, side="left") - 1
            first = np.searchsorted(nxt.ts, it.ts, side="left")
            ok = last >= first
            ends = np.where(ok, nxt.end[np.clip(last, 0, None)], it.ts)
            seconds = float((ends - it.ts)[ok].sum()) / 1e9
            batches = len(wait_ms) if len(wait_ms) else max(len(nxt.ts) - len(it.ts), 0)
            ips = batches / seconds if seconds > 0 else None
            rows.append(
                {
                    "rank": r,
                    "loader": name,
                    "passes": len(it.ts),
                    "batches": batches,
                    "seconds": seconds,
                    "iterations_per_s": ips,
                    "samples_per_s": ips * bs if ips is not None and bs else None,
                }
            )
    return rows
