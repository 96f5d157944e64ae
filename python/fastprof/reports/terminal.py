"""Terminal tables (rich) of a report document: the key numbers in seconds.

Up to :data:`~fastprof.reports.many.MANY_RANKS` ranks every per-rank figure
is a line or a row of its own; above, each is its distribution across the
ranks and the ranks that stand out, and each per-rank list of events a count
and its worst few, so the report stays within ~120 lines at any number of
ranks (issue #38, item 3; report.json and the CSV files keep every rank)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from fastprof.readers.merge import describe_rotated
from fastprof.reports.anatomy import overlap_line, slow_step_line
from fastprof.reports.data import HOST_COLUMNS, host_rows, human_bytes
from fastprof.reports.many import (
    OUTLIER_MADS,
    OUTLIER_SHARE,
    TOP_K,
    by_span_name,
    many,
    named,
    outliers,
    ranges,
    representatives,
    spread,
    spread_text,
    top,
)
from fastprof.reports.resumed import describe as describe_resumed
from fastprof.reports.speed import trend_note, trend_text
from fastprof.reports.stragglers import pace_line, straggler_line


def _s(v: Any, fmt: str = "{:.4f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(doc: dict[str, Any], verbose: bool = False, file: Any = None, title: str = "fastprof report") -> None:
    con = Console(file=file, width=140, highlight=False)
    src = doc["source"]
    n_ranks = len(src["ranks"])
    wide = many(n_ranks)
    said = f"{n_ranks:,} ({ranges(src['ranks'])})" if wide else str(src["ranks"])
    con.print(f"[bold]{title}[/bold] {src['path']}  ranks {said}  wall {doc['wall']['duration_s']:.3f} s")
    for e in src.get("rotated") or []:
        con.print(f"[yellow]rotated away:[/yellow] {describe_rotated(e, 'the report wall time')}", markup=True)
    for e in src.get("resumed") or []:
        con.print(f"[yellow]resumed:[/yellow] {describe_resumed(e)}", markup=True)

    if wide:
        _time_by_name(con, doc, verbose)
    else:
        _time_per_rank(con, doc, verbose)
    _speed(con, doc, wide)
    if wide:
        _system_across(con, doc["system"], n_ranks)
        _ranks_across(con, doc, n_ranks)
    else:
        _system_per_rank(con, doc["system"])
    spread_ = doc["ranks"]["spread"]
    if spread_:
        slowest = (
            "no rank slowest more often than chance (ties are no one's)"
            if spread_["most_often_slowest_rank"] is None
            else f"rank {spread_['most_often_slowest_rank']} clearly slowest in "
            f"{spread_['slowest_share_pct']:.0f}% of steps"
        )
        con.print(f"Ranks: step spread p50 {spread_['p50_s']:.4f} s, max {spread_['max_s']:.4f} s; {slowest}")
    if doc["breakdown"] is None:
        con.print(f"Step-time breakdown: {doc['breakdown_reason']}")
    else:
        con.print(_breakdown_table(doc["breakdown"], wide))
    hangs = doc.get("hangs") or []
    for h in hangs[:TOP_K] if wide else hangs:
        # One paragraph per stall the ranks reported (reports/hangs.py).
        con.print(f"Hang: {h['text']}", markup=False)
    if wide and len(hangs) > TOP_K:
        con.print(f"  ... {len(hangs) - TOP_K} more hang(s) in report.json")
    if wide:
        _anatomy_across(con, doc.get("anatomy"), n_ranks, _typical(doc))
        _memory_across(con, doc.get("memory"), n_ranks)
        _triggers_across(con, doc, n_ranks)
    else:
        _anatomy(con, doc.get("anatomy"))
        _memory_per_rank(con, doc.get("memory"))
        _triggers_per_rank(con, doc)
    recs = doc["recommendations"]["items"]
    con.print("[bold]Recommendations[/bold]" if recs else "Recommendations: none fired")
    for r in recs:
        con.print(f"  - {r['message']}")


def _time_per_rank(con: Any, doc: dict[str, Any], verbose: bool) -> None:
    rows = doc["time"]["rows"]
    t = Table(title="Time (seconds)" + (" - every span" if doc["time"]["verbose"] else " - training loop"))
    for col in ("rank", "name", "count", "total", "mean", "p50", "p95", "max", "% wall"):
        t.add_column(col, justify="left" if col == "name" else "right")
    limit = None if verbose else 25
    for r in rows[:limit]:
        t.add_row(
            str(r["rank"]),
            r["name"],
            str(r["count"]),
            _s(r["total_s"]),
            _s(r["mean_s"], "{:.5f}"),
            _s(r["p50_s"], "{:.5f}"),
            _s(r["p95_s"], "{:.5f}"),
            _s(r["max_s"], "{:.5f}"),
            _s(r["pct_wall"], "{:.1f}"),
        )
    con.print(t)
    if limit is not None and len(rows) > limit:
        con.print(f"  ({len(rows) - limit} more rows in time.csv / report.json)")


#: Span names in the time table of a run of many ranks (without --verbose).
NAMES_ACROSS = 15


def _time_by_name(con: Any, doc: dict[str, Any], verbose: bool) -> None:
    """One row per span name, its figures across the ranks that have it."""
    names = by_span_name(doc["time"]["rows"])
    t = Table(
        title="Time (seconds) across ranks"
        + (" - every span" if doc["time"]["verbose"] else " - training loop")
        + "; per rank: total median / max, p95 median, max"
    )
    for col in ("name", "ranks", "count", "total median", "total max (rank)", "p95 median", "max (rank)", "% wall p50"):
        t.add_column(col, justify="left" if col == "name" else "right")
    limit = None if verbose else NAMES_ACROSS
    for g in names[:limit]:
        t.add_row(
            g.name,
            f"{g.ranks:,}",
            f"{g.count:,}",
            _s(g.total and g.total.p50),
            "-" if g.total is None else f"{g.total.max:.4f} ({g.total.max_rank})",
            _s(g.p95 and g.p95.p50, "{:.5f}"),
            "-" if g.max is None else f"{g.max.max:.5f} ({g.max.max_rank})",
            _s(g.pct_wall and g.pct_wall.p50, "{:.1f}"),
        )
    con.print(t)
    if limit is not None and len(names) > limit:
        con.print(f"  ({len(names) - limit} more span names; every rank's rows in time.csv / report.json)")


def _speed(con: Any, doc: dict[str, Any], wide: bool) -> None:
    sp = doc["speed"]
    st = sp["step_time"]
    t = Table(title="Speed")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("train iterations/s", _s(sp["train"]["iterations_per_s"], "{:.2f}"))
    t.add_row("train samples/s", _s(sp["train"]["samples_per_s"], "{:.1f}"))
    t.add_row("batch size", f"{_s(sp['batch_size']['value'], '{}')} ({sp['batch_size']['source']})")
    t.add_row("warm-up excluded", f"{sp['warmup']['steps_excluded']} step(s) ({sp['warmup']['source']})")
    t.add_row("step p50 / p95 / max (s)", f"{_s(st['p50_s'])} / {_s(st['p95_s'])} / {_s(st['max_s'])}")
    t.add_row("step time trend (last tenth vs first)", trend_text(sp))
    if wide:
        n = len(sp["train"]["per_rank"])
        share = spread((r["rank"], r["loader_share_pct"]) for r in sp["train"]["per_rank"])
        if share is not None:
            t.add_row("DataLoader share of step, across ranks", spread_text(share, "{:.1f}%".format, n))
        for what, rows, key, fmt in (
            ("wait per batch (s)", sp["loaders"], "wait_per_batch_s", "{:.5f}"),
            ("iterations/s", sp["validation"], "iterations_per_s", "{:.2f}"),
        ):
            by: dict[str, list[dict[str, Any]]] = {}
            for r in rows:
                by.setdefault(str(r["loader"]), []).append(r)
            for loader, rs in by.items():
                t.add_row(f"loader {loader}: {what}", spread_text(spread((r["rank"], r[key]) for r in rs), fmt.format))
    else:
        for r in sp["train"]["per_rank"]:
            if r["loader_share_pct"] is not None:
                t.add_row(f"rank {r['rank']}: DataLoader share of step", _s(r["loader_share_pct"], "{:.1f}%"))
        for r in sp["loaders"]:
            t.add_row(f"rank {r['rank']} loader {r['loader']}: wait per batch (s)", _s(r["wait_per_batch_s"], "{:.5f}"))
        for r in sp["validation"]:
            t.add_row(f"rank {r['rank']} {r['loader']}: iterations/s", _s(r["iterations_per_s"], "{:.2f}"))
    con.print(t)
    con.print(trend_note(sp), markup=False)


def _system_per_rank(con: Any, sysr: dict[str, Any]) -> None:
    if sysr["gpu"]["available"]:
        t = Table(title="GPUs")
        for col in ("rank", "gpu", "util mean/max %", "mem mean/peak", "power mean/max W", "energy J", "J/sample"):
            t.add_column(col, justify="right")
        for d in sysr["gpu"]["devices"]:
            t.add_row(
                str(d["rank"]),
                d["gpu"],
                f"{_s(d['util_mean_pct'], '{:.0f}')}/{_s(d['util_max_pct'], '{:.0f}')}",
                f"{human_bytes(d['mem_used_mean_b'])}/{human_bytes(d['mem_used_peak_b'])}",
                f"{_s(d['power_mean_w'], '{:.0f}')}/{_s(d['power_max_w'], '{:.0f}')}",
                f"{_s(d['energy_j'], '{:.1f}')} ({d['energy_source']})",
                _s(d["energy_per_sample_j"], "{:.4f}"),
            )
        con.print(t)
    else:
        con.print(f"GPU: {sysr['gpu']['reason']}")
    t = Table(title="Host")
    for col in HOST_COLUMNS:
        t.add_column(col, justify="right")
    for row in host_rows(sysr["host"]):
        t.add_row(*row)
    con.print(t)
    for o in sysr["overhead"]:
        con.print(
            f"fastprof overhead, rank {o['rank']}: sampler {_s(o['sampler_thread_cpu_s'], '{:.3f}')} s CPU "
            f"({_s(o['sampler_cpu_pct_of_wall'], '{:.2f}')}% of wall), drops {_s(o['drops'], '{}')}, "
            f"torch window stalls {_s(o['torch_window_stall_s'], '{:.3f}')} s"
        )


def _pct(v: float) -> str:
    return f"{v:.0f}%"


def _bytes(v: float) -> str:
    return human_bytes(v)


def _spread_table(title: str, rows: list[tuple[str, list[tuple[int, Any]], Any]], n_ranks: int) -> Table | None:
    """One row per measure: its distribution across the ranks (measures no
    rank has are left out); None when no measure is left."""
    t = Table(title=title)
    for col in ("measure", "ranks", "min (rank)", "median", "p95", "max (rank)"):
        t.add_column(col, justify="left" if col == "measure" else "right")
    for label, pairs, fmt in rows:
        s = spread(pairs)
        if s is None:
            continue
        t.add_row(
            label, f"{s.n:,}/{n_ranks:,}", f"{fmt(s.min)} ({s.min_rank})", fmt(s.p50), fmt(s.p95),
            f"{fmt(s.max)} ({s.max_rank})",
        )  # fmt: skip
    return t if t.row_count else None


def _system_across(con: Any, sysr: dict[str, Any], n_ranks: int) -> None:
    """GPUs, host and fastprof's overhead as distributions across the ranks."""
    if sysr["gpu"]["available"]:
        devs = sysr["gpu"]["devices"]
        energy = [d["energy_j"] for d in devs if d.get("energy_j") is not None]
        t = _spread_table(
            f"GPUs ({len(devs):,} devices" + (f", {sum(energy):,.0f} J in all" if energy else "") + "), per device",
            [
                ("util mean %", [(d["rank"], d["util_mean_pct"]) for d in devs], _pct),
                ("memory peak", [(d["rank"], d["mem_used_peak_b"]) for d in devs], _bytes),
                ("power mean W", [(d["rank"], d["power_mean_w"]) for d in devs], "{:.0f}".format),
                ("energy J", [(d["rank"], d["energy_j"]) for d in devs], "{:.1f}".format),
                ("J/sample", [(d["rank"], d["energy_per_sample_j"]) for d in devs], "{:.4f}".format),
            ],
            n_ranks,
        )
        if t is not None:
            con.print(t)
        low = top(((d["rank"], d["util_mean_pct"]) for d in devs), largest=False)
        if low:
            con.print("  least busy GPUs (util mean): " + ", ".join(f"rank {r} {v:.0f}%" for r, v in low))
    else:
        con.print(f"GPU: {sysr['gpu']['reason']}")
    host, over = sysr["host"], sysr["overhead"]
    t = _spread_table(
        "Host and fastprof's overhead, per rank",
        [
            ("CPU mean %", [(h["rank"], h["cpu_mean_pct"]) for h in host], _pct),
            ("process CPU %", [(h["rank"], h["process_cpu_mean_pct"]) for h in host], _pct),
            ("peak RSS", [(h["rank"], h["rss_peak_b"]) for h in host], _bytes),
            ("workers", [(h["rank"], h["workers_max"]) for h in host], "{:.0f}".format),
            ("workers CPU %", [(h["rank"], h["workers_cpu_mean_pct"]) for h in host], _pct),
            ("workers RSS", [(h["rank"], h["workers_rss_peak_b"]) for h in host], _bytes),
            ("sampler CPU % of wall", [(o["rank"], o["sampler_cpu_pct_of_wall"]) for o in over], "{:.2f}%".format),
            ("drops", [(o["rank"], o["drops"]) for o in over], "{:.0f}".format),
            ("torch window stalls s", [(o["rank"], o["torch_window_stall_s"]) for o in over], "{:.3f}".format),
        ],
        n_ranks,
    )
    if t is None:
        con.print(f"Host: no host figures on any of the {n_ranks:,} ranks (no sampler counters)")
    else:
        con.print(t)
        dropped = [o["rank"] for o in over if o.get("drops")]
        if dropped:
            con.print(f"  drops on {len(dropped):,} rank(s): {named(dropped)}")


