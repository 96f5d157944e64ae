"""Numbers a report cannot take at face value: counter samples that are not
finite (a recording call accepts NaN and ±inf and the trace writes them as
``"NaN"``, ``"Infinity"``, ``"-Infinity"``) and figures that overflow on the
way (a ``batch_size`` counter of 1e308 times 100 it/s).

A report keeps such values (a mean over an infinite sample is infinite; hiding
it would be a lie), names each one in ``source.warnings`` (printed by
``fastprof report``), and its files write them as the trace does: strict JSON
has no literal for them, and a CSV or the HTML page should read the same.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from fastprof.readers.columns import Columns

#: How the trace writer spells non-finite numbers, and the report files too.
NAN, INF, NEG_INF = "NaN", "Infinity", "-Infinity"
#: Paths listed in one warning line before "and N more".
_LISTED = 8
_NESTED = (dict, list, tuple)


def text(v: float) -> str:
    """The trace's spelling of a non-finite float."""
    return NAN if math.isnan(v) else INF if v > 0 else NEG_INF


def number(v: Any) -> Any:
    """A report value read back from a file: the trace's spellings of
    non-finite numbers as floats, anything else as it is."""
    if isinstance(v, str) and v in (NAN, INF, NEG_INF):
        return float(v.replace("Infinity", "inf"))
    return v


def encode(doc: Any) -> Any:
    """``doc`` with every non-finite float spelt as the trace spells it (a
    copy; strict JSON, ``json.dumps(..., allow_nan=False)`` takes it)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return text(doc)
    if isinstance(doc, dict):
        return {k: encode(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [encode(v) for v in doc]
    return doc


def spelt(doc: Any) -> Any:
    """``doc`` itself when it holds no non-finite float (as Python's C
    encoder finds, ~10x quicker than :func:`encode`'s copy), else
    :func:`encode`'s copy. A 1,024-rank report's tables and page data
    were copied whole for none (0.2-0.4 s each)."""
    try:
        json.dumps(doc, allow_nan=False)
    except (ValueError, TypeError):  # a non-finite float, or a type json does not write
        return encode(doc)
    return doc


def paths(doc: Any, at: str = "") -> list[str]:
    """JSON paths (``speed.train.samples_per_s``, ``system.host[0].rss_peak_b``)
    of the non-finite floats in ``doc``, in document order."""
    if isinstance(doc, float):
        return [] if math.isfinite(doc) else [at or "$"]
    # A child is looked into only where it is a container or a non-finite
    # float: the rest, most of a report, is passed without a call or a path.
    if isinstance(doc, dict):
        return [
            p
            for k, v in doc.items()
            if isinstance(v, _NESTED) or (isinstance(v, float) and not math.isfinite(v))
            for p in paths(v, f"{at}.{k}" if at else str(k))
        ]
    if isinstance(doc, (list, tuple)):
        return [
            p
            for i, v in enumerate(doc)
            if isinstance(v, _NESTED) or (isinstance(v, float) and not math.isfinite(v))
            for p in paths(v, f"{at}[{i}]")
        ]
    return []


def report_warning(doc: dict[str, Any]) -> str | None:
    """One line naming the report figures that are not finite, or None."""
    found = paths(doc)
    if not found:
        return None
    shown = ", ".join(found[:_LISTED]) + (f" and {len(found) - _LISTED} more" if len(found) > _LISTED else "")
    return (
        f"{len(found)} report figure(s) are not finite numbers (a non-finite or overflowing input; "
        f'written as "{INF}", "{NEG_INF}" or "{NAN}" as the trace writes them): {shown}'
    )


def counter_warnings(cols: Columns) -> list[str]:
    """One line per (file, counter name) holding non-finite samples: how many
    of each kind. Read before the report drops the ``file`` column."""
    c = cols.counters
    v = c["value"]
    bad = ~np.isfinite(v)
    if not bad.any():
        return []
    name, series, file, val = c["name"][bad], c["series"][bad], c["file"][bad], v[bad]
    out = []
    for f, n, s in sorted({(int(f), int(n), int(s)) for f, n, s in zip(file, name, series, strict=True)}):
        sel = val[(file == f) & (name == n) & (series == s)]
        kinds = [
            (int(np.isnan(sel).sum()), NAN),
            (int(np.isposinf(sel).sum()), INF),
            (int(np.isneginf(sel).sum()), NEG_INF),
        ]
        said = ", ".join(f"{k} {t}" for k, t in kinds if k)
        path = cols.files[f]["path"] if 0 <= f < len(cols.files) else "?"
        key = "" if cols.names[s] == "value" else f" (args key {cols.names[s]!r})"
        out.append(f"{path}: counter {cols.names[n]!r}{key} holds {said} sample(s), kept as recorded")
    return out
