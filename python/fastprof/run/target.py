"""What ``fastprof run`` runs: a script or a ``-m`` module, found and
compiled before anything starts, with the ``sys.argv[0]``, ``sys.path[0]``
and globals Python gives it (the runpy semantics memray's ``run`` keeps):

* ``sys.argv`` is ``[script as given, *args]`` (``-m``: the module's file);
  ``sys.path[0]`` the script's real directory (``-m``: the current
  directory), unless ``-P`` / ``PYTHONSAFEPATH``;
* the globals: ``__file__`` absolute, ``__spec__`` None (``-m``: the
  module's spec, ``__package__`` its parent);
* the code is compiled without fastprof's ``__future__`` flags.

A script that cannot be opened is Python's status 2, a module that cannot
be found 1 (:class:`TargetError`); code that does not compile is
:class:`CompileFailed` (Python prints the ``SyntaxError`` and exits 1).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import os
import sys
import types
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from typing import Any

__all__ = ["CompileFailed", "Target", "TargetError", "module_target", "script_target", "set_path0"]


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
    set_path0(os.getcwd())
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


def set_path0(path: str) -> None:
    if getattr(sys.flags, "safe_path", False):
        return  # -P / PYTHONSAFEPATH: Python prepends nothing
    if sys.path:
        sys.path[0] = path
    else:
        sys.path.insert(0, path)
