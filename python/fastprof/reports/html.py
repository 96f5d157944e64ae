"""report.html: one self-contained page of a run's reports.

Plots are plotly figures; plotly's JavaScript is inlined from the plotly
Python package once per page, so the page makes no network request and opens
from a file on a machine without internet access. The report document is
embedded as JSON (``<script type="application/json" id="fastprof-report">``)
so the numbers behind the page travel with it: the whole document up to
:data:`~fastprof.reports.many.MANY_RANKS` ranks, above it a view whose
per-rank lists are bounded (:func:`fastprof.reports.html_embed.embedded`;
report.json beside the page keeps them all).

Series come from the report's :class:`~fastprof.reports.data.RunData`
(numpy over the core's columns, never a per-event Python loop) and are
downsampled (min and max per bucket, so peaks survive) to at most
:data:`MAX_POINTS` points each.

Above :data:`~fastprof.reports.many.MANY_RANKS` ranks the page draws ranks
as heat maps and percentile bands and lists them in one table with a filter
(:mod:`fastprof.reports.html_ranks`), never one line per rank.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from fastprof.readers.merge import describe_rotated
from fastprof.recording.names import REPORT_JSON, STEP_SPAN
from fastprof.reports import counter_plots, html_embed, html_ranks, html_triggers
from fastprof.reports.anatomy import per_step_phases, slow_and_overlap_note
from fastprof.reports.data import (
    _CHUNK,
    F64,
    HOST_COLUMNS,
    I64,
    RunData,
    binary_unit,
    host_rows,
    human_bytes,
    step_spans,
)
from fastprof.reports.finite import spelt
from fastprof.reports.many import MANY_RANKS, many, ranges, representatives
from fastprof.reports.memory import reading_steps
from fastprof.reports.resumed import describe as describe_resumed
from fastprof.reports.speed import trend_note, trend_text
from fastprof.reports.stragglers import pace_line, straggler_line

MAX_POINTS = 2000
#: Per-step parts beyond this many span names are summed into "other spans".
TOP_SPANS_IN_STEP = 8
TOP_ROWS = 20
MAX_RANK_PLOTS = 8
#: Bars per step-parts plot: more steps are merged into bars of consecutive steps.
MAX_BARS = 1000

_ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
#: Spans never counted as the user's work inside a step (the loop's own marks).
_NOT_USER = (STEP_SPAN, "ProfilerStep#")
_CONFIG = {"displaylogo": False, "responsive": True}


def _esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _num(v: Any, fmt: str = "{:.4g}") -> str:
    return "-" if v is None else fmt.format(v)


def downsample(x: F64, y: F64, max_points: int = MAX_POINTS) -> tuple[F64, F64]:
    """At most ``max_points`` of a series sorted by x: each of max_points/2
    equal-count buckets keeps its minimum and its maximum, in x order."""
    keep = extremes(y, max_points)
    return (x, y) if keep is None else (x[keep], y[keep])


def extremes(y: npt.NDArray[Any], max_points: int = MAX_POINTS) -> npt.NDArray[np.intp] | None:
    """What :func:`downsample` keeps of ``y`` (None: all of it): in each of
    max_points/2 equal-count runs, its smallest value (the first of equal
    ones) and its largest (the last of equal ones), in order. A run at a
    time, so that nothing of the series' length is made (a sort of the
    whole series by run and value took 5 copies of it: 400 MB at 10^7
    steps)."""
    n = len(y)
    if n <= max_points:
        return None
    buckets = max_points // 2
    # Bucket b holds the i with i * buckets // n == b: from ceil(b * n / buckets).
    starts = -(-np.arange(buckets + 1, dtype=np.int64) * n // buckets)
    keep = np.empty(2 * buckets, np.intp)
    for b in range(buckets):
        a, e = int(starts[b]), int(starts[b + 1])
        run = y[a:e]
        keep[2 * b] = a + int(np.argmin(run))
        keep[2 * b + 1] = e - 1 - int(np.argmax(run[::-1]))
    return np.unique(keep)


_figure = html_ranks.figure


class _Page:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.n_plots = 0

    def add(self, s: str) -> None:
        self.parts.append(s)

    def plot(self, fig: go.Figure) -> None:
        self.n_plots += 1
        self.parts.append(
            '<div class="plot">'
            + pio.to_html(
                fig,
                full_html=False,
                include_plotlyjs=False,
                div_id=f"plot-{self.n_plots}",
                config=_CONFIG,
                validate=True,
            )
            + "</div>"
        )

    def table(self, header: list[str], rows: list[list[Any]], cls: str = "") -> None:
        head = "".join(f"<th>{_esc(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
        self.parts.append(f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')

    def note(self, text: str) -> None:
        self.parts.append(f'<p class="note">{_esc(text)}</p>')


def _headline(page: _Page, doc: dict[str, Any], data: RunData) -> None:
    speed, system = doc["speed"], doc["system"]
    steps = sum(int(r["steps"]) for r in speed["train"]["per_rank"])
    rss = [h["rss_peak_b"] for h in system["host"] if h.get("rss_peak_b") is not None]
    cards: list[tuple[str, str, str]] = [
        ("wall", "wall time", f"{doc['wall']['duration_s']:.3f} s"),
        ("steps", "steps", str(steps)),
        ("iterations_per_s", "train iterations/s", _num(speed["train"]["iterations_per_s"], "{:.2f}")),
        ("samples_per_s", "train samples/s", _num(speed["train"]["samples_per_s"], "{:.1f}")),
        ("step_p50", "step time p50", _num(speed["step_time"]["p50_s"], "{:.4f} s")),
        ("rss_peak", "peak RSS", human_bytes(max(rss)) if rss else "-"),
    ]
    energy = [d["energy_j"] for d in system["gpu"]["devices"] if d.get("energy_j") is not None]
    if energy:
        cards.append(("energy", "GPU energy", f"{sum(energy):.1f} J"))
    page.add('<section id="headline"><div class="cards">')
    for key, label, value in cards:
        page.add(
            f'<div class="card" data-key="{key}"><div class="v">{_esc(value)}</div><div class="k">{label}</div></div>'
        )
    page.add("</div>")
    page.note(
        f"{speed['warmup']['note']} ({speed['warmup']['source']}); batch size "
        f"{_num(speed['batch_size']['value'], '{}')} ({speed['batch_size']['source']}); steps from "
        f"{speed['step_source']} spans."
    )
    page.add("</section>")


def _recommendations(page: _Page, doc: dict[str, Any]) -> None:
    recs = doc["recommendations"]
    page.add('<section id="recommendations"><h2>Recommendations</h2>')
    if recs["items"]:
        page.add("<ul class='recs'>" + "".join(f"<li>{_esc(r['message'])}</li>" for r in recs["items"]) + "</ul>")
    else:
        page.note("No rule fired.")
    page.table(
        ["rule", "status", "measured", "threshold", "detail"],
        [[c["rule"], c["status"], _num(c["measured"], "{:.3g}"), c["threshold"], c["message"]] for c in recs["checks"]],
    )
    page.add("</section>")


def _step_times(page: _Page, doc: dict[str, Any], data: RunData) -> None:
    page.add('<section id="steps"><h2>Step time</h2>')
    if many(len(data.ranks)):
        _step_times_many(page, doc, data)
        return
    fig = _figure("Step time per step", "ms")
    fig.update_xaxes(title_text="step (ordinal on the rank)")
    n_warm = int(doc["speed"]["warmup"]["steps_excluded"])
    any_steps = reduced = False
    for r in data.ranks:
        steps, _src = step_spans(data, r)
        if not len(steps.ts):
            continue
        any_steps = True
        # The steps kept for the plot chosen by their durations (ns): no copy of the run's.
        keep = extremes(steps.dur)
        x = np.arange(len(steps.dur), dtype=np.float64) if keep is None else keep.astype(np.float64)
        y = (steps.dur if keep is None else steps.dur[keep]) / 1e6
        reduced |= len(x) < len(steps.dur)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines+markers" if len(x) <= 200 else "lines",
                name=f"rank {r}",
                marker={"size": 4},
            )
        )
    if not any_steps:
        page.note("No steps in this trace (no fastprof 'step' or torch 'ProfilerStep#N' spans).")
        page.add("</section>")
        return
    if n_warm:
        fig.add_vrect(x0=-0.5, x1=n_warm - 0.5, fillcolor="gray", opacity=0.12, line_width=0)
        fig.add_annotation(x=(n_warm - 1) / 2, y=1, yref="paper", text="warm-up", showarrow=False)
    marked = html_triggers.mark(fig, doc, data.ranks)
    page.plot(fig)
    if marked:
        page.note(marked)
    if reduced:
        page.note(
            f"More than {MAX_POINTS} steps: drawn as the shortest and longest step of each of "
            f"{MAX_POINTS // 2} equal runs of steps, so every slow step stays on the plot."
        )
    _step_parts(page, doc, data)
    page.add("</section>")


def _step_times_many(page: _Page, doc: dict[str, Any], data: RunData) -> None:
    """Step time of many ranks: a rank x step heat map and the bands across
    the ranks, the triggers' marks on the bands."""
    got = html_ranks.step_matrices(data)
    if got is None:
        page.note("No steps in this trace (no fastprof 'step' or torch 'ProfilerStep#N' spans).")
        page.add("</section>")
        return
    ranks, heat, bands, heat_per, band_per = got
    page.note(
        f"{len(ranks):,} ranks (more than {MANY_RANKS}): each rank is a row of the heat map (each cell the median "
        f"step of its run of {heat_per} step(s): a rank slow at every step stands out, one long step does not; "
        f"its colours end at the {html_ranks.HEAT_TOP_PCT:g}th percentile of the cells), and the bands give the "
        f"spread across the ranks at each step (runs of {band_per} step(s) merged as their mean; the max line and "
        f"the slow-step marks show the long steps), with the {html_ranks.RANKS_OVER_BANDS} ranks slowest at their "
        "median step dotted. "
        "Every rank's figures are in the Ranks table below."
    )
    page.plot(html_ranks.step_heatmap(ranks, heat, heat_per))
    fig = html_ranks.step_bands(ranks, bands, band_per)
    n_warm = int(doc["speed"]["warmup"]["steps_excluded"])
    if n_warm:
        fig.add_vrect(x0=-0.5, x1=n_warm - 0.5, fillcolor="gray", opacity=0.12, line_width=0)
    marked = html_triggers.mark(fig, doc, data.ranks)
    page.plot(fig)
    if marked:
        page.note(marked)
    _step_parts(page, doc, data)
    page.add("</section>")


