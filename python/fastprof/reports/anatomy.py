"""The step anatomy (issue #25): every step of each rank split into
``dataloader``, ``forward``, ``backward``, ``optimizer``, ``communication``
and ``other``, from the spans the Profiler records at every step
(:mod:`fastprof.profiler.anatomy`), with no torch.profiler window.

A phase's spans are fastprof's own ``phase.*`` spans, or, on a rank that has
none of them for the phase, the user's own spans named for it (``forward``,
``backward``, ``optimizer``); ``dataloader`` is the train loader's wait
(``loader.train.next``). A span belongs to the step it starts in and ends
with it at the latest.

Phases that overlap are resolved by one rule (:data:`OVERLAP_RULE`, issue
#36 item 4): an instant that several phases' spans cover belongs to the
first of :data:`PRECEDENCE` that covers it, so that the phases never add up
to more than the step and nothing is rescaled; ``other`` is the rest of the
step. The report says where the rule had to split time (``overlap`` per
rank), and names the forward recomputed inside backward (gradient
checkpointing) as backward's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from fastprof import _core
from fastprof._core import FastprofError
from fastprof.profiler.slow_phase import slow_phase
from fastprof.profiler.slow_step import SlowStepRule
from fastprof.recording.names import (
    ACTION_COUNTER,
    GPU_PHASE_COUNTER,
    GPU_PHASE_STEP_COUNTER,
    PHASE_SPANS,
    PHASES,
    STEP_SPAN,
)
from fastprof.reports import long_run
from fastprof.reports.data import RunData, step_spans
from fastprof.reports.phases import PhaseSplit, chosen, split
from fastprof.reports.stragglers import straggler_section
from fastprof.reports.triggers import triggers_report

OVERLAP_RULE = (
    "phases never overlap in the anatomy: an instant that several phases cover belongs to the innermost one "
    "(a collective inside backward or forward is communication, an optimizer step inside a gradient hook is "
    "optimizer), except that a forward inside backward (gradient checkpointing's recomputation) is backward's, "
    "reported as its recomputed forward; other is what no phase covers, so the phases add up to the step exactly "
    "and no share is rescaled"
)
#: Slow steps listed per rank.
MAX_SLOW = 10
#: The schedule's action level from which a step runs inside a torch.profiler
#: window (the live detector judges only steps below it).
WINDOW_LEVEL = 2
NO_ANATOMY = (
    "no step anatomy in this trace: no fastprof step spans with phase spans in them (the Profiler records "
    "them at every step unless anatomy=False, and fastprof run does too)"
)


def _begin_end(data: RunData, rank: int, name: str) -> tuple[Any, Callable[[int, int], Any]]:
    """One name's spans on a rank as :func:`split` takes them: the begins
    (by start), and their ends as a function of a slice ``(i, j)`` of them,
    gathered a block at a time (8 bytes a span held, not 32)."""
    rows = data.span_rows(name, rank)
    ts, dur = data.cols.spans["ts"], data.cols.spans["dur"]
    begin = np.asarray(ts[rows], dtype=np.int64)

    def end(i: int, j: int) -> Any:
        return begin[i:j] + dur[rows[i:j]].astype(np.int64, copy=False)

    return begin, end


def split_phases(data: RunData, rank: int, skip: int = 0) -> PhaseSplit | None:
    """Each step's duration and its time in each phase by :data:`OVERLAP_RULE`
    (from step ``skip``), None without fastprof steps or phase spans."""
    long = (data.long or {}).get(rank)
    if long is not None:
        return long.split(skip)
    steps, source = step_spans(data, rank)
    if source != STEP_SPAN or len(steps.ts) <= skip:
        return None
    use, found = chosen(lambda names: any(len(data.span_rows(n, rank)) for n in names))
    if not found:
        return None
    spans = {phase: [_begin_end(data, rank, n) for n in names] for phase, names in use.items()}
    return split(steps.ts[skip:], steps.dur[skip:], spans)


def per_step_phases(data: RunData, rank: int, skip: int = 0) -> tuple[Any, dict[str, Any]] | None:
    """Each step's duration and its time in each phase (ns, arrays in step
    order from step ``skip``; the phases disjoint, see :data:`OVERLAP_RULE`),
    None without fastprof steps or phase spans."""
    got = split_phases(data, rank, skip)
    return None if got is None else (got.dur, got.per_step)


def slow_step_rule(data: RunData, rank: int) -> SlowStepRule:
    """The rule the rank's anomaly trigger used (its options in
    ``profiler.json``), the defaults without triggers."""
    triggers = (data.profiler.get(rank) or {}).get("triggers")
    return SlowStepRule.of_triggers(triggers.get("config") if isinstance(triggers, dict) else None)


#: Steps compared at a time when the args are paired with the step rows
#: (a few bytes a step of temporaries per chunk, not per step of the run).
_STEP_CHUNK = 1 << 20


def epoch_starts(data: RunData) -> dict[int, Any]:
    """rank -> a bool per step (in time order): the first step of an epoch,
    from the step spans' ``epoch`` args (``_core._read_step_args``: the
    columns carry no args); empty where the args cannot be matched with the
    columns' step spans (then only a run's first step counts as one).

    Linear in ranks: each rank's step rows are a slice of the rank index
    (:meth:`RunData.span_rows`, by start), laid rank after rank; the args
    come file after file in row order, so the k-th step read is the k-th
    smallest of those rows, and one sort of the step rows (a merge of one
    ascending run per rank, mostly) places every epoch in its rank's slice.
    Held: ~16 bytes a step (the rows, their order, the epochs) and one
    file's args at a time (24 bytes a step of it)."""
    if data.name_id(STEP_SPAN) is None:
        return {}
    parts = [(rank, data.span_rows(STEP_SPAN, rank)) for rank in data.ranks]
    parts = [(rank, rows) for rank, rows in parts if len(rows)]
    if not parts:
        return {}
    rows = np.concatenate([r for _, r in parts])
    cut = np.cumsum([0] + [len(r) for _, r in parts])
    by_row = np.argsort(rows, kind="stable")
    if len(rows) < 2**31:
        by_row = by_row.astype(np.int32)
    pid = data.cols.spans["pid"]
    epoch = np.empty(len(rows), np.int64)
    k = 0
    for f in data.cols.files:
        try:
            got = _core._read_step_args(str(f["path"]))
        except (FastprofError, OSError):
            return {}
        m = len(got["pid"])
        if k + m > len(rows):
            return {}
        for c in range(0, m, _STEP_CHUNK):
            stop = min(c + _STEP_CHUNK, m)
            at = by_row[k + c : k + stop]
            if not np.array_equal(pid[rows[at]], got["pid"][c:stop]):
                return {}
            epoch[at] = got["epoch"][c:stop]
        k += m
    if k != len(rows):
        return {}
    out: dict[int, Any] = {}
    for (rank, _), a, b in zip(parts, cut[:-1].tolist(), cut[1:].tolist(), strict=True):
        e = epoch[a:b]
        out[int(rank)] = np.concatenate([[True], e[1:] != e[:-1]])
    return out


