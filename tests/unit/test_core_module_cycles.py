"""The Rust core's modules depend one way: no module reaches back into one
that depends on it, and the readers (trace/, analyze/) never reach into the
merger. Read from the sources: each `crate::module` / `super::module` a
module names (tests left out) is an edge."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "rust" / "fastprof-core" / "src"


def _module(path: Path) -> str | None:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    if not parts or parts[-1] == "tests" or parts[0] == "test_support":
        return None
    # trace/ is a layer of its own modules; elsewhere the top level is the unit.
    return "/".join(parts[:2]) if parts[0] == "trace" and len(parts) > 1 else parts[0]


def _code(text: str) -> str:
    text = re.sub(r"(?s)#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for f in sorted(SRC.rglob("*.rs")):
        me = _module(f)
        if me is None:
            continue
        code = _code(f.read_text())
        targets = set()
        for top, sub in re.findall(r"crate::([a-z_]+)(?:::([a-z_]+))?", code):
            targets.add(f"trace/{sub}" if top == "trace" and sub else top)
        # `super::x` in a module directly under trace/ is trace/x.
        parent = f.parent.parent if f.name == "mod.rs" else f.parent
        if parent == SRC / "trace":
            targets.update(f"trace/{m}" for m in re.findall(r"\bsuper::([a-z_]+)", code))
        edges.setdefault(me, set()).update(t for t in targets if t != me)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for t in sorted(edges.get(n, ())):
            if state.get(t) == 1:
                return [*path[path.index(t) :], t]
            if t not in state and (found := visit(t)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_graph_is_read_from_the_sources() -> None:
    edges = _edges()
    # Known one-way edges, so that a parser that finds nothing fails here.
    assert "trace/scan" in edges["merge"] and "record" in edges["registry"]
    assert "trace/inputs" in edges["trace/columns"]


def test_no_module_cycle_in_the_core() -> None:
    assert _cycle(_edges()) is None, " -> ".join(_cycle(_edges()) or [])


def test_readers_never_reach_into_the_merger() -> None:
    edges = _edges()
    for m in [m for m in edges if m.startswith("trace/")] + ["analyze"]:
        assert "merge" not in edges[m], m
