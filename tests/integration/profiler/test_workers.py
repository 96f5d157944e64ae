"""DataLoader workers record their own traces (fastprof.profiler.workers).

Each test runs a real training-like loop in a subprocess (a real DataLoader
with real worker processes under fork, spawn or forkserver), then reads the
workers' segments back with Python's gzip + json (the ``traces`` fixture) and
with ``fastprof.read_trace``, and merges the rank directory.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastprof
from fastprof.profiler import workers

LOOP = r"""
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
import fastprof
from fastprof.profiler.workers import instrument


class Slow(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, idx):
        time.sleep(0.002)
        return torch.tensor([idx, os.getpid()])


class SlowStream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        for idx in range(info.id, 24, info.num_workers):
            time.sleep(0.002)
            yield torch.tensor([idx, os.getpid()])


def user_init(worker_id):
    # The user's own worker_init_fn must still run: it leaves a file behind.
    with open(os.path.join(os.environ["MARKS"], f"init-{worker_id}-{os.getpid()}"), "w") as f:
        f.write(str(fastprof.is_active()))


def main():
    ctx, out, kind, persistent, epochs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
    rec = fastprof.start(out_dir=out, run_name="w", flush_interval=0.05)
    rank_dir = os.path.join(out, "w", "rank0")
    if kind == "unwritable":
        # A file where the workers' directory would go: no worker can record.
        with open(os.path.join(rank_dir, "workers"), "w") as f:
            f.write("in the way")
    dataset = SlowStream() if kind == "iterable" else Slow()
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context=ctx,
                        worker_init_fn=user_init, persistent_workers=persistent)
    first = instrument(loader, name="train", rank_dir=rank_dir, run_name="w", rank=0, world_size=1)
    again = instrument(loader, name="train", rank_dir=rank_dir, run_name="w", rank=0, world_size=1)
    rows, batches = [], 0
    for epoch in range(epochs):
        for batch in loader:
            with fastprof.span("batch"):
                rows.extend(batch.tolist())
                batches += 1
    del loader  # persistent workers are shut down with their loader
    stats = fastprof.stop()
    print(json.dumps({"pid": os.getpid(), "rows": rows, "batches": batches, "first": first, "again": again,
                      "dropped": stats.dropped}))


if __name__ == "__main__":
    main()
