"""A URL that names no place is refused before anything runs (issue #34,
item 1): ``s3://`` without a bucket, a scheme no filesystem serves
(``foo://x``), a URL that lost a slash (``s3:/b``). Every verb, option and
environment variable that takes a URL says one line naming it, exits 2,
makes no file or folder and starts no script; the Profiler raises
:class:`fastprof.ConfigError` at construction. Never a local folder whose
name starts with a scheme (``./s3:/x``, ``./foo:/x``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastprof

#: (the text given, what the one line must say)
BAD = [
    ("s3://", "s3:// needs a bucket: s3://BUCKET/prefix"),
    ("s3:///runs", "s3:// needs a bucket"),
    ("foo://x", "no filesystem serves foo://"),
    ("simplecache::gs://", "gs:// needs a bucket"),
    ("s3:/bucket/runs", "a URL needs two slashes: s3://"),
]


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A real (tiny) run directory to point verbs at."""
    out = tmp_path / "runs"
    with fastprof.Recorder(out_dir=out, run_name="r", sample_hz=0):
        with fastprof.span("step"):
            pass
    return out / "r"


def _cli(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastprof", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _verbs(run: Path, url: str, script: Path) -> dict[str, list[str]]:
    return {
        "upload": ["upload", str(run), url],
        "report -o": ["report", str(run), "-o", url],
        "report": ["report", url],
        "summary": ["summary", url],
        "diff": ["diff", str(run), url],
        "merge": ["merge", url],
        "merge -o": ["merge", str(run), "-o", url],
        "trigger": ["trigger", url],
        "run -o": ["run", "-o", url, str(script)],
        "demo -o": ["demo", "-o", url, "--epochs", "1"],
    }


@pytest.mark.parametrize(("url", "says"), BAD, ids=[b[0] for b in BAD])
def test_every_verb_refuses_a_url_that_names_no_place(url: str, says: str, run_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "script-ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    before_run = _tree(run_dir)
    for verb, argv in _verbs(run_dir, url, script).items():
        p = _cli(work, *argv)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2, (verb, p.returncode, p.stdout, p.stderr)
        assert len(lines) == 1, (verb, p.stderr)
        assert says in lines[0] and url in lines[0], (verb, lines[0])
        assert "Traceback" not in p.stderr
        assert _tree(work) == [], (verb, _tree(work))
        assert not marker.exists(), f"{verb}: the script ran"
    assert _tree(run_dir) == before_run


@pytest.mark.parametrize(("url", "says"), BAD, ids=[b[0] for b in BAD])
def test_fastprof_run_refuses_a_bad_out_dir_variable_before_the_script(url: str, says: str, tmp_path: Path) -> None:
    marker = tmp_path / "script-ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    work = tmp_path / "work"
    work.mkdir()
    p = _cli(work, "run", str(script), env={"FASTPROF_OUT_DIR": url})
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip()
    assert "\n" not in line and says in line and "FASTPROF_OUT_DIR" in line, line
    assert not marker.exists()
    assert _tree(work) == []


@pytest.mark.parametrize(("url", "says"), BAD, ids=[b[0] for b in BAD])
def test_the_profiler_and_recorder_refuse_it_at_construction(
    url: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for make in (lambda: fastprof.Profiler(url, "x"), lambda: fastprof.Recorder(out_dir=url, run_name="x")):
        with pytest.raises(fastprof.ConfigError, match="out_dir") as e:
            make()
        assert says in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("FASTPROF_OUT_DIR", url)
    with pytest.raises(fastprof.ConfigError, match="FASTPROF_OUT_DIR"):
        fastprof.Profiler(run_name="x")
    assert _tree(tmp_path) == []


def test_a_report_to_a_bucket_url_puts_its_files_there(run_dir: Path, s3_url: str) -> None:
    """``report -o s3://...`` is a place, not a local folder named ``s3:``."""
    import s3fs

    rep = fastprof.report(run_dir, out_dir=f"{s3_url}/rep")
    assert rep.files == [] and rep.urls
    names = {u.rsplit("/", 1)[-1] for u in rep.urls}
    assert "report.json" in names
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    listed = {k.rsplit("/", 1)[-1] for k in fs.ls(s3_url.removeprefix("s3://") + "/rep")}
    assert names <= listed
    assert not Path("s3:").exists()


def test_a_store_that_cannot_be_reached_is_one_line_for_every_verb(run_dir: Path, tmp_path: Path) -> None:
    """Item 5: the store down (nothing listens on the endpoint): every verb
    says one line naming the failure, exit 1, never the library's traceback."""
    dead = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
    }
    url = "s3://bucket/runs/r"
    spool = tmp_path / "spool" / "r"
    (spool / "rank0").mkdir(parents=True)
    (spool / "rank0" / "profiler.json").write_text("{}")
    verbs = {
        "report": ["report", url],
        "report -o": ["report", str(run_dir), "-o", "s3://bucket/out"],
        "summary": ["summary", url],
        "diff": ["diff", str(run_dir), url],
        "merge": ["merge", url],
        "merge -o": ["merge", str(run_dir), "-o", "s3://bucket/out.json.gz"],
        "trigger": ["trigger", url, "--wait", "1"],
        "upload": ["upload", str(spool), "s3://bucket/runs"],
    }
    for verb, argv in verbs.items():
        p = _cli(tmp_path, *argv, env=dead)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1, (verb, p.returncode, p.stderr)
        assert len(lines) == 1 and "Traceback" not in p.stderr, (verb, p.stderr)
        assert "127.0.0.1:9" in lines[0], (verb, lines[0])


@pytest.mark.parametrize("spool", ["s3://bucket/spool", "s3:/bucket/spool"])
def test_the_spool_must_be_a_local_directory(spool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fastprof.ConfigError, match="spool_dir"):
        fastprof.Profiler("s3://bucket/runs", "x", spool_dir=spool)
    monkeypatch.setenv("FASTPROF_SPOOL_DIR", spool)
    with pytest.raises(fastprof.ConfigError, match="FASTPROF_SPOOL_DIR"):
        fastprof.Recorder(out_dir="s3://bucket/runs", run_name="x")
    assert _tree(tmp_path) == []