class _Bars:
    """At most :data:`MAX_BARS` bars for ``n`` steps in order: each bar the
    mean of ``per`` consecutive steps (``per`` 1 when they fit)."""

    def __init__(self, n: int) -> None:
        self.n, self.per = n, max(1, -(-n // MAX_BARS))
        self.starts = np.arange(0, n, self.per)

    def x(self, x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return x[self.starts] if self.per > 1 else x

    def y(self, y: npt.ArrayLike) -> F64:
        v = np.asarray(y, dtype=np.float64)
        if self.per == 1:
            return v
        return np.add.reduceat(v, self.starts) / np.diff(np.append(self.starts, self.n))

    def axis(self, title: str) -> str:
        return title + (f", first of each {self.per}" if self.per > 1 else "")

    def note(self) -> str:
        if self.per == 1:
            return ""
        return f" {self.n} steps are drawn as {len(self.starts)} bars, each the mean of {self.per} consecutive steps."


def _stacked_steps(
    title: str, n: int, series: Mapping[str, npt.NDArray[Any]], colours: dict[str, str]
) -> tuple[go.Figure, _Bars]:
    """ "Where the step went, <title>": a stacked bar per step (long runs
    merged by :class:`_Bars`) of each non-zero series (ns), coloured where
    ``colours`` names one."""
    bars = _Bars(n)
    fig = _figure(f"Where the step went, {title}", "ms", barmode="stack")
    fig.update_xaxes(title_text=bars.axis("step (ordinal on the rank)"))
    x = np.arange(n)
    for name, y in series.items():
        if y.any():
            marker = {"color": colours[name]} if name in colours else None
            fig.add_trace(go.Bar(x=bars.x(x), y=bars.y(y) / 1e6, name=name, marker=marker))
    return fig, bars


def anatomy_figures(doc: dict[str, Any], data: RunData) -> tuple[list[go.Figure], str]:
    """Every step's phases (the step anatomy), one stacked-bar figure per
    rank (at most :data:`MAX_RANK_PLOTS`; long runs merged as by
    :class:`_Bars`), and the note that says so; none without an anatomy."""
    an = doc.get("anatomy")
    figs: list[go.Figure] = []
    merged = ""
    if not an:
        return figs, ""
    colours = {"dataloader": "#e8a33d", "forward": "#4c78a8", "backward": "#72b7b2", "optimizer": "#54a24b",
               "communication": "#b279a2", "other": "#c8ccd0"}  # fmt: skip
    wide = many(len(an["per_rank"]))
    shown = an["per_rank"][:MAX_RANK_PLOTS]
    if wide:
        heat = html_ranks.phase_heatmap(an)
        if heat is not None:
            figs.append(heat)
        by_rank = {int(r["rank"]): r for r in an["per_rank"]}
        typical = {int(r["rank"]): r["p50_s"] for r in doc["ranks"]["per_rank"]}
        picks = representatives((int(r["rank"]), typical.get(int(r["rank"]))) for r in an["per_rank"])
        shown = [by_rank[rank] for label, rank in picks if label in ("slowest 1", "slowest 2", "median")]
    for r in shown:
        got = per_step_phases(data, int(r["rank"]))
        if got is None:
            continue
        dur, per_step = got
        # Each phase as it is (a long run's in 4 bytes a step): the bars convert one at a time.
        series = {p: per_step[p] for p in an["phases"]}
        fig, bars = _stacked_steps(f"rank {r['rank']} (step anatomy, every step)", len(dur), series, colours)
        merged = merged or bars.note()
        figs.append(fig)
    said = ""
    pace = an.get("ranks_in_pace")
    for st in an.get("stragglers") or []:
        said += " Straggler: " + straggler_line(st, pace and pace["jitter_ns"]) + "."
    if pace and not an.get("stragglers"):
        said += " No straggler: " + pace_line(pace) + "."
    if wide:
        verdicts: dict[str, list[int]] = {}
        for r in an["per_rank"]:
            if r.get("gpu"):
                verdicts.setdefault(str(r["gpu"]["verdict"]), []).append(int(r["rank"]))
        for verdict, ranks in sorted(verdicts.items(), key=lambda kv: -len(kv[1])):
            said += f" On the GPU, {len(ranks):,} rank(s) ({ranges(ranks)}): {verdict}."
        said += html_ranks.slow_steps_note(an, len(an["per_rank"]))
        said += (
            f" The heat map shows every rank's phases; the bars the two slowest ranks' steps and the median rank's"
            f" ({', '.join(str(r['rank']) for r in shown)})."
        )
    else:
        for r in an["per_rank"]:
            if r.get("gpu"):
                said += f" On the GPU, rank {r['rank']}: {r['gpu']['verdict']}."
        said += slow_and_overlap_note(an)
    return figs, (
        "Step anatomy: every step split into the train loader's wait, the outermost module call (forward), "
        "backward, the optimizer and collectives from Python, recorded at every step (no torch.profiler window); "
        "other is the rest of the step." + merged + said
    )


def step_part_figures(doc: dict[str, Any], data: RunData) -> tuple[list[go.Figure], str]:
    """Per-step stacked bars of where the step went, one figure per rank (at
    most :data:`MAX_RANK_PLOTS`), and a note saying where the parts come
    from: the report's step-time breakdown when it has one, else fastprof
    spans (see :func:`span_parts`). A long run's steps are merged into at
    most :data:`MAX_BARS` bars (:class:`_Bars`), and the note says so."""
    figs: list[go.Figure] = []
    merged = ""
    bd = doc.get("breakdown")
    b = data.breakdown
    if bd and b is not None and len(b):
        counts = {int(s["rank"]): int(s["steps"]) for s in b.summaries}
        for bars in _shown(b.bars, doc, data, lambda x: int(x["rank"])):
            r, per = int(bars["rank"]), int(bars["per"])
            fig = _figure(f"Where the step went, rank {r} (step-time breakdown)", "ms", barmode="stack")
            fig.update_xaxes(title_text="step" + (f", first of each {per}" if per > 1 else ""))
            for role in _ROLES:
                y = np.asarray(bars[f"{role}_ns"], dtype=np.float64)
                if y.any():
                    fig.add_trace(go.Bar(x=bars["step"], y=y / 1e6, name=role.replace("_", " ")))
            if per > 1 and not merged:
                merged = (
                    f" {counts.get(r, 0)} steps are drawn as {len(bars['step'])} bars, each the mean of "
                    f"{per} consecutive steps."
                )
            figs.append(fig)
        # Its figures said as what they are: which steps (#36, item 3).
        steps = bd.get("steps_from") or bd.get("source") or "torch windows"
        note = f"Step-time breakdown (in {steps}): {bd.get('note') or ''}"
        return figs, note.rstrip(": ") + ("." if merged and not note.endswith(".") else "") + merged
    for r in _shown(list(data.ranks), doc, data, int):
        parts = span_parts(data, r)
        if parts is None:
            continue
        x, series = parts
        fig, bars = _stacked_steps(f"rank {r} (fastprof spans)", len(x), series, {"rest of step": "#c8ccd0"})
        merged = merged or bars.note()
        figs.append(fig)
    return figs, (
        "Step-time breakdown: "
        + str(doc.get("breakdown_reason") or "not available")
        + ". The bars show where each step went by fastprof spans: the spans at the top of the step "
        "(the DataLoader's next() among them) and the rest of the step." + merged
    )


#: Per-rank plots of a part of the page above MANY_RANKS ranks: the two
#: slowest ranks by median step and the median one.
RANK_PLOTS_MANY = ("slowest 1", "slowest 2", "median")


def _shown(items: list[Any], doc: dict[str, Any], data: RunData, rank_of: Any) -> list[Any]:
    """The items (one per rank) to plot: the first :data:`MAX_RANK_PLOTS`;
    above MANY_RANKS ranks those of the two slowest ranks and the median one
    by median step (the first three when those are not among them)."""
    if not many(len(data.ranks)):
        return items[:MAX_RANK_PLOTS]
    picks = representatives((int(r["rank"]), r["p50_s"]) for r in doc["ranks"]["per_rank"])
    wanted = [rank for label, rank in picks if label in RANK_PLOTS_MANY]
    by_rank = {rank_of(x): x for x in items}
    got = [by_rank[r] for r in wanted if r in by_rank]
    return got or items[: len(RANK_PLOTS_MANY)]


def _step_parts(page: _Page, doc: dict[str, Any], data: RunData) -> None:
    """The step anatomy of every step where there is one; then the torch
    windows' finer breakdown (or, without either, the spans at the top of
    each step)."""
    figs, note = anatomy_figures(doc, data)
    if figs:
        page.note(note)
        for fig in figs:
            page.plot(fig)
        if not doc.get("breakdown"):
            return
    figs, note = step_part_figures(doc, data)
    page.note(note)
    for fig in figs:
        page.plot(fig)


def _per_step(which: I64, dur: I64, n: int) -> F64:
    return np.asarray(np.bincount(which, weights=dur, minlength=n), dtype=np.float64)


def span_parts(data: RunData, rank: int) -> tuple[I64, dict[str, F64]] | None:
    """Per step of a rank: time in the DataLoader's next(), in each span at the
    top of the step (on the step's thread), and the rest, in ns; None in a
    long run (the step pass keeps no span rows of a step: its page draws the
    anatomy's phases and the step-time breakdown instead)."""
    if data.long is not None:
        return None
    steps, src = step_spans(data, rank)
    if not len(steps.ts):
        return None
    s = data.cols.spans
    names = data.cols.names
    out: dict[str, F64] = {}
    covered = np.zeros(len(steps.ts), np.float64)
    step_id = data.name_id(STEP_SPAN) if src == STEP_SPAN else None
    user = data.category_mask([i for i, c in enumerate(data.cols.categories) if c == "user"])
    m = (s["rank"] == rank) & user[s["cat"]]
    if step_id is not None:
        sm = m & (s["name"] == step_id)
        tid = np.unique(s["tid"][sm])
        pid = np.unique(s["pid"][sm])
        m &= np.isin(s["tid"], tid) & np.isin(s["pid"], pid) & (s["name"] != step_id)
    ts, dur, nid = s["ts"][m].astype(np.int64), s["dur"][m].astype(np.int64), s["name"][m].astype(np.int64)
    keep = np.array([not names[int(i)].startswith(_NOT_USER) for i in np.unique(nid)], bool)
    allowed = np.unique(nid)[keep]
    sel = np.isin(nid, allowed)
    ts, dur, nid = ts[sel], dur[sel], nid[sel]
    order = np.lexsort((-dur, ts))
    ts, dur, nid = ts[order], dur[order], nid[order]
    end = ts + dur
    # Top-level: not inside an earlier span (spans nest strictly on one thread).
    prev_end = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1]])
    top = ts >= prev_end
    ts, dur, nid, end = ts[top], dur[top], nid[top], end[top]
    which = np.searchsorted(steps.ts, ts, side="right") - 1
    inside = (which >= 0) & (end <= steps.end[np.clip(which, 0, None)])
    which, dur, nid = which[inside], dur[inside], nid[inside]
    if len(nid):
        totals = np.bincount(nid, weights=dur)
        ranked = [int(i) for i in np.argsort(-totals) if totals[i] > 0]
        for i in ranked[:TOP_SPANS_IN_STEP]:
            per = _per_step(which[nid == i], dur[nid == i], len(steps.ts))
            out[names[i]] = per
            covered += per
        rest = ~np.isin(nid, ranked[:TOP_SPANS_IN_STEP])
        if rest.any():
            per = _per_step(which[rest], dur[rest], len(steps.ts))
            out["other spans"] = per
            covered += per
    out["rest of step"] = np.clip(steps.dur - covered, 0, None)
    return np.arange(len(steps.ts)), out


