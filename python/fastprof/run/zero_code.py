"""What a script never says, inferred for ``fastprof run``
(:class:`ZeroCode`): where its steps are, and its DataLoader passes.

Steps end at ``optimizer.step()`` (torch's global post hook; a second
optimizer stepped in the same batch ends no second step), and every pass
over a ``torch.utils.data.DataLoader`` is timed, with
``DataLoader.__iter__`` patched for the run's duration. The **train** loader
is the one the steps run in: its passes begin a step at each batch
(:meth:`fastprof.Profiler.begin_step`) and each is an epoch
(``begin_epoch`` / ``end_epoch``, the framework-loop calls). Until it is
known, any pass opened with autograd enabled may be it: it begins steps at
its batches, and its epoch begins at its first optimizer step (so a
``sanity`` pass before training, with autograd on, shifts no epoch). Once
known: its own passes, a pass over its dataset (a DataLoader made anew each
epoch), or any autograd pass once it is gone; never a pass opened inside a
train pass or under ``no_grad``. Other passes are timed as
``loader.val.next`` (``val2``, ... for more loaders) outside the steps. A
loader class that overrides ``__iter__`` is left alone (its iterator may be
more than an iterator), except Accelerate's prepared loaders
(``accelerate.data_loader.DataLoaderShard`` and ``DataLoaderDispatcher``),
whose ``__iter__`` is patched the same way once ``accelerate.data_loader`` is
imported: a pass over one is timed, and the DataLoader it wraps
(``base_dataloader``), iterated inside it, is not timed a second time.

A script that starts its own :class:`fastprof.Profiler` says what its
steps are: that Profiler records in the run (its ``out_dir`` / ``run_name``
/ recorder options are not used, as a stderr line says), and from its start the
inferred steps, the DataLoader patch, ``fastprof run``'s torch windows and
triggers are off, so nothing is recorded twice. Its ``profiler.json`` is the
rank's; ``fastprof run`` still finishes the run (done marker, merge).

torch is not imported up front: a script may set ``TORCH_*`` / ``OMP_*``
variables or ``sys.path`` before its own ``import torch``, and a script
without torch should not pay for it. A finder on ``sys.meta_path`` waits for
the first ``import torch`` to finish, then hooks the optimizer and the
DataLoader (at once when torch is already imported). Every patch is made
here and undone by :meth:`ZeroCode.uninstall`.

The Profiler is a :class:`fastprof._loop_api.RunHost` here: the
framework-loop API, and the pieces of ``Profiler.loader`` a pass needs.
"""

from __future__ import annotations

import functools
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from fastprof._core import FastprofWarning
from fastprof._loop_api import RunHost
from fastprof.recording.names import TRAIN_LOADER, VAL_LOADER
from fastprof.run.after_import import AfterImport

__all__ = ["ZeroCode"]


