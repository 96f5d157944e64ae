"""Columns of traces for analysis: spans, instants and counters as numpy arrays.

The files are read by the Rust core's streaming scanner with the GIL
released; no JSON document and no Python object per event is ever built, so
memory is proportional to the rows kept by the filters.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from fastprof import _core

KINDS = ("spans", "instants", "counters")

PathArg: TypeAlias = str | os.PathLike[str]


@dataclass(frozen=True)
class Columns:
    """What :func:`read_columns` returns.

    ``spans``, ``instants`` and ``counters`` each map a column name to a 1-D
    numpy array, all of one length per table (row ``i`` across them):

    - ``name`` (uint32): index into :attr:`names`; ``cat`` (uint32): index
      into :attr:`categories` (the whole ``cat`` string, ``""`` when absent);
    - ``ts`` (int64): epoch ns (``baseTimeNanoseconds`` + relative µs, or
      absolute epoch µs, parsed as decimal text, plus the rank's clock offset);
      ``dur`` (int64 ns, spans only);
    - ``pid``, ``tid`` (int64; -1 where the trace has a non-integer);
    - ``rank`` (int32, -1 unknown); ``step`` (int64, -1 outside every step);
      ``file`` (uint32): index into :attr:`files`;
    - counters only: ``series`` (uint32, index into :attr:`names`: the args
      key, one row per numeric key) and ``value`` (float64).
    """

    spans: dict[str, npt.NDArray[Any]]
    instants: dict[str, npt.NDArray[Any]]
    counters: dict[str, npt.NDArray[Any]]
    names: list[str]
    categories: list[str]
    #: One dict per input file: path, kind ("fastprof", "kineto", "chrome",
    #: "merged"), rank, base_ns, offset_ns, events, salvaged, cut (a salvaged
    #: file's (byte, reason)), bad_dur ((span name, count) of spans left out
    #: for a negative, unreadable or out-of-range dur), skipped.
    files: list[dict[str, Any]]
    #: Salvages, dropped events, skipped files: one line each, naming the
    #: file and, where there is one, the byte offset.
    warnings: list[str]
    #: Spans folded by ``fold_categories``, one row per (rank, name, cat),
    #: sorted by them: ``rank`` (int32), ``name``, ``cat`` (uint32 ids),
    #: ``count``, ``total_ns``, ``max_ns``, ``first_ns`` (earliest start),
    #: ``last_ns`` (latest end), all int64. Empty columns without folding.
    folded: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    #: Per table ("spans", "instants", "counters"): whether every column's
    #: memory is exactly its rows (the reader gives back a growing vector's
    #: spare room before the arrays are made; the arrays are that memory,
    #: not a copy of it).
    exact: dict[str, bool] = field(default_factory=dict)

    def names_of(self, ids: npt.ArrayLike) -> npt.NDArray[np.object_]:
        """The strings of name ids (e.g. ``cols.names_of(cols.spans["name"])``)."""
        table = np.asarray(self.names, dtype=object)
        return table[np.asarray(ids, dtype=np.intp)]


def _strings(value: str | Iterable[str] | None, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    out = list(value)
    if not all(isinstance(v, str) for v in out):
        raise _core.ConfigError(f"invalid option {what}: expected strings, got {out!r}")
    return out


def read_columns(
    path: PathArg | Sequence[PathArg],
    *,
    names: str | Iterable[str] | None = None,
    name_prefix: str | Iterable[str] | None = None,
    categories: str | Iterable[str] | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    kinds: Iterable[str] = KINDS,
    fold_categories: str | Iterable[str] | None = None,
    fold_except: str | Iterable[str] | None = None,
    step_column: bool = True,
    collapse_numbered: str | Iterable[str] | None = None,
    omit: str | Iterable[str] | None = None,
    chunk_rows: int | None = None,
    on_chunk: Callable[[dict[str, Any]], object] | None = None,
    step_epochs: bool = False,
) -> Columns:
    """Read spans, instants and counters of traces into numpy columns.

    ``path``: a trace file (``.json``, ``.json.gz``, an open ``.part``
    segment), a run directory (every rank's fastprof segments and the
    torch.profiler traces under it), a merged ``trace.json.gz``, a glob, or a
    list of these. In a directory, a previous merge output next to its inputs
    is skipped, and so is a file that is not a trace (with a warning).

    Filters (applied while reading, so rows left out take no memory): exact
    ``names`` and/or ``name_prefix`` (a row is kept when either matches;
    counters match on the event name), ``categories`` (any comma-separated
    part of ``cat``), and the window ``[start_ns, end_ns)`` in epoch ns (spans
    overlapping it, points inside it). ``kinds``: any of ``"spans"``,
    ``"instants"``, ``"counters"``.

    ``fold_categories``: spans of these categories (as ``categories``
    matches) are not rows but totals per (rank, name, category) in
    :attr:`Columns.folded`, except names starting with one of
    ``fold_except``: a report reads a torch window's operators and kernels
    so. Not with ``start_ns`` / ``end_ns``. ``step_column=False`` leaves the
    ``step`` column out (it costs 8 bytes a row and a lookup per row).
    ``collapse_numbered``: span names made of one of these prefixes and a
    number are read as the prefix and ``*`` (``"ProfilerStep#"`` reads
    every ``ProfilerStep#N`` as ``ProfilerStep#*``: one name, not one per
    step).

    ``omit``: columns left out, as ``"<table>.<column>"`` (``cat``, ``pid``,
    ``tid`` or ``file`` of ``spans``, ``instants`` or ``counters``): never
    stored, so they take no memory even while reading (a report leaves out
    ``spans.file`` and the counters' ``file``, ``pid``, ``tid``, ``cat``:
    24 of a counter row's 52 bytes). A left-out ``pid`` still gives the
    rank; it needs ``step_column=False``.

    ``chunk_rows`` with ``on_chunk``: every row goes to ``on_chunk`` instead
    of the result, a chunk at a time (a fastprof segment's every
    ``chunk_rows`` rows, another trace whole): a dict of ``spans``,
    ``instants``, ``counters`` (as :class:`Columns` has them), ``names`` and
    ``categories`` as read so far (the same ids from chunk to chunk), the
    ``file`` (index into the result's ``files``), ``last`` (the file's last
    chunk) and ``moved_ns`` (in a file's last chunk: by how much the times of
    its earlier chunks move, placed before the file gave its clock offset).
    The result then holds no rows. Not with ``step_column`` or a window.
    ``step_epochs``: the spans' ``epoch`` column, a fastprof ``step`` span's
    ``args.epoch`` (-1 on other rows and where it has none).

    Raises :class:`fastprof.TraceError` (a ``ValueError``) for a file named
    here that is not a trace, naming the file and byte offset, and
    :class:`fastprof.FastprofFileNotFoundError` for a missing path.
    """
    if isinstance(path, (str, os.PathLike)):
        paths = [os.fspath(path)]
    else:
        paths = [os.fspath(p) for p in path]
    wanted = set(_strings(kinds, "kinds") or [])
    unknown = wanted - set(KINDS)
    if unknown:
        raise _core.ConfigError(f"invalid option kinds: {sorted(unknown)} (choose from {', '.join(KINDS)})")
    raw = _core.read_columns(
        paths,
        names=_strings(names, "names"),
        name_prefixes=_strings(name_prefix, "name_prefix") or [],
        categories=_strings(categories, "categories"),
        start_ns=start_ns,
        end_ns=end_ns,
        spans="spans" in wanted,
        instants="instants" in wanted,
        counters="counters" in wanted,
        fold_categories=_strings(fold_categories, "fold_categories") or [],
        fold_except=_strings(fold_except, "fold_except") or [],
        step_column=bool(step_column),
        collapse_numbered=_strings(collapse_numbered, "collapse_numbered") or [],
        omit=_strings(omit, "omit") or [],
        chunk_rows=chunk_rows,
        on_chunk=on_chunk,
        step_epochs=bool(step_epochs),
    )
    return Columns(
        spans=raw["spans"],
        instants=raw["instants"],
        counters=raw["counters"],
        names=raw["names"],
        categories=raw["categories"],
        files=raw["files"],
        warnings=raw["warnings"],
        folded=raw["folded"],
        exact=raw["exact"],
    )