def _ranks_across(con: Any, doc: dict[str, Any], n_ranks: int) -> None:
    """Each rank's median and mean step: their distributions, and the ranks
    whose median step stands out (a rank slow at every step, not one whose
    few long steps raise its mean: those are the slow steps, below)."""
    per = doc["ranks"]["per_rank"]
    typical = spread((r["rank"], r["p50_s"]) for r in per)
    mean = spread((r["rank"], r["mean_s"]) for r in per)
    if typical is None or mean is None:
        return
    ms = "{:.2f} ms".format
    con.print(f"Median step of each rank ({n_ranks:,} ranks): {spread_text(typical, lambda v: ms(v * 1e3))}")
    con.print(f"Mean step of each rank: {spread_text(mean, lambda v: ms(v * 1e3))}")
    rule = f"median step more than {OUTLIER_MADS:g} MADs and {100 * OUTLIER_SHARE:g}% above the ranks' median"
    out = outliers((r["rank"], r["p50_s"]) for r in per)
    if out:
        con.print(
            f"  {len(out):,} rank(s) stand out ({rule}): "
            + ", ".join(f"rank {r} {v * 1e3:.2f} ms ({100 * (v / typical.p50 - 1):+.0f}%)" for r, v in out[:20])
            + (f" and {len(out) - 20:,} more" if len(out) > 20 else "")
        )
    else:
        worst = top((r["rank"], r["p50_s"]) for r in per)
        con.print(
            f"  none stands out ({rule}); the {len(worst)} slowest: "
            + ", ".join(f"rank {r} {v * 1e3:.2f} ms" for r, v in worst)
        )


