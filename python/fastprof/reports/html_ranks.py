"""report.html for a run of many ranks (issue #38, item 3): above
:data:`~fastprof.reports.many.MANY_RANKS` ranks the page draws ranks as a
heat map (rank x step, rank x phase) and as percentile bands across the
ranks (min, median, p95, max), never one line per rank with a legend entry
each; the per-rank figures are one table with a plain JavaScript filter
(:func:`rank_table`), and the page's other per-rank tables become
distributions across the ranks.

Every figure here is sized by a budget, not by the ranks: a heat map holds
at most :data:`HEAT_CELLS` cells (fewer columns of merged steps as the ranks
grow), bands at most :data:`BAND_POINTS` points, so a page of 1,024 ranks
stays a few MB above plotly.js and the embedded report.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import plotly.graph_objects as go

from fastprof.reports.data import F64, RunData, human_bytes, step_spans
from fastprof.reports.many import TOP_K, by_span_name, spread, top

#: Cells of a rank x step heat map at most: its step columns are
#: ``HEAT_CELLS // ranks`` (within :data:`HEAT_COLUMNS`), each the median
#: step of its run of steps.
HEAT_CELLS = 150_000
HEAT_COLUMNS = (20, 500)
#: The heat map's colours end at this percentile of its cells (longer: the top colour).
HEAT_TOP_PCT = 99.0
#: Points of a percentile band at most (consecutive steps, or instants, merged).
BAND_POINTS = 1000
#: The slowest ranks drawn as lines of their own over the bands.
RANKS_OVER_BANDS = 3
_BAND_COLOURS = {"min": "#9ecae1", "median": "#08519c", "p95": "#fd8d3c", "max": "#c0392b"}


def _esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def figure(title: str, ytitle: str, height: int = 320, **layout: Any) -> go.Figure:
    """A figure in the page's style (as ``html._figure``)."""
    fig = go.Figure()
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 20, "t": 45, "b": 45},
        yaxis_title=ytitle,
        legend={"orientation": "h", "y": -0.2},
        **layout,
    )
    return fig


