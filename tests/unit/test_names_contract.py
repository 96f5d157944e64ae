"""One contract for names (#35, item 3): the names the recorder and the
Profiler write and the readers, reports and CLI read (spans, counters,
instants, segment and rank files, run markers) are spelled once, in
``fastprof/recording/names.py``; every other module imports them, so writer
and reader cannot drift. The names the Rust core also reads are defined in
the core (``fastprof_core::contract``) and taken from ``_core``.

The scan reads every module of the package (the AST, docstrings and other
bare string statements left out) and fails on a literal that spells a name
of the contract:

* a literal equal to a name (``"phase.gpu [ms]"``, ``"profiler.json"``), or a
  path ending in one (``"rank*/profiler.json"``, ``f"rank{r}/profiler.json"``);
* a literal that starts with one of the prefixes records are built from
  (``"loader."``, ``"phase."``, ``"torch.window."``): ``f"loader.{name}.next"``;
* a segment file name or pattern (``"fastprof.*.json.gz"``, ``".json.gz.part"``);
* a prefix or suffix of the contract handed to ``startswith``/``endswith``
  (``name.startswith("fastprof.")``);
* the step span's bare word ``"step"`` where it names a record: compared
  (``name == "step"``) or handed to a reader or recorder call
  (``data.spans("step", r)``, ``read_columns(names=[..., "step"])``). Elsewhere
  ``"step"`` is a JSON key or a column header, not the span.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import fastprof
from fastprof import _core
from fastprof.recording import names

ROOT = Path(fastprof.__file__).parent
NAMES_PY = ROOT / "recording" / "names.py"

#: Modules being rewritten now (the Profiler's loop.py and the drivers it is
#: split into, the triggers, the anatomy's hooks) and the literals they still
#: spell: to be emptied as they import from names.py.
ALLOWED: dict[str, set[str]] = {}

#: Calls whose arguments name a record (readers, the recorder, the step loop).
RECORD_CALLS = frozenset({"spans", "counter", "span", "instant", "name_id", "read_columns", "_complete", "_StepLoop"})
#: Calls whose argument is a prefix or a suffix of a name.
AFFIX_CALLS = frozenset({"startswith", "endswith", "removeprefix", "removesuffix"})


def _whole_names() -> set[str]:
    """Every full name of the contract: its string constants and the names
    its functions make for the loaders fastprof names itself."""
    out = {
        v
        for k, v in vars(names).items()
        if k.isupper() and isinstance(v, str) and v not in _fragments() and v != names.STEP_SPAN
    }
    out |= set(names.PHASE_SPANS.values()) | {name for _, name in names.CUDA_COUNTERS}
    for loader in (names.TRAIN_LOADER, names.VAL_LOADER):
        out |= {
            f(loader)
            for f in (
                names.loader_next,
                names.loader_wait,
                names.loader_batch_size,
                names.loader_iter,
                names.loader_fetch,
                names.loader_worker_init,
            )
        }
    out.add(names.SEGMENT_SUFFIX + names.OPEN_SUFFIX)
    return out


def _fragments() -> set[str]:
    """Parts names are built from, which alone are common words or suffixes
    (``".json.gz"``, ``"train"``): found only where they are used as affixes."""
    return {
        names.SEGMENT_PREFIX,
        names.SEGMENT_SUFFIX,
        names.OPEN_SUFFIX,
        names.RECORD_PREFIX,
        names.LOADER_PREFIX,
        names.LOADER_NEXT_SUFFIX,
        names.PHASE_PREFIX,
        names.TORCH_WINDOW_PREFIX,
        names.TRAIN_LOADER,
        names.VAL_LOADER,
    }


#: Prefixes a literal must not start with: records are built from them.
PREFIXES = (names.LOADER_PREFIX, names.PHASE_PREFIX, names.TORCH_WINDOW_PREFIX)


def _bare_strings(tree: ast.AST) -> set[int]:
    """Ids of string statements (docstrings and the like): prose, not code."""
    return {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
    }


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _step_uses(tree: ast.AST) -> Iterator[ast.Constant]:
    """The ``"step"`` literals that name the step span (see the module's doc)."""

    def flat(n: ast.AST) -> Iterator[ast.AST]:
        yield n
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            for e in n.elts:
                yield from flat(e)
        if isinstance(n, ast.Starred):
            yield from flat(n.value)

    for n in ast.walk(tree):
        operands: list[ast.AST] = []
        if isinstance(n, ast.Compare):
            operands = [n.left, *n.comparators]
        elif isinstance(n, ast.Call) and _call_name(n) in RECORD_CALLS:
            operands = [*n.args, *(k.value for k in n.keywords)]
        for op in operands:
            for e in flat(op):
                if isinstance(e, ast.Constant) and e.value == names.STEP_SPAN:
                    yield e


def _spelled(path: Path) -> list[tuple[int, str]]:
    """(line, literal) of each name of the contract ``path`` spells."""
    tree = ast.parse(path.read_text())
    prose = _bare_strings(tree)
    whole = _whole_names()
    files = {v for v in whole if "." in v and " " not in v and "/" not in v}
    segment_prefix = names.SEGMENT_PREFIX
    affixes = _fragments() - {names.TRAIN_LOADER, names.VAL_LOADER, names.SEGMENT_SUFFIX}
    found: list[tuple[int, str]] = []
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for n in ast.walk(tree):
        if not isinstance(n, ast.Constant) or not isinstance(n.value, str) or id(n) in prose:
            continue
        s = n.value
        last = s.rsplit("/", 1)[-1]
        starts_record = s.startswith(PREFIXES) and (id(n) not in in_fstring or _first_in_fstring(tree, n))
        if (
            s in whole
            or (last in files and last != s)
            or starts_record
            or (s.startswith(segment_prefix) and names.SEGMENT_SUFFIX in s)
            or names.SEGMENT_SUFFIX + names.OPEN_SUFFIX in s
        ):
            found.append((n.lineno, s))
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and _call_name(n) in AFFIX_CALLS:
            for a in n.args:
                for e in a.elts if isinstance(a, ast.Tuple) else [a]:
                    if isinstance(e, ast.Constant) and e.value in affixes:
                        found.append((e.lineno, e.value))
    found += [(e.lineno, str(e.value)) for e in _step_uses(tree)]
    return sorted(set(found))


def _first_in_fstring(tree: ast.AST, const: ast.Constant) -> bool:
    """Whether ``const`` is the leading literal of its f-string (``f"loader.{x}"``,
    not the middle of a message)."""
    return any(isinstance(n, ast.JoinedStr) and n.values and n.values[0] is const for n in ast.walk(tree))


def _modules() -> Iterator[tuple[str, Path]]:
    for f in sorted(ROOT.rglob("*.py")):
        if f != NAMES_PY:
            yield f.relative_to(ROOT).as_posix(), f


def test_no_module_spells_a_name_of_the_contract() -> None:
    offenders = []
    for rel, f in _modules():
        for line, literal in _spelled(f):
            if literal not in ALLOWED.get(rel, ()):
                offenders.append(f"{rel}:{line}: {literal!r}")
    assert not offenders, "import these from fastprof.recording.names:\n" + "\n".join(offenders)


def test_the_scan_finds_each_kind_of_copy(tmp_path: Path) -> None:
    """A scan that finds nothing passes everything: each kind is caught."""
    src = tmp_path / "m.py"
    src.write_text(
        '"""Docstrings may say phase.gpu [ms] and loader.train.next."""\n'
        'A = "phase.gpu [ms]"\n'
        'B = data.spans("loader.train.next", r)\n'
        'C = f"loader.{name}.wait_ms"\n'
        'D = run.glob("rank*/profiler.json")\n'
        'E = f"rank{r}/triggers.json"\n'
        'F = p.rglob("fastprof.*.json.gz")\n'
        'G = n.endswith(".json.gz.part")\n'
        'H = n.startswith("fastprof.")\n'
        'I = name == "step"\n'
        'J = read_columns(x, names=[stage, "step"])\n'
        'K = {"step": 3, "headers": ["step", "rank"]}\n'
        'L = f"time in loader.train.next, see {x}"\n'
    )
    got = {line for line, _ in _spelled(src)}
    assert got == set(range(2, 12)), got


def test_the_core_and_the_package_read_the_same_names() -> None:
    # Taken from the core, not copied: the same objects.
    for k in ("STEP_SPAN", "STEP_COUNTER", "LOADER_PREFIX", "SEGMENT_PREFIX", "PROFILER_JSON", "UNIFIED_TRACE"):
        assert getattr(names, k) is getattr(_core, k), k
    # What the recorder writes is what the readers find: a segment's name by
    # both rules, and the train loader's wait is the loader pattern the core's
    # analysis looks for.
    seg = names.segment_name(4, open=True)
    assert names.is_open_segment_name(seg) and names.SEGMENT.match(seg)
    assert names.loader_of_next(names.TRAIN_NEXT) == names.TRAIN_LOADER
    assert names.loader_of_next(names.loader_fetch(names.TRAIN_LOADER)) is None
    assert set(names.OWN_JSON_FILES) >= {names.PROFILER_JSON, names.TRIGGERS_JSON, names.LIVE_JSON, names.OOM_JSON}


def test_the_url_rule_is_the_cores() -> None:
    urls = ["s3://bucket/runs/run1", "file:///tmp/x", "memory://a", "simplecache::s3://b/x", "gs://b", "s3a://b"]
    paths = ["C://x", "C:\\runs", "runs/s3://x", "/tmp/s3://x", "1s://x", "-s3://x", "s3:/b", "", "s3\udcff://x"]
    for u in urls:
        assert names.is_url(u) and _core._is_url(u), u
    for p in paths:
        assert not names.is_url(p) and not _core._is_url(p), p
    assert not names.is_url(Path("s3://b/x"))