def _memory_per_rank(con: Any, mem: dict[str, Any] | None) -> None:
    if not mem:
        return
    for o in mem.get("oom") or []:
        _oom(con, o)
    for r in mem.get("per_rank") or []:
        g = r["growth_b_per_step"]
        # Growth that ended has no rate worth quoting: its verdict says how much, and until when.
        rate = "" if r.get("ended_at_step") is not None else f", growth {_s(g and g / 2**20, '{:+.3f}')} MiB/step"
        con.print(
            f"Memory, rank {r['rank']} ({r['series']}): peak {_s(r['peak_b'] and r['peak_b'] / 2**20, '{:.1f}')} "
            f"MiB{rate}: {r['verdict']}" + (f" from step {r['began_at_step']}" if r["leak"] else "")
        )


def _oom(con: Any, o: dict[str, Any]) -> None:
    con.print(
        f"[bold]Out of memory[/bold] on rank {o['rank']} at step {o['step']} ({o['phase']}): "
        f"{o['exception'][:160]}\n  at {o['where']}"
    )
    if o["largest"]:
        t = Table(title="Largest live allocations at the OOM, by the frame that made them")
        for col in ("where", "MiB", "blocks"):
            t.add_column(col, justify="left" if col == "where" else "right")
        for g in o["largest"]:
            t.add_row(g["where"], f"{g['bytes'] / 2**20:.1f}", str(g["blocks"]))
        con.print(t)
    else:
        con.print(f"  no allocator snapshot: {o['cuda_reason']}")


