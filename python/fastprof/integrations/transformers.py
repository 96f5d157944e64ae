"""``FastprofCallback``: fastprof in a Hugging Face ``transformers.Trainer``.

::

    from fastprof.integrations.transformers import FastprofCallback

    trainer = transformers.Trainer(model, args, train_dataset=..., callbacks=[FastprofCallback()])
    trainer.train()

It takes the :class:`fastprof.Profiler`'s arguments and runs one Profiler per
``Trainer.train()`` call, in ``<out_dir>/<run_name>``. ``out_dir`` defaults to
``FASTPROF_OUT_DIR``, else ``<TrainingArguments.output_dir>/fastprof``; a
recording that already runs (``fastprof run``, the job's Recorder) is joined
instead.
What it records:

* **Steps.** A ``step`` is one optimizer update, as the Trainer's
  ``global_step`` counts them. It begins at the fetch of its first batch and
  ends at the Trainer's ``on_step_end``. With gradient accumulation, every
  micro-batch's fetch, forward and backward is inside its update's step. The
  logging, evaluation and checkpoint the Trainer runs after a step are in no
  step (``Profiler.begin_epoch(n, tile=False)``).
* **Batches.** The train DataLoader is Accelerate's ``DataLoaderShard``
  (or ``DataLoaderDispatcher``), which overrides ``__iter__``, so a
  ``torch.utils.data.DataLoader`` patch never sees it. While training runs,
  the class's ``__iter__`` is wrapped: a pass over the train loader times
  each ``next()`` as ``loader.train.next``. Epochs are the Trainer's
  (``on_epoch_begin`` / ``on_epoch_end``), their length in updates.
  Passes over any other loader of that class (evaluation's) are timed as
  ``loader.val.next``. The wrapper is removed at the end of
  training.
* **Evaluation.** An evaluation the Trainer runs after a step is the span
  ``hf.evaluate``, outside the steps: from the step's end, when the
  Trainer's control says it will evaluate, to ``on_evaluate``.
* **The step anatomy** (forward, backward, optimizer; the Profiler's
  ``anatomy`` option, on by default): the model's forward is the outermost
  module call, and the Trainer computes the loss inside it.

Kineto's own log lines (each torch.profiler window's start and stop; on a
machine without a GPU, an ERROR "gpuGetDeviceCount failed") stay out of
the job's stderr, as under ``fastprof run``; a ``KINETO_LOG_LEVEL`` the
job sets wins.

A bad option raises :class:`fastprof.ConfigError` when the callback is
made, before training. Anything else that goes wrong inside the callback
warns once and training goes on unprofiled. An exception out of ``train()``
reaches no callback: while a Trainer with the callback lives, its class's
``train`` is wrapped (from ``on_init_end``, when the callback sees the
Trainer made) so that the loader class's ``__iter__`` is restored on every
way out of ``train()``; the Profiler is closed when the process exits, as an
unclosed Profiler is, or at the next ``train()``. A callback added with
``Trainer.add_callback`` first sees its Trainer inside ``train()``: the
wrapper covers the calls after that one.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from fastprof._package import pip_install

try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError as _e:  # pragma: no cover - exercised without transformers installed
    raise ImportError(
        "fastprof.integrations.transformers needs Hugging Face Transformers: "
        f"{pip_install('transformers')} or pip install 'transformers>=4.40' 'accelerate>=0.30'"
    ) from _e

from fastprof import _core
from fastprof._core import FastprofError, FastprofWarning
from fastprof.profiler.args import ProfilerArgs
from fastprof.profiler.loop import Profiler
from fastprof.recording.names import TRAIN_LOADER, VAL_LOADER

__all__ = ["FastprofCallback"]

#: The span an evaluation after a step is recorded as.
EVALUATE_SPAN = "hf.evaluate"


class FastprofCallback(_TrainerCallback):
    """A ``TrainerCallback`` that profiles ``Trainer.train()`` with a
    :class:`fastprof.Profiler` (see the module's doc). ``out_dir``,
    ``run_name`` and ``**options`` are the Profiler's."""

    def __init__(self, out_dir: str | os.PathLike[str] | None = None, run_name: str | None = None, **options: Any):
        self.out_dir = out_dir
        self.run_name = run_name
        # Every option checked now, before training.
        self._args = ProfilerArgs.checked(out_dir, run_name, options)
        #: The Profiler of the train() call running now, or of the last one.
        self.profiler: Profiler | None = None
        self._runs = 0
        self._patches: list[tuple[type, Any, Any]] = []
        self._train_loader: Any = None
        self._eval_t0 = 0
        self._eval_name = _core.name_id(EVALUATE_SPAN)
        self._failed = False

    # ------------------------------------------------------------ lifecycle

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _guard_train(_trainer_of(self))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _guard_train(_trainer_of(self))  # added with add_callback: no on_init_end came
        self._close()
        self._runs += 1
        prof = self._args.make(self._runs, lambda: Path(getattr(args, "output_dir", None) or ".") / "fastprof")
        try:
            prof.start(defer_step=True)
        except FastprofError:
            raise
        except Exception as e:  # noqa: BLE001 - profiling never takes training down
            self._warn("the Profiler failed to start", e)
            return
        self.profiler = prof
        # The script made no torch.profiler window itself: Kineto's log lines
        # of the callback's windows (an ERROR "gpuGetDeviceCount failed" on a
        # CPU machine) are not its output, as under `fastprof run`.
        prof.quiet_torch_windows()
        loader = kwargs.get("train_dataloader")
        self._train_loader = loader
        if loader is not None:
            self._patch(type(loader))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        prof = self._running()
        if prof is not None:
            # A step ends at on_step_end: the logging, evaluation and checkpoint
            # the Trainer runs after it are in no step.
            prof.begin_epoch(_updates_per_epoch(self._train_loader, args), tile=False)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        prof = self._running()
        if prof is not None:
            prof.end_epoch()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Opened at the batch's fetch already when the loader is timed.
        prof = self._running()
        if prof is not None:
            prof.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        prof = self._running()
        if prof is None:
            return
        prof.step()
        if getattr(control, "should_evaluate", False):
            self._eval_t0 = _core._ticks()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._eval_t0 and self._running() is not None:
            _core._complete(self._eval_name, self._eval_t0, global_step=int(getattr(state, "global_step", 0)))
        self._eval_t0 = 0

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    # ------------------------------------------------------------- helpers

    def _train_left(self) -> None:
        """``train()`` was left, by its end (on_train_end closed all this
        already) or by an exception (no event said so)."""
        self._unpatch()
        self._train_loader = None
        self._eval_t0 = 0

    def _running(self) -> Profiler | None:
        prof = self.profiler
        return prof if prof is not None and prof.running else None

    def _close(self) -> None:
        self._unpatch()
        self._train_loader = None
        self._eval_t0 = 0
        prof = self.profiler
        if prof is not None and prof.running:
            try:
                prof.close_after(None)
            except Exception as e:  # noqa: BLE001 - the job's result is not ours to spoil
                self._warn("closing the Profiler failed", e)

    def _patch(self, cls: type) -> None:
        """Time passes over the train loader (and others of its class) while
        training runs: Accelerate's loaders override ``__iter__``."""
        original = cls.__dict__.get("__iter__")
        if original is None or getattr(original, "_fastprof_callback", None) is self:
            return
        me = self

        def __iter__(loader: Any) -> Iterator[Any]:
            return me._open(loader, original)

        __iter__._fastprof_callback = self  # type: ignore[attr-defined]
        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        __iter__.__doc__ = original.__doc__
        cls.__iter__ = __iter__  # type: ignore[attr-defined]
        self._patches.append((cls, original, __iter__))

    def _unpatch(self) -> None:
        for cls, original, ours in reversed(self._patches):
            if cls.__dict__.get("__iter__") is ours:
                cls.__iter__ = original  # a patch made on top of ours stays
        self._patches = []

    def _open(self, loader: Any, original: Any) -> Iterator[Any]:
        prof = self._running()
        if prof is None or not prof.on_training_thread():
            return original(loader)  # type: ignore[no-any-return]
        try:
            if loader is self._train_loader:
                # The epoch is the Trainer's (on_epoch_begin): its length is in updates, not batches.
                return _train_pass(prof, prof.open_pass(loader, TRAIN_LOADER, False, opener=original))
            return prof.timed(prof.open_pass(loader, VAL_LOADER, False, opener=original), VAL_LOADER)
        except Exception as e:  # noqa: BLE001 - never in the way of the job's data
            self._warn("DataLoader timing failed", e)
            return original(loader)  # type: ignore[no-any-return]

    def _warn(self, what: str, e: BaseException) -> None:
        if not self._failed:
            self._failed = True
            warnings.warn(f"fastprof: transformers callback: {what} ({type(e).__name__}: {e})", FastprofWarning, 3)


def _trainer_of(callback: FastprofCallback) -> Any:
    """The Trainer whose event ``callback`` is in (a few frames up: its
    ``__init__`` or its training loop), None when none is found. No event
    is given the Trainer itself."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return None
        me = frame.f_locals.get("self")
        callbacks = getattr(getattr(me, "callback_handler", None), "callbacks", None)
        if isinstance(callbacks, list) and any(c is callback for c in callbacks):
            return me
        frame = frame.f_back
    return None


#: Trainer classes whose ``train`` fastprof wraps: class -> [the class's own
#: ``train`` before (None: inherited), the wrapper, Trainers alive that need it].
_GUARDED: dict[type, list[Any]] = {}
#: The Trainers counted in :data:`_GUARDED`.
_TRAINERS: weakref.WeakSet[Any] = weakref.WeakSet()


def _guard_train(trainer: Any) -> None:
    """Wrap the ``train`` of ``trainer``'s class, while a Trainer with a
    FastprofCallback lives, so that its callbacks hear of every way out of
    ``train()``: an exception out of it reaches no callback, and the loader
    class patched for it must not stay patched. On the class, not the
    instance: a wrapper on the instance would either keep the Trainer (and
    its optimizer's memory) in a cycle until the garbage collector runs, or
    lose it in ``Trainer(...).train()``."""
    if trainer is None or trainer in _TRAINERS:
        return
    cls = type(trainer)
    entry = _GUARDED.get(cls)
    if entry is None:
        own = vars(cls).get("train")

        def train(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if own is not None:
                    return own(self, *args, **kwargs)
                return super(cls, self).train(*args, **kwargs)
            finally:
                for cb in list(getattr(getattr(self, "callback_handler", None), "callbacks", ())):
                    if isinstance(cb, FastprofCallback):
                        cb._train_left()

        functools.update_wrapper(train, own if own is not None else cls.train)
        train._fastprof_guard = True  # type: ignore[attr-defined]
        entry = _GUARDED[cls] = [own, train, 0]
        cls.train = train
    entry[2] += 1
    _TRAINERS.add(trainer)
    weakref.finalize(trainer, _unguard, cls)


def _unguard(cls: type) -> None:
    """A guarded Trainer is gone: the last of its class restores the class."""
    entry = _GUARDED.get(cls)
    if entry is None:
        return
    entry[2] -= 1
    if entry[2] > 0:
        return
    del _GUARDED[cls]
    if vars(cls).get("train") is entry[1]:  # a patch made on top of ours stays
        if entry[0] is None:
            delattr(cls, "train")
        else:
            cls.train = entry[0]  # type: ignore[attr-defined]


def _updates_per_epoch(loader: Any, args: Any) -> int | None:
    """Optimizer updates in an epoch: the loader's batches over the gradient
    accumulation steps, rounded up (None when the loader has no length)."""
    try:
        n, accumulate = len(loader), max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
    except Exception:  # noqa: BLE001 - an iterable dataset has no length
        return None
    return -(-n // accumulate) if n > 0 else None


def _train_pass(prof: Profiler, iterator: Iterator[Any]) -> Iterator[Any]:
    """A pass over the train loader: each ``next()`` timed as
    ``loader.train.next``, a step begun before it (none is begun twice: the
    micro-batches of one update share their step)."""
    timed = prof.timed(iterator, TRAIN_LOADER)
    while True:
        prof.begin_step()
        try:
            batch = next(timed)
        except StopIteration:
            return
        yield batch
