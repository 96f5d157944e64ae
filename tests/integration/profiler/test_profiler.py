"""``fastprof.Profiler`` in real CPU training loops with real torch.profiler
windows; every trace is read back with Python's gzip + json."""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import fastprof
from fastprof import ConfigError, FastprofWarning, TorchWindows
from fastprof.profiler.schedule import Action

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

COMPOSER = dict(skip_first=1, wait=1, warmup=1, active=2, repeat=1)


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _loader(batches: int = 16, batch_size: int = 4) -> Any:
    n = batches * batch_size
    return DataLoader(TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,))), batch_size=batch_size)


def _train(prof: fastprof.Profiler, epochs: int = 2, batches: int = 16, call_step: bool = True) -> None:
    model, opt = _model()
    dl = _loader(batches)
    for _ in range(epochs):
        for x, y in prof.loader(dl):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if call_step:
                prof.step()
        with torch.no_grad():
            for x, _y in prof.loader(dl, name="val"):
                model(x)


def _spans(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == name]


def _profiler_steps(doc: dict[str, Any]) -> list[int]:
    return sorted(
        int(e["name"].split("#")[1])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )


def test_two_epochs_with_composers_schedule(tmp_path: Path) -> None:
    prof = fastprof.Profiler(
        out_dir=tmp_path, run_name="run", schedule=fastprof.schedule.epoch(**COMPOSER), torch=TorchWindows()
    )
    with prof:
        _train(prof)
    run = tmp_path / "run"
    # Saved windows only, named by the default format from their last step:
    # batches 3-4 and 7-8 of every epoch (global steps 19-20, 23-24 in epoch 1).
    torch_dir = run / "rank0" / "torch"
    assert sorted(p.name for p in torch_dir.iterdir()) == sorted(
        f"{n}.pt.trace.json.gz" for n in ("ep0-ba4", "ep0-ba8", "ep1-ba20", "ep1-ba24")
    )
    expected = {"ep0-ba4": [3, 4], "ep0-ba8": [7, 8], "ep1-ba20": [19, 20], "ep1-ba24": [23, 24]}
    for stem, steps in expected.items():
        doc = _load(torch_dir / f"{stem}.pt.trace.json.gz")
        assert _profiler_steps(doc) == steps, stem
    # The unified trace: 32 steps with their position and schedule state.
    assert prof.trace_path == run / "trace.json.gz"
    doc = _load(run / "trace.json.gz")
    steps = sorted(_spans(doc, "step"), key=lambda e: e["args"]["batch"])
    assert [e["args"]["batch"] for e in steps] == list(range(32))
    assert [e["args"]["epoch"] for e in steps] == [0] * 16 + [1] * 16
    assert [e["args"]["batch_in_epoch"] for e in steps] == list(range(16)) * 2
    actions = [e["args"]["action"] for e in steps[:16]]
    assert actions[:10] == [
        "skip_first",
        "wait",
        "warmup",
        "active",
        "active_and_save",
        "wait",
        "warmup",
        "active",
        "active_and_save",
        "disabled",
    ]
    assert [e["args"]["action"] for e in steps[16:]] == actions
    # The schedule's state is a counter track too, and the loaders are timed.
    assert any(e.get("ph") == "C" and e.get("name") == "profiler.action" for e in doc["traceEvents"])
    assert len(_spans(doc, "loader.train.next")) == 2 * 17  # 16 batches + the exhausted next()
    assert len(_spans(doc, "loader.val.next")) == 2 * 17
    summary = json.loads((run / "rank0" / "profiler.json").read_text())
    assert summary["steps"] == 32 and summary["epochs"] == 2
    assert [w["saved"] for w in summary["torch"]["windows"]] == [True] * 4
    assert all(w["stop_stall_s"] > 0 and w["export_s"] > 0 for w in summary["torch"]["windows"])


def test_each_profiler_step_lines_up_with_its_step_span(tmp_path: Path) -> None:
    with fastprof.Profiler(
        out_dir=tmp_path, run_name="run", schedule=fastprof.schedule.cyclic(wait=1, warmup=1, active=3, repeat=2)
    ) as prof:
        _train(prof, epochs=1, batches=12)
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    steps = {e["args"]["batch"]: e for e in _spans(doc, "step")}
    marks = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    assert sorted(int(e["name"].split("#")[1]) for e in marks) == [2, 3, 4, 7, 8, 9]
    # The job's own work: torch's ops and the loaders' fetches.
    work = sorted(
        e["ts"]
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and (e.get("cat") == "cpu_op" or str(e.get("name", "")).startswith("loader."))
    )

    def work_between(a: float, b: float) -> list[float]:
        lo, hi = min(a, b), max(a, b)
        return [t for t in work if lo < t < hi]

    for e in marks:
        s = steps[int(e["name"].split("#")[1])]
        # Both ends line up: none of the job's work begins between torch's
        # step boundary and fastprof's (only the profiler's own bookkeeping
        # runs there; on an idle machine that is well under 1 ms, and a
        # loaded one may preempt it for longer, so time is not the measure).
        assert not work_between(e["ts"], s["ts"]), (e, s)
        assert not work_between(e["ts"] + e["dur"], s["ts"] + s["dur"]), (e, s)
        assert e["pid"] == s["pid"]
    assert len(work) > 6 * 3  # the check had work to look at