def _add_bytes(fig: go.Figure, series: list[tuple[str, F64, F64]]) -> str:
    """Draw byte series on ``fig`` in one binary unit, the one human_bytes
    writes their largest value in, so the axis says what the headline and
    the tables say; returns the unit. plotly's own SI ticks of raw bytes
    wrote 703.3 MiB as "737MB" on all four ticks (decimal, and three digits
    could not tell the ticks apart); in MiB its ticks take the digits they
    need."""
    top = 0.0
    for _name, _x, y in series:
        finite = y[np.isfinite(y)]
        if len(finite):
            top = max(top, float(np.abs(finite).max()))
    unit, scale = binary_unit(top)
    for name, x, y in series:
        fig.add_trace(go.Scatter(x=x, y=y / scale, mode="lines", name=name))
    fig.update_yaxes(title_text=unit, exponentformat="none")
    return unit


def _series(data: RunData, name: str, rank: int) -> tuple[I64, F64]:
    if name == "proc.cpu [%]":  # user + system, sampled on the same ticks
        ts, user = data.counter(counter_plots.PROC_CPU[0], rank)
        _, system = data.counter(counter_plots.PROC_CPU[1], rank)
        n = min(len(user), len(system))
        return ts[:n], user[:n] + system[:n]
    return data.counter(name, rank)


