"""``fastprof run``'s machinery inside the process: a script (or ``-m``
module) run as ``python script.py`` would run it, under a
:class:`fastprof.Profiler`, with no change to the script.

What "as Python would" means here (the runpy semantics memray's ``run``
keeps, in this process, not a child):

* ``sys.argv`` is ``[script as given, *args]`` (``-m``: the module's file);
  ``sys.path[0]`` the script's real directory (``-m``: the current
  directory), unless ``-P`` / ``PYTHONSAFEPATH``;
* the code runs in a fresh module that *is* ``sys.modules["__main__"]``
  from then on (pickling ``__main__.X`` for spawned workers, atexit handlers
  reading the script's globals), with the globals Python gives a script:
  ``__file__`` absolute, ``__spec__`` None (``-m``: the module's spec,
  ``__package__`` its parent);
* stdin, the signal dispositions and ``sys.excepthook`` are the process's;
  the code is compiled without fastprof's ``__future__`` flags.

What the script never says is inferred (:class:`ZeroCode`): steps end at
``optimizer.step()`` (torch's global post hook; a second optimizer stepped
in the same batch ends no second step), and every pass over a
``torch.utils.data.DataLoader`` is timed, with ``DataLoader.__iter__``
patched for the run's duration. The **train** loader is the one the steps
run in: its passes begin a step at each batch
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
more than an iterator).

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
DataLoader (at once when torch is already imported).
"""

from __future__ import annotations

import builtins
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import shutil
import sys
import time
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any, NamedTuple

from fastprof._core import FastprofWarning
from fastprof._loop_api import RunHost
from fastprof.memory.oom import is_oom

__all__ = ["CompileFailed", "Ended", "Target", "TargetError", "ZeroCode", "module_target", "run", "script_target"]


class TargetError(Exception):
    """The script or module cannot be run (one line; Python's exit status:
    2 for a script it cannot open, 1 for a module it cannot find)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CompileFailed(Exception):
    """The code does not compile: Python prints the ``SyntaxError`` (no
    traceback) and exits 1."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class Target:
    """What to run: its code, ``sys.argv[0]``, ``sys.path[0]`` and globals."""

    #: The script as given, or ``-m name``: for messages.
    label: str
    code: types.CodeType
    argv0: str
    path0: str | None
    main_globals: dict[str, Any]