def _memory_across(con: Any, mem: dict[str, Any] | None, n_ranks: int) -> None:
    """The first out-of-memory in full, the rest counted; the ranks' memory
    verdicts counted, their peaks as a distribution, the fastest growths named."""
    if not mem:
        return
    ooms = mem.get("oom") or []
    for o in ooms[:1]:
        _oom(con, o)
    if len(ooms) > 1:
        con.print(f"  {len(ooms) - 1:,} more out-of-memory error(s) on ranks {named([o['rank'] for o in ooms[1:]])}")
    per = mem.get("per_rank") or []
    if not per:
        return
    verdicts: dict[str, int] = {}
    for r in per:
        verdicts[str(r["verdict"])] = verdicts.get(str(r["verdict"]), 0) + 1
    peak = spread((r["rank"], r["peak_b"]) for r in per)
    con.print(f"Memory ({len(per):,} of {n_ranks:,} ranks): peak {spread_text(peak, _bytes)}")
    for verdict, count in sorted(verdicts.items(), key=lambda kv: -kv[1])[:TOP_K]:
        con.print(f"  {count:,} rank(s): {verdict}")
    leaks = [r for r in per if r["leak"]]
    if leaks:
        worst = top((r["rank"], r["growth_b_per_step"]) for r in leaks)
        began = {int(r["rank"]): r["began_at_step"] for r in leaks}
        con.print(
            f"  growing on {len(leaks):,} rank(s); the fastest: "
            + ", ".join(f"rank {r} {g / 2**20:+.3f} MiB/step from step {began[r]}" for r, g in worst)
        )