def test_steps_come_from_the_optimizer_when_step_is_never_called(tmp_path: Path) -> None:
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None) as prof:
        _train(prof, epochs=2, batches=5, call_step=False)
    assert prof.batch == 10 and prof.steps_by_optimizer == 10
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    steps = sorted(_spans(doc, "step"), key=lambda e: e["args"]["batch"])
    assert [(e["args"]["epoch"], e["args"]["batch_in_epoch"]) for e in steps] == [
        (ep, b) for ep in range(2) for b in range(5)
    ]


def test_an_explicit_step_after_the_optimizer_does_not_count_twice(tmp_path: Path) -> None:
    # Without a loader: the first optimizer step ends step 0 before the
    # profiler knows that step() is called; that call must not end step 1.
    model, opt = _model()
    x, y = torch.randn(4, 16), torch.randint(0, 4, (4,))
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None) as prof:
        for _ in range(6):
            with fastprof.span("train_step"):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    assert prof.batch == 6
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    # The time after the last step() is not a step.
    assert sorted(e["args"]["batch"] for e in _spans(doc, "step")) == list(range(6))
    assert len(_spans(doc, "train_step")) == 6


def test_step_inside_a_user_span_keeps_spans_nested(tmp_path: Path) -> None:
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None) as prof:
        model, opt = _model()
        for x, y in prof.loader(_loader(6)):
            with fastprof.span("train_step"):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                prof.step()
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    inner = sorted(_spans(doc, "train_step"), key=lambda e: e["ts"])
    steps = sorted(_spans(doc, "step"), key=lambda e: e["ts"])
    assert len(inner) == len(steps) == 6
    for s, t in zip(steps, inner, strict=True):
        # The step span holds the fetch and begins before the user's span;
        # it ends at step(), inside the user's span (the rest of it is the
        # user's own bookkeeping): never a partial overlap with the next step.
        assert s["ts"] <= t["ts"]
    for a, b in itertools.pairwise(steps):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3


class _Slow(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.005)
        return torch.full((4,), float(i))


def _blocked_ms(tmp_path: Path, name: str, num_workers: int) -> list[float]:
    dl = DataLoader(_Slow(), batch_size=8, num_workers=num_workers)
    with fastprof.Profiler(out_dir=tmp_path, run_name=name, torch=None) as prof:
        for batch in prof.loader(dl):
            time.sleep(0.03)  # "compute": workers prefetch meanwhile
            batch.sum()
            prof.step()
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    spans = sorted(_spans(doc, "loader.train.next"), key=lambda e: e["ts"])
    assert len(spans) == 5  # 4 batches + the exhausted next()
    return [e["dur"] / 1000 for e in spans[:4]]


def test_loader_wait_is_timed_and_falls_with_workers(tmp_path: Path) -> None:
    serial = _blocked_ms(tmp_path, "serial", 0)
    # 8 samples x 5 ms of sleep each, on the training thread.
    assert all(ms >= 40 for ms in serial), serial
    parallel = _blocked_ms(tmp_path, "workers", 2)
    # With two workers prefetching during the compute, the loop waits less
    # in total (the first batch still waits for a worker to start).
    assert sum(parallel[1:]) < sum(serial[1:]), (serial, parallel)


def test_any_iterable_nested_loaders_and_marks(tmp_path: Path) -> None:
    def gen() -> Any:
        yield from range(3)

    with fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None) as prof:
        for epoch in range(2):
            for i in prof.loader(gen()):
                for _ in prof.loader([1, 2], name="val"):
                    pass
                prof.mark("batch_done", epoch=epoch, i=i)
                prof.step()
        assert prof.epoch == 1 and prof.batch == 6
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    assert len(_spans(doc, "loader.val.next")) == 6 * 3
    marks = [e for e in doc["traceEvents"] if e.get("name") == "batch_done"]
    assert [m["args"]["i"] for m in marks] == [0, 1, 2] * 2
    assert [(e["args"]["epoch"], e["args"]["batch_in_epoch"]) for e in _spans(doc, "step")] == [
        (ep, b) for ep in range(2) for b in range(3)
    ]


