"""Exit codes and messages of every verb (issue #23, items 15-19): bad input
is exit 2 and one line naming the file or flag, never a traceback, for every
verb; an up-to-date merge output is exit 0; help and titles say what they
are. The CLI runs as a real subprocess (``python -m fastprof``) on real
files: a recording, a directory, files that are not traces, JSON nested
100,000 deep, numbers no flag can take."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastprof
from fastprof.cli.main import main

DEEP = 100_000


def _cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    return subprocess.run(
        [sys.executable, "-m", "fastprof", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def _record(out: Path, name: str = "run") -> Path:
    """A real recording: ``out/name/rank0/fastprof.0.json.gz``."""
    with fastprof.Recorder(out_dir=out, run_name=name, sample_hz=0):
        for i in range(3):
            with fastprof.span("step", step=i):
                fastprof.instant("x")
    return out / name


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad_input")
    run = _record(d / "runs")
    (d / "empty_dir").mkdir()
    (d / "notjson.json").write_text("this is not a trace")
    (d / "deep.json").write_text("[" * DEEP + "]" * DEEP)
    # A report.json in name and schema, too deep for Python's json (RecursionError).
    (d / "deep_report.json").write_text(
        '{"schema": "fastprof.report", "schema_version": 3, "x": ' + "[" * DEEP + "]" * DEEP + "}"
    )
    # A number past Python's 4300-digit limit for int(str).
    (d / "bigint_report.json").write_text('{"schema": "fastprof.report", "schema_version": ' + "9" * 5000 + "}")
    # A run whose live.json (written by the job, read by fastprof trigger) nests too deeply.
    deep_live = _record(d / "runs", "deep_live")
    (deep_live / "rank0" / "live.json").write_text('{"rank": 0, "x": ' + "[" * DEEP + "]" * DEEP + "}")
    return {
        "run": run,
        "deep_live": deep_live,
        "trace": run / "rank0" / "fastprof.0.json.gz",
        "dir": d / "empty_dir",
        "notjson": d / "notjson.json",
        "deep": d / "deep.json",
        "deep_report": d / "deep_report.json",
        "bigint_report": d / "bigint_report.json",
        "missing": d / "nope",
    }


BIG = "99999999999999999999999"

# (argv, the name the one line must say). {name}: a file of the fixture;
# {out}: a fresh path that must not exist afterwards.
CASES: list[tuple[tuple[str, ...], str]] = [
    # merge: paths
    (("merge", "{missing}", "-o", "{out}"), "nope"),
    (("merge", "{dir}", "-o", "{out}"), "empty_dir"),
    (("merge", "{notjson}", "-o", "{out}"), "notjson.json"),
    (("merge", "{deep}", "-o", "{out}"), "deep.json"),
    (("merge", "{run}", "-o", "{notjson}"), "notjson.json"),  # exists, and is no merge of the run
    (("merge", "{run}", "-o", "{trace}/sub/m.json"), "fastprof.0.json.gz/sub"),
    # merge: numbers
    (("merge", "{run}", "-o", "{out}", "--ranks", "a"), "--ranks"),
    (("merge", "{run}", "-o", "{out}", "--ranks", BIG), "--ranks"),
    (("merge", "{run}", "-o", "{out}", "--ranks", "0-99999999999"), "--ranks"),
    (("merge", "{run}", "-o", "{out}", "--ranks", "3-1"), "--ranks"),
    (("merge", "{run}", "-o", "{out}", "--steps", "a:b"), "--steps"),
    (("merge", "{run}", "-o", "{out}", "--steps", f"1:{BIG}"), "--steps"),
    (("merge", "{run}", "-o", "{out}", "--start", "nan"), "--start"),
    (("merge", "{run}", "-o", "{out}", "--start", "inf"), "--start"),
    (("merge", "{run}", "-o", "{out}", "--start", "1e308"), "--start"),
    (("merge", "{run}", "-o", "{out}", "--start", "soon"), "--start"),
    (("merge", "{run}", "-o", "{out}", "--end=-1"), "--end"),
    (("merge", "{run}", "-o", "{out}", "--max-bytes", "nan"), "--max-bytes"),
    (("merge", "{run}", "-o", "{out}", "--max-bytes", "1e308"), "--max-bytes"),
    (("merge", "{run}", "-o", "{out}", "--max-bytes", BIG), "--max-bytes"),
    (("merge", "{run}", "-o", "{out}", "-j", "1e308"), "-j/--threads"),
    # report and summary
    (("report", "{missing}", "-o", "{out}"), "nope"),
    (("report", "{dir}", "-o", "{out}"), "empty_dir"),
    (("report", "{notjson}", "-o", "{out}"), "notjson.json"),
    (("report", "{deep}", "-o", "{out}"), "deep.json"),
    (("report", "{run}", "-o", "{out}", "--warmup-steps", "nan"), "--warmup-steps"),
    (("report", "{run}", "-o", "{out}", "--warmup-steps", "-1"), "--warmup-steps"),
    (("report", "{run}", "-o", "{out}", "--warmup-steps", BIG), "--warmup-steps"),
    (("report", "{run}", "-o", "{out}", "--batch-size", "0"), "--batch-size"),
    (("report", "{run}", "-o", "{out}", "--batch-size", "inf"), "--batch-size"),
    (("summary", "{missing}"), "nope"),
    (("summary", "{deep}"), "deep.json"),
    (("summary", "{run}", "--batch-size", "1e308"), "--batch-size"),
    # diff: a CI gate reads exit 1 as "threshold crossed"
    (("diff", "{missing}", "{run}"), "nope"),
    (("diff", "{run}", "{missing}"), "nope"),
    (("diff", "{dir}", "{run}"), "empty_dir"),
    (("diff", "{deep}", "{run}"), "deep.json"),
    (("diff", "{deep_report}", "{run}"), "deep_report.json"),
    (("diff", "{bigint_report}", "{run}"), "bigint_report.json"),
    (("diff", "{run}", "{run}", "--max-slowdown", "nan"), "--max-slowdown"),
    (("diff", "{run}", "{run}", "--max-slowdown", "inf"), "--max-slowdown"),
    (("diff", "{run}", "{run}", "--max-slowdown", "1e308"), "--max-slowdown"),
    (("diff", "{run}", "{run}", "--max-slowdown", "-5%"), "--max-slowdown"),
    (("diff", "{run}", "{run}", "--max-memory-growth", "nan%"), "--max-memory-growth"),
    (("diff", "{run}", "{run}", "--warmup-steps", "1e308"), "--warmup-steps"),
    # doctor: 1e308 s overflowed a thread join after the other checks (44 s)
    (("doctor", "--probe-timeout", "1e308"), "--probe-timeout"),
    (("doctor", "--probe-timeout", "nan"), "--probe-timeout"),
    (("doctor", "--probe-timeout", "-1"), "--probe-timeout"),
    (("doctor", "--require", "bogus"), "--require"),
    # trigger: paths, and numbers taken silently before (--wait nan)
    (("trigger", "{missing}"), "nope"),
    (("trigger", "{trace}"), "fastprof.0.json.gz"),
    (("trigger", "{dir}"), "empty_dir"),
    (("trigger", "{run}", "--wait", "nan"), "--wait"),
    (("trigger", "{run}", "--wait", "inf"), "--wait"),
    (("trigger", "{run}", "--wait", "1e308"), "--wait"),
    (("trigger", "{run}", "--wait", "-1"), "--wait"),
    (("trigger", "{run}", "--steps", "0"), "--steps"),
    (("trigger", "{run}", "--steps", "1e308"), "--steps"),
    (("trigger", "{run}", "--rank", "a"), "--rank"),
    (("trigger", "{run}", "--rank", "-1"), "--rank"),
    (("trigger", "{deep_live}"), "live.json"),
    # demo
    (("demo", "-o", "{out}", "--steps", "0"), "--steps"),
    (("demo", "-o", "{out}", "--steps", BIG), "--steps"),
    (("demo", "-o", "{out}", "--steps", "nan"), "--steps"),
    (("demo", "-o", "{out}", "--workers", "-1"), "--workers"),
    (("demo", "-o", "{out}", "--batch-size", "1e308"), "--batch-size"),
    (("demo", "-o", "{out}", "--device", "foo"), "--device"),
    (("demo", "-o", "{notjson}/runs", "--steps", "2"), "--out-dir"),  # trained unrecorded, then an AssertionError
    # run: its own flags (the script's exit status is Python's: 2 for a script it cannot open)
    (("run", "-o", "{out}", "--sample-hz", "nan", "x.py"), "--sample-hz"),
    (("run", "-o", "{out}", "--sample-hz", "1e308", "x.py"), "--sample-hz"),
    (("run", "-o", "{out}", "--sample-hz", "-1", "x.py"), "--sample-hz"),
    (("run", "-o", "{out}", "--schedule", "bogus", "x.py"), "--schedule"),
    (("run", "-o", "{out}", "{missing}"), "nope"),
    (("run", "-o", "{out}", "{dir}"), "empty_dir"),
    # no such verb
    (("bogus-verb",), "bogus-verb"),
]


@pytest.mark.parametrize(("argv", "name"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_exit_2_and_one_line_naming_it(
    files: dict[str, Path], tmp_path: Path, argv: tuple[str, ...], name: str
) -> None:
    out = tmp_path / "out"
    args = [a.format(out=out, **files) for a in argv]
    r = _cli(*args, cwd=tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("fastprof"), r.stderr
    assert name in lines[0], lines[0]
    assert r.stdout == ""
    assert not out.exists()


# ------------------------------------------------------------------- merge


def test_an_up_to_date_merge_is_exit_0_and_says_so(tmp_path: Path) -> None:
    """After a run that merged itself, the README's `fastprof merge <run dir>`
    said "already exists" and exited 1."""
    with fastprof.Profiler(tmp_path / "runs", "p", torch=False, sample_hz=0) as prof:
        for _ in range(3):
            prof.step()
    run = tmp_path / "runs" / "p"
    trace = run / "trace.json.gz"
    assert trace.is_file()
    stamp = (trace.read_bytes(), trace.stat().st_mtime_ns)
    r = _cli("merge", str(run))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{trace} is up to date: the merge of its 1 inputs, newer than each\n" and r.stderr == ""
    r = _cli("merge", str(run), "-q")
    assert (r.returncode, r.stdout) == (0, f"{trace}\n"), r.stderr
    assert (trace.read_bytes(), trace.stat().st_mtime_ns) == stamp  # not rewritten

    # What it cannot vouch for is refused, as before (exit 2): a filtered
    # merge (the output may hold another selection), an input newer than
    # the output, an input more or fewer, an output that is no merge.
    for extra in (["--exclude-cat", "x"], ["--steps", "0:1"], ["--ranks", "0"]):
        r = _cli("merge", str(run), *extra)
        assert r.returncode == 2 and "already exists" in r.stderr and "-f" in r.stderr, (extra, r.stderr)
    seg = run / "rank0" / "fastprof.0.json.gz"
    os.utime(seg, ns=(stamp[1] + 10**9,) * 2)
    r = _cli("merge", str(run))
    assert r.returncode == 2 and "already exists" in r.stderr, r.stderr
    assert _cli("merge", str(run), "-f", "-q").returncode == 0
    assert _cli("merge", str(run)).returncode == 0
    added = run / "rank0" / "added.json"  # an input older than the output, not in it
    added.write_text(json.dumps({"traceEvents": [{"ph": "i", "name": "x", "pid": 1, "tid": 1, "ts": 1.7e15}]}))
    os.utime(added, ns=(stamp[1] - 10**9,) * 2)
    r = _cli("merge", str(run))
    assert r.returncode == 2 and "already exists" in r.stderr, r.stderr
    assert _cli("merge", str(run), "-f", "-q").returncode == 0
    other = tmp_path / "other.json.gz"
    other.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode()))
    r = _cli("merge", str(run), "-o", str(other))
    assert r.returncode == 2 and "already exists" in r.stderr, r.stderr
    assert json.loads(gzip.decompress(other.read_bytes())) == {"traceEvents": []}


# ------------------------------------------------------------- help, titles


def test_help_texts_have_no_rest_markup(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("demo", "run", "merge", "report", "summary", "diff", "doctor", "trigger"):
        with pytest.raises(SystemExit) as e:
            main([verb, "--help"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        assert f"fastprof {verb}" in text
        assert "``" not in text, (verb, text)


def test_summary_is_titled_summary(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(files["run"])]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"fastprof summary {files['run']}"), first
