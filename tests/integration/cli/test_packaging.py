"""The package as a user installs it: its name on the index, its one version,
and extras that resolve to versions that work.

``fastprof`` on the Python package index is an unrelated project, so the
distribution is ``fastprof-torch`` (import name and command ``fastprof``):
every line that tells a user what to install must say so. The version is set
once (Cargo.toml) and every file fastprof writes carries it, the same as the
CHANGELOG's newest release. The tests marked ``slow`` resolve each extra in a
fresh environment from PyPI with uv (no build of the extension) and run the
S3 store on the floor versions against moto's server.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import fastprof
from fastprof import _core
from fastprof._package import DISTRIBUTION, pip_install
from moto_s3 import MotoServer, child_env

try:
    import tomllib
except ImportError:  # Python 3.10: pytest and mypy bring tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
BASE: list[str] = PYPROJECT["project"]["dependencies"]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def _reqs(specs: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, specs)}


def _floor(req: Requirement) -> Version | None:
    """The lowest version ``req`` allows (its ``>=`` or ``==``), None without one."""
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    return max(floors) if floors else None


# ------------------------------------------------------------------- name


def test_the_distribution_is_ours_and_installs_fastprof_and_its_command() -> None:
    assert PYPROJECT["project"]["name"] == DISTRIBUTION
    assert canonicalize_name(DISTRIBUTION) != "fastprof"  # the index's fastprof is another project
    dist = importlib.metadata.distribution(DISTRIBUTION)
    scripts = {e.name: e.value for e in dist.entry_points if e.group == "console_scripts"}
    assert scripts == {"fastprof": "fastprof.cli.main:main"}
    assert pip_install("s3") == f"pip install '{DISTRIBUTION}[s3]'"


#: An install line that names the index's ``fastprof``: ``fastprof[s3]``, or
#: ``pip install fastprof`` without our suffix.
WRONG_NAME = re.compile(r"(?<![\w.-])fastprof\[\w+(?:,\s*\w+)*\]|pip install\s+(?:-\S+\s+)*['\"]?fastprof(?![\w-])")


def _texts() -> list[Path]:
    """Every doc, help text and message source a user reads (the CHANGELOG
    is history; _package.py and this file name the wrong spelling on purpose)."""
    skip = {ROOT / "python/fastprof/_package.py", Path(__file__).resolve()}
    found = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", *sorted((ROOT / "docs").glob("*.md"))]
    for tree in ("python", "benches", "tests"):
        found += sorted(p for p in (ROOT / tree).rglob("*") if p.suffix in (".py", ".pyi", ".md", ".sh", ".toml"))
    return [p for p in found if p.is_file() and p.resolve() not in skip]


def test_every_install_hint_names_our_distribution() -> None:
    wrong = []
    for path in _texts():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if WRONG_NAME.search(line):
                wrong.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not wrong, "install lines naming the index's unrelated fastprof:\n" + "\n".join(wrong)


# ---------------------------------------------------------------- version


def _changelog_release() -> str:
    """The CHANGELOG's newest released section (``## 0.2.0 (date)``), below Unreleased."""
    heads = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    released = [h for h in heads if h != "Unreleased"]
    assert released and re.fullmatch(r"\d+\.\d+\.\d+", released[0]), heads[:3]
    return released[0]


JOB = textwrap.dedent(
    """
    import sys, fastprof
    with fastprof.Profiler(sys.argv[1], "v", torch=None, sample_hz=20) as prof:
        for _ in range(6):
            with fastprof.span("forward"):
                sum(range(10000))
            prof.step()
    """
)


