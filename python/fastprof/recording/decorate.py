"""The decorator form of a span: ``@fastprof.span("name")``.

Called from Rust (``Name.__call__``); lives in Python because
``functools.wraps`` and coroutine detection belong here.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from fastprof._process import PROCESS

F = TypeVar("F", bound=Callable[..., Any])


def _task_key() -> int:
    """One key per asyncio task for its lifetime (PROCESS.async_spans)."""
    keys = PROCESS.async_spans
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running asyncio loop (another event loop library)
        task = None
    if task is None:
        return keys.next_key()  # no task to share with: a key of its own
    key = keys.task_keys.get(task)
    if key is None:
        key = keys.task_keys[task] = keys.next_key()
    return key


def wrap(span: AbstractContextManager[Any], func: F) -> F:
    """Return ``func`` wrapped so every call runs inside ``span``.

    Return values and exceptions pass through unchanged. For a coroutine
    function the span covers the awaited body and is recorded as an async
    span keyed by the running asyncio task: coroutines that interleave on one
    thread each get their own track and their own durations (a plain
    ``with span:`` around an ``await`` cannot tell them apart).
    """
    if not callable(func):
        raise TypeError(f"fastprof.span(...) decorates callables, not {type(func).__name__}")

    if inspect.iscoroutinefunction(func):
        begin = span._async_begin  # type: ignore[attr-defined]
        end = span._async_end  # type: ignore[attr-defined]

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            key = _task_key()
            begin(key)
            try:
                result = await func(*args, **kwargs)
            except BaseException:
                end(key, True)
                raise
            end(key)
            return result

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with span:
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
