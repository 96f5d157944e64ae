"""The CLI's one error type and its one-line rendering, shared by every verb
(``main`` catches :class:`CommandError`; the verbs raise it)."""

from __future__ import annotations


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