def judged_steps(data: RunData, rank: int, n: int, captures: list[dict[str, Any]], epoch_starts: Any = None) -> Any:
    """Which of the rank's ``n`` steps (from step 0) the live detector
    judges: not the first of an epoch (``epoch_starts``; without it the
    run's first step), none inside a torch.profiler window, none of the
    steps held after a triggered capture (its export competes for the CPU).

    A step's level is the schedule's action level (a counter recorded where
    it changes) last recorded before the step ends: the step machine sets it
    as the step begins, which may be after the step's span began (a step
    opened while its batch was awaited). The hold counts from the first step
    after the capture's window."""
    ok = np.ones(n, dtype=bool)
    if not n:
        return ok
    ok[0] = False
    if epoch_starts is not None and len(epoch_starts) == n:
        ok &= ~np.asarray(epoch_starts, dtype=bool)
    steps, _ = step_spans(data, rank)
    t, v = data.counter(ACTION_COUNTER, rank)
    level = np.zeros(n)
    if len(t):
        at = np.searchsorted(t, steps.end[:n], side="left") - 1
        level = np.where(at >= 0, v[np.maximum(at, 0)], 0)
    window = level >= WINDOW_LEVEL
    ok &= ~window
    for c in captures:
        if c.get("status") != "done":
            continue
        after = np.flatnonzero(~window[int(c["first_step"]) :])
        if len(after):
            first = int(c["first_step"]) + int(after[0])
            ok[first : first + max(10, 2 * int(c["steps"]))] = False
    return ok


