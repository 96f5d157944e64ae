"""Pure checks of the public surface: the exception and warning hierarchy,
the ``RunStats`` dataclass, and the one table of options
(``fastprof.recording.options``): how every option's argument and environment
variables are honoured or refused when a ``Recorder`` is made, before any
file is created, and that the signature, the docs and README follow the table.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import fastprof
from fastprof.recording import options_doc as _options_doc
from fastprof.recording.options import ENV_VARS, OPTIONS, TORCHRUN, Options, resolve

README = Path(__file__).resolve().parents[2] / "README.md"
NAMES = [o.name for o in OPTIONS]


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


# ----------------------------------------------------- the table and its users


def test_recorder_parameters_are_the_table():
    params = list(inspect.signature(fastprof.Recorder.__init__).parameters.values())[1:]
    assert [p.name for p in params] == NAMES
    # None means "not given": the environment, then the default, decide.
    assert all(p.default is None for p in params)


def test_options_fields_are_the_table_and_torchrun():
    fields = {f.name for f in dataclasses.fields(Options)}
    # out_url: what out_dir was given as when it is a URL (derived, not an option).
    assert fields == {o.name for o in OPTIONS + TORCHRUN} | {"out_url"}


def test_a_url_out_dir_records_into_a_spool_with_segments_closing_on_time(tmp_path: Path):
    o = resolve("s3://bucket/runs/", "r", env={})
    assert o.out_url == "s3://bucket/runs" and o.run_url == "s3://bucket/runs/r"
    assert o.spool_dir is not None and o.out_dir == o.spool_dir
    assert o.spool_dir.name == "s3-bucket-runs" and o.spool_dir.parent.name == "fastprof-spool"
    assert o.segment_seconds == 300 and o.upload_timeout == 20
    # Given ones win, from arguments or the environment.
    o = resolve("s3://b/x", "r", env={"FASTPROF_SPOOL_DIR": str(tmp_path), "FASTPROF_SEGMENT_SECONDS": "0"})
    assert o.out_dir == tmp_path and o.segment_seconds == 0
    assert resolve("s3://b/x", "r", env={}, segment_seconds=5.0).segment_seconds == 5.0
    # A path is a path: C://x is a Windows drive, runs/s3: a folder.
    for path in ("runs", "runs/s3:", "C://x"):
        o = resolve(path, "r", env={})
        assert o.out_url is None and o.run_url is None and o.segment_seconds == 0


def test_defaults_pass_their_own_checks():
    for o in OPTIONS + TORCHRUN:
        if o.default is not None:
            assert o.check(o.parse(o.default)), o.name
        assert o.env and o.expect and o.doc, o.name


def test_docstring_lists_every_option():
    doc = fastprof.Recorder.__doc__ or ""
    for o in OPTIONS:
        assert f"    {o.name}: " in doc, o.name
        for var in o.env:
            assert f"``{var}``" in doc, var


def test_readme_table_is_generated_from_the_table():
    block = _options_doc.readme_block(README.read_text())
    assert block == _options_doc.markdown(), (
        "README's options table is stale: python -m fastprof.recording.options_doc --write README.md"
    )
    for o in OPTIONS:
        assert f"| `{o.name}` |" in block


def test_generator_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-W", "error", "-m", "fastprof.recording.options_doc", "--markdown"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == _options_doc.markdown()
    assert out.stderr == ""


def test_conftest_clears_every_variable_the_table_reads():
    from conftest import ENV_VARS as CLEARED

    assert set(ENV_VARS) <= set(CLEARED)


# ------------------------------------------------------------- resolution

# Per option: (a good environment value, what it resolves to, a good explicit
# value, what that resolves to). Every option of the table must be here.
GOOD = {
    "out_dir": ("/tmp/fp-{rank}", Path("/tmp/fp-3"), "/tmp/given", Path("/tmp/given")),
    "run_name": ("exp-{world_size}", "exp-4", "given", "given"),
    "rank": ("3", 3, 2, 2),
    "resume": ("1", True, True, True),
    "buffer_size": ("64K", 65536, 4096, 4096),
    "buffer_growth": ("1GiB", 1 << 30, 0, 0),
    "flush_interval": ("0.25", 0.25, 2, 2.0),
    "segment_size": ("1MiB", 1 << 20, "64KiB", 65536),
    "segment_seconds": ("30", 30.0, 1.5, 1.5),
    # Explicit values beside the default segment_size (256 MiB): two segments at least.
    "max_disk": ("1GiB", 1 << 30, "512MiB", 512 << 20),
    "keep_segments": ("5", 5, 2, 2),
    "compression_level": ("6", 6, 9, 9),
    "sample_hz": ("100", 100.0, 0, 0.0),
    "sample_system_hz": ("0.5", 0.5, 1, 1.0),
    "sample_per_cpu": ("yes", True, False, False),
    "sample_gpus": ("0,GPU-abc", ["0", "GPU-abc"], "none", []),
    "sample_history": ("1000", 1000, 2, 2),
    "host_sampler": ("psutil", "psutil", "procfs", "procfs"),
    "window_seconds": ("60", 60.0, 86400, 86400.0),
    "window_bytes": ("128MiB", 128 << 20, "1MiB", 1 << 20),
    "spool_dir": ("/tmp/spool-{rank}", Path("/tmp/spool-3"), "/tmp/given-spool", Path("/tmp/given-spool")),
    "upload_timeout": ("5", 5.0, 0, 0.0),
    "world_size": ("8", 8, None, None),
    "local_rank": ("1", 1, None, None),
    "local_world_size": ("2", 2, None, None),
    "node_rank": ("1", 1, None, None),
}
# The torchrun context the good values above are resolved in (rank 3 of 4).
CONTEXT = {"WORLD_SIZE": "4", "RANK": "3"}


def test_every_option_has_good_values_here():
    assert set(GOOD) == {o.name for o in OPTIONS + TORCHRUN}


@pytest.mark.parametrize(("name", "var"), [(o.name, v) for o in OPTIONS + TORCHRUN for v in o.env])
def test_every_environment_variable_is_honoured(name, var):
    text, want, _, _ = GOOD[name]
    env = {**CONTEXT, var: text}
    got = getattr(resolve(env=env), name)
    assert got == want and type(got) is type(want), (got, want)
    # Without it, the default (or another source) gives something else.
    default = getattr(resolve(env={k: v for k, v in env.items() if k != var}), name)
    assert default != want or name == "rank"  # rank: RANK=3 gives the same as FASTPROF_RANK=3


@pytest.mark.parametrize("name", NAMES)
def test_explicit_argument_wins_over_environment(name):
    o = next(o for o in OPTIONS if o.name == name)
    text, _, given, want = GOOD[name]
    got = getattr(resolve(env={**CONTEXT, **{v: text for v in o.env}}, **{name: given}), name)
    assert got == want and type(got) is type(want), (got, want)


def test_first_rank_variable_wins_and_rank_widens_the_world():
    assert resolve(env={"FASTPROF_RANK": "1", "RANK": "5", "WORLD_SIZE": "8"}).rank == 1
    o = resolve(rank=6, env={})
    assert (o.rank, o.world_size) == (6, 7)
    o = resolve(rank=2**32 - 2, env={})
    assert o.world_size == 2**32 - 1  # still a u32 for the core


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="sample_rate"):
        resolve(env={}, sample_rate=5)


# Per option, values that must be refused when given as arguments.
BAD = {
    "out_dir": ["", 3, "/tmp/{nope}"],
    "run_name": ["a/b", "..", "{rank", 5, "x{epoch}"],
    "rank": [-1, 2**32 - 1, 2**40, True, 1.5, "x"],
    "resume": ["maybe", 2, 1.0, []],
    "buffer_size": [0, 15, -8, 2**26 + 1, 2**64, True, "lots", 1e300],
    "buffer_growth": [-1, (64 << 30) + 1, 2**64, True, 1.5, "lots"],
    "flush_interval": [0, -1.0, math.nan, math.inf, 3601, True, "soon", 10**400],
    "segment_size": [1024, 64 * 1024 - 1, -1, 2**64, 2**70, False, "1.5x", "1.3", 1.5],
    "segment_seconds": [-1.0, math.nan, math.inf, True, "never"],
    # 256 MiB: less than two segments of the default segment_size.
    "max_disk": [-1, 2**64, True, 1.5, "lots", "256MiB", 1],
    "keep_segments": [-1, 2**32, True, 1.5, "two"],
    "compression_level": [0, 10, -1, 2**40, True, 1.5, "fast"],
    "sample_hz": [0.5, 1001, -1, math.nan, math.inf, True, "often"],
    "sample_system_hz": [0, 0.05, 1001, math.nan, True],
    "sample_per_cpu": ["maybe", 2, 1.0, []],
    "sample_gpus": [-1, 2**40, True, ["0", -1], [" 0 1"], "", 1.5],
    "sample_history": [1, 0, -5, 2**24 + 1, 2**63, True, "many"],
    "host_sampler": ["magic", 3, ""],
    "window_seconds": [0.5, -1, 86401, math.nan, math.inf, True, "long"],
    "window_bytes": [0, "1KiB", (1 << 20) - 1, (16 << 30) + 1, 2**64, -1, True, "huge"],
    "spool_dir": ["", 3, "/tmp/{nope}"],
    "upload_timeout": [-1, 3601, math.nan, math.inf, True, "soon"],
}


def test_every_option_has_bad_values_here():
    assert set(BAD) == set(NAMES)


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in BAD.items() for v in vs], ids=repr)
def test_bad_argument_is_refused_at_construction(name, value, tmp_path):
    kwargs = {"out_dir": tmp_path / "o", "run_name": "r", name: value}
    with pytest.raises(fastprof.ConfigError) as info:
        fastprof.Recorder(**kwargs)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert f"option {name}" in msg, msg
    assert not (tmp_path / "o").exists()


# Environment values that must be refused; every variable the table reads is here.
BAD_ENV = [
    ("FASTPROF_OUT_DIR", "/tmp/{nope}"),
    ("FASTPROF_RUN_NAME", "a/b"),
    ("FASTPROF_RUN_NAME", "x{epoch}"),
    ("FASTPROF_RESUME", "maybe"),
    ("FASTPROF_RANK", "first"),
    ("RANK", "x"),
    ("RANK", "-1"),
    ("RANK", str(2**40)),
    ("WORLD_SIZE", "two"),
    ("WORLD_SIZE", "0"),
    ("WORLD_SIZE", str(2**32)),
    ("LOCAL_RANK", "-1"),
    ("LOCAL_WORLD_SIZE", "0"),
    ("GROUP_RANK", "1.5"),
    ("FASTPROF_BUFFER_SIZE", "lots"),
    ("FASTPROF_BUFFER_SIZE", "1e3x"),
    ("FASTPROF_BUFFER_SIZE", "-1"),
    ("FASTPROF_BUFFER_SIZE", str(2**64)),
    ("FASTPROF_BUFFER_GROWTH", "plenty"),
    ("FASTPROF_BUFFER_GROWTH", "65GiB"),
    ("FASTPROF_FLUSH_INTERVAL", "0"),
    ("FASTPROF_FLUSH_INTERVAL", "inf"),
    ("FASTPROF_SEGMENT_SIZE", "big"),
    ("FASTPROF_SEGMENT_SIZE", "10"),
    ("FASTPROF_SEGMENT_SIZE", "17179869184TiB"),
    ("FASTPROF_SEGMENT_SECONDS", "-5"),
    ("FASTPROF_MAX_DISK", "-1"),
    ("FASTPROF_MAX_DISK", "100MiB"),
    ("FASTPROF_KEEP_SEGMENTS", "some"),
    ("FASTPROF_COMPRESSION_LEVEL", "fast"),
    ("FASTPROF_COMPRESSION_LEVEL", "0"),
    ("FASTPROF_SAMPLE_HZ", "2000"),
    ("FASTPROF_SAMPLE_HZ", "nan"),
    ("FASTPROF_SAMPLE_SYSTEM_HZ", "0"),
    ("FASTPROF_SAMPLE_PER_CPU", "maybe"),
    ("FASTPROF_SAMPLE_GPUS", "-1"),
    ("FASTPROF_SAMPLE_HISTORY", "1"),
    ("FASTPROF_SAMPLE_HISTORY", str(2**63)),
    ("FASTPROF_HOST_SAMPLER", "magic"),
    ("FASTPROF_WINDOW_SECONDS", "0.5"),
    ("FASTPROF_WINDOW_BYTES", "1KiB"),
    ("FASTPROF_WINDOW_BYTES", "lots"),
    ("FASTPROF_SPOOL_DIR", "/tmp/{nope}"),
    ("FASTPROF_UPLOAD_TIMEOUT", "-1"),
    ("FASTPROF_UPLOAD_TIMEOUT", "forever"),
]


def test_every_variable_has_bad_values_here():
    assert {v for v, _ in BAD_ENV} == set(ENV_VARS)


@pytest.mark.parametrize(("var", "value"), BAD_ENV)
def test_bad_environment_value_is_refused_naming_the_variable(var, value, tmp_path, monkeypatch):
    monkeypatch.setenv(var, value)
    with pytest.raises(fastprof.ConfigError) as info:
        fastprof.Recorder(out_dir=None if var == "FASTPROF_OUT_DIR" else tmp_path / "o")
    msg = str(info.value)
    assert f"environment variable {var}={value!r}" in msg, msg
    option = next(o.name for o in OPTIONS + TORCHRUN if var in o.env)
    assert f"option {option}" in msg, msg
    assert "expected" in msg or "format variable" in msg, msg
    assert not (tmp_path / "o").exists()


# A 16-slot ring beside a 1000 Hz sampler drops (and counts, and says so)
# whenever the writer lags on a loaded machine: that is the bound working,
# not a failure of these values.
@pytest.mark.filterwarnings("ignore:fastprof. dropped:fastprof.FastprofWarning")
def test_widest_accepted_values_start_in_the_core(tmp_path):
    # What the table accepts never fails later (OverflowError, core error):
    # the bounds of the integer options, handed to the core as they are.
    rec = fastprof.start(
        tmp_path,
        "wide",
        rank=2**32 - 2,
        buffer_size=16,
        segment_size=2**64 - 1,
        compression_level=9,
        sample_hz=1000,
        sample_system_hz=0.1,
        sample_history=2**24,
        sample_gpus="none",
        flush_interval=3600,
        segment_seconds=1e300,
    )
    assert rec.options.world_size == 2**32 - 1
    fastprof.instant("x")
    stats = fastprof.stop()
    assert stats.error is None and stats.events_written >= 1
    rec = fastprof.start(
        tmp_path,
        "wide2",
        buffer_size=2**26,
        sample_hz=1,
        sample_history=2,
        flush_interval=0.001,
        max_disk=2**64 - 1,
        keep_segments=2**32 - 1,
    )
    fastprof.instant("x")
    assert fastprof.stop().error is None
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
    from fastprof.recording.options import resolve_gpus

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
