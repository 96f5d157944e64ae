"""Per-step memory statistics (issue #16): the process's resident memory at
every step's end, read by the core; the CUDA allocator's statistics once the
job uses CUDA (here: its reason, once); on, off, and from the environment."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from fastprof import ConfigError
from fastprof.profiler.drivers.memory import MemoryDriver

torch = pytest.importorskip("torch")
MIB = 1 << 20
PAGE = resource.getpagesize()


TRAIN = """
import json, resource, sys, time, torch, fastprof
out, steps, leak, memory = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
page = resource.getpagesize()
def statm_rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
kept, ours = [], []
options = {} if memory == "default" else {"memory_stats": memory == "1"}
prof = fastprof.Profiler(out_dir=out, run_name="run", torch=False, sample_hz=0, **options)
with prof:
    for _ in prof.loader(range(steps)):
        t = torch.ones(256 * 1024)  # 1 MiB of float32, written: resident
        if leak:
            kept.append(t)
        time.sleep(0.002)  # a step far longer than 20 reads of statm: its own reading
        prof.step()
        ours.append(statm_rss())
json.dump({"ours": ours, "trace": str(prof.trace_path), "rank_dir": str(prof.rank_dir),
           "memory_stats": prof.memory_stats}, open(out + "/result.json", "w"))
"""


class Run:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.ours: list[int] = doc["ours"]
        self.trace_path = Path(doc["trace"])
        self.rank_dir = Path(doc["rank_dir"])
        self.memory_stats: bool = doc["memory_stats"]


def _train(tmp: Path, steps: int, leak: bool, memory: str = "default", env: dict[str, str] | None = None) -> Run:
    """``steps`` steps in a fresh process (a heap with no freed memory in it
    to reuse), each allocating and, with ``leak``, keeping 1 MiB."""
    tmp.mkdir(parents=True, exist_ok=True)
    e = {**os.environ, **(env or {})}
    args = [str(tmp), str(steps), "1" if leak else "0", memory]
    subprocess.run([sys.executable, "-c", TRAIN, *args], check=True, env=e, capture_output=True, timeout=120)
    return Run(json.loads((tmp / "result.json").read_text()))


def _series(prof: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    cols = fastprof.read_columns(prof.trace_path, kinds=["counters"], names=[name])
    c = cols.counters
    order = np.argsort(c["ts"], kind="stable")
    return c["ts"][order], c["value"][order]


def test_rss_is_recorded_at_every_step_end_as_the_process_sees_it(tmp_path: Path) -> None:
    steps = 30
    prof = _train(tmp_path, steps, leak=True)
    ours = prof.ours
    ts, rss = _series(prof, "mem.rss [B]")
    assert len(rss) == steps
    # Each sample right after its step's end, before the next step begins.
    cols = fastprof.read_columns(prof.trace_path, kinds=["spans"], names=["step"])
    s = cols.spans
    order = np.argsort(s["ts"])
    starts, ends = s["ts"][order], (s["ts"] + s["dur"])[order]
    assert len(starts) == steps
    assert np.all(ts >= ends) and np.all(ts[:-1] <= starts[1:])
    # The same figure as our own read of /proc/self/statm just after (the
    # step's 1 MiB tensor is in both), within a few pages.
    assert np.max(np.abs(rss - np.asarray(ours, dtype=np.float64))) <= 64 * PAGE
    # Each step kept 1 MiB more.
    assert np.median(np.diff(rss)) == pytest.approx(MIB, abs=16 * PAGE)
    summary = json.loads((prof.rank_dir / "profiler.json").read_text())["memory"]
    assert summary["per_step"] is True and summary["host"] == "per step"
    if not torch.cuda.is_available():
        assert summary["cuda"] == "unavailable: no CUDA device (torch.cuda.is_available() is False)"
        assert summary["cuda_steps"] == 0
        assert not len(_series(prof, "mem.cuda.allocated [B]")[1])


def test_quiet_steps_of_a_torch_schedule_are_measured_too(tmp_path: Path) -> None:
    """Steps outside every torch window never call into Python (the core runs
    them): the resident memory is still read at each one's end."""
    steps = 12
    prof = fastprof.Profiler(
        out_dir=tmp_path,
        run_name="run",
        sample_hz=0,
        torch=True,
        schedule=fastprof.schedule.epoch(skip_first=2, wait=2, warmup=1, active=2, repeat=0),
    )
    with prof:
        for _ in prof.loader(range(steps)):
            torch.ones(1024).sum()
            time.sleep(0.002)  # longer than 20 reads of statm: each step its own reading
            prof.step()
    in_windows = sum(w["last_step"] - w["first_step"] + 1 for w in prof.windows)
    assert prof.windows and in_windows <= steps - 4  # skip_first and wait steps are quiet
    assert len(_series(prof, "mem.rss [B]")[1]) == steps


