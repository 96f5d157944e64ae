"""The Profiler's loaders: each ``next()`` of a loader timed by the core as
``loader.<name>.next`` (and its wait as the ``loader.<name>.wait_ms``
counter); a pass over the train loader starts an epoch and begins each step
at its ``next()``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from fastprof import _core
from fastprof._core import ConfigError
from fastprof.recording.names import TRAIN_LOADER, loader_batch_size, loader_iter, loader_next, loader_wait

__all__ = ["Loaders"]

T = TypeVar("T")


class _Names:
    __slots__ = ("next", "wait")

    def __init__(self, name: str) -> None:
        self.next = loader_next(name)
        self.wait = loader_wait(name)


def _same(it: T) -> T:
    return it


class Loaders:
    """What :meth:`fastprof.Profiler.loader`, ``open_pass`` and ``timed`` do.
    ``prof``: the Profiler (its state, step loop and epochs);
    ``instrument(iterable, name)``: a pass's DataLoader workers record."""

    def __init__(self, prof: Any, instrument: Callable[[Any, str], None]) -> None:
        self.prof = prof
        self.instrument = instrument
        self.names: dict[str, _Names] = {}

    def _names(self, name: str) -> _Names:
        names = self.names.get(name)
        if names is None:
            names = self.names[name] = _Names(name)
        return names

    def loader(self, iterable: Iterable[T], name: str, epoch: bool | None, steps: Any) -> Iterator[T]:
        if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"Profiler.loader: invalid name {name!r}: expected letters, digits, _ or -")
        train = (name == TRAIN_LOADER) if epoch is None else bool(epoch)
        names = self._names(name)

        def setup(it: Iterable[T]) -> Iterator[T]:
            # At the first next(), as a generator would: a loader made but
            # never iterated starts no epoch.
            return self.open_pass(it, name, train)

        return _core._LoaderIter(iterable, setup, steps if train else None, names.next, names.wait)

    def open_pass(
        self, it: Iterable[T], name: str, train: bool, opener: Callable[[Iterable[T]], Iterator[T]] = iter
    ) -> Iterator[T]:
        running = self.prof.running
        if running:
            self.instrument(it, name)
        bs = getattr(it, "batch_size", None)
        if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0 and running:
            # Samples per batch, for the reports' samples/s.
            _core.counter(loader_batch_size(name), bs)
        if train and running:
            try:
                n = len(it)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - not every iterable has a length
                n = None
            self.prof.begin_epoch(n, tile=False)
        with _core.span(loader_iter(name)):
            iterator = opener(it)
        return iterator

    def timed(self, iterator: Iterator[T], name: str) -> Iterator[T]:
        names = self._names(name)
        return _core._LoaderIter(iterator, _same, None, names.next, names.wait)
