"""The verdict across ranks (issue #37, item 4) on evidence as the ranks
write it: each kind a hung job can be in is told apart, and the sentence
names the suspect rank, its line and the collective the others wait in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from fastprof.profiler.drivers.hang.verdict import (
    CLOSED_FILE,
    WATCH_FILE,
    closed_ranks,
    gone_ranks,
    join,
    left_loop,
    rank_state,
    summarize,
    verdict,
)

TORCH = os.path.join(os.sep, "venv", "site-packages", "torch")
C10D = os.path.join(TORCH, "distributed", "distributed_c10d.py")
LOADER = os.path.join(TORCH, "utils", "data", "dataloader.py")
TRAIN = os.path.join(os.sep, "job", "train.py")
DATA = os.path.join(os.sep, "job", "dataset.py")


def _ev(frames: list[tuple[str, int, str]], by: str = "python", step: int = 41, fr: Any = None) -> dict[str, Any]:
    return {
        "answered_by": by,
        "step": step,
        "stalled_s": 47.2,
        "training_thread": 7,
        "threads": [
            {"ident": 9, "frames": [{"file": TRAIN, "line": 1, "function": "other_thread"}]},
            {"ident": 7, "frames": [{"file": f, "line": n, "function": fn} for f, n, fn in frames]},
        ],
        "flight_recorder": fr,
    }


def _in(op: str, line: int = 88) -> dict[str, Any]:
    return _ev([(C10D, 2800, op), (TRAIN, line, "train_step"), (TRAIN, 120, "<module>")])


IN_DATA = [(DATA, 22, "__getitem__"), (LOADER, 700, "__next__"), (TRAIN, 80, "<module>")]


def test_a_rank_elsewhere_is_named_with_its_line_and_phase() -> None:
    states = {
        0: rank_state(_in("all_reduce"), None),
        1: rank_state(_ev(IN_DATA), None),
        2: rank_state(_in("all_reduce"), None),
    }
    v = verdict(states)
    assert (v["kind"], v["suspect_ranks"], v["waiting_ranks"]) == ("elsewhere", [1], [0, 2])
    assert v["collective"] == {"op": "all_reduce", "seq": None}
    assert v["where"][0] | {"state": None} == {
        "rank": 1,
        "file": DATA,
        "line": 22,
        "function": "__getitem__",
        "phase": "dataloader",
        "state": None,
    }
    assert v["step"] == 42
    assert v["text"] == (
        "hang at step 42 (47 s): rank 1 never entered all_reduce; it is in the dataloader: dataset.py:22 in "
        "__getitem__. Ranks 0, 2 wait in all_reduce (train.py:88 in train_step)."
    )


def test_a_mismatched_collective_is_code_path_divergence() -> None:
    states = {
        0: rank_state(_in("all_reduce"), None),
        1: rank_state(_in("broadcast", 95), None),
        2: rank_state(_in("all_reduce"), None),
    }
    v = verdict(states)
    assert (v["kind"], v["suspect_ranks"], v["waiting_ranks"]) == ("mismatch", [1], [0, 2])
    assert "rank 1 is in broadcast (train.py:95 in train_step" in v["text"]
    assert "different code paths" in v["text"]


def test_a_skipped_collective_shows_as_different_sequence_numbers() -> None:
    def fr(seq: int) -> dict[str, Any]:
        return {"entries": [{"profiling_name": "gloo:all_reduce", "collective_seq_id": seq, "retired": False}]}

    e0, e1 = _in("all_reduce"), _in("all_reduce")
    e0["flight_recorder"], e1["flight_recorder"] = fr(12), fr(13)
    e2 = _in("all_reduce")
    e2["flight_recorder"] = fr(12)
    v = verdict({0: rank_state(e0, None), 1: rank_state(e1, None), 2: rank_state(e2, None)})
    assert (v["kind"], v["suspect_ranks"], v["collective"]) == ("mismatch", [1], {"op": "all_reduce", "seq": 12})


def test_all_ranks_in_the_same_collective_is_the_backend() -> None:
    v = verdict({0: rank_state(_in("all_reduce"), None), 1: rank_state(_in("all_reduce"), None)})
    assert (v["kind"], v["suspect_ranks"], v["waiting_ranks"]) == ("backend", [], [0, 1])
    assert "network or the collective backend" in v["text"]


def test_a_rank_spinning_with_the_gil_held() -> None:
    spin = _ev(
        [(os.path.join(sysconfig.get_paths()["stdlib"], "re", "__init__.py"), 166, "match"), (TRAIN, 60, "forward")],
        by="watchdog",
    )
    v = verdict({0: rank_state(_in("all_reduce"), None), 1: rank_state(spin, None)})
    assert (v["kind"], v["suspect_ranks"]) == ("gil", [1])
    assert "spins with the GIL held at train.py:60 in forward" in v["text"]


def test_a_gone_process_and_a_silent_one() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = {"host": socket.gethostname(), "pid": dead.pid}
    alive = {"host": socket.gethostname(), "pid": os.getpid()}
    v = verdict({0: rank_state(_in("all_reduce"), None), 1: rank_state(None, here), 2: rank_state(None, alive)})
    assert v["suspect_ranks"] == [1, 2] and v["kind"] == "gone"
    assert "rank 1 never entered all_reduce; its process is gone" in v["text"]
    assert "rank 2 never entered all_reduce; it cannot answer" in v["text"]
    # After the job (a report), a rank without evidence is only silent.
    assert rank_state(None, here, live=False)["state"] == "silent"


def test_summary_picks_the_training_thread_and_the_user_frame() -> None:
    s = summarize(_in("all_reduce"), 7)
    assert s["collective"]["op"] == "all_reduce" and s["collective"]["site"]["line"] == 88
    assert s["where"]["line"] == 88 and s["phase"] == "communication"
    # Without the training thread's id, the first thread with frames.
    assert summarize(_in("all_reduce"), None)["where"]["function"] == "other_thread"


def test_a_rank_with_no_record_here_is_not_called_stuck() -> None:
    """A rank whose node writes another run directory (no shared
    filesystem) has no watch file here: it is named as unknown here, not as
    a rank that cannot answer."""
    v = verdict({0: rank_state(_in("all_reduce"), None), 1: rank_state(None, None)})
    assert "rank 1: no evidence of it in this run directory (another node's?)" in v["text"]


def _wave(ev: dict[str, Any], entered: int, completed: int, op: str = "all_reduce") -> dict[str, Any]:
    ev["collectives"] = {
        "default": {
            "entered": {"op": op, "seq": entered, "site": None},
            "completed": {"op": op, "seq": completed, "site": None},
        }
    }
    return ev


def test_a_rank_past_the_step_with_fewer_collectives_skipped_one() -> None:
    """Rank 1 left out one all_reduce: gloo pairs the ranks' collectives by
    number, so the job runs on until rank 1 ends the step rank 0 waits in
    (all_reduce #40 of step 39) having entered only 39: a skipped collective,
    named with the rank, its last number and the one the others wait in."""
    after = [(TRAIN, 29, "<module>")]
    e0 = _wave(_in("all_reduce", 51), 40, 39)
    e0["step"] = 38
    e1 = _wave(_ev(after, step=39), 39, 39)
    v = verdict({0: rank_state(e0, None), 1: rank_state(e1, None)})
    assert (v["kind"], v["suspect_ranks"], v["waiting_ranks"]) == ("mismatch", [1], [0])
    assert v["collective"] == {"op": "all_reduce", "seq": 40}
    assert (
        "rank 1 skipped a collective: it ended step 39 after 39 collectives of the default group (the last "
        "all_reduce #39) where rank 0 entered all_reduce #40 in that step: the ranks took different code paths"
    ) in v["text"], v["text"]
    assert "rank 1 is now in other: train.py:29 in <module>" in v["text"]


def test_a_rank_late_in_the_same_step_did_not_skip() -> None:
    """Rank 1 stuck in its data in the step rank 0 waits in (both ended step
    5; rank 1 entered 6, rank 0 #7): late, not off the path."""
    e0 = _wave(_in("all_reduce"), 7, 6)
    e0["step"] = 5
    e1 = _wave(_ev(IN_DATA, step=5), 6, 6)
    v = verdict({0: rank_state(e0, None), 1: rank_state(e1, None)})
    assert (v["kind"], v["suspect_ranks"]) == ("elsewhere", [1])
    assert "rank 1 never entered all_reduce #7; it is in the dataloader" in v["text"]


def test_a_killed_process_not_yet_reaped_is_gone() -> None:
    """A rank SIGKILLed outside its launcher is a zombie until the launcher
    reaps it: still a pid, but gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        stat = Path(f"/proc/{child.pid}/stat")
        for _ in range(200):
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the child never ended")
        watch = {"host": socket.gethostname(), "pid": child.pid}
        assert rank_state(None, watch)["state"] == "gone"
    finally:
        child.wait()


def test_a_rank_that_left_its_loop_is_named_from_its_closed_file(tmp_path: Path) -> None:
    """Rank 1 skipped a collective and left its loop; its watchdog stopped
    with its Profiler, so it wrote no evidence, only ``.hang-closed.json``
    (its last step and wavefront) before the stall: the verdict still names
    the skip. Written after the stall, the file is not taken (silent)."""
    for r in (0, 1):
        (tmp_path / f"rank{r}").mkdir()
    e0 = _wave(_in("all_reduce", 51), 40, 39)
    e0.update(step=38, reason="stalled", time=1000.0)
    (tmp_path / "rank0" / "hang-1.json").write_text(json.dumps(e0))
    closed = {"rank": 1, "time": 990.0, "step": 39, "collectives": _wave({}, 39, 39)["collectives"]}
    (tmp_path / "rank1" / CLOSED_FILE).write_text(json.dumps(closed))
    v = verdict(join(tmp_path, 1000.0, 30.0, live=False))
    assert (v["kind"], v["suspect_ranks"], v["waiting_ranks"]) == ("mismatch", [1], [0])
    assert "rank 1 skipped a collective: it ended step 39 after 39 collectives of the default group" in v["text"]
    assert "rank 1 has left its training loop (its Profiler closed after step 39)" in v["text"]
    # A rank that left its loop as planned, with as many collectives: out of its loop, named so.
    closed["collectives"] = _wave({}, 40, 40)["collectives"]
    closed["step"] = 38
    (tmp_path / "rank1" / CLOSED_FILE).write_text(json.dumps(closed))
    v = verdict(join(tmp_path, 1000.0, 30.0, live=False))
    assert v["kind"] == "elsewhere"
    assert "rank 1 never entered all_reduce #40; it has left its training loop" in v["text"]
    closed["time"] = 1001.0  # closed after the stall was seen: not this stall's
    (tmp_path / "rank1" / CLOSED_FILE).write_text(json.dumps(closed))
    assert verdict(join(tmp_path, 1000.0, 30.0, live=False))["kind"] == "silent"
    # Another Profiler's closed file (the watch file names a newer one): not taken.
    closed.update(time=990.0, token="1-1")
    (tmp_path / "rank1" / CLOSED_FILE).write_text(json.dumps(closed))
    (tmp_path / "rank1" / WATCH_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere", "token": "1-2"}))
    assert verdict(join(tmp_path, 1000.0, 30.0, live=False))["kind"] == "silent"
    closed["token"] = "1-2"
    (tmp_path / "rank1" / CLOSED_FILE).write_text(json.dumps(closed))
    assert verdict(join(tmp_path, 1000.0, 30.0, live=False))["kind"] == "elsewhere"


def test_a_peer_that_left_its_loop_and_ended_is_a_skip_not_a_killed_process(tmp_path: Path) -> None:
    """Rank 0's collective raised ("Connection closed by peer") because rank
    1 ended: rank 1 had left its loop (its closed file, of the Profiler that
    watched it) and its process ended after it. It is named from the closed
    file, as having skipped a collective when it ended the step rank 0 was in
    with fewer collectives, and it is not among the ranks gone outside the
    launcher; a rank gone without a closed file still is."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process
    for r in (0, 1, 2):
        (tmp_path / f"rank{r}").mkdir()
        watch = {"host": socket.gethostname(), "pid": child.pid, "token": f"t{r}"}
        (tmp_path / f"rank{r}" / WATCH_FILE).write_text(json.dumps(watch))
    closed = {"rank": 1, "time": 990.0, "step": 39, "token": "t1", "collectives": _wave({}, 39, 39)["collectives"]}
    (tmp_path / "rank1" / CLOSED_FILE).write_text(json.dumps(closed))
    assert list(closed_ranks(tmp_path, exclude=0)) == [1]
    assert gone_ranks(tmp_path, exclude=0) == [(2, child.pid)]
    # Rank 0 ended steps 0-38 and entered all_reduce #40, which raised (the
    # anatomy marks it completed all the same).
    wave = _wave({}, 40, 40)["collectives"]
    (p,) = left_loop(0, 38, wave, closed_ranks(tmp_path, exclude=0))
    assert (p["rank"], p["step"], p["skipped"]) == (1, 39, True)
    assert p["text"] == (
        "rank 1 skipped a collective: it ended step 39 after 39 collectives of the default group (the last "
        "all_reduce #39) where rank 0 entered all_reduce #40 in that step: the ranks took different code paths "
        "(a collective called on some ranks only); rank 1 has left its training loop (its Profiler closed after "
        "step 39)"
    )
    # As many collectives (fewer batches on rank 1): it left its loop, no skip.
    (p,) = left_loop(0, 38, _wave({}, 39, 38)["collectives"], closed_ranks(tmp_path, exclude=0))
    assert not p["skipped"]
    assert p["text"] == (
        "rank 1 never entered all_reduce #39; it has left its training loop (its Profiler closed after step 39)"
    )
    # Another Profiler's closed file is not taken: rank 1 is then gone.
    other = {"host": socket.gethostname(), "pid": child.pid, "token": "t9"}
    (tmp_path / "rank1" / WATCH_FILE).write_text(json.dumps(other))
    assert closed_ranks(tmp_path, exclude=0) == {}
    assert gone_ranks(tmp_path, exclude=0) == [(1, child.pid), (2, child.pid)]


def test_with_no_collective_the_sentence_names_each_rank_plainly() -> None:
    """No rank in a collective (a stall before any, e.g. in start-up): each
    rank is said as "rank R is in ...", not "rank R it is in ..."."""
    v = verdict({0: rank_state(_ev([(TRAIN, 3, "<module>")]), None), 1: rank_state(_ev(IN_DATA), None)})
    assert v["collective"] is None
    assert v["text"] == (
        "hang at step 42 (47 s): rank 0 is in other: train.py:3 in <module>; "
        "rank 1 is in the dataloader: dataset.py:22 in __getitem__."
    )