def _triggers_per_rank(con: Any, doc: dict[str, Any]) -> None:
    for r in (doc.get("triggers") or {}).get("per_rank") or []:
        # With an anatomy its slow steps say what the trigger did with each (one list, one rule).
        for a in [] if doc.get("anatomy") else r["anomalies"]:
            if a.get("said"):
                continue  # the host slowed it: said below
            con.print(_anomaly_line(r["rank"], a))
        _contention(con, r)
        for c in r["captures"]:
            con.print(_capture_line(r["rank"], c))
        for d in r["flight_dumps"]:
            con.print(f"Flight dump on rank {r['rank']} ({d['reason']}, step {d['step']}): {d['file'] or d['error']}")


def _anomaly_line(rank: Any, a: dict[str, Any]) -> str:
    return (
        f"Slow step on rank {rank} (the anomaly trigger): step {a['step']} "
        f"took {a['duration_ms']:.1f} ms, "
        f"{_s(a['factor'], '{:.1f}')}x the median {a['median_ms']:.1f} ms ({a['action']})"
        + (f": {a['phase']}" if a.get("phase") else "")
    )


def _capture_line(rank: Any, c: dict[str, Any]) -> str:
    last = c["first_step"] + c["steps"] - 1
    return f"Capture on rank {rank} ({c['source']}): steps {c['first_step']}..{last}, {c['status']}" + (
        f": {c['file']}" if c["file"] else ""
    )


