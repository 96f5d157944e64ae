"""What report.html embeds of report.json (``<script type="application/json"
id="fastprof-report">``).

Up to :data:`~fastprof.reports.many.MANY_RANKS` ranks the page embeds the
whole report document. Above, it embeds a view of it whose per-rank lists of
events are bounded whatever the job recorded, so the page's size follows the
ranks, not what the triggers saw: each rank keeps at most 200 of each
trigger list, ~50 KB of slow steps a rank beside a CPU hog, which made the
triggers 54 MB of a 1,024-rank report.json and of its 64 MB page. The view
keeps:

- ``triggers``: per rank its signal, requests, coalesced captures, the
  host's contention (steps, wait, error), how many of each list it has
  (``counts``), its slow steps counted by cause (``anomalies_by_cause``) and
  its worst (``worst_anomaly``: step, times, factor, cause); of the whole
  run the :data:`EMBED_TOP` worst slow steps (``worst_anomalies``, in the
  order of the page's table: the largest factor first, then by rank and the
  rank's order), the first EMBED_TOP captures, flight dumps and notes, each
  with its rank, the totals (``counts``) and the contention rules named;
- ``anatomy``: each rank's :data:`EMBED_PER_RANK` slowest steps (report.json
  keeps up to 10 a rank; ``slow_step_count`` counts them all);
- ``page_view``: what is bounded, and that report.json holds it all.

Every other section is the document's own. The page itself is drawn from
the whole document (its tables and marks), only the embedded copy is
bounded; report.json beside the page keeps every list.
"""

from __future__ import annotations

import collections
import heapq
import html
from typing import Any

from fastprof.recording.names import REPORT_JSON
from fastprof.reports.many import MANY_RANKS, TOP_K, many

#: The run's worst slow steps, first captures, flight dumps and notes the view keeps.
EMBED_TOP = 50
#: Each rank's slowest steps of the anatomy the view keeps.
EMBED_PER_RANK = 1
_LISTS = ("anomalies", "captures", "flight_dumps", "notes")
_WORST = ("step", "duration_ms", "median_ms", "factor", "cause", "waited_ms")


def bounded(doc: dict[str, Any]) -> bool:
    """True when the page embeds a bounded view: more than MANY_RANKS ranks."""
    return many(len(doc["source"]["ranks"]))


def worst_first(per_rank: list[dict[str, Any]], k: int | None = None) -> list[int]:
    """The order of the page's slow-step table above MANY_RANKS ranks: the
    largest factor first, then by rank, then the rank's own order; as
    indices into the run's slow steps listed record by record of
    ``per_rank`` (the triggers' records, one a rank); with ``k``, the first
    ``k`` of them. Two stable orderings of indices, no key tuple a slow step:
    200,000 of them (1,024 ranks beside a CPU hog) made the cyclic collector
    walk the whole report again."""
    factor = [-float(a["factor"] or 0.0) for r in per_rank for a in r["anomalies"]]
    rank = [int(r["rank"]) for r in per_rank for _a in r["anomalies"]]
    by_rank = sorted(range(len(factor)), key=rank.__getitem__)
    if k is not None:
        return heapq.nsmallest(k, by_rank, key=factor.__getitem__)  # stable, as sorted()[:k]
    by_rank.sort(key=factor.__getitem__)
    return by_rank


def _triggers(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    ranks: list[dict[str, Any]] = []
    rules: list[str] = []
    for r in per_rank:
        rank = int(r["rank"])
        an = r["anomalies"]
        causes = collections.Counter(a.get("cause") for a in an)
        factor = [-float(a["factor"] or 0.0) for a in an]
        worst = an[min(range(len(an)), key=factor.__getitem__)] if an else None  # the first largest
        con = r.get("contention")
        if con and con.get("rule") and con["rule"] not in rules and len(rules) < TOP_K:
            rules.append(str(con["rule"]))
        ranks.append(
            {
                "rank": rank,
                "signal": r["signal"],
                "requests": r["requests"],
                "coalesced": r["coalesced"],
                "contention": None if not con else {k: con.get(k) for k in ("steps", "waited_ms", "error")},
                "counts": {k: len(r[k]) for k in _LISTS},
                "anomalies_by_cause": [
                    {"cause": c, "count": n} for c, n in sorted(causes.items(), key=lambda cn: (-cn[1], str(cn[0])))
                ],
                "worst_anomaly": None if worst is None else {k: worst.get(k) for k in _WORST},
            }
        )
    slow = [a for r in per_rank for a in r["anomalies"]]
    of = [int(r["rank"]) for r in per_rank for _a in r["anomalies"]]
    worst_all = [(of[i], slow[i]) for i in worst_first(per_rank, EMBED_TOP)]

    def first(key: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        for r in per_rank:
            rank = int(r["rank"])
            for item in r[key][: EMBED_TOP - len(got)]:
                got.append({"rank": rank, **item} if isinstance(item, dict) else {"rank": rank, "note": item})
        return got

    return {
        "per_rank": ranks,
        "counts": {k: sum(r["counts"][k] for r in ranks) for k in _LISTS},
        "contention_rules": rules,
        "worst_anomalies": [{"rank": rank, **a} for rank, a in worst_all],
        "captures": first("captures"),
        "flight_dumps": first("flight_dumps"),
        "notes": first("notes"),
    }


def embedded(doc: dict[str, Any]) -> dict[str, Any]:
    """The report document as report.html embeds it (see the module's
    docstring): ``doc`` itself up to MANY_RANKS ranks, else a bounded view
    (a shallow copy; ``doc`` is not changed)."""
    if not bounded(doc):
        return doc
    view = dict(doc)
    cut: list[str] = []
    per_rank = (doc.get("triggers") or {}).get("per_rank")
    if per_rank:
        view["triggers"] = _triggers(per_rank)
        cut.append("triggers")
    an = doc.get("anatomy")
    if an and an.get("per_rank"):
        view["anatomy"] = {
            **an,
            "per_rank": [
                {**r, "slow_steps": r["slow_steps"][:EMBED_PER_RANK]} if r.get("slow_steps") else r
                for r in an["per_rank"]
            ],
        }
        cut.append("anatomy")
    view["page_view"] = {
        "bounded": cut,
        "full": REPORT_JSON,
        "rule": (
            f"above {MANY_RANKS} ranks the page embeds each rank's triggers counted (slow steps by cause, its "
            f"worst), the run's {EMBED_TOP} worst slow steps and first {EMBED_TOP} captures, flight dumps and "
            f"notes, and each rank's {EMBED_PER_RANK} slowest step(s) of the anatomy; report.json holds every list"
        ),
    }
    return view


def where(json_href: str | None) -> str:
    """report.json, linked when it is written beside the page (HTML)."""
    if json_href:
        return f'<a href="{html.escape(json_href, quote=True)}">report.json</a>'
    return "report.json (not written with this page: ask for the json format too)"


def note(doc: dict[str, Any], json_href: str | None) -> str:
    """The page's note on what it embeds above MANY_RANKS ranks (HTML)."""
    return (
        f'<p class="note" id="embedded-view">The report embedded in this page (<code>#fastprof-report</code>) is '
        f"report.json with its per-rank lists bounded ({len(doc['source']['ranks']):,} ranks, more than "
        f"{MANY_RANKS}): each rank's triggers counted by cause with its worst slow step, the run's {EMBED_TOP} worst "
        f"slow steps and first {EMBED_TOP} captures, flight dumps and notes, each rank's {EMBED_PER_RANK} slowest "
        f"step(s) of the anatomy (<code>page_view</code> says so). Every list is in {where(json_href)}.</p>"
    )
