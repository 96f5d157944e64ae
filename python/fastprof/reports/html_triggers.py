"""report.html's Triggers section and its marks on the step-time plot: what
the job's triggers did (the report's ``triggers`` section, see
:mod:`fastprof.reports.triggers`), as report.json and the terminal list it.

Each capture links to its torch.profiler trace and each flight dump to its
file, by a link relative to the folder the page is written to (the page
opens from a file, beside the run or copied with it), and only where the
file is there: a file rotated away, or never written, is named, not linked.
On the step-time plot a capture shades its steps, a slow step the anomaly
detector flagged is a marker on its step (an open circle when the host
caused it), a flight dump a dotted line.

Above :data:`~fastprof.reports.many.MANY_RANKS` ranks the per-rank notes are
counted (the first few named), the slow steps' table lists the worst first,
and the plot marks at most :data:`MAX_MARKS` slow steps, the longest. The
page then embeds a bounded view of report.json
(:func:`fastprof.reports.html_embed.embedded`), and the section says so and
links report.json, which keeps every list."""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from fastprof.reports.html_embed import EMBED_TOP, bounded, where, worst_first
from fastprof.reports.many import MANY_RANKS, TOP_K, many, named
from fastprof.reports.triggers import CONTENTION

#: At most this many rows per table (the job keeps at most 200 of each per rank).
MAX_ROWS = 200
#: Captures named in the step-time plot's note (the rest only shaded).
MAX_LISTED = 20
#: Rows per table at most above MANY_RANKS ranks.
MAX_ROWS_MANY = 50
#: Slow-step markers on the step-time plot at most (the longest steps kept).
MAX_MARKS = 500
CAPTURE_COLOUR = "#d4a72c"
SLOW_COLOUR = "#c0392b"
DUMP_COLOUR = "#57606a"
_RANK_PART = re.compile(r"^rank\d+$")
#: A table's row (cells of HTML) from a rank (escaped) and its record.
_Row = Callable[[str, dict[str, Any]], list[str]]


def _esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _tail(path: Path) -> Path | None:
    """The ``rank{R}/...`` end of a path the job recorded (None without one)."""
    parts = path.parts
    for i in range(len(parts) - 1, -1, -1):
        if _RANK_PART.match(parts[i]):
            return Path(*parts[i:])
    return None


def locate(path: Any, run_dir: Path | None) -> Path | None:
    """The file a trigger wrote, as this report's run holds it: the same
    ``rank{R}/...`` under ``run_dir`` (the job recorded absolute paths; the
    run may have been moved or copied since, and a copy's report links the
    copy's files, never another run's); the recorded path without a run
    directory. None when it is not a file."""
    if not path:
        return None
    p = Path(str(path))
    tail = _tail(p)
    if run_dir is not None and tail is not None:
        p = run_dir / tail
    return p if p.is_file() else None


def _link(path: Any, run_dir: Path | None, link_from: Path | None) -> str:
    """An ``<a>`` to the file, relative to ``link_from``, shown by its path
    in the run; its name alone, and that it is missing, when it cannot be
    linked."""
    if not path:
        return "-"
    found = locate(path, run_dir)
    tail = _tail(Path(str(path)))
    shown = str(tail if run_dir is not None and tail is not None else path)
    if found is None:
        return f"{_esc(shown)} (not there now)"
    if link_from is None:
        return _esc(shown)
    href = Path(os.path.relpath(found.resolve(), link_from.resolve())).as_posix()
    return f'<a href="{_esc(href)}">{_esc(shown)}</a>'