def test_short_steps_share_readings_taken_right_after_a_step_end(tmp_path: Path) -> None:
    """An empty loop's steps (about a microsecond) are far shorter than a read
    of statm: the core reads it at the end of a step only when the time since
    the last read is 20 reads' worth, so the reads stay a small share of the
    training thread. Each reading is still taken at a step's end."""
    steps = 20_000
    prof = fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=False, sample_hz=0)
    with prof:
        for _ in prof.loader(range(steps)):
            prof.step()
    ts, rss = _series(prof, "mem.rss [B]")
    assert 1 <= len(rss) < steps // 4
    assert np.all(rss > MIB)
    s = fastprof.read_columns(prof.trace_path, kinds=["spans"], names=["step"]).spans
    order = np.argsort(s["ts"])
    starts, ends = s["ts"][order], (s["ts"] + s["dur"])[order]
    assert len(starts) == steps
    k = np.searchsorted(ends, ts, side="right") - 1  # the step each reading follows
    assert np.all(k >= 0) and np.all(ts >= ends[k])
    follows = k + 1 < steps
    assert np.all(ts[follows] <= starts[k[follows] + 1])


def test_off_by_option_and_by_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = _train(tmp_path / "a", 5, leak=False, memory="0")
    assert not len(_series(prof, "mem.rss [B]")[1])
    summary = json.loads((prof.rank_dir / "profiler.json").read_text())["memory"]
    assert summary["per_step"] is False and summary["host"].startswith("off")
    prof = _train(tmp_path / "b", 5, leak=False, env={"FASTPROF_MEMORY_STATS": "0"})
    assert prof.memory_stats is False and not len(_series(prof, "mem.rss [B]")[1])
    monkeypatch.setenv("FASTPROF_MEMORY_STATS", "sometimes")
    with pytest.raises(ConfigError, match="FASTPROF_MEMORY_STATS"):
        fastprof.Profiler(out_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_profiler_model_writes_its_summary_and_the_report_carries_it(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(16, 2)))
    prof = fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=False, sample_hz=0, model=net, model_depth=1)
    with prof:
        for x in prof.loader([torch.randn(4, 8) for _ in range(3)]):
            net(x).sum().backward()
            prof.step()
    assert prof.model_summary_path == prof.rank_dir / "memory" / "model_summary.json"
    doc = json.loads(prof.model_summary_path.read_text())
    assert doc["depth"] == 1 and doc["totals"]["params"] == sum(p.numel() for p in net.parameters())
    assert [r["name"] for r in doc["rows"]] == ["", "0", "1", "2"]  # depth 1: not 2.0
    rep = fastprof.report(prof.run_dir)
    out = prof.run_dir / "reports"
    assert {"model_summary.json", "model_summary.txt"} <= {p.name for p in rep.files}
    assert json.loads((out / "model_summary.json").read_text()) == doc
    model = rep["memory"]["model"]
    assert (model["rank"], model["depth"], model["layers"]) == (0, 1, 4)
    assert model["totals"]["params"] == doc["totals"]["params"]
    schema = json.loads(fastprof.reports.SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads((out / "report.json").read_text()))
    with pytest.raises(ConfigError, match="model_depth"):
        fastprof.Profiler(out_dir=tmp_path / "bad", model=net, model_depth=-1)


