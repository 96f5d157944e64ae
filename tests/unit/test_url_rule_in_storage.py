"""Readers never ask whether a path is a URL (issue #35, item 2): a run is
opened through one view, ``fastprof.storage.run_view.open_run``, wherever it
lives, and the writers that decide where a recording goes ask the storage
package one question each, named for what it decides. So ``is_url`` (the
URL rule, defined with the names' contract in ``fastprof.recording.names``
and re-exported by ``fastprof.storage.urls``) is used only inside
``fastprof/storage/``: not called, not imported, not passed around anywhere
else (its definition is no use)."""

from __future__ import annotations

import ast
from pathlib import Path

import fastprof

ROOT = Path(fastprof.__file__).parent
STORAGE = "storage"


def _uses(root: Path) -> dict[str, list[str]]:
    """Every use of ``is_url`` under ``root`` (a call, a name, an attribute,
    an import), as ``file:line``, by the package's top folder."""
    out: dict[str, list[str]] = {}
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            used = (
                (isinstance(node, ast.Name) and node.id == "is_url")
                or (isinstance(node, ast.Attribute) and node.attr == "is_url")
                or (isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] == "is_url")
            )
            if used:
                out.setdefault(rel.parts[0], []).append(f"{rel.as_posix()}:{node.lineno}")
    return out


def test_only_the_storage_package_asks_whether_a_path_is_a_url() -> None:
    uses = _uses(ROOT)
    # The walk sees the rule where it lives (else this test could not fail).
    assert uses.get(STORAGE), "no use of is_url found in fastprof/storage/"
    outside = sorted(u for top, found in uses.items() if top != STORAGE for u in found)
    assert outside == [], "is_url used outside fastprof/storage/ (open the run with open_run): " + ", ".join(outside)
