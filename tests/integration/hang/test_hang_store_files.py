"""The hang driver's link to the store (issue #37, :mod:`fastprof.profiler.drivers.hang.store`)
on a real ``file://`` store: no torch, no job, real files. A rank's files go
in under names the uploader does not skip; the verdict's folder is laid out
as a run directory with the rank's own spool over the store; one verdict per
stall across ranks that share no directory; a ``--stacks`` request object is
taken once; ``fastprof trigger URL --stacks`` refuses a run with no live
rank in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastprof.cli.main import main
from fastprof.profiler.drivers.hang.store import CLOSED_KEY, WATCH_KEY, RankBridge, StoreRun, mirror
from fastprof.profiler.drivers.hang.verdict import CLOSED_FILE, HANG_REQUEST_FILE, WATCH_FILE
from fastprof.storage.store import open_store


def _evidence(rank: int, n: int, where: str, line: int, t: float) -> dict[str, object]:
    frames = [{"file": f"/job/{where}", "line": line, "function": "f"}]
    return {
        "kind": "fastprof.hang",
        "rank": rank,
        "n": n,
        "reason": "stalled",
        "time": t,
        "step": 5,
        "stalled_s": 4.5,
        "answered_by": "python",
        "threads": [{"id": "0x1", "ident": 1, "name": "MainThread", "training": True, "frames": frames}],
    }


def _bridge(tmp_path: Path, rank: int) -> RankBridge:
    """Rank ``rank``'s bridge: its own spool folder, the shared store."""
    store = open_store((tmp_path / "bucket").as_uri(), what="out_dir")
    rank_dir = tmp_path / f"spool{rank}" / "job" / f"rank{rank}"
    rank_dir.mkdir(parents=True)
    (rank_dir / WATCH_FILE).write_text(json.dumps({"rank": rank, "pid": 1, "host": "elsewhere", "token": "t"}))
    return RankBridge(store, "job", rank, rank_dir)


def test_a_ranks_files_go_in_under_visible_names_and_come_back_as_a_run_directory(tmp_path: Path) -> None:
    b0, b1 = _bridge(tmp_path, 0), _bridge(tmp_path, 1)
    for b, line in ((b0, 10), (b1, 20)):
        ev = b.rank_dir / "hang-1.json"
        ev.write_text(json.dumps(_evidence(b.rank, 1, "train.py", line, 1000.0)))
        assert b.put(ev, ev.name) and b.put(b.rank_dir / WATCH_FILE, WATCH_KEY, rewritable=True)
    (b1.rank_dir / CLOSED_FILE).write_text(json.dumps({"rank": 1, "token": "t", "step": 9}))
    assert b1.put(b1.rank_dir / CLOSED_FILE, CLOSED_KEY, rewritable=True)
    keys = open_store((tmp_path / "bucket").as_uri()).list("job")
    assert keys == [
        "job/rank0/hang-1.json",
        "job/rank0/hang-watch.json",
        "job/rank1/hang-1.json",
        "job/rank1/hang-closed.json",
        "job/rank1/hang-watch.json",
    ]
    # Rank 0's folder: the store's files of both ranks, under the run directory's names,
    # with rank 0's own spool files over them (a newer evidence it has not sent yet).
    (b0.rank_dir / "hang-2.json").write_text(json.dumps(_evidence(0, 2, "train.py", 11, 1001.0)))
    into = mirror(StoreRun(b0.run.store, "job"), tmp_path / "mirror", range(2), b0.rank_dir.parent)
    assert sorted(str(p.relative_to(into)) for p in into.rglob("*")) == [
        "rank0",
        "rank0/.hang-watch.json",
        "rank0/hang-1.json",
        "rank0/hang-2.json",
        "rank1",
        "rank1/.hang-closed.json",
        "rank1/.hang-watch.json",
        "rank1/hang-1.json",
    ]
    states = b0.join(1000.5, 30.0, 2, b0.rank_dir.parent)
    assert states[0]["where"]["line"] == 11 and states[1]["where"]["line"] == 20, states
    b0.stop()


def test_one_verdict_per_stall_across_ranks_that_share_no_directory(tmp_path: Path) -> None:
    b0, b1 = _bridge(tmp_path, 0), _bridge(tmp_path, 1)
    assert b1.claim_verdict(6, 1000.0, 30.0) is True
    assert b0.claim_verdict(6, 1000.4, 30.0) is False  # the same stall, seen a little later
    assert b0.claim_verdict(9, 1100.0, 30.0) is True  # another stall
    # The same step an hour later (a resumed run): an earlier job's stall, this one is said too.
    assert b0.claim_verdict(6, 4600.0, 30.0) is True
    doc = json.loads((tmp_path / "bucket" / "job" / ".hang-verdict-6").read_text())
    assert doc == {"time": 1000.0, "rank": 1, "step": 6}


def test_a_stacks_request_object_is_taken_once_into_the_spool(tmp_path: Path) -> None:
    b = _bridge(tmp_path, 1)
    key = tmp_path / "bucket" / "job" / "rank1" / HANG_REQUEST_FILE
    key.parent.mkdir(parents=True)
    key.write_text("abc123\n")
    assert b.take_request() is True
    assert (b.rank_dir / HANG_REQUEST_FILE).read_text() == "abc123" and not key.exists()
    assert b.take_request() is False


def test_a_put_that_fails_is_noted_not_raised(tmp_path: Path) -> None:
    b = _bridge(tmp_path, 0)
    assert b.put(b.rank_dir / "hang-9.json", "hang-9.json") is False  # no such local file
    assert b.error is not None and "FileNotFoundError" in b.error


def test_trigger_stacks_on_a_url_run_with_no_live_rank_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "bucket" / "job"
    (run / "rank0").mkdir(parents=True)
    (run / "rank0" / "fastprof.0.json.gz").write_bytes(b"")
    url = run.as_uri()
    assert main(["trigger", url, "--stacks", "--wait", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no live rank with a hang watchdog" in err and url in err, err
    # A watch object of a process that is gone, on this host: not live either.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    watch = {"rank": 0, "pid": int(dead.stdout), "host": os.uname().nodename, "token": "t"}
    (run / "rank0" / WATCH_KEY).write_text(json.dumps(watch))
    assert main(["trigger", url, "--stacks", "--wait", "0", "--rank", "0"]) == 2
    assert "rank 0 has no live hang watchdog" in capsys.readouterr().err