def _counters(page: _Page, doc: dict[str, Any], data: RunData) -> None:
    page.add('<section id="counters"><h2>Counters over time</h2>')
    present = set(data.counter_names())
    gpus = counter_plots.gpus(present)
    t0 = int(doc["wall"]["start_ns"])
    drawn = reduced = 0
    for title, unit, wanted in counter_plots.COUNTER_PLOTS:
        names: list[str] = []
        for w in wanted:
            names.extend([w.replace("gpu*", g) for g in gpus] if w.startswith("gpu*") else [w])
        names = [n for n in names if n in present or (n == "proc.cpu [%]" and "proc.cpu_user [%]" in present)]
        if not names:
            continue
        if many(len(data.ranks)):
            bands = html_ranks.counter_bands(data, title, unit, names, t0, _series)
            if bands is not None:
                page.plot(bands)
                drawn += 1
            continue
        fig = _figure(title, unit)
        fig.update_xaxes(title_text="seconds since the start of the run")
        series: list[tuple[str, F64, F64]] = []
        for r in data.ranks:
            for n in names:
                ts, v = _series(data, n, r)
                if not len(ts) or (n.startswith("children.") and not v.any()):
                    continue  # no DataLoader workers: a flat zero says nothing
                x, y = downsample((ts - t0).astype(np.float64) / 1e9, v)
                reduced += len(x) < len(ts)
                series.append((n if len(data.ranks) == 1 else f"rank {r} {n}", x, y))
        if unit == "bytes":
            _add_bytes(fig, series)
        else:
            for label, x, y in series:
                fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=label))
        for idle in doc["source"].get("resumed") or []:
            # A resumed run: nothing was recorded there (the line only joins its ends).
            fig.add_vrect(x0=idle["start_s"], x1=idle["end_s"], fillcolor="#d0d7de", opacity=0.5, line_width=0)
        if fig.data:
            page.plot(fig)
            drawn += 1
    if not drawn:
        page.note("No sampler counters in this trace.")
    elif many(len(data.ranks)):
        page.note(
            f"{len(data.ranks):,} ranks: each counter as the minimum, median, p95 and maximum across the ranks of "
            f"their means in each of {html_ranks.BAND_POINTS} equal slices of the run; bytes in MiB."
        )
    elif reduced:
        page.note(
            f"{reduced} series longer than {MAX_POINTS} points are drawn as the minimum and maximum of "
            f"{MAX_POINTS // 2} equal buckets each, so every peak stays on the plot."
        )
    if not doc["system"]["gpu"]["available"]:
        page.note(str(doc["system"]["gpu"]["reason"]))
    page.add("</section>")