def rank_anatomy(
    data: RunData,
    rank: int,
    warmup_steps: int = 0,
    triggers: dict[str, Any] | None = None,
    epoch_starts: Any = None,
) -> dict[str, Any] | None:
    """One rank's anatomy (steps after the warm-up), None without steps or
    phases. ``triggers``: the rank's entry of the report's ``triggers``
    section (its captures and anomalies), and ``epoch_starts`` (a bool per
    step: the first of an epoch, see :func:`epoch_starts`; or a function of
    no argument that reads them, called only where a slow step is found),
    for the slow steps."""
    steps, _ = step_spans(data, rank)
    skip = warmup_steps if len(steps.ts) > warmup_steps else 0
    every = split_phases(data, rank)
    if every is None or len(every.dur) <= skip:
        return None
    dur = every.dur[skip:]
    per_step = {p: v[skip:] for p, v in every.per_step.items()}
    step_total = int(dur.sum())
    whole = float(step_total) or 1.0
    phases = {}
    for p in PHASES:
        v = per_step[p]
        phases[p] = {
            "total_ns": int(v.sum()),
            "p50_ns": float(np.percentile(v, 50)),
            "p95_ns": float(np.percentile(v, 95)),
            "share": float(v.sum()) / whole,
        }
    pairs: list[dict[str, Any]] = [
        {"phase": p, "counted_as": q, "ns": int(v[skip:].sum())}
        for (p, q), v in every.given.items()
        if int(v[skip:].sum()) > 0
    ]
    recompute = sum(x["ns"] for x in pairs if (x["phase"], x["counted_as"]) == ("forward", "backward"))
    backward = phases["backward"]["total_ns"]
    overlap = {
        "split_ns": sum(x["ns"] for x in pairs),
        "pairs": pairs,
        "recomputed_forward_ns": recompute,
        "recomputed_forward_share_of_backward": recompute / backward if backward else 0.0,
    }
    rule = slow_step_rule(data, rank)
    t = triggers or {}
    captures = list(t.get("captures") or [])
    starts = epoch_starts
    if callable(starts):
        # Reading the epochs is a pass over the traces: only where they may matter.
        starts = starts() if rule.find(every.dur, judged_steps(data, rank, len(every.dur), captures)) else None
    judged = judged_steps(data, rank, len(every.dur), captures, starts)
    live = {int(x["step"]): str(x["action"]) for x in t.get("anomalies") or []}
    # The trigger's slow steps that were not the job's: each is its own, not the start of the job's burst.
    not_jobs = [int(x["step"]) for x in t.get("anomalies") or [] if x.get("cause") not in (None, "the job")]
    out = {
        "rank": rank,
        "steps": len(dur),
        "warmup_steps_excluded": skip,
        "step_total_ns": step_total,
        "phases": phases,
        "overlap": overlap,
        "slow_steps": slow_steps(every.dur, every.per_step, 0, rule, judged, live, not_jobs),
        "slow_step_count": len(rule.find(every.dur, judged, not_jobs)),
    }
    gpu = gpu_phases(data, rank, phases, float(np.percentile(dur, 50)))
    if gpu is not None:
        out["gpu"] = gpu
    return out


def overlap_line(r: dict[str, Any]) -> str | None:
    """Where :data:`OVERLAP_RULE` split a rank's time, in one sentence (None where it had not to)."""
    o = r.get("overlap") or {}
    if not o.get("split_ns"):
        return None
    parts = []
    for x in o.get("pairs") or []:
        ms = f"{int(x['ns']) / 1e6:.1f} ms"
        if (x["phase"], x["counted_as"]) == ("forward", "backward"):
            share = 100 * float(o["recomputed_forward_share_of_backward"])
            parts.append(
                f"{ms} of forward ran inside backward and counts as backward's recomputed forward "
                f"(backward, of which {share:.0f}% recomputed forward)"
            )
        else:
            parts.append(f"{ms} of {x['phase']} was also {x['counted_as']} and counts as {x['counted_as']}")
    return f"rank {r['rank']}: phases overlapped: " + "; ".join(parts) + " (no share rescaled)"


def slow_step_line(rank: int, s: dict[str, Any]) -> str:
    """One slow step, as the terminal and the page list it."""
    factor = "" if s["phase_factor"] is None else f" {s['phase_factor']:.1f}x its median"
    live = f"; the anomaly trigger: {s['trigger']}" if s.get("trigger") else ""
    # The phase a preemption landed in made nothing slow (the trigger names none either).
    why = "the host's doing" if "contention" in str(s.get("trigger")) else f"{s['phase']}{factor}"
    return (
        f"Slow step on rank {rank}: step {s['step']} took {s['dur_ns'] / 1e6:.1f} ms "
        f"({s['dur_ns'] / s['median_step_ns']:.1f}x the median {s['median_step_ns'] / 1e6:.1f} ms of the steps "
        f"before it): {why}{live}"
    )


def slow_and_overlap_note(section: dict[str, Any]) -> str:
    """What the page says under the anatomy's plots: where the overlap rule
    split time, the slow-step rule and the slow steps (as the terminal)."""
    said = ""
    for r in section["per_rank"]:
        line = overlap_line(r)
        if line:
            said += f" {line}. Rule: {section['overlap_rule']}."
    rule = section.get("slow_step_rule")
    if rule:
        said += f" Slow steps: {rule['text']}."
        listed = [slow_step_line(int(r["rank"]), s) for r in section["per_rank"] for s in r["slow_steps"]]
        said += "".join(f" {x}." for x in listed) if listed else " None in this run."
    return said


