"""No import circle among fastprof's Python modules: cli verbs import their
error type from cli/errors.py (not back from cli/main.py), reports never
import an integration (the caller of reports logs to MLflow), and the parts
around the training loop (triggers, exits, outputs, memory, ``fastprof run``)
name the Profiler through the protocols of ``fastprof/_loop_api.py``, never
its module.

Every import counts: at module level, inside a function (a circle hidden in
a function body is still a circle of responsibilities) and under ``if
TYPE_CHECKING:`` (a type-only import is a dependency all the same, and it is
how such a circle used to hide). Importing ``a.b.c`` also runs the package
``a.b`` first, so it counts as importing ``a.b``'s ``__init__`` too, unless
that package holds the importing module (Python has begun running it
already); the root package ``fastprof``, the public facade that imports the
rest, holds every module.

An import of a fastprof module inside a function is allowed only where the
module is optional or heavy to load, and says so: a trailing ``# lazy:
<reason>`` comment on the import. Everything else is imported at the top."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import fastprof

ROOT = Path(fastprof.__file__).parent
#: The comment that marks a function-level import of a fastprof module as deliberate.
LAZY = "# lazy:"


@dataclass(frozen=True)
class _Import:
    module: str
    target: str
    line: int
    in_function: bool
    text: str


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _import_statements() -> list[_Import]:
    """Every import of a fastprof module by a fastprof module, with the
    packages that importing it runs first."""
    mods = _modules()
    out: list[_Import] = []
    for m, f in mods.items():
        pkg = m if f.name == "__init__.py" else m.rsplit(".", 1)[0]
        source = f.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        in_function = {
            id(n)
            for top in ast.walk(tree)
            if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for n in ast.walk(top)
        }
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            text = " ".join(lines[node.lineno - 1 : node.end_lineno])
            for t in targets:
                if t not in mods:
                    continue
                parts = t.split(".")
                # The packages that import runs first, then the module itself.
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in mods and name != m and not m.startswith(name + "."):
                        out.append(_Import(m, name, node.lineno, id(node) in in_function, text))
    return out


def _imports() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in _modules()}
    for imp in _import_statements():
        edges[imp.module].add(imp.target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    edges = _imports()
    assert "fastprof.cli.errors" in edges and "fastprof.integrations.mlflow" in edges
    # Known edges, so that a reader that finds nothing fails here: a
    # type-only import (the protocols), a function-level one, and the package
    # a submodule import runs first.
    assert "fastprof._loop_api" in edges["fastprof.profiler.exits"]
    assert "fastprof.reports.html" in edges["fastprof.reports.report"]
    assert "fastprof.memory" in edges["fastprof.profiler.drivers.triggers.driver"]
    assert _cycles(edges) == []


def test_type_only_and_package_imports_are_counted() -> None:
    """The reader is checked on made-up edges: a circle closed by a
    ``TYPE_CHECKING`` import, or by the package a submodule import runs, is
    found."""
    edges = _imports()
    edges["fastprof._loop_api"].add("fastprof.profiler.loop")  # what `if TYPE_CHECKING: from ...loop import` adds
    assert any("fastprof._loop_api" in c for c in _cycles(edges))
    edges = _imports()
    edges["fastprof.memory.oom"].add("fastprof.profiler")  # what `from fastprof.profiler.x import y` adds
    assert any("fastprof.memory.oom" in c for c in _cycles(edges))


def test_reports_never_import_integrations() -> None:
    edges = _imports()
    bad = {m: sorted(e for e in ts if e.startswith("fastprof.integrations")) for m, ts in edges.items()}
    assert {m: v for m, v in bad.items() if m.startswith("fastprof.reports") and v} == {}


def test_the_loop_parts_never_import_the_profiler() -> None:
    """The parts around the loop type the Profiler as a protocol of
    ``fastprof._loop_api`` (so the Profiler's module can import them)."""
    edges = _imports()
    parts = [
        m
        for m in edges
        if m.startswith(("fastprof.profiler.drivers", "fastprof.memory", "fastprof.run"))
        or m in ("fastprof.profiler.exits", "fastprof.profiler.outputs", "fastprof._loop_api", "fastprof._process")
    ]
    assert "fastprof.run.zero_code" in parts
    assert {m: "fastprof.profiler.loop" for m in parts if "fastprof.profiler.loop" in edges[m]} == {}


def test_function_level_imports_say_why() -> None:
    """A fastprof module imported inside a function carries ``# lazy:
    <reason>`` (optional or heavy: lightning, plotly, rich, an integration);
    one at the top needs no reason, and a marker there would mean nothing."""
    unmarked = sorted(
        {f"{i.module}:{i.line}: {i.text}" for i in _import_statements() if i.in_function and LAZY not in i.text}
    )
    assert unmarked == [], "import these at the top, or mark why not (# lazy: <reason>)"
    stray = sorted({f"{i.module}:{i.line}" for i in _import_statements() if not i.in_function and LAZY in i.text})
    assert stray == []
    reasons = [i.text.split(LAZY, 1)[1].strip() for i in _import_statements() if i.in_function]
    assert reasons and all(reasons), "a lazy import says why"
