"""One path for a Profiler's options from outside a script (issue #35, item
2): Lightning's FastprofProfiler, Transformers' FastprofCallback and
``fastprof run`` make their Profilers through ``ProfilerArgs`` (checked when
given, one rule for the folder and the run name), never with their own
``Profiler(...)`` call."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fastprof
from fastprof import ConfigError
from fastprof.profiler.args import ProfilerArgs
from fastprof.profiler.options import UNSET

ROOT = Path(fastprof.__file__).parent
CALLERS = [*sorted((ROOT / "integrations").glob("*.py")), ROOT / "cli" / "run.py"]


def test_the_integrations_and_fastprof_run_make_profilers_one_way() -> None:
    made = []
    for f in CALLERS:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Profiler":
                made.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert made == [], "make the Profiler through fastprof.profiler.args.ProfilerArgs"
    users = [f.name for f in CALLERS if "ProfilerArgs" in f.read_text()]
    assert {"lightning.py", "transformers.py", "run.py"} <= set(users)


def test_a_bad_option_is_refused_when_given(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="schedule"):
        ProfilerArgs.checked(tmp_path, "r", {"schedule": "not a schedule"})
    args = ProfilerArgs.checked(tmp_path, "r", {"torch": UNSET, "sample_hz": 0})
    assert "torch" not in args.options  # not given: the Profiler's own default


def test_a_frameworks_runs_take_one_folder_and_name_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTPROF_OUT_DIR", raising=False)
    monkeypatch.setenv("FASTPROF_RUN_NAME", "job")
    args = ProfilerArgs.checked(None, None, {"torch": None, "sample_hz": 0})
    first = args.make(1, lambda: tmp_path / "fw")
    second = args.make(2, lambda: tmp_path / "fw")
    assert first.recorder.options.run_name == "job" and second.recorder.options.run_name == "job-2"
    assert Path(first.recorder.options.out_dir) == tmp_path / "fw"
    mine = ProfilerArgs.checked(tmp_path / "mine", "r", {"torch": None, "sample_hz": 0}).make(
        3, lambda: tmp_path / "fw"
    )
    assert Path(mine.recorder.options.out_dir) == tmp_path / "mine" and mine.recorder.options.run_name == "r-3"