def _triggers_across(con: Any, doc: dict[str, Any], n_ranks: int) -> None:
    """What the triggers did on every rank, counted, with the worst few."""
    per = (doc.get("triggers") or {}).get("per_rank") or []
    if not per:
        return
    if not doc.get("anatomy"):
        slow = [(r["rank"], a) for r in per for a in r["anomalies"] if not a.get("said")]
        if slow:
            on = len({r for r, _ in slow})
            con.print(
                f"{len(slow):,} slow step(s) on {on:,} of {n_ranks:,} ranks (the anomaly trigger); "
                f"the {min(TOP_K, len(slow))} worst:"
            )
            slow.sort(key=lambda ra: (-float(ra[1]["factor"] or 0.0), int(ra[0])))
            for rank, a in slow[:TOP_K]:
                con.print("  " + _anomaly_line(rank, a))
    host = [r for r in per if r.get("contention") and r["contention"]["steps"]]
    if host:
        steps = sum(int(r["contention"]["steps"]) for r in host)
        waited = sum(float(r["contention"]["waited_ms"]) for r in host)
        most = top((r["rank"], r["contention"]["waited_ms"]) for r in host)
        con.print(
            f"Host contention on {len(host):,} of {n_ranks:,} ranks: {steps:,} slow step(s), {waited:,.0f} ms waiting "
            "for a CPU (another process had it), not the job's doing; the most: "
            + ", ".join(f"rank {r} {v:.0f} ms" for r, v in most)
        )
    caps = [(r["rank"], c) for r in per for c in r["captures"]]
    if caps:
        con.print(f"{len(caps):,} capture(s) on {len({r for r, _ in caps}):,} rank(s); the first {min(3, len(caps))}:")
        for rank, c in caps[:3]:
            con.print("  " + _capture_line(rank, c))
    dumps = [(r["rank"], d) for r in per for d in r["flight_dumps"]]
    if dumps:
        con.print(f"{len(dumps):,} flight dump(s) on ranks {named(sorted({r for r, _ in dumps}))}; the first:")
        rank, d = dumps[0]
        con.print(f"  rank {rank} ({d['reason']}, step {d['step']}): {d['file'] or d['error']}")


def _contention(con: Any, r: dict[str, Any]) -> None:
    """A rank's slow steps the host caused (fastprof.profiler.contention)."""
    c = r.get("contention")
    said = [a for a in r["anomalies"] if a.get("said")]
    if c and c["steps"]:
        con.print(
            f"Host contention on rank {r['rank']}: {c['steps']} slow step(s), {c['waited_ms']:.0f} ms waiting "
            "for a CPU (another process had it), not the job's doing"
        )
    for a in said[:10]:
        # Said when it is not the default (anomaly_on_contention captured it, say).
        done = "" if a["action"] == "recorded only (host contention)" else f" ({a['action']})"
        con.print(f"  {a['said']}{done}")
    if len(said) > 10:
        con.print(f"  ... {len(said) - 10} more in report.json")