def _memory(page: _Page, doc: dict[str, Any], data: RunData) -> None:
    """Memory per step (the series the report judged), the step where growth
    began marked, and each rank's out-of-memory capture."""
    mem = doc.get("memory")
    page.add('<section id="memory"><h2>Memory</h2>')
    if not mem:
        page.note(str(doc.get("memory_reason") or "no memory figures"))
        page.add("</section>")
        return
    ranks = (mem.get("per_rank") or [])[:MAX_RANK_PLOTS]
    if ranks:
        fig = _figure("Memory at each step's end", "bytes")
        fig.update_xaxes(title_text="step (ordinal on the rank)")
        reduced = False
        series: list[tuple[str, F64, F64]] = []
        for r in ranks:
            ts, v = data.counter(str(r["series"]), int(r["rank"]))
            at = reading_steps(data, int(r["rank"]), ts)
            x, y = downsample(at.astype(np.float64), v.astype(np.float64))
            reduced |= len(x) < len(v)
            series.append((f"rank {r['rank']} {r['series']}", x, y))
        _add_bytes(fig, series)
        for r in ranks:
            if r["leak"] and r["began_at_step"] is not None:
                fig.add_vline(x=r["began_at_step"], line_dash="dash", line_color="#c0392b")
            if r.get("ended_at_step") is not None:
                fig.add_vline(x=r["ended_at_step"], line_dash="dot", line_color="#1a7f37")
        for o in mem.get("oom") or []:
            if o.get("step") is not None:
                fig.add_vline(x=o["step"], line_color="#000000")
        marked = _mark_windows(fig, data, [int(r["rank"]) for r in ranks])
        page.plot(fig)
        for what, spans in marked.items():
            page.note(f"Shaded: {what} ({', '.join(spans)}).")
        for r in ranks:
            g = r["growth_b_per_step"]
            said = f"{human_bytes(g)} per step" if g is not None and g >= 0 else "-"
            if r.get("ended_at_step") is not None:
                page.note(f"Rank {r['rank']} ({r['series']}): {r['verdict']} (dotted line).")
                continue
            page.note(
                f"Rank {r['rank']} ({r['series']}): {r['verdict']}; growth {said}"
                + (f", from step {r['began_at_step']} (dashed line)" if r["leak"] else "")
                + "."
            )
        if reduced:
            page.note(f"Series longer than {MAX_POINTS} points are drawn as each bucket's minimum and maximum.")
    for o in mem.get("oom") or []:
        page.note(
            f"Out of memory on rank {o['rank']} at step {o['step']} ({o['phase']}), at {o['where']}: "
            f"{o['exception'][:200]}" + ("" if not ranks else " (solid line)")
        )
        if o["largest"]:
            page.table(
                ["largest live allocations, by the frame that made them", "bytes", "blocks"],
                [[g["where"], human_bytes(g["bytes"]), g["blocks"]] for g in o["largest"]],
            )
        else:
            page.note(f"No allocator snapshot: {o['cuda_reason']}")
    model = mem.get("model")
    if model:
        t = model["totals"]
        page.note(
            f"Model {model['model']}: {t.get('params', 0):,} parameters ({t.get('trainable', 0):,} trainable); "
            f"the layers to depth {model['depth']} are in {model['file']}."
        )
    page.add("</section>")