def test_memory_history_follows_the_schedule_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The history is on from a window's first step (warm-up) to its last,
    dumped there to rank{R}/memory/ep{epoch}-ba{batch}.history.pickle and
    listed in profiler.json. A stand-in allocator: no CUDA allocator can
    exist here (benches/gpu_check.py runs the real one)."""
    import fastprof.profiler.drivers.memory as loop  # where the Profiler's memory driver makes its history
    from fastprof.memory.history import HistoryDriver

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit"))
    try:
        from test_memory_history import Allocator
    finally:
        sys.path.pop(0)
    alloc = Allocator(events_per_step=100)
    monkeypatch.setattr(loop, "history_driver", lambda cfg: HistoryDriver(cfg, alloc))
    prof = fastprof.Profiler(
        out_dir=tmp_path,
        run_name="run",
        torch=False,
        sample_hz=0,
        memory_history=fastprof.MemoryHistory(max_entries=250),
        schedule=fastprof.schedule.epoch(skip_first=2, wait=1, warmup=1, active=2),
    )
    with prof:
        for _ in prof.loader(range(7)):
            alloc.step()
            prof.step()
    assert alloc.calls == [("start", 250, "python", "all"), ("snapshot",), ("stop",)]
    hist = json.loads((prof.rank_dir / "profiler.json").read_text())["memory"]["history"]
    (w,) = hist["windows"]
    assert (w["first_step"], w["last_step"], w["entries"], w["at_bound"]) == (3, 5, 250, True)
    assert w["path"] == str(prof.rank_dir / "memory" / "ep0-ba5.history.pickle") and w["bytes"] > 0
    # The dump's stall is on the timeline; the run's merge takes none of it as a trace.
    spans = fastprof.read_columns(prof.trace_path, kinds=["spans"], names=["memory.history.dump"]).spans
    assert len(spans["ts"]) == 1
    fastprof.merge(prof.run_dir, prof.run_dir / "trace.json.gz", force=True)


def _events(rank_dir: Path) -> list[dict[str, Any]]:
    import gzip

    out: list[dict[str, Any]] = []
    for seg in sorted(rank_dir.glob("fastprof.*.json.gz")):
        with gzip.open(seg, "rt") as f:
            out += json.load(f)["traceEvents"]
    return out


def test_state_only_snapshots_and_the_windows_on_the_timeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """state_every=2: a state-only snapshot at every 2nd step's end outside
    the windows (3..5, 7..9), quiet steps of the schedule included (the core's step
    loop calls back with the step's numbers); the window is a counter track
    (1 while the history records), the dump a span with what it kept, each
    snapshot and write a span; all in profiler.json."""
    import fastprof.profiler.drivers.memory as loop  # where the Profiler's memory driver makes its history
    from fastprof.memory.history import HISTORY_COUNTER, HistoryDriver

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit"))
    try:
        from test_memory_history import Allocator
    finally:
        sys.path.pop(0)
    alloc = Allocator(events_per_step=100)
    monkeypatch.setattr(loop, "history_driver", lambda cfg: HistoryDriver(cfg, alloc))
    monkeypatch.setenv("FASTPROF_MEMORY_HISTORY_STATE_EVERY", "2")
    prof = fastprof.Profiler(
        out_dir=tmp_path,
        run_name="run",
        torch=False,
        sample_hz=0,
        memory_history=fastprof.MemoryHistory(max_entries=250),
        schedule=fastprof.schedule.epoch(skip_first=2, wait=1, warmup=1, active=2),
    )
    with prof:
        for _ in prof.loader(range(12)):
            alloc.step()
            prof.step()
            history = prof._driver(MemoryDriver).history
            writer = history._state_writer if history is not None else None
            if writer is not None:
                writer.join(10)  # else a snapshot while the last is written is skipped (counted as busy)
    hist = json.loads((prof.rank_dir / "profiler.json").read_text())["memory"]["history"]
    state = hist["state"]
    assert state["busy"] == 0
    assert [e["step"] for e in state["snapshots"]] == [1, 11] and state["count"] == 2, state
    for e in state["snapshots"]:
        assert e["path"] == str(prof.rank_dir / "memory" / f"ep0-ba{e['step']}.state.pickle")
        assert Path(e["path"]).stat().st_size == e["bytes"] > 0
    w, _ = hist["windows"]
    assert (w["events"], w["dropped"]) == (300, 50)
    events = _events(prof.rank_dir)
    on = [e["args"]["value"] for e in events if e["ph"] == "C" and e["name"] == HISTORY_COUNTER]
    assert on == [1, 0, 1, 0]
    dump, _ = sorted(
        (e for e in events if e["ph"] == "X" and e["name"] == "memory.history.dump"), key=lambda e: e["ts"]
    )
    assert dump["args"] == {"first_step": 3, "last_step": 5, "entries": 250, "max_entries": 250, "dropped": 50}
    write, _ = sorted(
        (e for e in events if e["ph"] == "X" and e["name"] == "memory.history.write"), key=lambda e: e["ts"]
    )
    assert write["args"]["bytes"] == w["bytes"] and write["tid"] != dump["tid"]  # off the training thread
    snaps = [e for e in events if e["ph"] == "X" and e["name"] == "memory.state.snapshot"]
    assert [e["args"]["step"] for e in snaps] == [1, 11] and all(e["tid"] == dump["tid"] for e in snaps)
    writes = [e for e in events if e["ph"] == "X" and e["name"] == "memory.state.write"]
    assert sorted(e["args"]["bytes"] for e in writes) == sorted(e["bytes"] for e in state["snapshots"])
    # The report's page shades the history windows on its Memory plot.
    fastprof.report(prof.run_dir, out_dir=tmp_path / "page", formats=("html",))
    html = (tmp_path / "page" / "report.html").read_text()
    section = html.split('<section id="memory">', 1)[1].split("</section>", 1)[0]
    assert "Shaded: allocator history windows (steps 3-5, steps 7-9)." in section
    assert section.count('"type":"rect"') == 2 and '"x0":2.5' in section and '"x1":9.5' in section


def test_memory_history_without_cuda_says_why_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    monkeypatch.setenv("FASTPROF_MEMORY_HISTORY", "1")
    monkeypatch.setenv("FASTPROF_MEMORY_HISTORY_STATE_EVERY", "2")  # the state-only snapshots: the same reason
    prof, _ = fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=False, sample_hz=0), None
    assert isinstance(prof.memory_history, fastprof.MemoryHistory)
    with prof:
        for _ in prof.loader(range(12)):
            prof.step()
    hist = json.loads((prof.rank_dir / "profiler.json").read_text())["memory"]["history"]
    assert hist["available"] is False and hist["windows"] == []
    assert hist["reason"] == "no CUDA device (torch.cuda.is_available() is False)"
    assert hist["state"]["every"] == 2 and hist["state"]["count"] == 0 and hist["state"]["snapshots"] == []
    assert not (prof.rank_dir / "memory").exists() or not list((prof.rank_dir / "memory").glob("*.pickle"))
    with pytest.raises(ConfigError, match="memory_history"):
        fastprof.Profiler(out_dir=tmp_path / "bad", memory_history="yes please")