def _anatomy(con: Any, section: dict[str, Any] | None) -> None:
    """Every step's phases (no torch window needed), and what made the
    slowest steps slow."""
    if not section:
        return
    t = Table(title="Step anatomy, every step (% of step time; p50 ms per step)")
    t.add_column("rank", justify="right")
    for p in section["phases"]:
        t.add_column(p, justify="right")
    for r in section["per_rank"]:
        ph = r["phases"]
        t.add_row(
            str(r["rank"]),
            *(f"{100 * ph[p]['share']:.1f}% ({ph[p]['p50_ns'] / 1e6:.2f})" for p in section["phases"]),
        )
    con.print(t)
    for r in section["per_rank"]:
        g = r.get("gpu")
        if g:
            ph = g["phases"]
            parts = ", ".join(
                f"{p} {ph[p]['p50_ns'] / 1e6:.2f} ms (host {ph[p]['host_p50_ns'] / 1e6:.2f})"
                for p in ("forward", "backward", "optimizer", "communication")
                if ph[p]["p50_ns"] or ph[p]["host_p50_ns"]
            )
            con.print(f"On the GPU, rank {r['rank']} ({g['timed_steps']} timed steps, p50): {parts}. {g['verdict']}.")
    pace = section.get("ranks_in_pace")
    for st in section.get("stragglers") or []:
        con.print(f"Straggler: {straggler_line(st, pace and pace['jitter_ns'])}.")
    if pace and not section.get("stragglers"):
        con.print(f"No straggler: {pace_line(pace)}.")
    for r in section["per_rank"]:
        said = overlap_line(r)
        if said:
            con.print(f"{said}. Rule: {section['overlap_rule']}.", markup=False)
    rule = section.get("slow_step_rule")
    if rule:
        con.print(f"Slow steps: {rule['text']}.", markup=False)
    for r in section["per_rank"]:
        for s in r["slow_steps"][:3]:
            con.print(slow_step_line(r["rank"], s), markup=False)


def _typical(doc: dict[str, Any]) -> dict[int, float]:
    """Each rank's median step (s), the figure the tables of many ranks
    pick their rows by: a rank slow at every step, not one with a few long
    steps."""
    return {int(r["rank"]): float(r["p50_s"]) for r in doc["ranks"]["per_rank"] if r.get("p50_s") is not None}