#: The phases timed on the GPU: those fastprof records a span for.
GPU_PHASES = tuple(PHASE_SPANS)


def gpu_steps(data: RunData, rank: int) -> tuple[Any, dict[str, Any]] | None:
    """A rank's timed steps on the GPU: their numbers and each series of
    ``phase.gpu [ms]`` (ms, arrays in the order recorded), None without them.
    Each ms event's step is the value of the ``phase.gpu.step`` counter
    recorded just before it (a trace from before that counter has the step
    as a series ``step`` of the ms counter)."""
    c = data.cols.counters
    m = data.counter_rows(GPU_PHASE_COUNTER, rank)  # the rank's rows, not a scan of the column
    if not len(m):
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


class _Without(Mapping[str, Any]):
    """Each phase's times without step ``i``, made when asked for (one
    phase's copy at a time: all six at once were 6 x 8 bytes a step)."""

    def __init__(self, per_step: dict[str, Any], i: int) -> None:
        self._per_step, self._i = per_step, i

    def __getitem__(self, phase: str) -> Any:
        return np.delete(self._per_step[phase], self._i)

    def __iter__(self) -> Iterator[str]:
        return iter(self._per_step)

    def __len__(self) -> int:
        return len(self._per_step)


def slow_steps(
    dur: Any,
    per_step: dict[str, Any],
    first: int,
    rule: SlowStepRule | None = None,
    judged: Any = None,
    live: dict[int, str] | None = None,
    not_the_jobs: Any = (),
) -> list[dict[str, Any]]:
    """The slow steps by the one rule (:class:`fastprof.profiler.slow_step.SlowStepRule`,
    the live anomaly trigger's; ``judged``: the steps it judges), at most
    :data:`MAX_SLOW`, slowest first, each with the phase that made it slow
    (:func:`fastprof.profiler.slow_phase.slow_phase`, the trigger's answer
    too: the one furthest above its own median over the other steps,
    "backward 3.1x its median") and what the trigger did with it (``live``:
    step -> action; ``not_the_jobs``: the indices of its slow steps that the
    host slowed or that waited for another rank). ``first``: the number of
    the first step given."""
    found = (rule or SlowStepRule()).find(dur, judged, not_the_jobs)
    found.sort(key=lambda x: -x.dur_ns)
    out = []
    for f in found[:MAX_SLOW]:
        i = f.index
        step = {p: float(v[i]) for p, v in per_step.items()}
        got = slow_phase(step, _Without(per_step, i))
        if got is None:
            continue
        out.append(
            {
                "step": first + i,
                "dur_ns": f.dur_ns,
                "median_step_ns": float(f.median_ns),
                "mad_ns": float(f.mad_ns),
                "phase": got.phase,
                "phase_ns": int(per_step[got.phase][i]),
                "phase_median_ns": got.median,
                "phase_factor": got.factor,
                "trigger": (live or {}).get(first + i),
            }
        )
    return out


def anatomy_report(data: RunData, warmup_steps: int) -> tuple[dict[str, Any] | None, str | None]:
    """The report's ``anatomy`` section, or None and the reason."""
    triggers = {int(t["rank"]): t for t in (triggers_report(data) or {}).get("per_rank") or []}
    starts: dict[str, dict[int, Any]] = {}

    def starts_of(rank: int) -> Callable[[], Any]:
        def read() -> Any:
            if "all" not in starts:
                starts["all"] = long_run.epoch_starts(data.long) if data.long is not None else epoch_starts(data)
            return starts["all"].get(rank)

        return read

    per_rank = [
        a
        for r in data.ranks
        if (a := rank_anatomy(data, r, warmup_steps, triggers.get(int(r)), starts_of(int(r)))) is not None
    ]
    if not per_rank:
        return None, NO_ANATOMY
    warm = min(int(a["warmup_steps_excluded"]) for a in per_rank)
    return {
        "method": (
            "each step's time covered by its phase spans (phase.*, else the user's forward/backward/optimizer "
            "spans; dataloader: the train loader's wait), other the rest of the step; warm-up steps left out"
        ),
        "overlap_rule": OVERLAP_RULE,
        "slow_step_rule": slow_step_rule(data, per_rank[0]["rank"]).to_dict(),
        "phases": list(PHASES),
        "per_rank": per_rank,
        # Stragglers beyond the run's own noise (reports/stragglers.py).
        **straggler_section(data, per_rank, warm),
    }, None
