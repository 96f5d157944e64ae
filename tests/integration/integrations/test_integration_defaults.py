"""The framework integrations' default ``out_dir`` never fights a recording
that already runs (issue #35, item 6): ``FastprofCallback()`` and
``FastprofProfiler()`` with no arguments checked their options with a
stand-in ``out_dir``, which inside a running Recorder raised ``ConfigError``
and under ``fastprof run`` printed that options the user never gave "are
not used"; their train/setup paths did the same with the framework's
folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fastprof
from fastprof.profiler.options import framework_out_dir

pytest.importorskip("torch")


def test_the_default_out_dir_is_left_to_a_running_recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fallback() -> Path:
        return tmp_path / "fw"

    monkeypatch.delenv("FASTPROF_OUT_DIR", raising=False)
    assert framework_out_dir(None, fallback) == tmp_path / "fw"
    assert framework_out_dir("mine", fallback) == "mine"
    with fastprof.Recorder(out_dir=tmp_path / "runs", run_name="r", sample_hz=0):
        assert framework_out_dir(None, fallback) is None
        assert framework_out_dir("mine", fallback) == "mine"  # the user's is theirs to be refused
    monkeypatch.setenv("FASTPROF_OUT_DIR", str(tmp_path / "env"))
    assert framework_out_dir(None, fallback) is None


SCRIPT = """
import sys
import fastprof
which = sys.argv[1]
def make():
    if which == "transformers":
        from fastprof.integrations.transformers import FastprofCallback
        return FastprofCallback()
    from fastprof.integrations.lightning import FastprofProfiler
    return FastprofProfiler()
if sys.argv[2] == "recorder":
    with fastprof.Recorder(out_dir=sys.argv[3], run_name="r", sample_hz=0):
        make()
else:
    make()
print("MADE", flush=True)
"""


@pytest.mark.parametrize("which", ["transformers", "lightning"])
def test_an_integration_made_with_no_arguments_joins_a_running_recording(which: str, tmp_path: Path) -> None:
    pytest.importorskip(which)
    script = tmp_path / "make.py"
    script.write_text(SCRIPT)
    # Inside the job's own Recorder: no ConfigError.
    p = subprocess.run(
        [sys.executable, str(script), which, "recorder", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert p.returncode == 0 and "MADE" in p.stdout, p.stderr
    # Under fastprof run: no line about options the script never gave.
    p = subprocess.run(
        [sys.executable, "-m", "fastprof", "run", "-o", str(tmp_path / "run-out"), str(script), which, "plain"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert p.returncode == 0 and "MADE" in p.stdout, p.stderr
    assert "are not used" not in p.stderr, p.stderr