def test_action_follows_the_schedule(tmp_path: Path) -> None:
    sched = fastprof.schedule.cyclic(wait=1, warmup=1, active=2, repeat=1)
    seen = []
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", schedule=sched, torch=None) as prof:
        for _ in prof.loader(range(6)):
            seen.append(prof.action)
            prof.step()
    assert seen == [sched.action(i) for i in range(6)]
    assert seen[:4] == [Action.WAIT, Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE]


def test_gate_spans_records_only_warmup_and_active_steps(tmp_path: Path) -> None:
    sched = fastprof.schedule.cyclic(wait=2, warmup=1, active=1, repeat=1)
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", schedule=sched, torch=None, gate_spans=True) as prof:
        for i in prof.loader(range(6)):
            with fastprof.span("work", i=i):
                pass
            prof.step()
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    assert sorted(e["args"]["i"] for e in _spans(doc, "work")) == [2, 3]


def test_overwrite_protection_and_retention(tmp_path: Path) -> None:
    sched = fastprof.schedule.cyclic(wait=0, warmup=0, active=1, repeat=3)
    with fastprof.Profiler(
        out_dir=tmp_path, run_name="run", schedule=sched, torch=TorchWindows(num_traces_to_keep=2)
    ) as prof:
        _train(prof, epochs=1, batches=4)
    folder = tmp_path / "run" / "rank0" / "torch"
    # Three windows saved (steps 0, 1, 2); retention deleted the oldest.
    assert sorted(p.name for p in folder.iterdir()) == ["ep0-ba1.pt.trace.json.gz", "ep0-ba2.pt.trace.json.gz"]
    assert [w["deleted"] for w in prof.windows] == [True, False, False]
    # A second run resumed into the same folder (a job restarted after
    # preemption) starts: the earlier traces stay as they were, its own
    # windows take new names beside them.
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", schedule=sched, resume=True) as again:
        _train(again, epochs=1, batches=2)
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert {k: after[k] for k in before} == before
    assert len(after) == len(before) + 2, sorted(after)
    assert not fastprof.is_active()
    with fastprof.Profiler(
        out_dir=tmp_path,
        run_name="run",
        schedule=sched,
        torch=TorchWindows(overwrite=True, folder="rank{rank}/t2"),
        resume=True,
    ) as prof2:
        _train(prof2, epochs=1, batches=2)
    assert len(list((tmp_path / "run" / "rank0" / "t2").iterdir())) == 2


def test_format_strings_and_options_are_checked_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"unknown format variable \{step\}"):
        TorchWindows(filename="w{step}.json")
    with pytest.raises(ConfigError, match=r"ends in \.gz but use_gzip is False"):
        TorchWindows(use_gzip=False, filename="a.json.gz")
    with pytest.raises(ConfigError, match="memory_timeline needs"):
        TorchWindows(memory_timeline="html")
    with pytest.raises(ConfigError, match="num_traces_to_keep"):
        TorchWindows(num_traces_to_keep=0)
    monkeypatch.setenv("FASTPROF_TORCH_RECORD_SHAPES", "maybe")
    with pytest.raises(ConfigError, match="FASTPROF_TORCH_RECORD_SHAPES='maybe'"):
        TorchWindows()
    monkeypatch.delenv("FASTPROF_TORCH_RECORD_SHAPES")
    monkeypatch.setenv("FASTPROF_SCHEDULE", "epoch:wait=x")
    with pytest.raises(ConfigError, match="FASTPROF_SCHEDULE"):
        fastprof.Profiler()
    monkeypatch.setenv("FASTPROF_SCHEDULE", "cyclic:wait=1,warmup=0,active=2,repeat=1")
    prof = fastprof.Profiler(torch=None)
    assert prof.schedule == fastprof.schedule.cyclic(wait=1, warmup=0, active=2, repeat=1)
    monkeypatch.setenv("FASTPROF_SCHEDULE", "steps:3-4,9,warmup=2")
    assert fastprof.Profiler(torch=None).schedule == fastprof.schedule.steps([(3, 5), 9], warmup=2)
    monkeypatch.setenv("FASTPROF_MERGE_TIMEOUT", "-1")
    with pytest.raises(ConfigError, match="FASTPROF_MERGE_TIMEOUT"):
        fastprof.Profiler(torch=None)
    with pytest.raises(ConfigError, match=r"Profiler\.loader: invalid name"):
        fastprof.Profiler(torch=None, merge_timeout=1).loader([], name="a b")


