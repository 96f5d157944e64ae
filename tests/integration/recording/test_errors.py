"""Bad input to the recorder: documented exception types, nothing started,
nothing created.

Tests run as root, where permission bits do not stop writes, so an
unwritable output directory is made by putting it under a regular file.
"""

from __future__ import annotations

import pytest

import fastprof


def _assert_nothing_running():
    assert not fastprof.is_active()
    assert fastprof.stop() is None


def test_out_dir_under_a_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    with pytest.raises(fastprof.FastprofError) as info:
        fastprof.start(out_dir=afile / "sub", run_name="r")
    assert isinstance(info.value, OSError)
    assert not isinstance(info.value, fastprof.ConfigError)
    # The message says which path failed.
    assert "afile" in str(info.value)
    _assert_nothing_running()
    assert afile.read_text() == "not a directory"
    # The failure leaves the recorder usable.
    rec = fastprof.start(out_dir=tmp_path / "ok", run_name="r")
    fastprof.instant("fine")
    fastprof.stop()
    assert (rec.trace_dir / "fastprof.0.json.gz").is_file()


def test_out_dir_is_a_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(fastprof.FastprofError) as info:
        fastprof.start(out_dir=afile, run_name="r")
    assert isinstance(info.value, OSError)
    _assert_nothing_running()


def test_recorder_context_manager_does_not_start_on_error(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    entered = False
    with pytest.raises(OSError):
        with fastprof.Recorder(out_dir=afile / "sub", run_name="r"):
            entered = True
    assert not entered
    _assert_nothing_running()


@pytest.mark.parametrize(
    "options",
    [
        {"flush_interval": -1.0},
        {"flush_interval": 0},
        {"flush_interval": float("nan")},
        {"buffer_size": 0},
        {"buffer_size": -8},
        {"segment_size": 1024},
        {"segment_size": 64 * 1024 - 1},
        {"segment_seconds": -1.0},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_invalid_options_raise_config_error(options, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(fastprof.ConfigError) as info:
        fastprof.start(out_dir=out, run_name="bad", **options)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, fastprof.FastprofError)
    # The message names the option.
    (name,) = options
    assert name.split("_")[0] in str(info.value)
    _assert_nothing_running()
    assert not out.exists(), "a config error created the output directory"


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("FASTPROF_FLUSH_INTERVAL", "soon"),
        ("FASTPROF_FLUSH_INTERVAL", "-1"),
        ("FASTPROF_BUFFER_SIZE", "lots"),
        ("FASTPROF_BUFFER_SIZE", "0"),
        ("FASTPROF_SEGMENT_SIZE", "1.5x"),
        ("FASTPROF_SEGMENT_SIZE", "10"),
        ("FASTPROF_SEGMENT_SECONDS", "never"),
        ("FASTPROF_RANK", "first"),
        ("RANK", "-1"),
    ],
)
def test_invalid_env_values_raise_config_error(var, value, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv(var, value)
    with pytest.raises(fastprof.ConfigError) as info:
        fastprof.start(out_dir=out, run_name="bad")
    assert isinstance(info.value, ValueError)
    _assert_nothing_running()
    assert not out.exists()


def test_bad_env_out_dir(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("FASTPROF_OUT_DIR", str(afile / "sub"))
    with pytest.raises(fastprof.FastprofError) as info:
        fastprof.start(run_name="r")
    assert isinstance(info.value, OSError)
    _assert_nothing_running()


def test_second_start_raises_and_keeps_the_first(tmp_path, traces):
    rec = fastprof.start(out_dir=tmp_path, run_name="first")
    fastprof.instant("a")
    with pytest.raises(fastprof.AlreadyRunningError) as info:
        fastprof.start(out_dir=tmp_path, run_name="second")
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, fastprof.FastprofError)
    with pytest.raises(RuntimeError):
        with fastprof.Recorder(out_dir=tmp_path, run_name="third"):
            pass
    assert fastprof.is_active()
    fastprof.instant("b")
    stats = fastprof.stop()
    assert stats.events_written == 2
    assert not (tmp_path / "second").exists()
    assert not (tmp_path / "third").exists()
    run = traces.read(rec.trace_dir)
    assert [e["name"] for e in run.data_events()] == ["a", "b"]


def test_stop_without_start_returns_none():
    assert fastprof.stop() is None
    assert fastprof.stop() is None
    assert not fastprof.is_active()


def test_read_trace_errors(tmp_path):
    with pytest.raises(fastprof.FastprofFileNotFoundError) as info:
        fastprof.read_trace(tmp_path / "missing.json.gz")
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, fastprof.FastprofError)

    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not a trace")
    with pytest.raises(fastprof.TraceError) as info:
        fastprof.read_trace(garbage)
    assert isinstance(info.value, ValueError)
    assert "garbage.json" in str(info.value)

    empty = tmp_path / "empty.json.gz"
    empty.write_bytes(b"")
    with pytest.raises(fastprof.TraceError):
        fastprof.read_trace(empty)
