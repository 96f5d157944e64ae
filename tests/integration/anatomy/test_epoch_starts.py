"""The first step of each epoch, per rank (``anatomy.epoch_starts``, issue
#38 item 1: linear in ranks, each rank's step rows a slice of the rank
index, the step args paired with them by row).

A real run of three ranks, each a real process with the Profiler on CPU,
released together so that their steps interleave in time, each with its
own epoch lengths. Ranks 0, 2 and 10: the run directory lists ``rank10``
before ``rank2``, so the step rows (and the args, read file after file)
are not in rank order; in the ranks' merged trace (``fastprof.merge``)
the ranks' step rows interleave. What ``epoch_starts`` says is checked
against the epochs each script ran and against the traces read with
Python's json."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fastprof
from fastprof.reports.anatomy import epoch_starts
from fastprof.reports.data import load, step_spans

#: rank -> the steps of each of its epochs (a pass of ``prof.loader``):
#: every rank 20 steps, at different boundaries (epochs of one step too).
EPOCHS = {0: [6, 9, 5], 2: [3, 3, 2, 4, 3, 5], 10: [1, 1, 11, 7]}

RANK = """
import os, sys, time, pathlib, fastprof
out, lengths, go = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], pathlib.Path(sys.argv[3])
prof = fastprof.Profiler(out, "run", torch=False, sample_hz=0, flush_interval=0.01, merge=False)
with prof:
    (go.parent / ("ready" + os.environ["RANK"])).touch()
    while not go.exists():
        time.sleep(0.001)
    for n in lengths:
        for _ in prof.loader(range(n)):
            time.sleep(0.004)
            prof.step()
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("epochs")
    go = tmp / "go"
    base = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    procs = {
        rank: subprocess.Popen(
            [sys.executable, "-c", RANK, str(tmp), ",".join(map(str, lengths)), str(go)],
            env={**base, "RANK": str(rank), "WORLD_SIZE": "11", "FASTPROF_SAMPLE_HZ": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, lengths in EPOCHS.items()
    }
    deadline = time.monotonic() + 90
    while not all((tmp / f"ready{r}").exists() for r in EPOCHS):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs.values()), "a rank never started"
        time.sleep(0.01)
    go.touch()
    for p in procs.values():
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, err[-3000:]
    return tmp / "run"


def _steps_from_json(rank_dir: Path) -> list[tuple[int, int, int]]:
    """(start ns, epoch arg, pid) of the rank's step spans, its segments read
    with Python's json, by start."""
    out = []
    for seg in rank_dir.glob("fastprof.*.json.gz"):
        with gzip.open(seg, "rt") as f:
            doc = json.load(f)
        base = int(doc["baseTimeNanoseconds"]) + int(doc["otherData"].get("clock", {}).get("offset_ns", 0))
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and e["name"] == "step":
                out.append((base + round(float(e["ts"]) * 1000), int(e["args"]["epoch"]), int(e["pid"])))
    return sorted(out)


def _planned(lengths: list[int]) -> list[bool]:
    """What the script ran: True at the first step of each epoch."""
    return [i == 0 for n in lengths for i in range(n)]


@pytest.mark.parametrize("read", ["segments", "merged"])
def test_each_ranks_epoch_starts_are_its_own_with_steps_interleaved(run: Path, read: str, tmp_path: Path) -> None:
    assert sorted(p.name for p in run.glob("rank*")) == ["rank0", "rank10", "rank2"]
    assert not (run / "trace.json.gz").exists()
    steps = {r: _steps_from_json(run / f"rank{r}") for r in EPOCHS}
    # The ranks' steps interleave: each rank has steps that start between two of another's.
    for a in EPOCHS:
        for b in EPOCHS:
            if a != b:
                first, last = steps[a][0][0], steps[a][-1][0]
                assert any(first < t < last for t, _, _ in steps[b]), (a, b)
    if read == "merged":
        fastprof.merge(run, tmp_path / "merged.json.gz")
        data = load(tmp_path / "merged.json.gz")
        assert len(data.cols.files) == 1
    else:
        data = load(run)
        assert len(data.cols.files) == 3
    got = epoch_starts(data)
    assert sorted(got) == sorted(EPOCHS)
    for rank, lengths in EPOCHS.items():
        want = _planned(lengths)
        # The traces say the same as the script: an epoch arg that changes where an epoch began.
        epochs = [e for _, e, _ in steps[rank]]
        assert [i == 0 or epochs[i] != epochs[i - 1] for i in range(len(epochs))] == want
        assert got[rank].dtype == np.bool_
        assert got[rank].tolist() == want, rank
        # A bool per step of the rank, the steps the anatomy reads, in the same order.
        spans, source = step_spans(data, rank)
        assert source == "step"
        assert spans.ts.tolist() == [t for t, _, _ in steps[rank]]


def test_args_that_do_not_match_the_columns_give_nothing(run: Path) -> None:
    data = load(run)
    assert epoch_starts(data)
    # A step row whose process is not the one its args were read with.
    rows = data.span_rows("step", 2)
    data.cols.spans["pid"][rows[3]] += 1
    assert epoch_starts(data) == {}
    # More step args than step rows: a file's args read twice.
    data = load(run)
    data.cols.files.append(dict(data.cols.files[-1]))
    assert epoch_starts(data) == {}
