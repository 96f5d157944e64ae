"""The CLI's one error type and its one-line rendering, shared by every verb
(``main`` catches :class:`CommandError`; the verbs raise it).

Exit status, for every verb: 0 done; 1 what was asked for failed or found a
problem (``diff``: a threshold crossed; ``doctor --require``: a capability
missing; a full disk); 2 bad input (a path that is missing or not what the
verb reads, a file that is not a trace, a bad flag value) and bad usage."""

from __future__ import annotations

import errno

#: OSErrors that are the machine's, not the input's (exit 1, not 2).
_MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EFBIG})


class CommandError(Exception):
    """A failure the CLI reports as one line with an exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def describe(e: BaseException) -> str:
    """One line for an error: an OSError as "path: cause" (its str() reads
    "[Errno 2] ...: 'path'"), anything else as its message."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    return " ".join(str(e).split())


def exit_code(e: BaseException) -> int:
    """2 when ``e`` is the input's fault (a missing path, a file that is not
    a trace, an output that already exists, a bad option: ``ConfigError``,
    ``TraceError`` and ``NoEventsError`` are ValueErrors), 1 otherwise (a
    full disk, an I/O error, a recorder already running)."""
    if isinstance(e, OSError):
        return 1 if e.errno in _MACHINE_ERRNOS else 2
    return 2 if isinstance(e, ValueError) else 1
