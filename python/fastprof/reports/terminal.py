"""Terminal tables (rich) of a report document: the key numbers in seconds."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from fastprof.readers.merge import describe_rotated
from fastprof.reports.anatomy import overlap_line, slow_step_line
from fastprof.reports.data import HOST_COLUMNS, host_rows, human_bytes
from fastprof.reports.resumed import describe as describe_resumed
from fastprof.reports.speed import trend_note, trend_text
from fastprof.reports.stragglers import pace_line, straggler_line


def _s(v: Any, fmt: str = "{:.4f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(doc: dict[str, Any], verbose: bool = False, file: Any = None, title: str = "fastprof report") -> None:
    con = Console(file=file, width=140, highlight=False)
    src = doc["source"]
    con.print(f"[bold]{title}[/bold] {src['path']}  ranks {src['ranks']}  wall {doc['wall']['duration_s']:.3f} s")
    for e in src.get("rotated") or []:
        con.print(f"[yellow]rotated away:[/yellow] {describe_rotated(e, 'the report wall time')}", markup=True)
    for e in src.get("resumed") or []:
        con.print(f"[yellow]resumed:[/yellow] {describe_resumed(e)}", markup=True)

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
    for r in sp["train"]["per_rank"]:
        if r["loader_share_pct"] is not None:
            t.add_row(f"rank {r['rank']}: DataLoader share of step", _s(r["loader_share_pct"], "{:.1f}%"))
    for r in sp["loaders"]:
        t.add_row(f"rank {r['rank']} loader {r['loader']}: wait per batch (s)", _s(r["wait_per_batch_s"], "{:.5f}"))
    for r in sp["validation"]:
        t.add_row(f"rank {r['rank']} {r['loader']}: iterations/s", _s(r["iterations_per_s"], "{:.2f}"))
    con.print(t)
    con.print(trend_note(sp), markup=False)

    sysr = doc["system"]
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
    spread = doc["ranks"]["spread"]
    if spread:
        slowest = (
            "no rank slowest more often than chance (ties are no one's)"
            if spread["most_often_slowest_rank"] is None
            else f"rank {spread['most_often_slowest_rank']} clearly slowest in "
            f"{spread['slowest_share_pct']:.0f}% of steps"
        )
        con.print(f"Ranks: step spread p50 {spread['p50_s']:.4f} s, max {spread['max_s']:.4f} s; {slowest}")
    if doc["breakdown"] is None:
        con.print(f"Step-time breakdown: {doc['breakdown_reason']}")
    else:
        con.print(_breakdown_table(doc["breakdown"]))
    for h in doc.get("hangs") or []:
        # One paragraph per stall the ranks reported (reports/hangs.py).
        con.print(f"Hang: {h['text']}", markup=False)
    _anatomy(con, doc.get("anatomy"))
    mem = doc.get("memory")
    if mem:
        for o in mem.get("oom") or []:
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
        for r in mem.get("per_rank") or []:
            g = r["growth_b_per_step"]
            # Growth that ended has no rate worth quoting: its verdict says how much, and until when.
            rate = "" if r.get("ended_at_step") is not None else f", growth {_s(g and g / 2**20, '{:+.3f}')} MiB/step"
            con.print(
                f"Memory, rank {r['rank']} ({r['series']}): peak {_s(r['peak_b'] and r['peak_b'] / 2**20, '{:.1f}')} "
                f"MiB{rate}: {r['verdict']}" + (f" from step {r['began_at_step']}" if r["leak"] else "")
            )
    for r in (doc.get("triggers") or {}).get("per_rank") or []:
        # With an anatomy its slow steps say what the trigger did with each (one list, one rule).
        for a in [] if doc.get("anatomy") else r["anomalies"]:
            if a.get("said"):
                continue  # the host slowed it: said below
            con.print(
                f"Slow step on rank {r['rank']} (the anomaly trigger): step {a['step']} "
                f"took {a['duration_ms']:.1f} ms, "
                f"{_s(a['factor'], '{:.1f}')}x the median {a['median_ms']:.1f} ms ({a['action']})"
                + (f": {a['phase']}" if a.get("phase") else "")
            )
        _contention(con, r)
        for c in r["captures"]:
            last = c["first_step"] + c["steps"] - 1
            con.print(
                f"Capture on rank {r['rank']} ({c['source']}): steps {c['first_step']}..{last}, {c['status']}"
                + (f": {c['file']}" if c["file"] else "")
            )
        for d in r["flight_dumps"]:
            con.print(f"Flight dump on rank {r['rank']} ({d['reason']}, step {d['step']}): {d['file'] or d['error']}")
    recs = doc["recommendations"]["items"]
    con.print("[bold]Recommendations[/bold]" if recs else "Recommendations: none fired")
    for r in recs:
        con.print(f"  - {r['message']}")


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


_ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")


def _breakdown_table(section: dict[str, Any]) -> Table:
    """Per rank: the share of step time in each role (the TensorBoard
    plugin's priorities), summed over the steps the breakdown covers."""
    t = Table(title=f"Step-time breakdown (% of step time in {section.get('steps_from') or section['source']})")
    for col in ("rank", "steps", "mean step", *_ROLES, "GPU util"):
        t.add_column(col.replace("_", " "), justify="right")
    for r in section["per_rank"]:
        total = float(r["duration_ns"]) or 1.0
        util = r.get("gpu_util")
        t.add_row(
            str(r["rank"]),
            str(r["steps"]),
            f"{float(r['step_mean_ns']) / 1e9:.4f} s",
            *(f"{100 * float(r[role + '_ns']) / total:.1f}" for role in _ROLES),
            f"{100 * float(util):.0f}%" if util is not None else "no GPU",
        )
    return t
