"""The counters report.html plots over time (system, process, DataLoader
workers, GPU), one place for the page (``html._counters``) and for each
rank's summary, which keeps these series for the page of a run of many
ranks (``summaries.page_counters``, issue #38)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["COUNTER_PLOTS", "plotted"]

#: (title, unit, counters): ``gpu*`` stands for each GPU (``gpu0``...), and
#: ``proc.cpu [%]`` for ``proc.cpu_user [%]`` + ``proc.cpu_system [%]``.
COUNTER_PLOTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Host CPU", "%", ("sys.cpu [%]", "proc.cpu [%]", "children.cpu [%]")),
    ("Memory", "bytes", ("proc.rss [B]", "children.rss [B]")),
    ("GPU utilisation", "%", ("gpu*.util [%]",)),
    ("GPU memory used", "bytes", ("gpu*.mem_used [B]",)),
    ("GPU power", "W", ("gpu*.power [W]",)),
)
#: What ``proc.cpu [%]`` is the sum of (sampled on the same ticks).
PROC_CPU = ("proc.cpu_user [%]", "proc.cpu_system [%]")


def gpus(present: Iterable[str]) -> list[str]:
    """The GPUs (``gpu0``...) with a utilisation counter among ``present``."""
    return sorted({n.split(".", 1)[0] for n in present if n.startswith("gpu") and n.endswith(".util [%]")})


def plotted(present: Iterable[str]) -> list[str]:
    """The stored counters, among ``present``, that the plots read."""
    have = set(present)
    out: list[str] = []
    for _title, _unit, wanted in COUNTER_PLOTS:
        for w in wanted:
            names = [w.replace("gpu*", g) for g in gpus(have)] if w.startswith("gpu*") else [w]
            for n in names:
                out.extend(x for x in (PROC_CPU if n == "proc.cpu [%]" else (n,)) if x in have and x not in out)
    return out
