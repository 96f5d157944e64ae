"""The Rust core's modules depend one way: no module reaches back into one
that depends on it, the readers (trace/, analyze/) never reach into the
merger, and the offline half (src/offline/) never uses the in-process half
(src/runtime/). Read from the sources: each `crate::module` / `super::module`
a module names (tests left out) is an edge; the halves' prefix is not part of
a module's name here (`crate::runtime::registry` is `registry`)."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "rust" / "fastprof-core" / "src"
HALVES = ("runtime", "offline")


def _module(path: Path) -> str | None:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    if parts and parts[0] in HALVES:
        parts = parts[1:]
    if not parts or parts[-1] == "tests" or parts[0] == "test_support":
        return None
    # trace/ is a layer of its own modules; elsewhere the top level is the unit.
    return "/".join(parts[:2]) if parts[0] == "trace" and len(parts) > 1 else parts[0]


def _uncommented(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


def _code(text: str) -> str:
    return _uncommented(re.sub(r"(?s)#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text))


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for f in sorted(SRC.rglob("*.rs")):
        me = _module(f)
        if me is None:
            continue
        code = _code(f.read_text())
        targets = set()
        for top, sub in re.findall(r"crate::(?:runtime::|offline::)?([a-z_]+)(?:::([a-z_]+))?", code):
            targets.add(f"trace/{sub}" if top == "trace" and sub else top)
        # `super::x` in a module directly under trace/ is trace/x.
        parent = f.parent.parent if f.name == "mod.rs" else f.parent
        if parent == SRC / "offline" / "trace":
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


def _runtime_paths(code: str) -> list[str]:
    """The paths in `code` that lead into the runtime half: `crate::runtime`, a `super::` chain
    up to it, or a `crate::{...}` / `super::{...}` group with a `runtime` item. A bare
    `runtime` elsewhere is another name (the analysis's CUDA runtime role)."""
    found = re.findall(r"\b(?:crate|super)(?:::super)*::runtime\b", code)
    for group in re.findall(r"\b(?:crate|super)(?:::super)*::\{([^;]*)\}", code):
        found += [f"{{{item.strip()}}}" for item in group.split(",") if re.match(r"\s*runtime\b", item)]
    return found


def test_the_runtime_paths_are_read_from_the_sources() -> None:
    assert _runtime_paths("use super::super::runtime::clock;\nuse crate::{error, runtime::ring};")
    assert not _runtime_paths("let runtime = rd.runtime(corr);\nuse super::read::{runtime};")
    # The runtime half names itself this way, so a reader that finds nothing fails here.
    assert _runtime_paths((SRC / "runtime" / "registry.rs").read_text())


def test_the_offline_half_never_uses_the_runtime_half() -> None:
    """Reading, analysing and merging traces never reaches the recorder, its threads or its
    process-wide state, tests included."""
    offline = sorted((SRC / "offline").rglob("*.rs"))
    assert len(offline) > 20
    uses = {str(f.relative_to(SRC)): p for f in offline if (p := _runtime_paths(_uncommented(f.read_text())))}
    assert not uses, uses
