"""A callback once a module has been imported: ``fastprof run`` hooks torch
after the script's own ``import torch`` ran, never before it (a script may
set ``TORCH_*`` / ``OMP_*`` variables or ``sys.path`` first, and a script
without torch pays nothing)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from typing import Any

from fastprof._core import FastprofWarning

__all__ = ["AfterImport"]


class AfterImport(importlib.abc.MetaPathFinder):
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