#: What the Memory plot shades: profiler.json's windows, with their colours.
_WINDOW_SHADES = (
    (("memory", "history"), "allocator history windows", "#8e44ad", 0.18),
    (("torch",), "torch.profiler windows, left out of the growth judgement", "#7f8c8d", 0.10),
)


def _mark_windows(fig: go.Figure, data: RunData, ranks: list[int]) -> dict[str, list[str]]:
    """Shade each window of the plotted ranks (steps first..last) on the
    Memory plot; returns what was shaded, for the note under it."""
    marked: dict[str, list[str]] = {}
    for keys, what, colour, opacity in _WINDOW_SHADES:
        seen: set[tuple[int, int]] = set()
        for rank in ranks:
            for w in _windows_of(data.profiler.get(rank), keys):
                try:
                    first, last = int(w["first_step"]), int(w["last_step"])
                except (KeyError, TypeError, ValueError):
                    continue
                if (first, last) not in seen:
                    seen.add((first, last))
                    fig.add_vrect(x0=first - 0.5, x1=last + 0.5, fillcolor=colour, opacity=opacity, line_width=0)
                    marked.setdefault(what, []).append(f"steps {first}-{last}")
    return marked


def _windows_of(profiler: Any, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """profiler.json's ``<keys...>.windows`` (empty when absent)."""
    part = profiler
    for k in keys:
        part = part.get(k) if isinstance(part, dict) else None
    windows = part.get("windows") if isinstance(part, dict) else None
    return [w for w in windows if isinstance(w, dict)] if isinstance(windows, list) else []


def _top_spans(page: _Page, doc: dict[str, Any]) -> None:
    page.add('<section id="spans"><h2>Top span names</h2>')
    agg: dict[str, list[float]] = {}
    for r in doc["time"]["rows"]:
        a = agg.setdefault(r["name"], [0.0, 0.0, 0.0])
        a[0] += r["count"]
        a[1] += r["total_s"]
        a[2] = max(a[2], r["max_s"])
    top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:TOP_ROWS]
    page.table(
        ["name", "count", "total s", "mean s", "max s"],
        [[n, int(c), f"{t:.4f}", f"{t / c:.5f}" if c else "-", f"{mx:.5f}"] for n, (c, t, mx) in top],
    )
    page.note("All ranks together; " + str(doc["time"]["note"]) + ".")
    page.add("</section>")


def _cats(data: RunData, wanted: set[str]) -> list[int]:
    return [i for i, c in enumerate(data.cols.categories) if any(p in wanted for p in c.split(","))]


def top_events(data: RunData, wanted: set[str], limit: int = TOP_ROWS) -> list[list[Any]]:
    """name, count, total ms, mean µs, max µs of the spans in the categories
    ``wanted`` (Kineto's cpu_op, kernel ...), all ranks, by total time."""
    s = data.cols.spans
    ids = _cats(data, wanted)
    if not ids:
        return []
    wanted_cat = data.category_mask(ids)
    n_names = len(data.cols.names)
    total = np.zeros(n_names)
    count = np.zeros(n_names, np.int64)
    mx = np.zeros(n_names)
    # In chunks: the selected rows' copies stay a few MB however many rows
    # there are. Durations are whole ns, so the float sums are exact in any order.
    for a in range(0, len(s["ts"]), _CHUNK):
        m = wanted_cat[s["cat"][a : a + _CHUNK]]
        nid = s["name"][a : a + _CHUNK][m].astype(np.intp)
        dur = s["dur"][a : a + _CHUNK][m].astype(np.float64)
        total += np.bincount(nid, weights=dur, minlength=n_names)
        count += np.bincount(nid, minlength=n_names)
        np.maximum.at(mx, nid, dur)
    # Spans folded while reading (a torch window's ops and kernels): totals.
    f = data.cols.folded
    if f and len(f["name"]):
        m = wanted_cat[f["cat"]]
        nid = f["name"][m].astype(np.intp)
        total += np.bincount(nid, weights=f["total_ns"][m].astype(np.float64), minlength=n_names)
        count += np.bincount(nid, weights=f["count"][m], minlength=n_names).astype(np.int64)
        np.maximum.at(mx, nid, f["max_ns"][m].astype(np.float64))
    if not count.any():
        return []
    # As long as the largest id seen + 1, as one bincount over the rows gives
    # (the order of equal totals in the sort below depends on the length).
    k = int(np.flatnonzero(count)[-1]) + 1
    total, count, mx = total[:k], count[:k], mx[:k]
    rows = []
    for i in np.argsort(-total)[:limit]:
        if count[i] == 0:
            break
        rows.append(
            [
                data.cols.names[int(i)],
                int(count[i]),
                f"{total[i] / 1e6:.3f}",
                f"{total[i] / count[i] / 1e3:.1f}",
                f"{mx[i] / 1e3:.1f}",
            ]
        )
    return rows