class ZeroCode:
    """Steps and loader timing for a script that never calls the Profiler
    (see the module documentation). :meth:`install` at start,
    :meth:`uninstall` at the end restores ``DataLoader.__iter__`` and
    removes the optimizer hook."""

    def __init__(self, prof: RunHost) -> None:
        self.prof = prof
        self._finder: AfterImport | None = None
        #: Loader class -> (its own __iter__, ours), while patched.
        self._patches: dict[type, tuple[Callable[[Any], Iterator[Any]], Callable[[Any], Iterator[Any]]]] = {}
        #: Loaders an Accelerate pass wraps (iterated inside it: not timed again).
        self._wrapped: weakref.WeakSet[Any] = weakref.WeakSet()
        self._accelerate_finder: AfterImport | None = None
        self._hook: Any = None
        #: (torch.distributed, its init_process_group, ours) while patched.
        self._dist_patch: tuple[Any, Any, Any] | None = None
        #: Optimizer steps on the training thread so far.
        self.optimizer_steps = 0
        #: The open train pass (its serial; 0: none), its loader, whether its
        #: epoch has begun (a first pass's begins at its first optimizer step).
        self._serial = 0
        self._train = 0
        self._train_of: weakref.ref[Any] | None = None
        self._epoch_begun = False
        #: The loader the steps ran in, once known.
        self._train_loader: weakref.ref[Any] | None = None
        self._names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        #: A batch was fetched in the train pass since the last boundary.
        self.fetched = False
        self._failed = False
        #: Unhooked: the run ended, or the script's own Profiler took the loop.
        self.off = False

    def install(self) -> None:
        if not self.prof.running:
            return  # the run directory could not be written: nothing to time
        self.off = False
        if "torch" in sys.modules:
            self._on_torch()
        else:
            self._finder = AfterImport("torch", self._on_torch)
            sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        self.off = True
        if self._finder is not None:
            self._finder.remove()
            self._finder = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._accelerate_finder is not None:
            self._accelerate_finder.remove()
            self._accelerate_finder = None
        for cls, (original, ours) in self._patches.items():
            if cls.__dict__.get("__iter__") is ours:
                cls.__iter__ = original  # type: ignore[attr-defined]  # a patch made on top of ours stays
        self._patches = {}
        if self._dist_patch is not None:
            td, original, ours = self._dist_patch
            if getattr(td, "init_process_group", None) is ours:
                td.init_process_group = original
            self._dist_patch = None

    def _on_torch(self) -> None:
        """torch is imported (``import torch`` loads its optimizer and data
        modules): hook its optimizer steps and DataLoader passes."""
        try:
            register_optimizer_step_post_hook = sys.modules["torch.optim.optimizer"].register_optimizer_step_post_hook
            loader_cls = sys.modules["torch.utils.data"].DataLoader
        except Exception as e:  # noqa: BLE001 - an old or partial torch: the run goes on untimed
            self._warn("cannot hook torch's optimizer and DataLoader", e)
            return
        # The Profiler's own hook (torch was imported before it started):
        # this one replaces it, so each optimizer step is counted once.
        self.prof.remove_optimizer_hook()
        self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        self.prof.hook_torch_phases()
        self._patch_loader(loader_cls)
        if "accelerate.data_loader" in sys.modules:
            self._on_accelerate()
        else:
            self._accelerate_finder = AfterImport("accelerate.data_loader", self._on_accelerate)
            sys.meta_path.insert(0, self._accelerate_finder)
        self._patch_init_process_group()

    def _patch_loader(self, cls: type) -> None:
        """Time every pass over a ``cls`` (see :meth:`open`)."""
        original = cls.__dict__["__iter__"]
        zero = self

        def __iter__(loader: Any) -> Iterator[Any]:
            return zero.open(loader, cls)

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        __iter__.__doc__ = original.__doc__
        self._patches[cls] = (original, __iter__)
        cls.__iter__ = __iter__  # type: ignore[attr-defined]

    def _on_accelerate(self) -> None:
        """Accelerate is imported: its prepared loaders override ``__iter__``
        (they wrap a DataLoader): time their passes too."""
        if self.off:
            return
        try:
            adl = sys.modules["accelerate.data_loader"]

            for name in ("DataLoaderShard", "DataLoaderDispatcher"):
                cls = getattr(adl, name, None)
                if isinstance(cls, type) and "__iter__" in cls.__dict__ and cls not in self._patches:
                    self._patch_loader(cls)
        except Exception as e:  # noqa: BLE001 - Accelerate's loaders go untimed, the run goes on
            self._warn("cannot hook Accelerate's DataLoaderShard", e)

    def _patch_init_process_group(self) -> None:
        """The clock sync at start: the Profiler started before the script
        made its process group, so it runs right after the script's
        ``torch.distributed.init_process_group`` returns on every rank (a
        collective where all ranks already meet). Without it a run across
        nodes had only an end sync, skipped when the script destroys its
        group first, and the merge fell back on the hosts' NTP clocks."""
        try:
            td: Any = sys.modules["torch.distributed"]  # loaded by `import torch`
            if not td.is_available():
                return
            original = td.init_process_group
        except Exception as e:  # noqa: BLE001 - the run goes on without the start sync
            self._warn("cannot hook torch.distributed.init_process_group", e)
            return
        after = self._after_init_process_group

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            after()
            return out

        functools.update_wrapper(init_process_group, original)
        self._dist_patch = (td, original, init_process_group)
        td.init_process_group = init_process_group

    def _after_init_process_group(self) -> None:
        if self.off or not self.prof.running:
            return
        try:
            self.prof.sync_clocks_once("start")
        except Exception as e:  # noqa: BLE001 - never in the way of the job's process group
            self._warn("clock sync after init_process_group failed", e)

    def _warn(self, what: str, e: BaseException) -> None:
        if not self._failed:
            self._failed = True
            warnings.warn(f"fastprof run: {what} ({type(e).__name__}: {e})", FastprofWarning, stacklevel=3)

    def _live(self) -> bool:
        prof = self.prof
        return not self.off and prof.running and prof.on_training_thread()

    # ------------------------------------------------------------ steps

    def _on_optimizer_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not self._live():
            return
        self.optimizer_steps += 1
        if self._train:
            if not self.fetched:
                # A second optimizer in the same batch (a GAN's two): the
                # step already ended at the first.
                return
            self.fetched = False
            if not self._epoch_begun:
                # The first pass with an optimizer step in it: the train
                # loader is found, and its epoch (epoch 0: the first step,
                # open since the pass's first batch, keeps its start) begins.
                loader = None if self._train_of is None else self._train_of()
                if loader is not None:
                    self._epoch_begun = True
                    self._train_loader = weakref.ref(loader)
                    self.prof.begin_epoch(_length(loader))
        self.prof.steps_by_optimizer += 1
        self.prof.step()

    # ---------------------------------------------------------- loaders

    def open(self, loader: Any, cls: type) -> Iterator[Any]:
        """The patched ``__iter__`` of loader class ``cls``: a timed pass, or
        the loader's own iterator where fastprof has nothing to do (a
        subclass with its own ``__iter__``, a loader an Accelerate pass wraps)."""
        original, ours = self._patches.get(cls) or (cls.__dict__["__iter__"], None)
        try:
            if type(loader).__iter__ is not ours or not self._live() or loader in self._wrapped:
                return original(loader)
            train = self._is_train(loader)
            name = TRAIN_LOADER if train else self._name(loader)
            inner = getattr(loader, "base_dataloader", None) if cls is not self._torch_loader() else None
            if inner is not None:
                self._wrapped.add(inner)
        except Exception as e:  # noqa: BLE001 - never in the way of the job's data
            self._warn("DataLoader timing failed", e)
            return original(loader)
        self._serial += 1
        return _Pass(self, loader, name, train, self._serial, original)

    def _torch_loader(self) -> type | None:
        return next(iter(self._patches), None)

    def _is_train(self, loader: Any) -> bool:
        """Is a pass over ``loader`` opened now the train pass? Not inside
        another train pass (validation mid-epoch), nor without autograd.
        Before the train loader is known, any other pass may be (its epoch
        waits for its first optimizer step); then the train loader's own
        passes are, or one over its dataset (a DataLoader made anew each
        epoch), or any once it is gone."""
        if self._train:
            return False
        if not sys.modules["torch"].is_grad_enabled():  # a DataLoader's pass: the job's torch
            return False
        if self._train_loader is None:
            return True
        known = self._train_loader()
        return known is None or known is loader or getattr(known, "dataset", None) is getattr(loader, "dataset", ())

    def _name(self, loader: Any) -> str:
        name = self._names.get(loader)
        if name is None:
            n = len(self._names) + 1
            name = self._names[loader] = VAL_LOADER if n == 1 else f"{VAL_LOADER}{n}"
        return name

    def pass_began(self, p: _Pass) -> None:
        if not p.train:
            return
        self._train, self._train_of, self.fetched = p.serial, weakref.ref(p.loader), False
        self._epoch_begun = self._train_loader is not None
        if self._epoch_begun:
            self.prof.begin_epoch(_length(p.loader))

    def pass_ended(self, p: _Pass, loader: Any) -> None:
        train = p.serial == self._train
        if train:
            self._train, self._train_of = 0, None
            if self._epoch_begun:
                self._epoch_begun = False
                self.prof.end_epoch()
        if self.optimizer_steps > p.opt0 and not self._train:
            # Steps ran in this pass (and in no train pass around it): its
            # loader is the train loader from now on.
            self._train_loader = weakref.ref(loader)


