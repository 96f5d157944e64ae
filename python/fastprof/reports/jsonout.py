"""report.json: the report document, written to a temporary name and renamed;
non-finite numbers spelt as the trace spells them.

Its layout is one of indented lines down to the records: a dict is one
member a line and a list of containers one element a line, each indented one
space a level, and a container that holds no container (a slow step, a time
row, a list of numbers) is one line of its own, written by Python's C
encoder. ``json.dumps(doc, indent=1)`` drops to the pure-Python encoder and
wrote every field of every record on a line of its own: 3.8 s and 77 MB for
a 1,024-rank job whose triggers listed 200 slow steps a rank (issue #38),
where this layout takes ~1 s (the C encoder alone, one line, 0.8 s) and
each record can be read, grepped and diffed as a line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastprof.recording.names import REPORT_JSON
from fastprof.reports.finite import encode


def _one_line_encoder() -> Callable[[Any], str]:
    """One line of strict JSON (``", "`` and ``": "`` between items, as
    ``json.dumps`` without ``indent``); ValueError on a non-finite float.
    ``JSONEncoder.encode`` builds a C encoder each call: 0.3 s of the
    ~280,000 lines of a 1,024-rank report. The C encoder built once is used
    where this Python has it and it writes what ``encode`` writes."""
    public = json.JSONEncoder(allow_nan=False).encode
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return public
    try:
        chunks = make(None, None, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, False)
        probe: dict[str, Any] = {"a": [1, 2.5, -0.0, None, True, 'é"\n\u2028'], "b": {}, "c": [[]]}
        if "".join(chunks(probe, 0)) != public(probe):
            return public
    except (TypeError, ValueError):  # another signature: the public encoder
        return public
    return lambda x: "".join(chunks(x, 0))


_ONE_LINE = _one_line_encoder()

#: The types laid out over lines (what ``json`` writes as objects and arrays).
_NESTED = frozenset((dict, list, tuple))


def write_json(doc: dict[str, Any], out_dir: Path) -> Path:
    """``out_dir/report.json``. ``out_dir`` is the report's staging folder
    (``reports.report._write`` moves it in whole), so no temporary file."""
    path = out_dir / REPORT_JSON
    path.write_text(dumps(doc))
    return path


def dumps(doc: Any) -> str:
    """``doc`` as report.json holds it (the module's layout, a final newline),
    every non-finite float spelt as the trace spells it."""
    out: list[str] = []
    try:
        _lay(doc, "\n", out)
    except ValueError:
        # A non-finite float: written as the trace spells it. The copy that
        # spells them is made only then (a walk of the whole document).
        out.clear()
        _lay(encode(doc), "\n", out)
    out.append("\n")
    return "".join(out)


def _lay(x: Any, pad: str, out: list[str]) -> None:
    """Append ``x`` to ``out``; ``pad``: a new line and the indent of the
    line ``x`` starts on."""
    if isinstance(x, dict):
        items = x.values()
        if not x or _NESTED.isdisjoint(map(type, items)) or not all(type(k) is str for k in x):
            # A record, or keys json converts (numbers, None): one line.
            out.append(_ONE_LINE(x))
            return
        inner = pad + " "
        sep = "{" + inner
        for k, v in x.items():
            out.append(sep + _ONE_LINE(k) + ": ")
            _lay(v, inner, out)
            sep = "," + inner
        out.append(pad + "}")
    elif isinstance(x, (list, tuple)):
        if not x or _NESTED.isdisjoint(map(type, x)):
            out.append(_ONE_LINE(x))
            return
        inner = pad + " "
        sep = "[" + inner
        for v in x:
            out.append(sep)
            _lay(v, inner, out)
            sep = "," + inner
        out.append(pad + "]")
    else:
        out.append(_ONE_LINE(x))