def _table(header: list[str], rows: list[list[str]], cls: str) -> str:
    """A table whose cells are HTML already (escaped by the caller)."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _note(text: str) -> str:
    return f'<p class="note">{_esc(text)}</p>'


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None else _esc(fmt.format(v))


def section(
    doc: dict[str, Any], run_dir: Path | None, link_from: Path | None, json_href: str | None = None
) -> list[str]:
    """The page's ``<section id="triggers">``, in pieces; ``json_href``: the
    link to report.json beside the page (None: not written with it), which
    the section names when the page embeds a bounded view (``html_embed.embedded``)."""
    out = ['<section id="triggers"><h2>Triggers</h2>']
    per_rank = (doc.get("triggers") or {}).get("per_rank") or []
    if not per_rank:
        out.append(_note("No triggers: the job ran without them (Profiler(triggers=None)), or wrote no record."))
        out.append("</section>")
        return out
    if bounded(doc):
        out.append(_bounded_note(doc, json_href))
    # Each table's records and their ranks (escaped); only the rows a table
    # shows are made (above MANY_RANKS a run may list hundreds of thousands
    # of slow steps, its table the worst 50).
    captures: list[dict[str, Any]] = []
    dumps: list[dict[str, Any]] = []
    slow: list[dict[str, Any]] = []
    of: dict[str, list[str]] = {"captures": [], "flight-dumps": [], "slow-steps": []}
    wide = many(len(per_rank))
    if wide:
        out.extend(_notes_across(per_rank))
    for r in per_rank:
        rank = _esc(r["rank"])
        for kept, records, ranks in (
            (captures, r["captures"], of["captures"]),
            (dumps, r["flight_dumps"], of["flight-dumps"]),
            (slow, r["anomalies"], of["slow-steps"]),
        ):
            kept.extend(records)
            ranks.extend([rank] * len(records))
        if wide:
            continue
        said = [f"rank {r['rank']}: signal {r['signal'] or 'none'}", f"{r['requests']} request(s)"]
        con = r.get("contention")
        if con:
            said.append(
                f"{con['steps']} slow step(s) the host caused ({con['waited_ms']:.0f} ms waiting for a CPU), "
                "not captured"
            )
        if r["coalesced"]:
            said.append(f"{r['coalesced']} coalesced into another capture")
        out.append(_note("; ".join(said) + "."))
        out.extend(_note(f"rank {r['rank']}: {n}") for n in r["notes"])
        out.extend(_note(f"rank {r['rank']}, {a['said']}") for a in r["anomalies"][:MAX_ROWS] if a.get("said"))
        if con and con.get("error"):
            out.append(_note(f"rank {r['rank']}: {con['error']}"))
    limit = MAX_ROWS_MANY if wide else MAX_ROWS
    listed = {"captures": len(captures), "flight-dumps": len(dumps), "slow-steps": len(slow)}
    if wide:  # the worst first: the ones the table shows
        order = worst_first(per_rank, limit)
        slow, of["slow-steps"] = [slow[i] for i in order], [of["slow-steps"][i] for i in order]
    tables: list[tuple[str, list[str], list[dict[str, Any]], _Row, str, str]] = [
        (
            "Captures",
            ["rank", "source", "steps", "status", "torch.profiler trace"],
            captures,
            lambda rank, c: _capture_row(rank, c, run_dir, link_from),
            "captures",
            "No capture.",
        ),
        (
            "Flight dumps",
            ["rank", "reason", "step", "file"],
            dumps,
            lambda rank, d: _dump_row(rank, d, run_dir, link_from),
            "flight-dumps",
            "No flight dump.",
        ),
        (
            "Slow steps (one rule: over anomaly_factor, 3 by default, times the recent steps' median)",
            ["rank", "step", "took ms", "median ms", "factor", "cause (wait for a CPU)", "what was done"],
            slow,
            _slow_row,
            "slow-steps",
            "No slow step flagged.",
        ),
    ]
    for title, header, entries, row, cls, none in tables:
        out.append(f"<h3>{_esc(title)}</h3>")
        if not entries:
            out.append(_note(none))
            continue
        shown = zip(of[cls][:limit], entries[:limit], strict=True)
        out.append(_table(header, [row(rank, e) for rank, e in shown], cls))
        if listed[cls] > limit:
            worst = "; the table lists the worst first" if wide and cls == "slow-steps" else ""
            out.append(_note(f"{listed[cls] - limit:,} more in report.json{worst}."))
    out.append(
        _note(
            "Each capture is on the step-time plot (shaded), each slow step a marker on it, each flight dump a "
            "dotted line. Links are relative to this page's folder."
        )
    )
    out.append("</section>")
    return out


def _capture_row(rank: str, c: dict[str, Any], run_dir: Path | None, link_from: Path | None) -> list[str]:
    last = int(c["first_step"]) + max(int(c["steps"]), 1) - 1
    file = _link(c["file"], run_dir, link_from) if c["file"] else _esc(c["error"] or "-")
    late = int(c["late_by_steps"])
    return [
        rank,
        _esc(c["source"]),
        f"{int(c['first_step'])}..{last}",
        _esc(c["status"]) + (f" ({late} steps late)" if late else ""),
        file,
    ]


def _dump_row(rank: str, d: dict[str, Any], run_dir: Path | None, link_from: Path | None) -> list[str]:
    file = _link(d["file"], run_dir, link_from) if d["file"] else _esc(d["error"] or "-")
    return [rank, _esc(d["reason"]), _esc(d["step"]), file]


def _slow_row(rank: str, a: dict[str, Any]) -> list[str]:
    return [
        rank,
        _esc(a["step"]),
        _num(a["duration_ms"], "{:.1f}"),
        _num(a["median_ms"], "{:.1f}"),
        _num(a["factor"], "{:.1f}x"),
        _cause(a),
        _esc(a["action"]),
    ]


def _bounded_note(doc: dict[str, Any], json_href: str | None) -> str:
    """What the page embeds of the triggers, and where every list is."""
    per_rank = doc["triggers"]["per_rank"]
    n = sum(len(r["anomalies"]) for r in per_rank)
    return (
        f'<p class="note" id="triggers-bounded">{len(doc["source"]["ranks"]):,} ranks (more than {MANY_RANKS}): '
        f"the report embedded in this page holds each rank's triggers counted ({n:,} slow step(s) on "
        f"{sum(1 for r in per_rank if r['anomalies']):,} rank(s), counted by cause, and each rank's worst), the "
        f"{EMBED_TOP} worst slow steps and the first {EMBED_TOP} captures, flight dumps and notes of the run. "
        f"Every list, every rank's, is in {where(json_href)}.</p>"
    )


def _notes_across(per_rank: list[dict[str, Any]]) -> list[str]:
    """What the per-rank notes say, for many ranks: counted, a few named."""
    out: list[str] = []
    signals: dict[str, list[int]] = {}
    for r in per_rank:
        signals.setdefault(str(r["signal"] or "none"), []).append(int(r["rank"]))
    out.append(
        _note(
            f"{len(per_rank):,} ranks; signal "
            + "; ".join(f"{sig} on {len(rs):,}" for sig, rs in sorted(signals.items(), key=lambda kv: -len(kv[1])))
            + f"; {sum(int(r['requests']) for r in per_rank):,} request(s)"
            + f"; {sum(int(r['coalesced']) for r in per_rank):,} coalesced into another capture."
        )
    )
    host = [r for r in per_rank if r.get("contention") and r["contention"]["steps"]]
    if host:
        steps = sum(int(r["contention"]["steps"]) for r in host)
        waited = sum(float(r["contention"]["waited_ms"]) for r in host)
        out.append(
            _note(
                f"{steps:,} slow step(s) on {len(host):,} rank(s) the host caused ({waited:,.0f} ms waiting for a "
                f"CPU), not captured; ranks {named([int(r['rank']) for r in host])}."
            )
        )
    notes = [(int(r["rank"]), str(n)) for r in per_rank for n in r["notes"]]
    errors = [(int(r["rank"]), str(r["contention"]["error"])) for r in host if r["contention"].get("error")]
    for rank, n in (notes + errors)[:TOP_K]:
        out.append(_note(f"rank {rank}: {n}"))
    if len(notes) + len(errors) > TOP_K:
        out.append(_note(f"{len(notes) + len(errors) - TOP_K:,} more note(s) in report.json."))
    return out


def _cause(a: dict[str, Any]) -> str:
    """Who slowed the step, and how long it waited for a CPU."""
    cause = a.get("cause")
    if cause is None:
        return "-"
    waited = a.get("waited_ms")
    return _esc(cause) + ("" if waited is None else f" ({_num(waited, '{:.1f}')} ms)")


def mark(fig: go.Figure, doc: dict[str, Any], ranks: list[int]) -> str | None:
    """Mark the plotted ranks' captures, slow steps and flight dumps on the
    step-time plot ``fig`` (x: step); returns the note saying what is marked,
    None when nothing is."""
    plotted = set(ranks)
    per_rank = [r for r in (doc.get("triggers") or {}).get("per_rank") or [] if int(r["rank"]) in plotted]
    shaded: set[tuple[int, int]] = set()
    lines: set[int] = set()
    # The slow steps' durations, records and ranks; their steps and hover
    # texts are made for the marks drawn only (above MANY_RANKS the longest
    # MAX_MARKS of maybe 200,000).
    ys: list[float] = []
    slow: list[dict[str, Any]] = []
    of: list[Any] = []
    hy: list[float] = []  # the slow steps the host caused
    hslow: list[dict[str, Any]] = []
    hof: list[Any] = []
    for r in per_rank:
        for c in r["captures"][:MAX_ROWS]:
            first, n = int(c["first_step"]), max(int(c["steps"]), 1)
            if (first, n) not in shaded:
                shaded.add((first, n))
                fig.add_vrect(x0=first - 0.5, x1=first + n - 0.5, fillcolor=CAPTURE_COLOUR, opacity=0.25, line_width=0)
        for d in r["flight_dumps"][:MAX_ROWS]:
            step = int(d["step"])
            if step not in lines:
                lines.add(step)
                fig.add_vline(x=step, line_dash="dot", line_color=DUMP_COLOUR)
        for a in r["anomalies"][:MAX_ROWS]:
            host = a.get("cause") == CONTENTION
            (hy if host else ys).append(float(a["duration_ms"]))
            (hslow if host else slow).append(a)
            (hof if host else of).append(r["rank"])
    n_slow, n_host = len(ys), len(hy)
    if many(len(ranks)):
        hx, hy, htext = _marks(hy, hslow, hof, MAX_MARKS)
        xs, ys, text = _marks(ys, slow, of, MAX_MARKS - len(hx))
    else:
        hx, hy, htext = _marks(hy, hslow, hof, None)
        xs, ys, text = _marks(ys, slow, of, None)
    if hx:
        fig.add_trace(
            go.Scatter(
                x=hx,
                y=hy,
                mode="markers",
                name="slow step (host contention)",
                marker={"symbol": "circle-open", "size": 11, "color": SLOW_COLOUR},
                text=htext,
            )
        )
    if xs:
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name="slow step (anomaly trigger)",
                marker={"symbol": "x", "size": 11, "color": SLOW_COLOUR},
                text=text,
            )
        )
    said = []
    if shaded:
        spans = [_span(f, n) for f, n in sorted(shaded)]
        listed = ", ".join(spans[:MAX_LISTED]) + (", ..." if len(spans) > MAX_LISTED else "")
        said.append(f"shaded: {len(shaded)} capture(s) (steps {listed})")
    if xs:
        said.append(f"x: {len(xs)} slow step(s) the anomaly trigger flagged" + _of(n_slow, len(xs)))
    if hx:
        said.append(f"o: {len(hx)} slow step(s) the host caused (waiting for a CPU)" + _of(n_host, len(hx)))
    if lines:
        said.append(f"dotted: {len(lines)} flight dump(s)")
    return ("Triggers on this plot: " + "; ".join(said) + " (see Triggers below).") if said else None


def _of(n: int, drawn: int) -> str:
    return f" (the {drawn:,} longest of {n:,})" if n > drawn else ""


def _marks(
    y: list[float], slow: list[dict[str, Any]], of: list[Any], k: int | None
) -> tuple[list[int], list[float], list[str]]:
    """The marks of slow steps (durations ``y``, records ``slow`` of ranks
    ``of``): steps, durations and hover texts; with ``k``, of the ``k``
    longest only (all when they fit), in their order."""
    keep: Any = range(len(y))
    if k is not None and len(y) > k:
        keep = sorted(sorted(keep, key=lambda i: -y[i])[: max(k, 0)])
    return (
        [int(slow[i]["step"]) for i in keep],
        [y[i] for i in keep],
        [f"rank {of[i]}: {slow[i].get('said') or slow[i]['action']}" for i in keep],
    )


def _span(first: int, n: int) -> str:
    return f"{first}-{first + n - 1}" if n > 1 else str(first)