"""


def _run(pyscript: Any, tmp_path: Path, ctx: str, kind: str = "map", persistent: bool = False, epochs: int = 1):
    marks = tmp_path / "marks"
    marks.mkdir()
    out = tmp_path / "runs"
    proc = pyscript.run(
        LOOP,
        ctx,
        str(out),
        kind,
        "1" if persistent else "0",
        str(epochs),
        timeout=100,
        env={"MARKS": str(marks)},
        name="loop.py",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result, out / "w" / "rank0", marks


def _worker_meta(other: dict[str, Any]) -> dict[str, Any]:
    # Top-level otherData.worker once the core lifts Recorder.metadata there;
    # until then Recorder.metadata lands in otherData.config.
    if "worker" in other:
        return other["worker"]  # type: ignore[no-any-return]
    return other["config"]["worker"]  # type: ignore[no-any-return]


def _check_workers(result: dict[str, Any], rank_dir: Path, marks: Path, traces: Any, fetches: int) -> list[Path]:
    main_pid = result["pid"]
    worker_pids = {r[1] for r in result["rows"]}
    assert len(worker_pids) == 2 and main_pid not in worker_pids
    dirs = sorted((rank_dir / "workers").iterdir())
    assert len(dirs) == 2, dirs
    seen_ids, seen_pids, total = set(), set(), 0
    for d in dirs:
        run = traces.read(d)  # gzip + json; fails on a .part left open
        meta = _worker_meta(run.final)
        wid, pid = meta["id"], run.final["pid"]
        assert d.name == f"train-w{wid}-pid{pid}"
        assert meta == {"loader": "train", "id": wid, "parent_pid": main_pid}
        assert run.final["rank"] == 0 and run.final["run_name"] == "w"
        assert pid in worker_pids and pid != main_pid
        fetch = run.of("X", "loader.train.fetch")
        assert {e["pid"] for e in run.events} == {pid}
        assert all(e["args"]["worker"] == wid for e in fetch)
        assert sorted(e["args"]["n"] for e in fetch) == list(range(1, len(fetch) + 1))
        assert len(run.of("X", "loader.train.worker_init")) == 1
        traces.nesting(run)
        # The Rust reader agrees with gzip + json.
        for seg in run.segments:
            doc = fastprof.read_trace(seg.path)
            got = [e for e in doc["traceEvents"] if e.get("name") == "loader.train.fetch"]
            assert len(got) == len([e for e in seg.events if e.get("name") == "loader.train.fetch"])
        seen_ids.add(wid)
        seen_pids.add(pid)
        total += len(fetch)
        assert (marks / f"init-{wid}-{pid}").read_text() == "True", "user's worker_init_fn did not run after start"
    assert seen_ids == {0, 1} and seen_pids == worker_pids
    assert total == fetches
    return dirs


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_workers_record_fetch_spans(ctx, tmp_path, pyscript, traces):
    result, rank_dir, marks = _run(pyscript, tmp_path, ctx)
    assert result["first"] is True and result["again"] is True
    assert result["batches"] == 6 and sorted(r[0] for r in result["rows"]) == list(range(24))
    assert result["dropped"] == 0
    assert "not recorded" not in result["stderr"], result["stderr"]
    _check_workers(result, rank_dir, marks, traces, fetches=6)
    # The main process's own trace holds none of the workers' events.
    main = traces.read(rank_dir)
    assert {e["pid"] for e in main.events} == {result["pid"]}
    assert len(main.of("X", "batch")) == 6 and not main.of("X", "loader.train.fetch")

    # The rank merges into one file holding the workers' fetch spans.
    out = tmp_path / "merged.json.gz"
    fastprof.merge([rank_dir], out)
    with gzip.open(out, "rt", encoding="utf-8") as f:
        merged = json.load(f)
    fetch = [e for e in merged["traceEvents"] if e.get("name") == "loader.train.fetch" and e.get("ph") == "X"]
    assert len(fetch) == 6
    assert len({e["pid"] for e in fetch}) == 2
    assert len([e for e in merged["traceEvents"] if e.get("name") == "batch"]) == 6
    main_pids = {e["pid"] for e in merged["traceEvents"] if e.get("name") == "batch"}
    assert not main_pids & {e["pid"] for e in fetch}


def test_forkserver_and_iterable_dataset(tmp_path, pyscript, traces):
    # An iterable dataset: each worker yields half the items, in batches of 4
    # (3 batches each); its last fetch finds the end and is a span too.
    result, rank_dir, marks = _run(pyscript, tmp_path, "forkserver", kind="iterable")
    assert result["batches"] == 6 and sorted(r[0] for r in result["rows"]) == list(range(24))
    _check_workers(result, rank_dir, marks, traces, fetches=6 + 2)


def test_persistent_workers_over_two_epochs(tmp_path, pyscript, traces):
    result, rank_dir, marks = _run(pyscript, tmp_path, "fork", persistent=True, epochs=2)
    assert result["batches"] == 12
    # The same two workers served both epochs, and their traces were closed
    # when the loader shut them down.
    _check_workers(result, rank_dir, marks, traces, fetches=12)


def test_a_worker_that_cannot_record_still_loads(tmp_path, pyscript):
    result, rank_dir, marks = _run(pyscript, tmp_path, "fork", kind="unwritable")
    assert result["batches"] == 6 and sorted(r[0] for r in result["rows"]) == list(range(24))
    # One line per worker says why, and the user's worker_init_fn still ran.
    lines = [ln for ln in result["stderr"].splitlines() if "is not recorded" in ln]
    assert len(lines) == 2, result["stderr"]
    assert len(list(marks.iterdir())) == 2
    assert all(p.read_text() == "False" for p in marks.iterdir())
    assert (rank_dir / "workers").is_file()


class _Items(Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, idx: int) -> int:
        return idx


def _user_fn(worker_id: int) -> None:
    pass


def test_instrument_only_multiprocess_loaders(tmp_path):
    rank_dir = tmp_path / "run" / "rank0"
    kw: dict[str, Any] = {"name": "train", "rank_dir": rank_dir, "run_name": "run", "rank": 0, "world_size": 1}
    single = DataLoader(_Items(), batch_size=2)
    assert workers.instrument(single, **kw) is False
    assert single.worker_init_fn is None
    assert workers.instrument([1, 2, 3], **kw) is False
    assert workers.instrument(range(3), **kw) is False

    multi = DataLoader(_Items(), batch_size=2, num_workers=2, worker_init_fn=_user_fn)
    assert workers.instrument(multi, **kw) is True
    wrapped = multi.worker_init_fn
    assert isinstance(wrapped, workers._WorkerInit) and wrapped.user_fn is _user_fn
    assert workers.instrument(multi, **{**kw, "name": "other"}) is True
    assert multi.worker_init_fn is wrapped, "instrumenting twice wrapped twice"
    # It crosses spawn: a plain picklable object.
    import pickle

    again = pickle.loads(pickle.dumps(wrapped))
    assert again.user_fn is _user_fn and again.name == "train" and again.rank_dir == os.fspath(rank_dir)
    # The parent's own fetchers are untouched.
    from torch.utils.data._utils import fetch

    assert not getattr(fetch._MapDatasetFetcher.fetch, "_fastprof_wrapped", False)
    assert torch.equal(next(iter(single)), torch.tensor([0, 1]))
