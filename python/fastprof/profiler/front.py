"""The calls a training loop makes on :class:`fastprof.Profiler`: its loaders,
its step and epoch boundaries, and where the loop stands. Each is one call
into the core's step loop (``rust/fastprof-py/src/steps.rs``), which calls
back :mod:`fastprof.profiler.seam` when a step needs Python; the Profiler
(``loop.py``) coordinates the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from fastprof import _core
from fastprof.profiler.loaders import Loaders
from fastprof.profiler.schedule import Action
from fastprof.profiler.seam import StepSeam
from fastprof.recording.names import TRAIN_LOADER
from fastprof.recording.recorder import Recorder

__all__ = ["LoopFront"]

T = TypeVar("T")


class LoopFront:
    """The loop's side of the Profiler (its base class)."""

    #: The core's step loop while the Profiler runs (None before).
    _steps: Any
    _state: str
    _seam: StepSeam
    _loaders: Loaders
    #: The recorder it records into (its own, or one already running).
    recorder: Recorder

    def format_variables(self) -> dict[str, Any]:
        """The variables a folder or file name may use, now."""
        o = self.recorder.options
        return {
            "run_name": o.run_name,
            "rank": o.rank,
            "local_rank": o.local_rank,
            "world_size": o.world_size,
            "local_world_size": o.local_world_size,
            "node_rank": o.node_rank,
            "epoch": self.epoch,
            "batch": self.batch,
            "batch_in_epoch": self.batch_in_epoch,
        }

    @property
    def batch(self) -> int:
        """The global step of the current step (steps ended so far)."""
        return int(self._loop("batch"))

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return int(self._loop("epoch"))

    @property
    def batch_in_epoch(self) -> int:
        """The current step's batch within its epoch."""
        return int(self._loop("batch_in_epoch"))

    def _loop(self, name: str) -> int:
        return self._seam.position(self._steps, name)

    @property
    def action(self) -> Action:
        """The current step's action: the schedule's, merged with a
        triggered capture's (see :mod:`fastprof.profiler.plan`)."""
        return self._seam.action

    def step(self) -> None:
        """End the current training step (the next begins at the train loader's
        next ``next()``, or now when no train loader is iterating). Never raises."""
        steps = self._steps
        if steps is not None and self._state == "running":
            steps.step()

    # ------------------------------------------------------ framework loops

    def begin_epoch(self, epoch_len: int | None = None, *, tile: bool = True) -> None:
        """A pass over the training data starts, in a loop that does not go
        through :meth:`loader` (a framework's): what a train loader's pass
        does, with ``epoch_len`` its number of steps when known. Until
        :meth:`end_epoch`, each step begins at :meth:`begin_step`.

        ``tile``: steps tile the epoch, each ending where the next begins (what
        runs between a :meth:`step` and the next fetch is the ending step's).
        False: a step ends at :meth:`step`, and what runs until the next
        :meth:`begin_step` (a framework's evaluation, logging, checkpoint) is
        in no step. Never raises."""
        if self._state != "running":
            return
        n = epoch_len if isinstance(epoch_len, int) and not isinstance(epoch_len, bool) and epoch_len > 0 else None
        self._seam.passes += 1
        self._steps.start_epoch(n, bool(tile))

    def end_epoch(self) -> None:
        """The pass :meth:`begin_epoch` started is over: its last step ends
        here, and a step a fetch began without a :meth:`step` after it (the
        fetch that found the data exhausted) is no step."""
        if self._steps is not None:
            self._steps.end_epoch()

    def begin_step(self) -> None:
        """The next step begins now, if none is open (where a framework's loop
        fetches its batch, or starts the batch). A loop that says where its
        steps begin ends them with :meth:`step`: the first call switches the
        optimizer-step boundaries off. Never raises."""
        if self._state == "running":
            self._steps.begin_step()

    def mark(self, name: str, **args: Any) -> None:
        """An instant event ``name`` with ``args`` at this moment."""
        _core.instant(name, **args)

    # --------------------------------------------------------------- loaders

    def loader(self, iterable: Iterable[T], name: str = TRAIN_LOADER, *, epoch: bool | None = None) -> Iterator[T]:
        """Iterate ``iterable`` and time each ``next()`` as ``loader.<name>.next``.

        A pass over the train loader (``name="train"``, or ``epoch=True``)
        starts an epoch and begins each step at its ``next()``. Any iterable
        works (DataLoader, generator, list); loaders may nest (validation
        inside training). A DataLoader with workers also records each
        worker's fetches in the worker (see :mod:`fastprof.profiler.workers`)."""
        return self._loaders.loader(iterable, name, epoch, self._steps if self._state == "running" else None)

    def open_pass(
        self, it: Iterable[T], name: str, train: bool, opener: Callable[[Iterable[T]], Iterator[T]] = iter
    ) -> Iterator[T]:
        """A pass over ``it`` begins: its workers record, its batch size is
        counted, a train pass starts an epoch, and ``opener(it)`` (``iter``,
        or ``fastprof run``'s unpatched ``DataLoader.__iter__``) is timed as
        ``loader.<name>.iter``. Returns the pass's iterator."""
        return self._loaders.open_pass(it, name, train, opener)

    def timed(self, iterator: Iterator[T], name: str) -> Iterator[T]:
        """Time each ``next()`` of an iterator already opened (by
        :meth:`open_pass`) as ``loader.<name>.next`` (no step bookkeeping:
        the caller says where steps begin)."""
        return self._loaders.timed(iterator, name)