def _operators(page: _Page, data: RunData) -> None:
    page.add('<section id="operators"><h2>Top operators and kernels (torch windows)</h2>')
    header = ["name", "count", "total ms", "mean µs", "max µs"]
    ops = top_events(data, {"cpu_op"})
    if not ops:
        page.note("no torch windows: the trace holds no torch.profiler operators (cpu_op).")
    else:
        page.add("<h3>CPU operators (inclusive time)</h3>")
        page.table(header, ops)
        kernels = top_events(data, {"kernel", "gpu_memcpy", "gpu_memset"})
        page.add("<h3>GPU kernels, memcpy and memset</h3>")
        if kernels:
            page.table(header, kernels)
        else:
            page.note("no GPU activity in the torch windows.")
    page.add("</section>")


def _speed_rows(sp: dict[str, Any], st: dict[str, Any]) -> list[list[Any]]:
    """The Speed table's rows for the whole run (speed, step_time of report.json)."""
    return [
        ["train iterations/s", _num(sp["train"]["iterations_per_s"], "{:.3f}")],
        ["train samples/s", _num(sp["train"]["samples_per_s"], "{:.2f}")],
        ["step p50 / p95 / max (s)", f"{_num(st['p50_s'])} / {_num(st['p95_s'])} / {_num(st['max_s'])}"],
        ["step time trend (last tenth vs first)", trend_text(sp)],
    ]


def _tables(page: _Page, doc: dict[str, Any]) -> None:
    if many(len(doc["source"]["ranks"])):
        _tables_many(page, doc)
        return
    sp, st = doc["speed"], doc["speed"]["step_time"]
    page.add('<section id="speed"><h2>Speed</h2>')
    rows = _speed_rows(sp, st)
    for r in sp["train"]["per_rank"]:
        rows.append([f"rank {r['rank']}: steps (measured)", f"{r['steps']} ({r['steps_measured']})"])
        rows.append([f"rank {r['rank']}: DataLoader share of step", _num(r["loader_share_pct"], "{:.1f}%")])
    for r in sp["loaders"]:
        rows.append([f"rank {r['rank']} loader {r['loader']}: wait per batch (s)", _num(r["wait_per_batch_s"])])
    for r in sp["validation"]:
        rows.append([f"rank {r['rank']} {r['loader']}: iterations/s", _num(r["iterations_per_s"], "{:.2f}")])
    page.table(["measure", "value"], rows, cls="kv")
    page.note(trend_note(sp))
    page.add('</section><section id="system"><h2>System</h2>')
    page.table(list(HOST_COLUMNS), host_rows(doc["system"]["host"]))
    devices = doc["system"]["gpu"]["devices"]
    if devices:
        page.table(
            ["rank", "gpu", "util mean/max %", "mem peak", "power mean/max W", "energy J", "J/sample"],
            [
                [
                    d["rank"],
                    d["gpu"],
                    f"{_num(d['util_mean_pct'], '{:.0f}')}/{_num(d['util_max_pct'], '{:.0f}')}",
                    human_bytes(d["mem_used_peak_b"]),
                    f"{_num(d['power_mean_w'], '{:.0f}')}/{_num(d['power_max_w'], '{:.0f}')}",
                    f"{_num(d['energy_j'], '{:.1f}')} ({d['energy_source']})",
                    _num(d["energy_per_sample_j"]),
                ]
                for d in devices
            ],
        )
    page.add('</section><section id="time"><h2>Time</h2>')
    page.table(
        ["rank", "name", "count", "total s", "mean s", "p50 s", "p95 s", "max s", "% wall"],
        [
            [
                r["rank"],
                r["name"],
                r["count"],
                f"{r['total_s']:.4f}",
                f"{r['mean_s']:.5f}",
                f"{r['p50_s']:.5f}",
                f"{r['p95_s']:.5f}",
                f"{r['max_s']:.5f}",
                f"{r['pct_wall']:.1f}",
            ]
            for r in doc["time"]["rows"]
        ],
    )
    page.add("</section>")


