"""No import circle among fastprof's Python modules: cli verbs import their
error type from cli/errors.py (not back from cli/main.py), and reports never
import an integration (the caller of reports logs to MLflow).

Every import counts, at module level or inside a function: a circle hidden in
a function body is still a circle of responsibilities. Importing a module's
own parent package is not counted (importing a submodule runs it anyway),
nor an import under ``if TYPE_CHECKING:``: it never runs, and it is how the
parts split out of one class (the Profiler's exits and outputs) name the
class they serve in annotations."""

from __future__ import annotations

import ast
from pathlib import Path

import fastprof

ROOT = Path(fastprof.__file__).parent


def _imports() -> dict[str, set[str]]:
    mods: dict[str, Path] = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        pkg = m if f.name == "__init__.py" else m.rsplit(".", 1)[0]
        tree = ast.parse(f.read_text())
        typing_only = {
            id(n)
            for top in ast.walk(tree)
            if isinstance(top, ast.If) and ast.unparse(top.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for n in ast.walk(top)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            edges[m].update(t for t in targets if t in mods and t != m and not m.startswith(t + "."))
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
    assert _cycles(edges) == []


def test_reports_never_import_integrations() -> None:
    edges = _imports()
    bad = {m: sorted(e for e in ts if e.startswith("fastprof.integrations")) for m, ts in edges.items()}
    assert {m: v for m, v in bad.items() if m.startswith("fastprof.reports") and v} == {}