def test_one_version_in_the_package_every_file_and_the_changelog(tmp_path: Path) -> None:
    release = _changelog_release()
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    assert cargo == release, "Cargo.toml's version is the one place the version is set"
    assert importlib.metadata.version(DISTRIBUTION) == release, "the installed metadata (rebuild: make dev)"
    assert fastprof.__version__ == _core.__version__ == release
    cli = subprocess.run([sys.executable, "-m", "fastprof", "--version"], capture_output=True, text=True, timeout=110)
    assert cli.stdout.strip() == f"fastprof {release}", cli

    job = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp_path / "runs")], capture_output=True, text=True, timeout=110
    )
    assert job.returncode == 0, job.stderr
    run = tmp_path / "runs" / "v"
    rep = subprocess.run(
        [sys.executable, "-m", "fastprof", "report", str(run)], capture_output=True, text=True, timeout=110
    )
    assert rep.returncode == 0, rep.stderr
    written = {
        "segment otherData": json.loads(gzip.decompress(next((run / "rank0").glob("fastprof.*.json.gz")).read_bytes()))[
            "otherData"
        ]["version"],
        "trace.json.gz otherData": json.loads(gzip.decompress((run / "trace.json.gz").read_bytes()))["otherData"][
            "version"
        ],
        "profiler.json": json.loads((run / "rank0" / "profiler.json").read_text())["version"],
        "report.json": json.loads((run / "reports" / "report.json").read_text())["fastprof_version"],
    }
    assert written == dict.fromkeys(written, release)
    assert f"fastprof {release} · schema v" in (run / "reports" / "report.html").read_text()


def test_the_readme_and_docs_name_the_report_schema_the_code_writes() -> None:
    """Every report is written at SCHEMA_VERSION and ``diff`` reads every
    schema checked in: README and docs/reports.md say so (they said v3, and
    that diff reads v1 and v2)."""
    from fastprof.cli.diff import known_versions
    from fastprof.reports import SCHEMA_VERSION

    readme = (ROOT / "README.md").read_text()
    assert set(re.findall(r"report\.v(\d+)\.json", readme)) == {str(SCHEMA_VERSION)}
    assert known_versions() == list(range(1, SCHEMA_VERSION + 1))
    assert f"`fastprof diff` reads reports of schema v1 to v{SCHEMA_VERSION}" in readme
    docs = " ".join((ROOT / "docs" / "reports.md").read_text().split())
    assert (
        f"follows `schema/report.v{SCHEMA_VERSION}.json` (JSON Schema 2020-12, `schema_version` {SCHEMA_VERSION}"
        in docs
    )


# --------------------------------------------------------------- extras


def _makefile_deps() -> dict[str, Requirement]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("DEPS :="))
    return _reqs(re.findall(r"'([^']+)'", line))


def test_makefile_deps_are_pyprojects_requirements() -> None:
    """make dev installs DEPS by hand (uv, no build): each is the same
    requirement as pyproject's, and the test extra is all there."""
    declared: dict[str, set[str]] = {}
    for spec in BASE + PYPROJECT["build-system"]["requires"] + [s for v in EXTRAS.values() for s in v]:
        r = Requirement(spec)
        declared.setdefault(canonicalize_name(r.name), set()).add(str(r))
    deps = _makefile_deps()
    for name, req in deps.items():
        assert name in declared, f"Makefile DEPS has {req}, pyproject.toml does not"
        assert str(req) in declared[name], f"Makefile DEPS {req} against pyproject.toml's {sorted(declared[name])}"
    for name, req in _reqs(EXTRAS["test"] + BASE).items():
        assert name in deps and str(deps[name]) == str(req), f"{req} (pyproject) is not in Makefile's DEPS"


def test_every_requirement_has_a_floor() -> None:
    """Unfloored, a resolver that meets an older pin falls back as far as it
    must: s3fs 0.4.2 of 2019."""
    for extra, specs in {"(base)": BASE, **EXTRAS}.items():
        for spec in specs:
            assert _floor(Requirement(spec)) is not None, f"[{extra}] {spec} has no floor"


