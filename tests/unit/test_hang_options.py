"""The hang watchdog's two Profiler options (issue #37, item 1):
``hang_timeout`` and ``hang_action`` are rows of the Profiler's option table,
so ``Profiler(...)``, Lightning, Transformers and ``fastprof run`` (through
``ProfilerArgs``) take them one way: the argument, else
``FASTPROF_HANG_TIMEOUT`` / ``FASTPROF_HANG_ACTION``, else the default; a bad
value is a :class:`fastprof.ConfigError` naming it, before training."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastprof import ConfigError
from fastprof.profiler.args import ProfilerArgs
from fastprof.profiler.drivers.hang import HangDriver
from fastprof.profiler.options import resolve


def test_the_argument_wins_over_the_variable_which_wins_over_the_default() -> None:
    assert resolve({}, {}).hang_timeout is None  # auto
    assert resolve({}, {}).hang_action == "report"
    env = {"FASTPROF_HANG_TIMEOUT": "off", "FASTPROF_HANG_ACTION": "abort"}
    assert resolve({}, env).hang_timeout == 0.0
    assert resolve({}, env).hang_action == "abort"
    mine = resolve({"hang_timeout": 45, "hang_action": "report"}, env)
    assert (mine.hang_timeout, mine.hang_action) == (45.0, "report")
    assert resolve({"hang_timeout": "auto"}, {"FASTPROF_HANG_TIMEOUT": "9"}).hang_timeout is None
    assert resolve({"hang_timeout": "off"}, {"FASTPROF_HANG_TIMEOUT": "9"}).hang_timeout == 0.0
    assert resolve({"hang_timeout": " 2.5 "}, {}).hang_timeout == 2.5


@pytest.mark.parametrize("bad", [-1, "soon", float("nan"), float("inf"), True, [3]])
def test_a_bad_timeout_is_refused_naming_the_option(bad: object) -> None:
    with pytest.raises(ConfigError, match="hang_timeout: expected seconds > 0, auto or off"):
        resolve({"hang_timeout": bad}, {})


def test_a_bad_variable_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="FASTPROF_HANG_TIMEOUT='-3'"):
        resolve({}, {"FASTPROF_HANG_TIMEOUT": "-3"})
    with pytest.raises(ConfigError, match="FASTPROF_HANG_ACTION='kill'"):
        resolve({}, {"FASTPROF_HANG_ACTION": "kill"})
    with pytest.raises(ConfigError, match="hang_action"):
        resolve({"hang_action": "kill"}, {})


def test_the_integrations_path_checks_and_passes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="hang_timeout"):
        ProfilerArgs.checked(tmp_path, "r", {"hang_timeout": "soon"})
    monkeypatch.setenv("FASTPROF_HANG_TIMEOUT", "600")
    prof = ProfilerArgs.checked(tmp_path, "r", {"hang_timeout": 7, "hang_action": "abort", "sample_hz": 0}).make()
    hang = next(d for d in prof._drivers if isinstance(d, HangDriver))
    assert (hang.config.timeout, hang.config.action) == (7.0, "abort")
    # Not given: the variable.
    prof = ProfilerArgs.checked(tmp_path, "s", {"sample_hz": 0}).make()
    hang = next(d for d in prof._drivers if isinstance(d, HangDriver))
    assert (hang.config.timeout, hang.config.action) == (600.0, "report")


def test_lightning_takes_them_and_checks_them_before_training(tmp_path: Path) -> None:
    lightning = pytest.importorskip("fastprof.integrations.lightning")
    with pytest.raises(ConfigError, match="hang_action"):
        lightning.FastprofProfiler(tmp_path, "r", hang_action="kill")
    p = lightning.FastprofProfiler(tmp_path, "r", hang_timeout=30, sample_hz=0)
    assert p._args.options["hang_timeout"] == 30


def test_transformers_takes_them_and_checks_them_before_training(tmp_path: Path) -> None:
    hf = pytest.importorskip("fastprof.integrations.transformers")
    with pytest.raises(ConfigError, match="hang_timeout"):
        hf.FastprofCallback(tmp_path, "r", hang_timeout="soon")
    cb = hf.FastprofCallback(tmp_path, "r", hang_timeout="off", hang_action="abort", sample_hz=0)
    assert cb._args.options["hang_timeout"] == "off" and cb._args.options["hang_action"] == "abort"