def script_target(path: str) -> Target:
    """``python path``: read and compile the script (before anything runs)."""
    if os.path.isdir(path):
        raise TargetError(f"{path}: is a directory; give the script to run (e.g. {path}/__main__.py) or -m", 2)
    # Python makes __main__.__file__ absolute (cwd joined, not normalised)
    # and sys.path[0] the script's real directory; argv[0] stays as given.
    file = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    try:
        with io.open_code(file) as f:
            source = f.read()
    except OSError as e:
        raise TargetError(f"can't open file {file!r}: [Errno {e.errno}] {e.strerror}", 2) from None
    try:
        # dont_inherit: this module's `from __future__` must not reach the script.
        code = compile(source, file, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        raise CompileFailed(e) from None
    main_globals = {
        "__name__": "__main__",
        "__doc__": None,
        "__package__": None,
        "__loader__": importlib.machinery.SourceFileLoader("__main__", file),
        "__spec__": None,
        "__file__": file,
        "__cached__": None,
        "__builtins__": builtins,
    }
    return Target(path, code, path, os.path.dirname(os.path.realpath(file)), main_globals)


def module_target(name: str) -> Target:
    """``python -m name``: find the module (``sys.path[0]`` is the current
    directory first, as for ``-m``) and get its code, running nothing of it."""
    if not name or name.startswith("."):
        raise TargetError(f"-m {name}: relative module names are not supported", 1)
    _set_path0(os.getcwd())
    spec = _find(name, name)
    if spec.submodule_search_locations is not None:
        # A package runs its __main__ submodule, as python -m does.
        spec = _find(f"{name}.__main__", name)
        if spec.submodule_search_locations is not None:
            raise TargetError(f"-m {name}: {name}.__main__ is a package; it cannot be run", 1)
    loader = spec.loader
    if loader is None or not hasattr(loader, "get_code"):
        raise TargetError(f"-m {name}: {spec.name} has no code to run (a namespace package?)", 1)
    try:
        code = loader.get_code(spec.name)
    except SyntaxError as e:
        raise CompileFailed(e) from None
    except ImportError as e:
        raise TargetError(f"-m {name}: {' '.join(str(e).split())}", 1) from None
    if code is None:
        raise TargetError(f"-m {name}: no code object available for {spec.name}", 1)
    file = spec.origin if spec.has_location and spec.origin else None
    main_globals = {
        "__name__": "__main__",
        "__doc__": None,
        "__package__": spec.parent,
        "__loader__": loader,
        "__spec__": spec,
        "__file__": file,
        "__cached__": spec.cached if file else None,
        "__builtins__": builtins,
    }
    if file is None:
        del main_globals["__file__"], main_globals["__cached__"]
    return Target(f"-m {name}", code, file or name, os.getcwd(), main_globals)


def _find(name: str, asked: str) -> ModuleSpec:
    try:
        # Imports the parent packages, as python -m does.
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as e:
        raise TargetError(f"-m {asked}: no module named {e.name or name!r}", 1) from None
    except Exception as e:  # noqa: BLE001 - a parent package's own error, in one line
        why = " ".join(f"{type(e).__name__}: {e}".split())
        raise TargetError(f"-m {asked}: error while finding the module specification for {name!r} ({why})", 1) from None
    if spec is None:
        if name.endswith(".__main__"):
            raise TargetError(f"-m {asked}: {asked!r} is a package with no __main__ module; it cannot be run", 1)
        raise TargetError(f"-m {asked}: no module named {name!r} (looked in the current directory, then sys.path)", 1)
    return spec


def _set_path0(path: str) -> None:
    if getattr(sys.flags, "safe_path", False):
        return  # -P / PYTHONSAFEPATH: Python prepends nothing
    if sys.path:
        sys.path[0] = path
    else:
        sys.path.insert(0, path)


# ---------------------------------------------------------------- running


class Ended(NamedTuple):
    """How the code ended, as :func:`run` returns it."""

    #: None when the code ended normally, else what ended it (``SystemExit`` included).
    error: BaseException | None
    #: It failed before its first step (an argparse error, an import that
    #: failed): its files were removed, nothing is recorded.
    discarded: bool = False


def run(target: Target, args: Sequence[str], prof: RunHost) -> Ended:
    """Run ``target`` with ``args`` under ``prof`` (started here, closed
    here). What Python would print is printed first (an exception through
    ``sys.excepthook`` with the traceback from the script's own frame; a
    ``sys.exit("message")``'s message), then the Profiler closes: the trace
    is safe before the caller exits. Code that fails before its first step
    leaves nothing (:func:`_discard`)."""
    sys.argv = [target.argv0, *args]
    if target.path0 is not None:
        _set_path0(target.path0)
    main = types.ModuleType("__main__")
    main.__dict__.update(target.main_globals)
    sys.modules["__main__"] = main
    zero = ZeroCode(prof)
    out_dir_made = not prof.run_dir.parent.exists()
    # File times come from the kernel's coarse clock (a tick behind time.time()).
    started = time.time() - 1.0
    prof.start()
    # The script asked for no torch.profiler window: Kineto's log lines of
    # one that a trigger opens are not its output.
    prof.quiet_torch_windows()
    zero.install()
    # A Profiler the script starts itself takes the loop (its steps are the
    # run's): the inferred steps are unhooked then, not counted twice.
    prof.host_run(zero.uninstall)
    ended: BaseException | None = None
    try:
        exec(target.code, main.__dict__)
    except BaseException as e:  # noqa: BLE001 - the script's ending, whatever it is, is handled below
        ended = e
    try:
        if isinstance(ended, SystemExit):
            if ended.code is not None and not isinstance(ended.code, int):
                # Python prints such an exit's message, then exits 1: printed
                # here, before fastprof's own lines.
                print(ended.code, file=sys.stderr, flush=True)
        elif ended is not None:
            print_exception(ended, target.code)
        discard = _failed_before_a_step(prof, zero, ended) and _written_since(prof.rank_dir, started)
        if discard:
            prof.merge_enabled = False  # nor wait for the other ranks: there is nothing to merge
        _close(prof, ended)
        if discard:
            discard = _discard(prof, started, out_dir_made)
    finally:
        zero.uninstall()
    return Ended(ended, discard)


def _failed_before_a_step(prof: RunHost, zero: ZeroCode, ended: BaseException | None) -> bool:
    """The code failed (an exception, a non-zero exit) before any step of
    the run began: before its first optimizer step and before a batch of
    its train loader. An out-of-memory error is kept (its capture is the
    point), and so is a run that a script's own Profiler took over."""
    if ended is None or not prof.running or prof.successor is not None or zero.fetched or prof.batch:
        return False
    if isinstance(ended, SystemExit):
        return ended.code is not None and ended.code != 0
    return not is_oom(ended)


def _written_since(folder: Path, started: float) -> bool:
    """Whether every file in ``folder`` was written since ``started``: a
    resumed run's folder holds the earlier run's files, not this run's."""
    try:
        return all(p.lstat().st_mtime >= started for p in folder.rglob("*") if not p.is_dir())
    except OSError:
        return False


def _discard(prof: RunHost, started: float, out_dir_made: bool) -> bool:
    """Remove what this run wrote (it failed before its first step): this
    rank's folder (every file in it written since ``started``); then the run
    directory and the out_dir when nothing else is in them (the run
    directory's own hidden files, written since ``started``, go with it; the
    out_dir only when this process made it)."""
    rank_dir = prof.rank_dir
    try:
        if not _written_since(rank_dir, started):
            return False
        shutil.rmtree(rank_dir)
        run_dir = prof.run_dir
        left = list(run_dir.iterdir())
        if all(p.name.startswith(".") and p.is_file() and p.lstat().st_mtime >= started for p in left):
            for p in left:
                p.unlink()
            run_dir.rmdir()
            if out_dir_made:
                run_dir.parent.rmdir()
    except OSError:
        pass  # another rank's files, or the user's: left where they are
    return not rank_dir.exists()


def print_exception(exc: BaseException, code: types.CodeType | None = None) -> None:
    """Print ``exc`` as Python prints an uncaught exception: through
    ``sys.excepthook`` (the script's, if it set one), with the traceback
    starting at the frame of ``code`` (the script's top level), not in
    fastprof. Without ``code`` (the script never ran: it does not compile),
    no traceback, as Python prints a script's ``SyntaxError``."""
    tb = exc.__traceback__ if code is not None else None
    t = tb
    while t is not None and t.tb_frame.f_code is not code:
        t = t.tb_next
    if t is not None:
        tb = t
    try:
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    except BaseException as hook_error:  # noqa: BLE001 - as Python: say so, then the default print
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(exc), exc, tb)
    sys.stderr.flush()


