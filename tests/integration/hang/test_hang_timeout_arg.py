"""``Profiler(hang_timeout=...)`` reaches the watchdog (issue #37, item 1):
in one process, a loop that stops for longer than the argument's timeout
(the variable says 600 s) gets its evidence and verdict; the argument
``"off"`` wins over a variable's short timeout: nothing is reported."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import fastprof

pytestmark = pytest.mark.slow


def _loop(prof: fastprof.Profiler, pause: float, until_hang: bool = False) -> None:
    """Four steps, the last after `pause` s; with `until_hang`, the pause
    lasts until the rank's hang evidence is written (at most 60 s: a loaded
    machine's watchdog is late, never early)."""
    with prof:
        for i in range(4):
            if i == 3:
                t0 = time.monotonic()
                while time.monotonic() - t0 < pause or (
                    until_hang and not list(prof.rank_dir.glob("hang-*.json")) and time.monotonic() - t0 < 60
                ):
                    time.sleep(0.05)  # PAUSE
            prof.step()


def test_the_argument_timeout_wins_over_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTPROF_HANG_TIMEOUT", "600")
    monkeypatch.setenv("FASTPROF_HANG_GRACE", "1")
    prof = fastprof.Profiler(tmp_path, "r", torch=False, sample_hz=0, merge=False, hang_timeout=1.0)
    _loop(prof, 3.5, until_hang=True)
    (doc,) = [json.loads(p.read_text()) for p in sorted(prof.rank_dir.glob("hang-*.json"))]
    assert doc["reason"] == "stalled" and doc["timeout_s"] == 1.0 and doc["stalled_s"] >= 1.0
    assert doc["summary"]["where"]["function"] == "_loop"
    acct = json.loads((prof.rank_dir / "profiler.json").read_text())["hang"]
    assert acct["timeout"] == 1.0 and len(acct["verdicts"]) == 1


def test_the_argument_off_wins_over_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTPROF_HANG_TIMEOUT", "1")
    monkeypatch.setenv("FASTPROF_HANG_GRACE", "1")
    prof = fastprof.Profiler(tmp_path, "r", torch=False, sample_hz=0, merge=False, hang_timeout="off")
    _loop(prof, 3.5)
    assert list(prof.rank_dir.glob("hang-*.json")) == []
    acct = json.loads((prof.rank_dir / "profiler.json").read_text())["hang"]
    assert acct["enabled"] is False


def test_a_short_timeout_does_not_report_the_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the first step ends (imports, the process group, the first
    step's compilation) a fixed timeout is at least the start-up's 300 s:
    a 1 s timeout meant for the steps reports a stop after a step, not a
    slow first step."""
    monkeypatch.setenv("FASTPROF_HANG_GRACE", "1")
    prof = fastprof.Profiler(tmp_path, "r", torch=False, sample_hz=0, merge=False, hang_timeout=1.0)
    with prof:
        time.sleep(3.0)  # the start-up, three times the timeout
        for _ in range(3):
            prof.step()
    assert list(prof.rank_dir.glob("hang-*.json")) == []
    assert json.loads((prof.rank_dir / "profiler.json").read_text())["hang"]["verdicts"] == []
