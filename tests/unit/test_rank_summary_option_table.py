"""``rank_summary`` is a row of the Profiler's option table (issue #38):
``Profiler(...)``, Lightning, Transformers and ``fastprof run`` (through
``ProfilerArgs``) take it one way: the argument, else
``FASTPROF_RANK_SUMMARY``, else on; a bad value is a
:class:`fastprof.ConfigError` naming it, before training. Off, the Profiler
has no summary driver (what the runs do is in
``tests/integration/reports/test_rank_summary_option.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastprof import ConfigError
from fastprof.profiler.args import ProfilerArgs
from fastprof.profiler.drivers.summary import SummaryDriver
from fastprof.profiler.options import resolve


def test_the_argument_wins_over_the_variable_which_wins_over_the_default() -> None:
    assert resolve({}, {}).rank_summary is True
    assert resolve({}, {"FASTPROF_RANK_SUMMARY": "0"}).rank_summary is False
    assert resolve({}, {"FASTPROF_RANK_SUMMARY": "1"}).rank_summary is True
    assert resolve({"rank_summary": True}, {"FASTPROF_RANK_SUMMARY": "0"}).rank_summary is True
    assert resolve({"rank_summary": False}, {"FASTPROF_RANK_SUMMARY": "1"}).rank_summary is False
    assert resolve({"rank_summary": None}, {"FASTPROF_RANK_SUMMARY": "0"}).rank_summary is False  # None: not given


def test_a_bad_value_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="FASTPROF_RANK_SUMMARY='maybe'"):
        resolve({}, {"FASTPROF_RANK_SUMMARY": "maybe"})
    with pytest.raises(ConfigError, match="rank_summary"):
        resolve({"rank_summary": "yes please"}, {})


def test_off_the_profiler_has_no_summary_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def drivers(name: str, options: dict[str, object]) -> list[object]:
        prof = ProfilerArgs.checked(tmp_path, name, {"sample_hz": 0, "torch": False, **options}).make()
        return [d for d in prof._drivers if isinstance(d, SummaryDriver)]

    monkeypatch.delenv("FASTPROF_RANK_SUMMARY", raising=False)
    assert len(drivers("on", {})) == 1
    assert drivers("off", {"rank_summary": False}) == []
    monkeypatch.setenv("FASTPROF_RANK_SUMMARY", "0")
    assert drivers("env", {}) == []
    assert len(drivers("arg", {"rank_summary": True})) == 1


def test_lightning_and_transformers_take_it_and_check_it_before_training(tmp_path: Path) -> None:
    lightning = pytest.importorskip("fastprof.integrations.lightning")
    with pytest.raises(ConfigError, match="rank_summary"):
        lightning.FastprofProfiler(tmp_path, "r", rank_summary="sometimes")
    p = lightning.FastprofProfiler(tmp_path, "r", rank_summary=False, sample_hz=0)
    assert p._args.options["rank_summary"] is False
    hf = pytest.importorskip("fastprof.integrations.transformers")
    with pytest.raises(ConfigError, match="rank_summary"):
        hf.FastprofCallback(tmp_path, "r", rank_summary="sometimes")
    cb = hf.FastprofCallback(tmp_path, "r", rank_summary=False, sample_hz=0)
    assert cb._args.options["rank_summary"] is False
