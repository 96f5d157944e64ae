"""The unified trace of a training loop: fastprof spans nest strictly with
torch.profiler's ``python_function`` and annotation events, one name per
process and thread, DataLoader worker recordings as tracks of their rank,
and ``distributedInfo`` that Holistic Trace Analysis reads. Real torch, real
recorders in real processes; outputs checked with Python's gzip and json."""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

import fastprof

torch = pytest.importorskip("torch")


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def partial_overlaps(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Pairs of complete events on one (pid, tid) track that overlap without
    one containing the other, in integer ns (ts/dur carry three decimals)."""
    tracks: dict[tuple[Any, Any], list[tuple[int, int, str]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            b = round(float(e["ts"]) * 1000)
            tracks[(e["pid"], e["tid"])].append((b, b + round(float(e["dur"]) * 1000), e["name"]))
    bad = []
    for track, evs in tracks.items():
        evs.sort(key=lambda x: (x[0], -x[1]))
        open_: list[tuple[int, int, str]] = []  # enclosing events, innermost last
        for b, e, name in evs:
            while open_ and open_[-1][1] <= b:
                open_.pop()
            if open_ and e > open_[-1][1]:
                bad.append((track, open_[-1], (b, e, name)))
            open_.append((b, e, name))
    return bad


def test_the_checker_sees_partial_overlaps() -> None:
    evs = [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 2.0, "dur": 2.0},
        {"ph": "X", "name": "c", "pid": 1, "tid": 2, "ts": 2.0, "dur": 2.0},
        {"ph": "X", "name": "d", "pid": 1, "tid": 2, "ts": 2.5, "dur": 1.5},
        {"ph": "X", "name": "e", "pid": 1, "tid": 2, "ts": 4.0, "dur": 1.0},
    ]
    assert [(t, x[2], y[2]) for t, x, y in partial_overlaps(evs)] == [((1, 1), "a", "b")]


def train(run_dir: Path, steps: int = 7) -> None:
    """A CPU training loop shaped like fastprof.Profiler's: ``step()`` closes
    the fastprof step span, steps torch.profiler and opens the next span in
    one Python call; loader, forward and backward spans inside each step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8, 32), torch.randn(8, 4)) for _ in range(steps)]
    out = run_dir / "rank0" / "torch"
    out.mkdir(parents=True)

    def ready(p: Any) -> None:
        p.export_chrome_trace(str(out / "window.pt.trace.json.gz"))

    with (
        fastprof.Recorder(out_dir=run_dir.parent, run_name=run_dir.name),
        profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
            on_trace_ready=ready,
            with_stack=True,
            record_shapes=True,
        ) as tprof,
    ):
        span = fastprof.span("step", step=0)
        span.__enter__()

        def step(n: int) -> Any:
            span.__exit__(None, None, None)
            tprof.step()
            nxt = fastprof.span("step", step=n)
            nxt.__enter__()
            return nxt

        it = iter(data)
        for n in range(1, steps + 1):
            with fastprof.span("loader.train.next"):
                x, y = next(it)
            with fastprof.span("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with fastprof.span("backward"):
                loss.backward()
            with torch.profiler.record_function("optimizer"), fastprof.span("optimizer"):
                opt.step()
                opt.zero_grad()
            span = step(n)
        span.__exit__(None, None, None)


def test_fastprof_spans_nest_with_torch_python_functions(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(run)
    raw = load(next((run / "rank0" / "torch").glob("*.pt.trace.json.gz")))["traceEvents"]
    calls = [e for e in raw if e.get("cat") == "python_function"]
    assert calls, "with_stack=True wrote no python_function events"
    # Kineto's tid for the training thread is the OS thread id, as fastprof's is.
    fp_tids = {e["tid"] for e in load(run / "rank0" / "fastprof.0.json.gz")["traceEvents"] if e.get("ph") == "X"}
    assert fp_tids & {e["tid"] for e in calls}

    out = tmp_path / "trace.json.gz"
    s = fastprof.merge(run, out)
    doc = load(out)
    ev = doc["traceEvents"]
    assert partial_overlaps(ev) == []
    nesting = doc["otherData"]["nesting"]
    assert nesting["python_calls"] == len(calls) and nesting["moved"] > 0 and s["nest_moved"] == nesting["moved"]
    # Nothing was dropped: every span and torch event is still there.
    names = Counter(e["name"] for e in ev if e.get("ph") == "X" and e.get("cat") == "user")
    assert names["step"] == 8 and names["forward"] == names["backward"] == names["optimizer"] == 7
    assert sum(e["name"].startswith("ProfilerStep#") for e in ev) == 3
    # Spans only moved later, never earlier or longer than the torch call they met.
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "step" and e.get("cat") == "user")
    assert all(a[1] <= b[0] + 0.0005 for a, b in itertools.pairwise(steps)), "step spans overlap"
    # Inside the window, fastprof's step and torch's ProfilerStep#N are one interval.
    prof_steps = {(e["ts"], e["dur"]) for e in ev if e["name"].startswith("ProfilerStep#")}
    fp_steps = {(e["ts"], e["dur"]) for e in ev if e["name"] == "step"}
    assert prof_steps <= fp_steps


def test_one_name_per_process_and_thread(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(run, steps=5)
    out = tmp_path / "trace.json.gz"
    fastprof.merge(run, out)
    ev = load(out)["traceEvents"]
    procs = Counter(e["pid"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name")
    threads = Counter((e["pid"], e["tid"]) for e in ev if e.get("ph") == "M" and e["name"] == "thread_name")
    assert procs and max(procs.values()) == 1 and threads and max(threads.values()) == 1
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    main = next(e["pid"] for e in ev if e.get("name") == "forward")
    assert names[main] == "rank 0"
    thread = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert thread[next(e["tid"] for e in ev if e.get("name") == "forward")] == "MainThread"
    # The single rank's distributedInfo is carried, as HTA reads it.
    text = gzip.open(out, "rt").read(4096)
    assert '"distributedInfo": {"rank": 0, "world_size": 1}' in text


WORKER = """
import json, os, sys, time
import fastprof
from fastprof import _core
rank_dir, ident = sys.argv[1], int(sys.argv[2])
extra = {"worker": {"loader": "train", "id": ident, "parent_pid": os.getppid()}}
d = f"{rank_dir}/workers/train-w{ident}-pid{os.getpid()}"
s = _core.Session(d, "run", 0, 1, 0, 1 << 16, 0.1, 1 << 28, 0.0, 1, json.dumps(extra))
for n in range(3):
    with fastprof.span("loader.train.fetch", worker=ident, n=n):
        time.sleep(0.002)
s.stop()
"""


def test_worker_segments_are_tracks_of_their_rank(tmp_path: Path, pyscript: Any) -> None:
    run = tmp_path / "run"
    with fastprof.Recorder(out_dir=tmp_path, run_name="run") as rec:
        with fastprof.span("epoch"):
            for ident in (1, 0):  # out of order: the merge sorts them
                r = pyscript.run(WORKER, str(rec.trace_dir), str(ident))
                assert r.returncode == 0, r.stderr
    segs = sorted((run / "rank0" / "workers").glob("*/fastprof.*.json.gz"))
    assert len(segs) == 2
    other = load(segs[0])["otherData"]
    assert other["worker"]["loader"] == "train" and "worker" not in other["config"]

    out = tmp_path / "trace.json.gz"
    s = fastprof.merge(run, out)
    assert s["ranks"] == [0]
    ev = load(out)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in ev if e.get("ph") == "M" and e["name"] == "process_sort_index"}
    fetch_pids = {e["pid"] for e in ev if e.get("name") == "loader.train.fetch"}
    main = next(e["pid"] for e in ev if e.get("name") == "epoch")
    assert len(fetch_pids) == 2 and main not in fetch_pids
    assert all(p // 100_000 - 1 == 0 for p in fetch_pids)  # tracks of rank 0
    ordered = [names[p] for p in sorted(sort, key=sort.__getitem__)]
    assert ordered[:3] == ["rank 0", "rank 0 · train loader worker 0", "rank 0 · train loader worker 1"]


# HTA 0.5 calls pandas APIs that pandas 3.1 deprecates (in its own parser processes).
@pytest.mark.filterwarnings("ignore:The inplace keyword:DeprecationWarning", "ignore:The inplace keyword:FutureWarning")
def test_hta_finds_the_rank_of_each_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hta.trace_analysis as hta  # installed by `make dev` (Makefile), never skipped

    monkeypatch.setenv("WORLD_SIZE", "2")
    flat = tmp_path / "flat"
    flat.mkdir()
    for rank in (0, 1):
        with fastprof.Recorder(out_dir=tmp_path, run_name="run", rank=rank):
            for n in range(3):
                with fastprof.span("step", step=n), fastprof.span("forward"):
                    sum(range(1000))
        seg = tmp_path / "run" / f"rank{rank}" / "fastprof.0.json.gz"
        head = gzip.open(seg, "rt").readline()
        assert f'"distributedInfo": {{"rank": {rank}, "world_size": 2}}' in head
        assert load(seg)["distributedInfo"] == {"rank": rank, "world_size": 2}
        shutil.copy(seg, flat / f"trace_{1 - rank}.json.gz")  # names that disagree with the ranks
    analysis = hta.TraceAnalysis(trace_dir=str(flat))
    assert sorted(analysis.t.traces) == [0, 1]
    for rank in (0, 1):
        assert analysis.t.meta_data[rank]["distributedInfo"]["rank"] == rank
        assert Path(analysis.t.trace_files[rank]).name == f"trace_{1 - rank}.json.gz"
        df = analysis.t.get_trace(rank)
        assert len(df) == 6


PROFILED_LOOP = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
import fastprof

class Images(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.full((32,), float(i))

if __name__ == "__main__":
    out, ctx = sys.argv[1], sys.argv[2]
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dl = DataLoader(Images(), batch_size=4, num_workers=2, multiprocessing_context=ctx)
    prof = fastprof.Profiler(
        out_dir=out, run_name="run",
        schedule=fastprof.schedule.epoch(wait=1, warmup=1, active=2, repeat=1),
        torch=fastprof.TorchWindows(with_stack=True, record_shapes=True),
    )
    with prof:
        for epoch in range(2):
            for x in prof.loader(dl):
                with fastprof.span("forward"):
                    loss = model(x).sum()
                with fastprof.span("backward"):
                    loss.backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    print(json.dumps({"trace": str(prof.trace_path), "windows": prof.windows}))
"""


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_profiler_unified_trace_with_workers_and_stacks(ctx: str, tmp_path: Path, pyscript: Any) -> None:
    r = pyscript.run(PROFILED_LOOP, str(tmp_path), ctx)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    # Per epoch of 6: batches 2-3 saved; the second window's warmup (batch 5)
    # is cut by the epoch's end and discarded.
    assert [w["saved"] for w in result["windows"]] == [True, False, True, False]
    doc = load(Path(result["trace"]))
    ev = doc["traceEvents"]
    assert any(e.get("cat") == "python_function" for e in ev)
    # Strict nesting on every track, against torch's python_function events too.
    assert partial_overlaps(ev) == []
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    fetches = [e for e in ev if e.get("name") == "loader.train.fetch"]
    # 6 batches per epoch; each epoch has its own 2 workers.
    assert len(fetches) == 12
    worker_pids = {e["pid"] for e in fetches}
    assert len(worker_pids) == 4
    assert all("train loader worker" in names[p] for p in worker_pids)
    (main,) = {e["pid"] for e in ev if e.get("name") == "step"}
    assert names[main] == "rank 0" and main not in worker_pids
    assert sorted(e["args"]["batch"] for e in ev if e.get("name") == "step") == list(range(12))
    assert sorted(e["name"] for e in ev if e["name"].startswith("ProfilerStep#")) == sorted(
        f"ProfilerStep#{n}" for n in (2, 3, 8, 9)
    )