def _tables_many(page: _Page, doc: dict[str, Any]) -> None:
    """The tables of many ranks: each per-rank figure as its distribution
    across the ranks (every rank in the Ranks table, below)."""
    sp, st = doc["speed"], doc["speed"]["step_time"]
    page.add('<section id="speed"><h2>Speed</h2>')
    rows = _speed_rows(sp, st)
    page.table(["measure", "value"], rows, cls="kv")
    page.table(html_ranks.SPREAD_HEADER, html_ranks.speed_spread(doc), cls="spread")
    page.note(trend_note(sp))
    page.add('</section><section id="system"><h2>System</h2>')
    host = html_ranks.host_spread(doc)
    if host:
        page.table(html_ranks.SPREAD_HEADER, host, cls="spread")
    else:
        page.note(f"No host figures on any of the {len(doc['source']['ranks']):,} ranks (no sampler counters).")
    gpus = html_ranks.gpu_spread(doc)
    if gpus:
        page.table(html_ranks.SPREAD_HEADER, gpus, cls="spread")
    page.add('</section><section id="time"><h2>Time</h2>')
    page.table(html_ranks.TIME_HEADER, html_ranks.time_by_name(doc))
    page.note("One row per span name across the ranks; every rank's rows are in time.csv and report.json.")
    page.add("</section>")
    page.add(html_ranks.rank_table(doc))


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1300px;padding:16px 24px;
color:#1f2328;background:#fff}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;
padding-bottom:4px}h3{font-size:15px;margin:16px 0 6px}
.src{color:#57606a;font-size:13px;word-break:break-all}.note{color:#57606a;font-size:13px;margin:6px 0}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:14px 0 6px}
.card{border:1px solid #d0d7de;border-radius:8px;padding:10px 16px;min-width:130px}
.card .v{font-size:22px;font-weight:600}.card .k{color:#57606a;font-size:12px}
ul.recs li{margin:4px 0;padding:6px 10px;background:#fff8c5;border-left:4px solid #d4a72c;list-style:none}
ul.recs{padding:0}
table{border-collapse:collapse;font-size:13px;margin:6px 0 10px}
th,td{border-bottom:1px solid #eaeef2;padding:3px 10px;text-align:right}th{background:#f6f8fa}
td:first-child,th:first-child{text-align:left}
#recommendations td:last-child,#recommendations th:last-child,#time td:nth-child(2),#time th:nth-child(2)
{text-align:left;max-width:640px}
.plot{border:1px solid #eaeef2;border-radius:6px;margin:10px 0}
.rank-scroll{max-height:640px;overflow:auto;border:1px solid #eaeef2;margin:6px 0}
#rank-table td{white-space:nowrap}#rank-table th{position:sticky;top:0}
#rank-filter{font-size:14px;padding:4px 8px;margin:4px 0}
"""


def render_html(doc: dict[str, Any], data: RunData, link_from: Path | None = None, json_beside: bool = True) -> str:
    """The page as one string (see the module's docstring); ``link_from``:
    the folder the page will be in, that its links to the run's files are
    relative to (None: files named, not linked); ``json_beside``: report.json
    is written beside the page (linked where the page embeds a bounded view)."""
    return "".join(_render(doc, data, link_from, json_beside))


def _render(doc: dict[str, Any], data: RunData, link_from: Path | None, json_beside: bool) -> list[str]:
    """The page in pieces, in order: written one by one, the page never
    exists as one string (a large trace's page is ~10 MB of text, held as
    two bytes a character in a str that holds a "·")."""
    page = _Page()
    src = doc["source"]
    n_ranks = len(src["ranks"])
    said = f"{n_ranks:,} ({ranges(src['ranks'])})" if many(n_ranks) else src["ranks"]
    page.add(f"<h1>fastprof report</h1><div class='src'>{_esc(src['path'])} · ranks {_esc(said)} · ")
    page.add(f"fastprof {_esc(doc['fastprof_version'])} · schema v{_esc(doc['schema_version'])}</div>")
    for w in src["warnings"]:
        page.note("warning: " + w)
    for gone in src.get("rotated") or []:
        page.note("rotated away: " + describe_rotated(gone, "the report wall time"))
    for idle in src.get("resumed") or []:
        page.note("resumed: " + describe_resumed(idle))
    _headline(page, doc, data)
    _recommendations(page, doc)
    for h in doc.get("hangs") or []:
        page.add(f"<h2>Hang</h2><p>{_esc(h['text'])}</p>")
    _step_times(page, doc, data)
    json_href = REPORT_JSON if json_beside else None
    for part in html_triggers.section(doc, data.run_dir, link_from, json_href):
        page.add(part)
    _memory(page, doc, data)
    _counters(page, doc, data)
    _top_spans(page, doc)
    _operators(page, data)
    _tables(page, doc)
    if html_embed.bounded(doc):
        page.add(html_embed.note(doc, json_href))
    # "<", ">" and "&" escaped as JSON \u escapes: the block cannot end early.
    # Above MANY_RANKS ranks the per-rank lists are bounded (report.json has them all).
    embedded = (
        json.dumps(spelt(html_embed.embedded(doc)), allow_nan=False, separators=(",", ":"))
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )
    body = [part for i, p in enumerate(page.parts) for part in ((p,) if i == 0 else ("\n", p))]
    return [
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>fastprof report: {_esc(Path(str(src['path'])).name)}</title><style>{_CSS}</style>"
        "<script>",
        get_plotlyjs(),
        "</script></head><body>\n",
        *body,
        '\n<script type="application/json" id="fastprof-report">',
        embedded,
        "</script>\n</body></html>\n",
    ]


def write_html(doc: dict[str, Any], data: RunData, out_dir: Path, link_from: Path | None = None) -> Path:
    """``out_dir/report.html``, written part by part into the report's
    staging folder (moved in whole by ``reports.report._write``);
    ``link_from``: the folder the page ends up in (default ``out_dir``),
    that its links to the run's files are relative to."""
    path = out_dir / "report.html"
    # report.json is written first, into the same folder, when asked for.
    json_beside = (out_dir / REPORT_JSON).is_file()
    with open(path, "w", encoding="utf-8") as f:
        for part in _render(doc, data, out_dir if link_from is None else link_from, json_beside):
            f.write(part)
    return path
