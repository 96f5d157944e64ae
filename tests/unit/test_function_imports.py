"""fastprof imports its modules at the top; an import inside a function is
the exception, and there are few of them.

One is a dependency that a reader of the module's top never sees, and one
that runs again at each call. What stays inside a function is what must not
load with ``import fastprof`` or ``fastprof run``: an optional or heavy
package (mlflow, jsonschema, pynvml, fsspec, plotly and rich through
``fastprof.reports``), torch where fastprof itself must start it (a torch
window, ``fastprof doctor``, the demo's workload), each in one place of its
module. Code that runs only once the job uses torch takes the job's module
from ``sys.modules`` instead: fastprof never imports torch into a job that did
not. The standard library is imported at the top.

A call of ``importlib.import_module`` or ``__import__`` inside a function
counts as an import too: it is one, written so that no reader sees it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fastprof

ROOT = Path(fastprof.__file__).parent
#: The most function-level imports the package may hold.
LIMIT = 12
_DYNAMIC = frozenset({"import_module", "__import__"})


def _dynamic(node: ast.AST) -> str | None:
    """The module a call of ``importlib.import_module`` / ``__import__`` names, else None."""
    if not isinstance(node, ast.Call):
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if name not in _DYNAMIC:
        return None
    arg = node.args[0] if node.args else None
    return f"{name}({arg.value if isinstance(arg, ast.Constant) else '...'})"


def function_imports(root: Path = ROOT) -> list[str]:
    """``file:line module`` for every import inside a function body under ``root``, in file and line order."""
    out: list[tuple[str, int, str]] = []
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        seen: set[int] = set()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for node in ast.walk(fn):
                if id(node) in seen:
                    continue  # a nested function's import, met from the outer one already
                if isinstance(node, ast.Import):
                    what = ", ".join(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom):
                    what = "." * node.level + (node.module or "")
                else:
                    dyn = _dynamic(node)
                    if dyn is None:
                        continue
                    what = dyn
                seen.add(id(node))
                out.append((f.relative_to(root).as_posix(), node.lineno, what))
    return [f"{path}:{line} {what}" for path, line, what in sorted(out, key=lambda x: x[:2])]


def test_few_imports_inside_functions() -> None:
    found = function_imports()
    listing = "\n  ".join(found)
    assert len(found) <= LIMIT, (
        f"{len(found)} imports inside functions (at most {LIMIT}): import at the top, take the job's torch "
        f"from sys.modules, or import an optional package in one helper of its module:\n  {listing}"
    )


def test_the_walk_finds_every_kind(tmp_path: Path) -> None:
    """The reader is checked on a made-up package: statements in functions,
    methods, nested functions and dynamic imports count, once each; the
    module's own top and ``if TYPE_CHECKING:`` do not."""
    (tmp_path / "m.py").write_text(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import torch\n"
        "def f():\n"
        "    import json\n"
        "    def g():\n"
        "        from . import sibling\n"
        "    return g\n"
        "class C:\n"
        "    async def h(self):\n"
        "        import importlib\n"
        "        return importlib.import_module('torch'), __import__('x')\n"
    )
    assert function_imports(tmp_path) == [
        "m.py:6 json",
        "m.py:8 .",
        "m.py:12 importlib",
        "m.py:13 import_module(torch)",
        "m.py:13 __import__(x)",
    ]