def _anatomy_across(con: Any, section: dict[str, Any] | None, n_ranks: int, typical: dict[int, float]) -> None:
    """The anatomy of many ranks: the rows of the ranks that stand for the
    rest (the slowest, the median, the fastest by median step), the GPU
    verdicts counted, every straggler named, the slow steps counted with the
    worst few."""
    if not section:
        return
    per = section["per_rank"]
    by_rank = {int(r["rank"]): r for r in per}
    picks = representatives((int(r["rank"]), typical.get(int(r["rank"]))) for r in per)
    t = Table(
        title=f"Step anatomy, every step (% of step time; p50 ms per step): {len(picks)} of {n_ranks:,} ranks "
        "by median step (every rank in report.json)"
    )
    t.add_column("which")
    t.add_column("rank", justify="right")
    t.add_column("median step", justify="right")
    t.add_column("mean step", justify="right")
    for p in section["phases"]:
        t.add_column(p, justify="right")
    for label, rank in picks:
        r = by_rank[rank]
        ph = r["phases"]
        t.add_row(
            label,
            str(rank),
            f"{typical[rank] * 1e3:.2f} ms",
            f"{int(r['step_total_ns']) / r['steps'] / 1e6:.2f} ms",
            *(f"{100 * ph[p]['share']:.1f}% ({ph[p]['p50_ns'] / 1e6:.2f})" for p in section["phases"]),
        )
    con.print(t)
    verdicts: dict[str, list[int]] = {}
    for r in per:
        if r.get("gpu"):
            verdicts.setdefault(str(r["gpu"]["verdict"]), []).append(int(r["rank"]))
    for verdict, ranks in sorted(verdicts.items(), key=lambda kv: -len(kv[1]))[:3]:
        con.print(f"On the GPU, {len(ranks):,} rank(s) ({named(ranks, 5)}): {verdict}.")
    pace = section.get("ranks_in_pace")
    stragglers = section.get("stragglers") or []
    for st in stragglers[:10]:
        con.print(f"Straggler: {straggler_line(st, pace and pace['jitter_ns'])}.")
    if len(stragglers) > 10:
        con.print(f"  ... {len(stragglers) - 10} more stragglers in report.json")
    if pace and not stragglers:
        con.print(f"No straggler: {pace_line(pace)}.")
    split = [r for r in per if overlap_line(r)]
    if split:
        con.print(f"{overlap_line(split[0])}. Rule: {section['overlap_rule']}.", markup=False)
        if len(split) > 1:
            con.print(
                f"  phases overlapped on {len(split) - 1:,} more rank(s): {named([r['rank'] for r in split[1:]])}"
            )
    rule = section.get("slow_step_rule")
    if rule:
        con.print(f"Slow steps: {rule['text']}.", markup=False)
    slow = [(int(r["rank"]), s) for r in per for s in r["slow_steps"]]
    counted = sum(int(r.get("slow_step_count", len(r["slow_steps"]))) for r in per)
    if counted:
        on = sum(1 for r in per if r.get("slow_step_count", len(r["slow_steps"])))
        slow.sort(key=lambda rs: (-rs[1]["dur_ns"] / max(float(rs[1]["median_step_ns"]), 1.0), rs[0]))
        con.print(
            f"{counted:,} slow step(s) on {on:,} of {n_ranks:,} ranks; the {min(TOP_K, len(slow))} worst "
            "(against the median of the steps before each):",
            markup=False,
        )
        for rank, s in slow[:TOP_K]:
            con.print("  " + slow_step_line(rank, s), markup=False)


_ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")


def _breakdown_table(section: dict[str, Any], wide: bool = False) -> Table:
    """Per rank: the share of step time in each role (the TensorBoard
    plugin's priorities), summed over the steps the breakdown covers; with
    many ranks, the ranks that stand for the rest (slowest, median, fastest
    by median step)."""
    title = f"Step-time breakdown (% of step time in {section.get('steps_from') or section['source']})"
    rows = section["per_rank"]
    labels: dict[int, str] = {}
    if wide:
        picks = representatives((int(r["rank"]), float(r.get("step_p50_ns") or r["step_mean_ns"])) for r in rows)
        by_rank = {int(r["rank"]): r for r in rows}
        labels = {rank: label for label, rank in picks}
        rows = [by_rank[rank] for _, rank in picks]
        title += f": {len(rows)} of {len(section['per_rank']):,} ranks by median step (every rank in report.json)"
    t = Table(title=title)
    for col in (*(("which",) if wide else ()), "rank", "steps", "mean step", *_ROLES, "GPU util"):
        t.add_column(col.replace("_", " "), justify="left" if col == "which" else "right")
    for r in rows:
        total = float(r["duration_ns"]) or 1.0
        util = r.get("gpu_util")
        t.add_row(
            *((labels[int(r["rank"])],) if wide else ()),
            str(r["rank"]),
            str(r["steps"]),
            f"{float(r['step_mean_ns']) / 1e9:.4f} s",
            *(f"{100 * float(r[role + '_ns']) / total:.1f}" for role in _ROLES),
            f"{100 * float(util):.0f}%" if util is not None else "no GPU",
        )
    return t
