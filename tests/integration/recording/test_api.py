"""The public recording API: ``span`` as context manager and decorator,
``instant``, ``counter``, ``name_id``, the ``Recorder`` context manager,
no-ops while inactive, sequential recorders, thread names and environment
overrides — each checked in the trace file read back with gzip + json.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

import fastprof


def _record(tmp_path: Path, name: str, body, **options):
    rec = fastprof.start(out_dir=tmp_path, run_name=name, **options)
    body()
    stats = fastprof.stop()
    return rec, stats


# ------------------------------------------------------------------- span


def test_span_decorator_passes_values_and_exceptions(tmp_path, traces):
    @fastprof.span("deco")
    def add(a, b=1):
        return a + b

    @fastprof.span("deco_raise", kind="err")
    def fail(x):
        raise KeyError(x)

    def body():
        assert add(1, b=2) == 3
        assert add(40) == 41
        with pytest.raises(KeyError) as info:
            fail("boom")
        assert info.value.args == ("boom",)

    rec, _ = _record(tmp_path, "deco", body)
    run = traces.read(rec.trace_dir)
    assert len(run.of("X", "deco")) == 2
    assert all("args" not in e for e in run.of("X", "deco"))
    (raised,) = run.of("X", "deco_raise")
    assert raised["args"] == {"kind": "err", "exception": True}


def test_decorated_before_start_records_after_start(tmp_path, traces):
    @fastprof.span("early")
    def f(n):
        return f(n - 1) + 1 if n else 0

    assert f(3) == 3  # inactive: plain call

    rec, _ = _record(tmp_path, "early", lambda: f(2))
    run = traces.read(rec.trace_dir)
    (spans,) = traces.nesting(run).values()
    assert sorted(depth for _, _, depth, _ in spans) == [0, 1, 2]  # recursion nests three deep


def test_span_exception_flag_and_propagation(tmp_path, traces):
    def body():
        with pytest.raises(ZeroDivisionError):
            with fastprof.span("boom", step=7):
                _ = 1 / 0
        with fastprof.span("fine", step=8):
            pass

    rec, _ = _record(tmp_path, "exc", body)
    run = traces.read(rec.trace_dir)
    (boom,) = run.of("X", "boom")
    assert boom["args"] == {"step": 7, "exception": True}
    (fine,) = run.of("X", "fine")
    assert fine["args"] == {"step": 8}


def test_span_args_types_and_escaping(tmp_path, traces):
    name = 'résumé "quoted" \\ back\nline ✓'

    def body():
        with fastprof.span(name, n=3, f=0.25, s='a "b"\n\tc', yes=True, no=False, big=2**40):
            pass
        fastprof.instant(name, where="here")

    rec, _ = _record(tmp_path, "types", body)
    run = traces.read(rec.trace_dir)
    (span,) = run.of("X", name)
    assert span["args"] == {"n": 3, "f": 0.25, "s": 'a "b"\n\tc', "yes": True, "no": False, "big": 2**40}
    (inst,) = run.of("i", name)
    assert inst["args"] == {"where": "here"}


def test_span_durations(tmp_path, traces):
    def body():
        with fastprof.span("sleep"):
            time.sleep(0.05)

    rec, _ = _record(tmp_path, "dur", body)
    run = traces.read(rec.trace_dir)
    (e,) = run.of("X", "sleep")
    assert 50_000 <= e["dur"] < 5_000_000
    assert e["ts"] >= 0
    assert e["pid"] == os.getpid()
    assert e["tid"] == threading.get_native_id()


def test_unclosed_span_at_stop(tmp_path, traces):
    rec = fastprof.start(out_dir=tmp_path, run_name="open")
    with fastprof.span("outer", tag="t"):
        with fastprof.span("closed"):
            pass
        time.sleep(0.02)
        stats = fastprof.stop()
        # Leaving the span after stop is harmless.
    assert stats.unclosed_spans == 1
    run = traces.read(rec.trace_dir)
    (outer,) = run.of("X", "outer")
    assert outer["args"] == {"tag": "t", "unclosed": True}
    assert outer["dur"] >= 20_000
    (closed,) = run.of("X", "closed")
    assert "args" not in closed
    assert run.final["unclosed_spans"] == 1
    traces.nesting(run)


def test_span_begun_before_start_is_ignored(tmp_path, traces):
    """A span entered while inactive and left while recording writes nothing."""
    with fastprof.span("before"):
        rec = fastprof.start(out_dir=tmp_path, run_name="late")
        with fastprof.span("inside"):
            pass
    stats = fastprof.stop()
    run = traces.read(rec.trace_dir)
    assert [e["name"] for e in run.data_events()] == ["inside"]
    assert stats.unclosed_spans == 0


# ------------------------------------------------------ instant / counter


def test_instant_and_counter_forms(tmp_path, traces):
    def body():
        fastprof.instant("plain")
        fastprof.instant("with_args", step=3, loss=0.5)
        fastprof.counter("scalar_f", 1.5)
        fastprof.counter("scalar_i", 7)
        fastprof.counter("mapping", {"allocated": 10, "reserved": 12.5})

    rec, stats = _record(tmp_path, "forms", body)
    run = traces.read(rec.trace_dir)
    (plain,) = run.of("i", "plain")
    assert plain["s"] == "t" and "args" not in plain
    (wa,) = run.of("i", "with_args")
    assert wa["args"] == {"step": 3, "loss": 0.5}
    (cf,) = run.of("C", "scalar_f")
    assert cf["args"] == {"value": 1.5}
    (ci,) = run.of("C", "scalar_i")
    assert ci["args"] == {"value": 7}
    (cm,) = run.of("C", "mapping")
    assert cm["args"] == {"allocated": 10, "reserved": 12.5}
    assert stats.events_written == 5
    for e in run.data_events():
        assert e["pid"] == os.getpid() and e["tid"] == threading.get_native_id()
        assert "dur" not in e
    traces.time_format(run.segments[0].text)


# ----------------------------------------------------------------- name_id


def test_name_id_fast_path(tmp_path, traces):
    hot = fastprof.name_id("hot")  # created while inactive, like a module constant
    assert isinstance(hot, fastprof.Name)

    def body():
        with hot:
            with fastprof.span(hot):
                pass
        fastprof.instant(hot)
        fastprof.counter(hot, 2.5)

        @fastprof.span(hot)
        def f():
            return "ok"

        assert f() == "ok"

    rec, _ = _record(tmp_path, "nid", body)
    run = traces.read(rec.trace_dir)
    assert len(run.of("X", "hot")) == 3
    assert len(run.of("i", "hot")) == 1
    (c,) = run.of("C", "hot")
    assert c["args"] == {"value": 2.5}
    traces.nesting(run)

    # The same Name keeps working in a later recorder.
    rec2, _ = _record(tmp_path, "nid2", lambda: fastprof.instant(hot))
    assert [e["name"] for e in traces.read(rec2.trace_dir).data_events()] == ["hot"]


def test_name_id_exception_flag(tmp_path, traces):
    nid = fastprof.name_id("nid_raise")

    def body():
        with pytest.raises(ValueError):
            with nid:
                raise ValueError("x")

    rec, _ = _record(tmp_path, "nidx", body)
    (e,) = traces.read(rec.trace_dir).of("X", "nid_raise")
    assert e["args"]["exception"] is True


def test_many_distinct_names(tmp_path, traces):
    def body():
        for i in range(5000):
            fastprof.instant(f"name-{i}")

    rec, _ = _record(tmp_path, "names", body)
    run = traces.read(rec.trace_dir)
    assert [e["name"] for e in run.data_events()] == [f"name-{i}" for i in range(5000)]


# ------------------------------------------------------------------ no-ops


def test_calls_are_noops_when_inactive(tmp_path):
    assert not fastprof.is_active()
    nid = fastprof.name_id("idle")
    with fastprof.span("idle", a=1):
        fastprof.instant("idle", b=2)
        fastprof.counter("idle", 3)
        fastprof.counter("idle", {"x": 1})
    with nid:
        fastprof.instant(nid)
        fastprof.counter(nid, 1.0)
    with fastprof.span(nid):
        pass

    @fastprof.span("idle_deco")
    def f():
        return 5

    assert f() == 5
    with pytest.raises(KeyError):
        with fastprof.span("idle"):
            raise KeyError
    assert fastprof.stop() is None
    assert not fastprof.is_active()
    assert list(tmp_path.iterdir()) == []  # nothing written (cwd is tmp_path)


def test_calls_after_stop_are_noops(tmp_path, traces):
    rec, stats = _record(tmp_path, "after", lambda: fastprof.instant("during"))
    fastprof.instant("after")
    with fastprof.span("after"):
        pass
    run = traces.read(rec.trace_dir)
    assert [e["name"] for e in run.data_events()] == ["during"]
    assert stats.events_written == 1


# --------------------------------------------------------- recorder objects


def test_recorder_context_manager(tmp_path, traces):
    with fastprof.Recorder(out_dir=tmp_path, run_name="cm", flush_interval=0.1) as rec:
        assert isinstance(rec, fastprof.Recorder)
        assert fastprof.is_active()
        with fastprof.span("in_cm"):
            pass
    assert not fastprof.is_active()
    assert rec.run_dir == tmp_path / "cm"
    assert rec.trace_dir == tmp_path / "cm" / "rank0"
    run = traces.read(rec.trace_dir)
    assert [e["name"] for e in run.data_events()] == ["in_cm"]


def test_recorder_context_manager_stops_on_exception(tmp_path, traces):
    with pytest.raises(RuntimeError, match="inside"):
        with fastprof.Recorder(out_dir=tmp_path, run_name="cmx") as rec:
            with fastprof.span("work"):
                raise RuntimeError("inside")
    assert not fastprof.is_active()
    (e,) = traces.read(rec.trace_dir).of("X", "work")
    assert e["args"] == {"exception": True}


def test_start_returns_recorder_and_run_stats(tmp_path, traces):
    rec = fastprof.start(out_dir=tmp_path, run_name="stats")
    assert isinstance(rec, fastprof.Recorder)
    assert isinstance(rec.run_dir, Path) and isinstance(rec.trace_dir, Path)
    assert rec.trace_dir.is_dir()
    assert list(rec.trace_dir.glob("*.part")), "the first segment is opened at start"
    fastprof.instant("x")
    stats = rec.stop()
    assert isinstance(stats, fastprof.RunStats)
    assert dataclasses.is_dataclass(stats)
    assert stats.events_written == 1
    assert stats.dropped == 0
    assert stats.unclosed_spans == 0
    assert stats.error is None
    assert isinstance(stats.dropped_per_thread, dict)
    assert all(isinstance(p, Path) for p in stats.segments)
    assert stats.segments == [rec.trace_dir / "fastprof.0.json.gz"]
    assert stats.segments[0].is_file()
    assert fastprof.stop() is None


def test_default_run_name(tmp_path, traces):
    rec = fastprof.start(out_dir=tmp_path)
    fastprof.instant("first")
    fastprof.stop()
    assert rec.run_dir.parent == tmp_path
    assert rec.run_dir.name
    assert rec.trace_dir == rec.run_dir / "rank0"
    # A second unnamed run right after must not reuse (and overwrite) the first one's trace.
    rec2 = fastprof.start(out_dir=tmp_path)
    fastprof.instant("second")
    fastprof.stop()
    assert rec2.run_dir != rec.run_dir
    assert [e["name"] for e in traces.read(rec.trace_dir).data_events()] == ["first"]
    assert [e["name"] for e in traces.read(rec2.trace_dir).data_events()] == ["second"]


def test_default_out_dir_is_relative_to_cwd(tmp_path):
    rec = fastprof.start(run_name="here")
    fastprof.stop()
    assert rec.run_dir.resolve() == (tmp_path / "fastprof_runs" / "here").resolve()
    assert (tmp_path / "fastprof_runs" / "here" / "rank0" / "fastprof.0.json.gz").is_file()


def test_two_sequential_recorders(tmp_path, traces):
    rec1 = fastprof.start(out_dir=tmp_path, run_name="one")
    with fastprof.span("first"):
        fastprof.instant("first_i")
    s1 = fastprof.stop()
    fastprof.instant("between")
    rec2 = fastprof.start(out_dir=tmp_path, run_name="two")
    with fastprof.span("second"):
        fastprof.instant("second_i")
    s2 = fastprof.stop()

    run1, run2 = traces.read(rec1.trace_dir), traces.read(rec2.trace_dir)
    assert [e["name"] for e in run1.data_events()] == ["first_i", "first"]
    assert [e["name"] for e in run2.data_events()] == ["second_i", "second"]
    assert s1.events_written == s2.events_written == 2
    for run in (run1, run2):
        assert run.final["final"] is True
        assert run.thread_names() == {threading.get_native_id(): "MainThread"}
    assert run2.segments[0].base_ns > run1.segments[0].base_ns


def test_named_threads(tmp_path, traces):
    tids: dict[str, int] = {}

    def work():
        tids[threading.current_thread().name] = threading.get_native_id()
        with fastprof.span("named"):
            pass

    def body():
        work()
        for name in ("loader", "comm thread", "日本"):
            t = threading.Thread(target=work, name=name)
            t.start()
            t.join()

    rec, _ = _record(tmp_path, "names", body)
    run = traces.read(rec.trace_dir)
    names = {e["args"]["name"]: e["tid"] for e in run.of("M", "thread_name")}
    assert names == tids
    assert set(tids) == {"MainThread", "loader", "comm thread", "日本"}
    assert {e["tid"] for e in run.of("X", "named")} == set(tids.values())


# -------------------------------------------------------------- environment


def _cfg(cfg: dict, *keys: str):
    """otherData.config value under the first of ``keys`` present."""
    for k in keys:
        if k in cfg:
            return cfg[k]
    raise AssertionError(f"none of {keys} in otherData.config: {cfg}")


def test_env_overrides(tmp_path, monkeypatch, traces):
    monkeypatch.setenv("FASTPROF_OUT_DIR", str(tmp_path / "envout"))
    monkeypatch.setenv("FASTPROF_RUN_NAME", "envrun")
    monkeypatch.setenv("FASTPROF_BUFFER_SIZE", "4096")
    monkeypatch.setenv("FASTPROF_FLUSH_INTERVAL", "0.25")
    monkeypatch.setenv("FASTPROF_SEGMENT_SIZE", str(1 << 20))
    monkeypatch.setenv("FASTPROF_SEGMENT_SECONDS", "30")
    rec = fastprof.start()
    fastprof.instant("env")
    fastprof.stop()
    assert rec.run_dir == tmp_path / "envout" / "envrun"
    run = traces.read(rec.trace_dir)
    cfg = run.final["config"]
    assert _cfg(cfg, "buffer_size") == 4096
    assert _cfg(cfg, "flush_interval_s", "flush_interval") == 0.25
    assert _cfg(cfg, "segment_size") == 1 << 20
    assert _cfg(cfg, "segment_seconds") == 30
    assert run.final["run_name"] == "envrun"


def test_arguments_beat_env(tmp_path, monkeypatch, traces):
    monkeypatch.setenv("FASTPROF_OUT_DIR", str(tmp_path / "envout"))
    monkeypatch.setenv("FASTPROF_RUN_NAME", "envrun")
    monkeypatch.setenv("FASTPROF_BUFFER_SIZE", "4096")
    monkeypatch.setenv("FASTPROF_FLUSH_INTERVAL", "0.25")
    rec = fastprof.start(out_dir=tmp_path / "argout", run_name="argrun", buffer_size=2048, flush_interval=0.5)
    fastprof.stop()
    assert rec.run_dir == tmp_path / "argout" / "argrun"
    assert not (tmp_path / "envout").exists()
    cfg = traces.read(rec.trace_dir).final["config"]
    assert _cfg(cfg, "buffer_size") == 2048
    assert _cfg(cfg, "flush_interval_s", "flush_interval") == 0.5


@pytest.mark.parametrize("var", ["FASTPROF_RANK", "RANK"])
def test_rank_from_env(var, tmp_path, monkeypatch, traces):
    monkeypatch.setenv(var, "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    rec = fastprof.start(out_dir=tmp_path, run_name="ranked")
    fastprof.instant("r")
    fastprof.stop()
    assert rec.trace_dir == tmp_path / "ranked" / "rank3"
    assert traces.read(rec.trace_dir).final["rank"] == 3


def test_rank_argument(tmp_path, monkeypatch, traces):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    rec = fastprof.start(out_dir=tmp_path, run_name="ranked", rank=2)
    fastprof.stop()
    assert rec.trace_dir == tmp_path / "ranked" / "rank2"
    assert traces.read(rec.trace_dir).final["rank"] == 2
