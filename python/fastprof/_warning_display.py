"""How a :class:`fastprof.FastprofWarning` is shown: one ``fastprof: ...``
line on stderr, nothing after it.

fastprof speaks in its own lines. Python shows a warning as
``path:lineno: Category: message`` followed by the source line at
``path:lineno``, which for fastprof's warnings is a line of fastprof or of
the job that called it (``self.close(...)``): noise that reads like a
traceback. Only the display changes: the warning is still a
``FastprofWarning`` issued through :mod:`warnings`, so filters
(``filterwarnings``, ``-W error::fastprof.FastprofWarning``, pytest's
``filterwarnings = error``) and recorders (``catch_warnings(record=True)``,
``pytest.warns``) see it as before.

Where: :func:`install` wraps ``warnings._formatwarnmsg_impl``, the step of
the default display that turns a warning into text. Recording bypasses it
(a recorder keeps the message, never its text); a ``warnings.formatwarning``
or ``showwarning`` that someone installed still wins (Python calls theirs
instead, and ``logging.captureWarnings`` formats through
``warnings.formatwarning``, which lands here and logs the one line). Every
other category goes to the function that was there with the whole message
record, so other libraries' warnings show exactly as they did (the
``source`` of a ``ResourceWarning``, tracemalloc's "Object allocated at",
included, which a wrapper of the public ``showwarning`` would lose).

The core says its messages on stderr itself when they happen (from any
thread, with or without the GIL) and then issues the warning on the next
Python thread that calls fastprof, marked :data:`SAID`: its display is
empty, the message one line.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from fastprof import _core

__all__ = ["install", "line", "said"]

#: Set on a warning the core issues for a message it has said on stderr
#: itself, at the time (a thread without a ring, a failed write): shown as
#: nothing, the core's line being the one.
SAID = "_fastprof_said"

# "fastprof: ", or a verb's own prefix ("fastprof run: ", "fastprof diff: ").
_PREFIX = re.compile(r"fastprof(?: [a-z]+)?: ")


def line(message: object) -> str:
    """The line fastprof shows for a warning's ``message``, newline ended:
    prefixed with ``fastprof: `` unless it already names fastprof so."""
    text = str(message).strip()
    if not _PREFIX.match(text):
        text = f"fastprof: {text}"
    return text + "\n"


def said(message: str) -> _core.FastprofWarning:
    """A warning for a message the core has said on stderr already (a
    session's notices): filters and recorders see it, the display shows
    nothing, so the line is not printed twice."""
    w = _core.FastprofWarning(message)
    setattr(w, SAID, True)
    return w


def install() -> None:
    """Show FastprofWarnings as one line each, from now on in this process
    (once; a no-op on a Python whose warnings module has no such step)."""
    original = getattr(warnings, "_formatwarnmsg_impl", None)
    if not callable(original) or getattr(original, "_fastprof", False):
        return

    def _formatwarnmsg_impl(msg: Any) -> str:
        category = getattr(msg, "category", None)
        if isinstance(category, type) and issubclass(category, _core.FastprofWarning):
            if getattr(msg.message, SAID, False):
                return ""  # the core's own line is on stderr already
            return line(msg.message)
        return original(msg)  # type: ignore[no-any-return]

    _formatwarnmsg_impl._fastprof = True  # type: ignore[attr-defined]
    _formatwarnmsg_impl.__wrapped__ = original  # type: ignore[attr-defined]
    warnings._formatwarnmsg_impl = _formatwarnmsg_impl  # type: ignore[attr-defined]