def test_custom_format_names_the_files(tmp_path: Path) -> None:
    tw = TorchWindows(
        folder="traces/r{rank}-of-{world_size}", filename="{run_name}_e{epoch}_b{batch_in_epoch}.json", use_gzip=False
    )
    sched = fastprof.schedule.epoch(wait=0, warmup=1, active=1, repeat=1)
    with fastprof.Profiler(out_dir=tmp_path, run_name="named", schedule=sched, torch=tw) as prof:
        _train(prof, epochs=2, batches=3)
    folder = tmp_path / "named" / "traces" / "r0-of-1"
    assert sorted(p.name for p in folder.iterdir()) == ["named_e0_b1.json", "named_e1_b1.json"]
    assert _profiler_steps(_load(folder / "named_e1_b1.json")) == [4]


def test_a_failing_torch_profiler_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    sched = fastprof.schedule.cyclic(wait=0, warmup=0, active=1, repeat=0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.warns(FastprofWarning, match="torch.profiler failed") as caught:
            with fastprof.Profiler(out_dir=tmp_path, run_name="run", schedule=sched) as prof:
                _train(prof, epochs=1, batches=4)
    assert len([w for w in caught if "torch.profiler failed" in str(w.message)]) == 1
    assert prof.batch == 4
    assert not (tmp_path / "run" / "rank0" / "torch").exists()
    assert len(_spans(_load(prof.trace_path), "step")) == 4  # type: ignore[arg-type]


def test_uses_a_running_recorder_and_leaves_it_running(tmp_path: Path) -> None:
    with fastprof.Recorder(out_dir=tmp_path, run_name="rec") as rec:
        with pytest.raises(ConfigError, match="already running"):
            fastprof.Profiler(out_dir=tmp_path)
        with fastprof.Profiler(torch=None) as prof:
            assert prof.recorder is rec
            for _ in prof.loader(range(3)):
                prof.step()
        assert rec.active and prof.trace_path is None
    doc_events = [
        e for p in sorted((tmp_path / "rec" / "rank0").glob("fastprof.*.json.gz")) for e in _load(p)["traceEvents"]
    ]
    assert len([e for e in doc_events if e.get("name") == "step"]) == 3


def test_calls_outside_a_running_profiler_do_nothing(tmp_path: Path) -> None:
    prof = fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None)
    prof.step()
    prof.mark("x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(prof.loader([1, 2])) == [1, 2]
    assert prof.stop() is None
    with prof:
        pass
    with pytest.raises(ConfigError, match="runs once"):
        prof.start()


def test_memory_timeline_beside_each_window(tmp_path: Path) -> None:
    tw = TorchWindows(profile_memory=True, record_shapes=True, with_stack=True, memory_timeline="json")
    sched = fastprof.schedule.cyclic(wait=0, warmup=1, active=2, repeat=1)
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", schedule=sched, torch=tw) as prof:
        _train(prof, epochs=1, batches=4)
    folder = tmp_path / "run" / "rank0" / "torch"
    assert sorted(p.name for p in folder.iterdir()) == ["ep0-ba2.memory.json", "ep0-ba2.pt.trace.json.gz"]
    times, sizes = _load(folder / "ep0-ba2.memory.json")  # torch's [times, [sizes by category]]
    assert len(times) == len(sizes) > 0
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(ConfigError, match="needs matplotlib"):
            TorchWindows(profile_memory=True, record_shapes=True, with_stack=True, memory_timeline="html")


def test_persistent_workers_are_complete_in_the_unified_trace(tmp_path: Path) -> None:
    dl = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=4, num_workers=2, persistent_workers=True)
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None) as prof:
        for _ in range(2):
            for (_x,) in prof.loader(dl):
                prof.step()
    # No open (.part) worker segment was merged: the workers were shut down
    # first, so the merge salvaged nothing (a warning would fail this test).
    assert not list((tmp_path / "run").rglob("*.part"))
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    fetches = _spans(doc, "loader.train.fetch")
    assert len(fetches) == 16 and len({e["pid"] for e in fetches}) == 2
    # The loader still works afterwards (torch starts new workers).
    assert sum(len(x) for (x,) in dl) == 32


def test_the_loaders_batch_size_is_recorded_for_the_reports(tmp_path: Path) -> None:
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None) as prof:
        for _ in prof.loader(_loader(3, batch_size=5)):
            prof.step()
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    sizes = [e["args"]["value"] for e in doc["traceEvents"] if e.get("name") == "loader.train.batch_size"]
    assert sizes == [5]


def _prev(doc: dict[str, Any], i: int) -> float:
    return _counter_values(doc, "fastprof.step")[i - 1]


