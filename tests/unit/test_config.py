"""Pure checks of the public surface: the exception and warning hierarchy,
the ``RunStats`` dataclass, and how option values (arguments and
``FASTPROF_*`` environment variables) are accepted or refused before any
file is created.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import fastprof


@pytest.mark.parametrize(
    ("exc", "builtin"),
    [
        ("ConfigError", ValueError),
        ("AlreadyRunningError", RuntimeError),
        ("TraceError", ValueError),
        ("FastprofPermissionError", PermissionError),
        ("FastprofFileNotFoundError", FileNotFoundError),
    ],
)
def test_exception_hierarchy(exc, builtin):
    cls = getattr(fastprof, exc)
    assert issubclass(cls, fastprof.FastprofError)
    assert issubclass(cls, builtin)
    assert issubclass(fastprof.FastprofError, Exception)
    # A user's `except ValueError:` (etc.) catches it.
    with pytest.raises(builtin):
        raise cls("message")


def test_fastprof_error_is_not_a_catch_all_builtin():
    assert not issubclass(fastprof.FastprofError, (ValueError, RuntimeError, OSError))


def test_warning_class():
    assert issubclass(fastprof.FastprofWarning, UserWarning)
    with pytest.warns(UserWarning):
        warnings.warn("x", fastprof.FastprofWarning, stacklevel=1)


def test_run_stats_fields():
    assert dataclasses.is_dataclass(fastprof.RunStats)
    names = {f.name for f in dataclasses.fields(fastprof.RunStats)}
    assert {"events_written", "dropped", "dropped_per_thread", "segments", "unclosed_spans", "error"} <= names


def test_is_active_false_at_import():
    assert fastprof.is_active() is False


@pytest.mark.parametrize(
    ("var", "value", "option"),
    [
        ("FASTPROF_BUFFER_SIZE", "1e3x", "buffer"),
        ("FASTPROF_BUFFER_SIZE", "-1", "buffer"),
        ("FASTPROF_FLUSH_INTERVAL", "0", "flush"),
        ("FASTPROF_FLUSH_INTERVAL", "inf", "flush"),
        ("FASTPROF_SEGMENT_SIZE", "big", "segment"),
        ("FASTPROF_SEGMENT_SECONDS", "-5", "segment"),
    ],
)
def test_env_garbage_names_the_variable_or_option(var, value, option, tmp_path, monkeypatch):
    monkeypatch.setenv(var, value)
    with pytest.raises(fastprof.ConfigError) as info:
        fastprof.start(out_dir=tmp_path / "o", run_name="r")
    msg = str(info.value)
    assert var in msg or option in msg.lower(), msg
    assert not (tmp_path / "o").exists()
    assert not fastprof.is_active()


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("FASTPROF_BUFFER_SIZE", "65536"),
        ("FASTPROF_FLUSH_INTERVAL", "0.5"),
        ("FASTPROF_FLUSH_INTERVAL", "2"),
        ("FASTPROF_SEGMENT_SIZE", "65536"),
        ("FASTPROF_SEGMENT_SECONDS", "0"),
        ("FASTPROF_SEGMENT_SECONDS", "1.5"),
    ],
)
def test_env_valid_values_are_accepted(var, value, tmp_path, monkeypatch):
    monkeypatch.setenv(var, value)
    rec = fastprof.start(out_dir=tmp_path / "o", run_name="r")
    assert fastprof.is_active()
    stats = fastprof.stop()
    assert stats.error is None
    assert rec.trace_dir.is_dir()


def test_smallest_valid_options(tmp_path):
    rec = fastprof.start(
        out_dir=tmp_path, run_name="small", buffer_size=16, segment_size=64 * 1024, flush_interval=0.001
    )
    fastprof.instant("x")
    stats = fastprof.stop()
    assert stats.events_written == 1
    assert rec.trace_dir.is_dir()


def test_gpu_selection_follows_torchrun_and_cuda_visible_devices():
    from fastprof._config import resolve_gpus

    env = {"CUDA_VISIBLE_DEVICES": "3,1,GPU-abc"}
    assert resolve_gpus("auto", env, local_rank=1, world_size=4) == ["1"]
    assert resolve_gpus("auto", env, local_rank=2, world_size=4) == ["GPU-abc"]
    assert resolve_gpus("auto", env, local_rank=5, world_size=8) == []
    assert resolve_gpus("auto", {}, local_rank=2, world_size=4) == ["2"]
    assert resolve_gpus("auto", env, local_rank=0, world_size=1) == ["3", "1", "GPU-abc"]
    assert resolve_gpus("auto", {}, local_rank=0, world_size=1) is None
    assert resolve_gpus("all", env, local_rank=1, world_size=4) is None
    assert resolve_gpus("none", env, local_rank=1, world_size=4) == []
    assert resolve_gpus(["0", "2"], env, local_rank=1, world_size=4) == ["0", "2"]


def test_sampler_options_from_env_and_errors(monkeypatch):
    from fastprof._config import resolve

    o = resolve(env={"FASTPROF_SAMPLE_HZ": "100", "FASTPROF_SAMPLE_GPUS": "0,1", "FASTPROF_HOST_SAMPLER": "psutil"})
    assert (o.sample_hz, o.sample_gpus, o.host_sampler) == (100.0, ["0", "1"], "psutil")
    assert resolve(env={}).sample_hz == 10.0
    assert resolve(env={}).sample_system_hz == 10.0
    assert resolve(env={"FASTPROF_SAMPLE_SYSTEM_HZ": "100"}).sample_system_hz == 100.0
    with pytest.raises(fastprof.ConfigError, match="sample_system_hz"):
        resolve(sample_system_hz=0, env={})
    with pytest.raises(fastprof.ConfigError, match="FASTPROF_HOST_SAMPLER"):
        resolve(env={"FASTPROF_HOST_SAMPLER": "magic"})
    with pytest.raises(fastprof.ConfigError, match="FASTPROF_SAMPLE_PER_CPU"):
        resolve(env={"FASTPROF_SAMPLE_PER_CPU": "maybe"})