class _Pass:
    """One pass over a DataLoader under ``fastprof run`` (what the patched
    ``__iter__`` returns). Opened at the first ``next()`` as the loader's own
    iterator would be; a train pass begins a step at every ``next()`` (one
    already open with nothing fetched goes on) and ends its epoch when the
    loader is exhausted, or when the loop leaves it (``break``: the pass is
    dropped)."""

    __slots__ = ("_it", "_loader", "_opener", "_zero", "done", "name", "opt0", "serial", "train")

    def __init__(
        self, zero: ZeroCode, loader: Any, name: str, train: bool, serial: int, opener: Callable[[Any], Iterator[Any]]
    ) -> None:
        # The ZeroCode holds no reference back (the serial names the pass):
        # a pass the loop left is freed at once, and its epoch ends then.
        self._zero = zero
        #: The loader's own (unpatched) ``__iter__``.
        self._opener = opener
        self.serial = serial
        self._loader: Any = loader
        self.name = name
        self.train = train
        self._it: Iterator[Any] | None = None
        self.done = False
        self.opt0 = 0

    @property
    def loader(self) -> Any:
        return self._loader

    def __iter__(self) -> _Pass:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        it = self._it
        if it is None:
            if self.done:
                raise StopIteration
            it = self._open()
        zero = self._zero
        if self.train and not zero.off:
            zero.prof.begin_step()
            zero.fetched = True
        try:
            return next(it)
        except StopIteration:
            self._end()
            raise

    def _open(self) -> Iterator[Any]:
        zero = self._zero
        prof = zero.prof
        self.opt0 = zero.optimizer_steps
        zero.pass_began(self)
        # Set up as Profiler.loader sets a pass up (workers, batch size, the
        # loader.<name>.iter span), opened by the loader's own __iter__.
        raw = prof.open_pass(self._loader, self.name, False, self._opener)
        self._it = prof.timed(raw, self.name)
        return self._it

    def _end(self) -> None:
        if self.done:
            return
        self.done = True
        began = self._it is not None
        self._it = None
        if began:
            self._zero.pass_ended(self, self._loader)

    def close(self) -> None:
        """Leave the pass now."""
        self._end()

    def __del__(self) -> None:
        try:
            self._end()
        except Exception:  # noqa: BLE001 - nothing may raise from a finalizer
            pass


def _length(loader: Any) -> int | None:
    try:
        n = len(loader)
    except Exception:  # noqa: BLE001 - an iterable dataset has no length
        return None
    return n if isinstance(n, int) and n > 0 else None