def _counter_values(doc: dict[str, Any], name: str) -> list[float]:
    ev = sorted((e for e in doc["traceEvents"] if e.get("ph") == "C" and e.get("name") == name), key=lambda e: e["ts"])
    return [next(iter(e["args"].values())) for e in ev]


@pytest.mark.parametrize("loop", ["empty loader", "empty range", "empty loader, twice"])
def test_a_run_of_no_iterations_has_no_step(tmp_path: Path, loop: str) -> None:
    """A pass that fetched nothing records no phantom step (the report would
    read it as a step of a few µs: tens of thousands of it/s)."""
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None) as prof:
        if loop == "empty range":
            for _ in range(0):
                prof.step()
        else:
            for _ in range(2 if loop.endswith("twice") else 1):
                for _batch in prof.loader(_loader(0)):
                    prof.step()
    assert prof.batch == 0
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    assert _spans(doc, "step") == []
    summary = json.loads((prof.rank_dir / "profiler.json").read_text())
    assert summary["steps"] == 0
    fastprof.report(prof.run_dir, formats=("json",))
    doc = json.loads((prof.run_dir / "reports" / "report.json").read_text())

    def rates(node: Any) -> list[Any]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if k == "iterations_per_s" and v is not None] + [
                r for v in node.values() for r in rates(v)
            ]
        return [r for v in node for r in rates(v)] if isinstance(node, list) else []

    assert rates(doc["speed"]) == []
    fired = doc["recommendations"]["items"]
    assert fired == [], fired


def test_an_empty_pass_between_real_ones_adds_no_step(tmp_path: Path) -> None:
    with fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=None) as prof:
        for n in (3, 0, 2):
            for _batch in prof.loader(_loader(n)):
                prof.step()
    doc = _load(prof.trace_path)  # type: ignore[arg-type]
    steps = sorted(_spans(doc, "step"), key=lambda e: e["args"]["batch"])
    assert [(e["args"]["epoch"], e["args"]["batch_in_epoch"]) for e in steps] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (2, 0),
        (2, 1),
    ]


@pytest.mark.parametrize(
    "sched",
    [
        fastprof.schedule.epoch(skip_first=2, wait=3, warmup=1, active=2, repeat=1),
        fastprof.schedule.cyclic(wait=4, warmup=1, active=1, repeat=3, skip_first=1),
        fastprof.schedule.steps([(6, 8), (30, 31)], warmup=2),
        fastprof.schedule.from_callable(lambda s: Action.ACTIVE if s % 7 == 3 else Action.WAIT),
    ],
    ids=["epoch", "cyclic", "steps", "callable"],
)
def test_every_step_carries_its_schedule_action(tmp_path: Path, sched: Any) -> None:
    """Steps of a quiet stretch of the schedule are begun in the core without
    asking the schedule: each step's action and the profiler.action track must
    still be exactly what the schedule says, across epochs (with a torch window
    driver, and without)."""
    epochs, batches = 3, 13
    for torch_on in (False, True):
        out = tmp_path / str(torch_on)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FastprofWarning)
            with fastprof.Profiler(
                out_dir=out, run_name="run", schedule=sched, torch=TorchWindows() if torch_on else None
            ) as prof:
                for _ in range(epochs):
                    for _batch in prof.loader(_loader(batches)):
                        prof.step()
        doc = _load(prof.trace_path)  # type: ignore[arg-type]
        steps = sorted(_spans(doc, "step"), key=lambda e: e["args"]["batch"])
        want = [sched.at(ep * batches + b, ep, b, batches).value for ep in range(epochs) for b in range(batches)]
        assert [e["args"]["action"] for e in steps] == want
        assert [e["args"]["batch"] for e in steps] == list(range(epochs * batches))
        levels = {"skip_first": 0, "wait": 1, "disabled": 1, "warmup": 2, "active": 3, "active_and_save": 4}
        changes = [levels[a] for i, a in enumerate(want) if i == 0 or levels[a] != levels[want[i - 1]]]
        # The fetch that finds the last epoch exhausted has begun a step
        # (and marked it) before it knew: one trailing value at most.
        got = _counter_values(doc, "profiler.action")
        assert got[: len(changes)] == changes and len(got) - len(changes) in (0, 1), (got, changes)
        # Likewise the step marker: marked again when the step really begins.
        marks = [m for i, m in enumerate(_counter_values(doc, "fastprof.step")) if i == 0 or m != _prev(doc, i)]
        assert marks == list(range(epochs * batches + 1))[: len(marks)] and len(marks) - epochs * batches in (0, 1)