def _close(prof: RunHost, ended: BaseException | None) -> None:
    """Close the Profiler as ``with prof:`` would on the way out (an OOM is
    captured, the reason recorded); a failure is one stderr line (the
    script may have turned warnings into errors)."""
    try:
        prof.close_after(ended)
    except Exception as e:  # noqa: BLE001 - profiling never changes how the job ends
        print(f"fastprof run: closing the profiler failed: {type(e).__name__}: {e}", file=sys.stderr)


# ------------------------------------------------------ zero code change


class ZeroCode:
    """Steps and loader timing for a script that never calls the Profiler
    (see the module documentation). :meth:`install` at start,
    :meth:`uninstall` at the end restores ``DataLoader.__iter__`` and
    removes the optimizer hook."""

    def __init__(self, prof: RunHost) -> None:
        self.prof = prof
        self._finder: _AfterImport | None = None
        self._loader_cls: Any = None
        self._original: Callable[[Any], Iterator[Any]] | None = None
        self._patched: Callable[[Any], Iterator[Any]] | None = None
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
            self._finder = _AfterImport("torch", self._on_torch)
            sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        self.off = True
        if self._finder is not None:
            self._finder.remove()
            self._finder = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        cls = self._loader_cls
        if cls is not None and cls.__dict__.get("__iter__") is self._patched:
            cls.__iter__ = self._original  # a patch made on top of ours stays
        self._loader_cls = None
        if self._dist_patch is not None:
            td, original, ours = self._dist_patch
            if getattr(td, "init_process_group", None) is ours:
                td.init_process_group = original
            self._dist_patch = None

    def _on_torch(self) -> None:
        """torch is imported: hook its optimizer steps and DataLoader passes."""
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
            from torch.utils.data import DataLoader
        except Exception as e:  # noqa: BLE001 - an old or partial torch: the run goes on untimed
            self._warn("cannot hook torch's optimizer and DataLoader", e)
            return
        # The Profiler's own hook (torch was imported before it started):
        # this one replaces it, so each optimizer step is counted once.
        self.prof.remove_optimizer_hook()
        self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        original = DataLoader.__iter__
        zero = self

        def __iter__(loader: Any) -> Iterator[Any]:
            return zero.open(loader)

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        __iter__.__doc__ = original.__doc__
        self._loader_cls, self._original, self._patched = DataLoader, original, __iter__
        DataLoader.__iter__ = __iter__  # type: ignore[method-assign,assignment]
        self._patch_init_process_group()

    def _patch_init_process_group(self) -> None:
        """The clock sync at start: the Profiler started before the script
        made its process group, so it runs right after the script's
        ``torch.distributed.init_process_group`` returns on every rank (a
        collective where all ranks already meet). Without it a run across
        nodes had only an end sync, skipped when the script destroys its
        group first, and the merge fell back on the hosts' NTP clocks."""
        try:
            import torch.distributed as td

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

    def open(self, loader: Any) -> Iterator[Any]:
        """The patched ``DataLoader.__iter__``: a timed pass, or the loader's
        own iterator where fastprof has nothing to do."""
        original = self._original
        assert original is not None
        try:
            if type(loader).__iter__ is not self._patched or not self._live():
                return original(loader)
            train = self._is_train(loader)
            name = "train" if train else self._name(loader)
        except Exception as e:  # noqa: BLE001 - never in the way of the job's data
            self._warn("DataLoader timing failed", e)
            return original(loader)
        self._serial += 1
        return _Pass(self, loader, name, train, self._serial, original)

    def _is_train(self, loader: Any) -> bool:
        """Is a pass over ``loader`` opened now the train pass? Not inside
        another train pass (validation mid-epoch), nor without autograd.
        Before the train loader is known, any other pass may be (its epoch
        waits for its first optimizer step); then the train loader's own
        passes are, or one over its dataset (a DataLoader made anew each
        epoch), or any once it is gone."""
        if self._train:
            return False
        import torch

        if not torch.is_grad_enabled():
            return False
        if self._train_loader is None:
            return True
        known = self._train_loader()
        return known is None or known is loader or getattr(known, "dataset", None) is getattr(loader, "dataset", ())

    def _name(self, loader: Any) -> str:
        name = self._names.get(loader)
        if name is None:
            n = len(self._names) + 1
            name = self._names[loader] = "val" if n == 1 else f"val{n}"
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


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback`` once the module ``name`` has been imported (after
    its code ran), by wrapping its loader's ``exec_module`` for that one
    import. Finds nothing itself: the other finders do."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback
        self._finding = False

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if fullname != self.name or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:  # noqa: BLE001 - the import fails as it would without fastprof
            return None
        finally:
            self._finding = False
        loader = None if spec is None else spec.loader
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        exec_module = loader.exec_module

        def exec_then_call(module: types.ModuleType) -> None:
            try:
                exec_module(module)
            finally:
                # The loader is this module's own: give back its method.
                loader.__dict__.pop("exec_module", None)
            self.remove()
            try:
                self.callback()
            except Exception as e:  # noqa: BLE001 - the job's import must succeed
                why = f"{type(e).__name__}: {e}"
                warnings.warn(f"fastprof run: after import {fullname}: {why}", FastprofWarning, stacklevel=2)

        try:
            loader.exec_module = exec_then_call  # type: ignore[method-assign]
        except AttributeError:  # a loader that takes no attributes: torch goes unhooked
            return None
        return spec