def _buckets(n: int, b: int) -> tuple[np.ndarray[Any, np.dtype[np.int64]], int]:
    """Bucket of each of ``n`` consecutive items in at most ``b`` equal runs; (buckets, runs)."""
    per = max(1, -(-n // b))
    return np.arange(n, dtype=np.int64) // per, -(-n // per)


def step_matrices(data: RunData) -> tuple[list[int], F64, F64, int, int] | None:
    """Each rank's step times (ms), merged into runs of consecutive steps:
    (ranks, heat: ranks x heat columns of each run's median step, bands:
    ranks x band columns of each run's mean step, steps per heat column,
    steps per band column). NaN where a rank has no such step. None
    without steps."""
    per_rank: list[tuple[int, F64]] = []
    for r in data.ranks:
        steps, _src = step_spans(data, r)
        if len(steps.dur):
            per_rank.append((r, np.asarray(steps.dur, dtype=np.float64) / 1e6))
    if not per_rank:
        return None
    n = max(len(d) for _, d in per_rank)
    cols = int(np.clip(HEAT_CELLS // len(per_rank), *HEAT_COLUMNS))
    _hb, hn = _buckets(n, cols)
    per = max(1, -(-n // cols))
    bb, bn = _buckets(n, BAND_POINTS)
    heat = np.full((len(per_rank), hn), np.nan)
    bands = np.full((len(per_rank), bn), np.nan)
    for i, (_r, d) in enumerate(per_rank):
        # The median of each run: the rank's typical step there (its long
        # steps are the bands' max and the slow-step marks); no run all NaN.
        m = -(-len(d) // per)
        runs = np.full(m * per, np.nan)
        runs[: len(d)] = d
        heat[i, :m] = np.nanmedian(runs.reshape(m, per), axis=1)
        b = bb[: len(d)]
        bands[i, : int(b[-1]) + 1] = np.bincount(b, weights=d) / np.bincount(b)
    return [r for r, _ in per_rank], heat, bands, per, max(1, -(-n // BAND_POINTS))


def step_heatmap(ranks: list[int], heat: F64, per: int) -> go.Figure:
    """Rank x step: each cell the median step of its run of ``per`` steps."""
    fig = figure(
        f"Step time, rank x step ({len(ranks):,} ranks)",
        "rank",
        height=max(320, min(900, 120 + 2 * len(ranks))),
    )
    x = np.arange(heat.shape[1], dtype=np.int64) * per
    # Colours up to the 99th percentile of the cells: a few long steps would
    # otherwise take the whole scale and a rank slow at every step fade into the rest.
    finite = heat[np.isfinite(heat)]
    zmin = float(finite.min()) if len(finite) else 0.0
    zmax = float(np.percentile(finite, HEAT_TOP_PCT)) if len(finite) else 1.0
    fig.add_trace(
        go.Heatmap(
            z=heat.astype(np.float32),
            x=x,
            y=np.asarray(ranks, dtype=np.int32),
            zmin=zmin,
            zmax=max(zmax, zmin + 1e-9),
            colorscale="Viridis",
            colorbar={"title": {"text": "ms"}},
            hovertemplate="rank %{y}, step %{x}: %{z:.3f} ms<extra></extra>",
            name="step time",
        )
    )
    fig.update_xaxes(title_text="step (ordinal on the rank)" + (f", first of each {per}" if per > 1 else ""))
    fig.update_yaxes(autorange="reversed")
    return fig


def _band_lines(fig: go.Figure, x: Any, m: F64, axis: int = 0) -> None:
    """min / median / p95 / max of ``m`` across its rows (NaN left out), the
    band between min and max filled."""
    with np.errstate(all="ignore"):
        cols = ~np.all(np.isnan(m), axis=axis)
        m, x = m[:, cols], np.asarray(x)[cols]
        q = {
            "min": np.nanmin(m, axis=axis),
            "median": np.nanpercentile(m, 50, axis=axis),
            "p95": np.nanpercentile(m, 95, axis=axis),
            "max": np.nanmax(m, axis=axis),
        }
    for name in ("min", "max", "median", "p95"):
        fill = "tonexty" if name == "max" else None
        fig.add_trace(
            go.Scatter(
                x=x,
                y=q[name],
                mode="lines",
                name=f"{name} across ranks",
                line={"color": _BAND_COLOURS[name], "width": 1 if name in ("min", "max") else 2},
                fill=fill,
                fillcolor="rgba(158,202,225,0.25)" if fill else None,
            )
        )


def step_bands(ranks: list[int], bands: F64, per: int) -> go.Figure:
    """Step time across the ranks: min / median / p95 / max per step (runs
    of ``per`` steps merged as their mean), and the own lines of the ranks
    slowest at their median step."""
    fig = figure("Step time across ranks (min, median, p95, max)", "ms")
    x = np.arange(bands.shape[1], dtype=np.int64) * per
    _band_lines(fig, x, bands)
    # The slowest by their typical step (each row's median), not by a few long ones.
    typical = np.nanmedian(bands, axis=1)
    for r, _v in top(zip(ranks, typical.tolist(), strict=True), RANKS_OVER_BANDS):
        fig.add_trace(go.Scatter(x=x, y=bands[ranks.index(r)], mode="lines", name=f"rank {r}", line={"dash": "dot"}))
    fig.update_xaxes(title_text="step (ordinal on the rank)" + (f", mean of each {per}" if per > 1 else ""))
    return fig


def phase_heatmap(section: dict[str, Any]) -> go.Figure | None:
    """Rank x phase: each phase's share of the rank's step time (%)."""
    per = section["per_rank"]
    phases = list(section["phases"])
    if not per or not phases:
        return None
    z = np.asarray([[100.0 * float(r["phases"][p]["share"]) for p in phases] for r in per], dtype=np.float32)
    p50 = np.asarray([[float(r["phases"][p]["p50_ns"]) / 1e6 for p in phases] for r in per], dtype=np.float32)
    fig = figure(
        f"Step anatomy, rank x phase ({len(per):,} ranks; % of step time)",
        "rank",
        height=max(320, min(900, 120 + 2 * len(per))),
    )
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=phases,
            y=np.asarray([int(r["rank"]) for r in per], dtype=np.int32),
            customdata=p50,
            colorscale="Blues",
            colorbar={"title": {"text": "%"}},
            hovertemplate="rank %{y}, %{x}: %{z:.1f}% of the step, p50 %{customdata:.3f} ms<extra></extra>",
            name="phase share",
        )
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def counter_bands(
    data: RunData, title: str, unit: str, names: list[str], t0: int, series: Callable[..., Any]
) -> go.Figure | None:
    """One counter plot of many ranks: per counter, min / median / p95 /
    max across the ranks of each instant's mean (the run's wall in
    :data:`BAND_POINTS` equal slices). Byte counters in MiB."""
    fig = figure(f"{title}, across ranks (min, median, p95, max)", "MiB" if unit == "bytes" else unit)
    fig.update_xaxes(title_text="seconds since the start of the run")
    end = max((data.wall(r)[1] for r in data.ranks), default=t0)
    span = max(end - t0, 1)
    for n in names:
        rows: list[F64] = []
        for r in data.ranks:
            ts, v = series(data, n, r)
            if not len(ts) or (n.startswith("children.") and not v.any()):
                continue
            b = np.clip((ts - t0) * BAND_POINTS // span, 0, BAND_POINTS - 1).astype(np.int64)
            cnt = np.bincount(b, minlength=BAND_POINTS).astype(np.float64)
            with np.errstate(all="ignore"):
                rows.append(np.bincount(b, weights=v, minlength=BAND_POINTS) / cnt)
        if not rows:
            continue
        m = np.vstack(rows)
        if unit == "bytes":
            m = m / 2**20
        before = len(fig.data)
        _band_lines(fig, (np.arange(BAND_POINTS) + 0.5) * span / BAND_POINTS / 1e9, m)
        if len(names) > 1:
            for tr in fig.data[before:]:
                tr.name = f"{n}: {tr.name}"
    return fig if fig.data else None


def spread_rows(rows: Iterable[tuple[str, Iterable[tuple[int, Any]], Callable[[float], str]]]) -> list[list[Any]]:
    """Rows of a distribution table (measure, ranks, min (rank), median, p95,
    max (rank)); measures no rank has left out."""
    out: list[list[Any]] = []
    for label, pairs, fmt in rows:
        s = spread(pairs)
        if s is not None:
            out.append(
                [
                    label,
                    f"{s.n:,}",
                    f"{fmt(s.min)} ({s.min_rank})",
                    fmt(s.p50),
                    fmt(s.p95),
                    f"{fmt(s.max)} ({s.max_rank})",
                ]
            )
    return out


SPREAD_HEADER = ["measure", "ranks", "min (rank)", "median", "p95", "max (rank)"]


def _f(fmt: str) -> Callable[[float], str]:
    return fmt.format


def host_spread(doc: dict[str, Any]) -> list[list[Any]]:
    host, over = doc["system"]["host"], doc["system"]["overhead"]
    return spread_rows(
        [
            ("CPU mean %", [(h["rank"], h["cpu_mean_pct"]) for h in host], _f("{:.0f}")),
            ("process CPU %", [(h["rank"], h["process_cpu_mean_pct"]) for h in host], _f("{:.0f}")),
            ("peak RSS", [(h["rank"], h["rss_peak_b"]) for h in host], human_bytes),
            ("workers", [(h["rank"], h["workers_max"]) for h in host], _f("{:.0f}")),
            ("workers CPU %", [(h["rank"], h["workers_cpu_mean_pct"]) for h in host], _f("{:.0f}")),
            ("workers RSS", [(h["rank"], h["workers_rss_peak_b"]) for h in host], human_bytes),
            ("sampler CPU % of wall", [(o["rank"], o["sampler_cpu_pct_of_wall"]) for o in over], _f("{:.2f}")),
            ("drops", [(o["rank"], o["drops"]) for o in over], _f("{:.0f}")),
        ]
    )


def gpu_spread(doc: dict[str, Any]) -> list[list[Any]]:
    devs = doc["system"]["gpu"]["devices"]
    return spread_rows(
        [
            ("util mean %", [(d["rank"], d["util_mean_pct"]) for d in devs], _f("{:.0f}")),
            ("memory peak", [(d["rank"], d["mem_used_peak_b"]) for d in devs], human_bytes),
            ("power mean W", [(d["rank"], d["power_mean_w"]) for d in devs], _f("{:.0f}")),
            ("energy J", [(d["rank"], d["energy_j"]) for d in devs], _f("{:.1f}")),
        ]
    )


def speed_spread(doc: dict[str, Any]) -> list[list[Any]]:
    sp = doc["speed"]
    rows: list[tuple[str, Iterable[tuple[int, Any]], Callable[[float], str]]] = [
        ("steps", [(r["rank"], r["steps"]) for r in sp["train"]["per_rank"]], _f("{:.0f}")),
        (
            "DataLoader share of step %",
            [(r["rank"], r["loader_share_pct"]) for r in sp["train"]["per_rank"]],
            _f("{:.1f}"),
        ),
        ("mean step s", [(r["rank"], r["mean_s"]) for r in doc["ranks"]["per_rank"]], _f("{:.5f}")),
    ]
    loaders = sorted({str(r["loader"]) for r in sp["loaders"]})
    for ld in loaders:
        rows.append(
            (
                f"loader {ld}: wait per batch s",
                [(r["rank"], r["wait_per_batch_s"]) for r in sp["loaders"] if r["loader"] == ld],
                _f("{:.5f}"),
            )
        )
    for ld in sorted({str(r["loader"]) for r in sp["validation"]}):
        rows.append(
            (
                f"{ld}: iterations/s",
                [(r["rank"], r["iterations_per_s"]) for r in sp["validation"] if r["loader"] == ld],
                _f("{:.2f}"),
            )
        )
    return spread_rows(rows)


def time_by_name(doc: dict[str, Any]) -> list[list[Any]]:
    """The time table by span name across the ranks (one row per name)."""
    return [
        [
            g.name,
            f"{g.ranks:,}",
            f"{g.count:,}",
            "-" if g.total is None else f"{g.total.p50:.4f}",
            "-" if g.total is None else f"{g.total.max:.4f} ({g.total.max_rank})",
            "-" if g.p95 is None else f"{g.p95.p50:.5f}",
            "-" if g.max is None else f"{g.max.max:.5f} ({g.max.max_rank})",
        ]
        for g in by_span_name(doc["time"]["rows"])
    ]


TIME_HEADER = [
    "name",
    "ranks",
    "count",
    "total s, median rank",
    "total s, max (rank)",
    "p95 s, median rank",
    "max s (rank)",
]


def _n(v: Any, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def rank_table(doc: dict[str, Any]) -> str:
    """``<section id="ranks">``: one row per rank, every figure the page
    shows as a distribution, and an input that filters the rows (rank
    numbers and ranges, "3, 10-12", or any text of the row)."""
    speed = {int(r["rank"]): r for r in doc["speed"]["train"]["per_rank"]}
    steps = {int(r["rank"]): r for r in doc["ranks"]["per_rank"]}
    host = {int(h["rank"]): h for h in doc["system"]["host"]}
    gpus: dict[int, list[dict[str, Any]]] = {}
    for d in doc["system"]["gpu"]["devices"]:
        gpus.setdefault(int(d["rank"]), []).append(d)
    an = doc.get("anatomy") or {}
    anatomy = {int(r["rank"]): r for r in an.get("per_rank") or []}
    phases = list(an.get("phases") or [])
    mem = {int(r["rank"]): r for r in (doc.get("memory") or {}).get("per_rank") or []}
    trig = {int(r["rank"]): r for r in (doc.get("triggers") or {}).get("per_rank") or []}
    ranks = sorted({int(r) for r in doc["source"]["ranks"]} | set(speed) | set(steps))
    header = ["rank", "steps", "mean step ms", "p50 ms", "p95 ms", "max ms", "DataLoader %"]
    header += [f"{p} p50 ms" for p in phases]
    header += ["slow steps", "peak RSS", "GPU util %", "memory peak", "memory leak", "captures"]
    body: list[str] = []
    for r in ranks:
        s, sp, a, m, t = steps.get(r, {}), speed.get(r, {}), anatomy.get(r), mem.get(r), trig.get(r)
        util = [d["util_mean_pct"] for d in gpus.get(r, []) if d.get("util_mean_pct") is not None]
        cells = [
            str(r),
            _n(sp.get("steps"), "{}"),
            _n(s.get("mean_s") and s["mean_s"] * 1e3, "{:.3f}"),
            _n(s.get("p50_s") and s["p50_s"] * 1e3, "{:.3f}"),
            _n(s.get("p95_s") and s["p95_s"] * 1e3, "{:.3f}"),
            _n(s.get("max_s") and s["max_s"] * 1e3, "{:.3f}"),
            _n(sp.get("loader_share_pct"), "{:.1f}"),
            *(_n(a and a["phases"][p]["p50_ns"] / 1e6, "{:.3f}") for p in phases),
            _n(a and a.get("slow_step_count", len(a["slow_steps"])), "{}"),
            human_bytes(host.get(r, {}).get("rss_peak_b")),
            "/".join(f"{u:.0f}" for u in util) or "-",
            "-" if m is None else human_bytes(m.get("peak_b")),
            "-" if m is None else ("yes" if m.get("leak") else "no"),
            "-" if t is None else str(len(t["captures"])),
        ]
        body.append(f'<tr data-rank="{r}">' + "".join(f"<td>{_esc(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    return (
        '<section id="ranks"><h2>Ranks</h2>'
        f'<p class="note">Every rank, one row ({len(ranks):,}). Filter: rank numbers or ranges ("3, 10-12"), '
        "or any text of a row; every figure is in report.json.</p>"
        '<input id="rank-filter" type="search" placeholder="filter ranks: 3, 10-12, or text" size="40">'
        ' <span id="rank-count" class="note"></span>'
        f'<div class="rank-scroll"><table id="rank-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        f"<script>{_FILTER_JS}</script></section>"
    )


_FILTER_JS = """
(function () {
  const input = document.getElementById('rank-filter');
  const rows = Array.from(document.querySelectorAll('#rank-table tbody tr'));
  const count = document.getElementById('rank-count');
  function wanted(q) {
    const tokens = q.split(/[\\s,]+/).filter(Boolean);
    if (!tokens.length) return () => true;
    const tests = tokens.map(t => {
      const m = t.match(/^(\\d+)(?:-(\\d+))?$/);
      if (m) {
        const lo = +m[1], hi = m[2] === undefined ? lo : +m[2];
        return tr => { const r = +tr.dataset.rank; return r >= lo && r <= hi; };
      }
      const s = t.toLowerCase();
      return tr => tr.textContent.toLowerCase().includes(s);
    });
    return tr => tests.some(f => f(tr));
  }
  function apply() {
    const keep = wanted(input.value);
    let shown = 0;
    for (const tr of rows) { const on = keep(tr); tr.style.display = on ? '' : 'none'; shown += on; }
    count.textContent = shown + ' of ' + rows.length + ' ranks';
  }
  input.addEventListener('input', apply);
  apply();
})();
"""


def slow_steps_note(section: dict[str, Any], n_ranks: int) -> str:
    """The anatomy's slow steps of many ranks: counted, the worst named."""
    per = section["per_rank"]
    counted = sum(int(r.get("slow_step_count", len(r["slow_steps"]))) for r in per)
    rule = section.get("slow_step_rule")
    said = f" Slow steps: {rule['text']}." if rule else ""
    if not counted:
        return said + (" None in this run." if rule else "")
    on = sum(1 for r in per if r.get("slow_step_count", len(r["slow_steps"])))
    slow = [(int(r["rank"]), s) for r in per for s in r["slow_steps"]]
    slow.sort(key=lambda rs: (-rs[1]["dur_ns"] / max(float(rs[1]["median_step_ns"]), 1.0), rs[0]))
    worst = "; ".join(
        f"rank {r} step {s['step']}, {s['dur_ns'] / 1e6:.1f} ms ({s['dur_ns'] / s['median_step_ns']:.1f}x)"
        for r, s in slow[:TOP_K]
    )
    return said + f" {counted:,} slow step(s) on {on:,} of {n_ranks:,} ranks; the worst: {worst}."
