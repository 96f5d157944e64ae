"""Reading traces back (the Rust reader, with salvage warnings in Python)."""

from __future__ import annotations

import os
import warnings
from typing import Any

from fastprof import _core


def read_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a Chrome trace (``.json``, ``.json.gz`` or an open ``.part`` segment).

    A truncated file (a process killed mid-write) is salvaged up to its last
    complete event; each salvage emits a :class:`fastprof.FastprofWarning`
    naming the file and the bytes that could not be used, and the returned
    document's ``otherData`` carries ``salvaged`` and ``unused_bytes``.

    Raises :class:`fastprof.TraceError` (a ``ValueError``) for a file that is
    not a trace, naming the file and byte offset, and
    :class:`fastprof.FastprofFileNotFoundError` for a missing one.
    """
    doc, messages, _salvaged, _unused = _core.read_trace(os.fspath(path))
    for message in messages:
        warnings.warn(message, _core.FastprofWarning, stacklevel=2)
    return doc  # type: ignore[no-any-return]
