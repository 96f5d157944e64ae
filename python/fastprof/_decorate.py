"""The decorator form of a span: ``@fastprof.span("name")``.

Called from Rust (``Name.__call__``); lives in Python because
``functools.wraps`` and coroutine detection belong here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def wrap(span: AbstractContextManager[Any], func: F) -> F:
    """Return ``func`` wrapped so every call runs inside ``span``.

    Return values and exceptions pass through unchanged; for a coroutine
    function the span covers the awaited body, not just coroutine creation.
    """
    if not callable(func):
        raise TypeError(f"fastprof.span(...) decorates callables, not {type(func).__name__}")

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with span:
                return await func(*args, **kwargs)

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with span:
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