def _uv(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if UV is None:
        pytest.skip("uv is not installed (make dev installs it)")
    return subprocess.run(
        [UV, *args], capture_output=True, text=True, timeout=280, cwd=cwd, env={**os.environ, "NO_COLOR": "1"}
    )


def _pins(out: str) -> dict[str, Version]:
    return {canonicalize_name(m[1]): Version(m[2]) for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", out, flags=re.M)}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_each_extra_resolves_in_a_fresh_environment_at_or_above_its_floors(extra: str, tmp_path: Path) -> None:
    """pyproject.toml's own metadata, read by uv without building anything,
    resolved from PyPI for this Python as if nothing were installed."""
    r = _uv(
        "pip", "compile", str(ROOT / "pyproject.toml"), "--extra", extra, "--no-build", "--no-header",
        "--no-annotate", "--quiet", "--python", sys.executable, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    pins = _pins(r.stdout)
    for name, req in _reqs(BASE + EXTRAS[extra]).items():
        floor = _floor(req)
        assert floor is not None and pins[name] >= floor and req.specifier.contains(pins[name]), (req, pins[name])
    if extra in ("s3", "test"):
        assert pins["s3fs"] >= Version("2026.2.0") and pins["fsspec"] == pins["s3fs"], pins
        # s3fs's aiobotocore brings a botocore that sends If-None-Match.
        assert pins["botocore"] >= Version("1.36"), pins


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_older_boto3_never_drags_s3fs_back_to_2019(tmp_path: Path) -> None:
    """An environment that holds boto3 1.35 (installed, or pinned by another
    package): with no floor uv and pip settled on s3fs 0.4.2, which fsspec
    warns about on every command and which cannot create an object once.
    With the floor the resolution is refused, naming s3fs."""
    (tmp_path / "s3.txt").write_text("\n".join([*EXTRAS["s3"], "boto3==1.35.0"]) + "\n")
    r = _uv("pip", "compile", "s3.txt", "--no-build", "--no-header", "--quiet", cwd=tmp_path)
    pins = _pins(r.stdout)
    if r.returncode == 0:
        assert pins["s3fs"] >= Version("2026.2.0"), pins
    else:
        assert "s3fs" in r.stderr and "No solution found" in r.stderr, r.stderr


S3_PROBE = textwrap.dedent(
    """
    import sys, fsspec, s3fs
    from fastprof.storage.store import StoreConflictError, open_store
    print("versions", s3fs.__version__, fsspec.__version__, s3fs.__file__)
    s3fs.S3FileSystem().mkdir("floor")
    store = open_store("s3://floor/runs")
    a, b = sys.argv[1], sys.argv[2]
    assert store.put(a, "rank0/profiler.json").action == "uploaded"
    assert store.put(a, "rank0/profiler.json").action == "same"
    try:
        store.put(b, "rank0/profiler.json")
    except StoreConflictError as e:
        print("refused", e)
    print("kept", store.fs.cat_file(store.path("rank0/profiler.json")).decode())
    """
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_s3_store_works_on_the_floor_versions(tmp_path: Path) -> None:
    """[s3] installed fresh (into a folder of its own, put ahead of the
    venv's) at its floors, the store run on it against moto's S3 server: an
    object is created once, a second writer with other content refused."""
    site = tmp_path / "site"
    r = _uv(
        "pip", "install", "--quiet", "--no-build", "--resolution", "lowest-direct", "--target", str(site),
        "--python", sys.executable, *EXTRAS["s3"], cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (tmp_path / "a.json").write_text('{"job": "a"}')
    (tmp_path / "b.json").write_text('{"job": "bb"}')
    server = MotoServer()
    server.start()
    try:
        p = subprocess.run(
            [sys.executable, "-c", S3_PROBE, "a.json", "b.json"],
            capture_output=True,
            text=True,
            timeout=110,
            cwd=tmp_path,
            env=child_env(server, PYTHONPATH=str(site)),
        )
    finally:
        server.stop()
    assert p.returncode == 0, p.stderr
    floor = _floor(_reqs(EXTRAS["s3"])["s3fs"])
    assert f"versions {floor} {floor} {site}" in p.stdout, p.stdout
    assert "refused s3://floor/runs/rank0/profiler.json already exists with other content" in p.stdout, p.stdout
    assert 'kept {"job": "a"}' in p.stdout
    assert "very old" not in p.stderr, p.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_adding_an_extra_to_an_installed_fastprof_builds_nothing(tmp_path: Path) -> None:
    """The line every message gives (pip install 'fastprof-torch[s3]') beside
    this installed fastprof: pip would install the extra's packages, never
    fastprof-torch again (the issue's [s3] install rebuilt the extension: 3 min)."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", f"{DISTRIBUTION}[s3]"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    names = {canonicalize_name(i["metadata"]["name"]) for i in report["install"]}
    assert canonicalize_name(DISTRIBUTION) not in names, names
