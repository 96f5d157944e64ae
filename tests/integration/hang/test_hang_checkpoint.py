"""The false alarm issue #37 names: rank 0 saves a 20 s checkpoint while
rank 1 waits at a barrier, under ``torchrun -m fastprof run`` (a script with
no Profiler, 2 ranks, gloo on CPU). The save is real: ``torch.save`` of a
state, again and again, for 20 s of the script's own clock.

With ``hang_timeout`` above the save nothing is reported at all. With it
below, the ranks report once, only once the timeout has passed since the
last step ended, while the save still runs, and the verdict says rank 1
waits for rank 0 in its save function. Times are compared with the times
the script measured (the step's end, the save's start and end), never with
a fixed figure; every file is read back with Python's json."""

from __future__ import annotations

import json
import re
import textwrap
from functools import partial
from pathlib import Path

import pytest

from hung_job import fastprof_run, hangs, job_env, line_of, run_to_end, start, torchrun_cmd

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

SAVE_S = 20.0

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out, seconds = sys.argv[1], float(sys.argv[2])

    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def save_checkpoint(path, seconds):
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "extra": torch.randn(1 << 18)}
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # SAVE-LOOP
            torch.save(state, path)  # SAVE-ONE

    step_end = None
    for i, x in enumerate(torch.utils.data.DataLoader(torch.randn(16, 256), batch_size=1)):
        if i == 6:
            if rank == 0:
                began = time.time()
                save_checkpoint(os.path.join(out, "ckpt.pt"), seconds)
                with open(os.path.join(out, "save.json"), "w") as f:
                    json.dump({"step_end": step_end, "began": began, "ended": time.time()}, f)
            dist.barrier()  # BARRIER
        model(x).sum().backward()
        t = torch.ones(1)
        dist.all_reduce(t)
        opt.step()
        step_end = time.time()  # the step ended in opt.step() (fastprof run's step boundary)
        opt.zero_grad()
    dist.destroy_process_group()
    """
)


_line = partial(line_of, SCRIPT)


def _run(root: Path, timeout: str) -> tuple[str, Path, dict[str, float]]:
    """The job to its end under ``torchrun -m fastprof run``: its stderr,
    the run directory and the save's times (``save.json``)."""
    (root / "train.py").write_text(SCRIPT)
    (root / "out").mkdir()
    base = job_env({"FASTPROF_HANG_TIMEOUT": timeout, "FASTPROF_HANG_GRACE": "2"})
    p = start(torchrun_cmd(*fastprof_run(root / "out", "train.py", str(root / "out"), str(SAVE_S))), root, base)
    run = root / "out" / "job"
    _out, err = run_to_end(p, run, 150, "the job did not end within 150 s")
    assert p.returncode == 0, err[-5000:]
    save = json.loads((root / "out" / "save.json").read_text())
    # The premise: the save lasted its 20 s, after a step had ended.
    assert save["ended"] - save["began"] >= SAVE_S and save["step_end"] is not None, save
    return err, run, save


def test_a_20s_checkpoint_under_a_longer_timeout_is_no_hang(tmp_path: Path) -> None:
    err, run, _save = _run(tmp_path, "30")
    assert "fastprof: hang" not in err, err[-3000:]
    for rank in (0, 1):
        assert hangs(run, rank) == []
        acct = json.loads((run / f"rank{rank}" / "profiler.json").read_text())["hang"]
        assert acct["enabled"] and acct["timeout"] == 30.0 and acct["reports"] == [] and acct["verdicts"] == [], acct
    assert not (run / ".hang-verdict").exists()


def test_a_20s_checkpoint_past_the_timeout_is_said_once_as_waiting_for_rank0_in_save(tmp_path: Path) -> None:
    timeout = 6.0
    err, run, save = _run(tmp_path, str(timeout))
    lines = [ln for ln in err.splitlines() if "fastprof: hang" in ln]
    assert len(lines) == 1, err[-3000:]
    (v,) = lines
    m = re.search(
        r"fastprof: hang at step 6 \((\d+) s\): rank 0 never entered barrier #(\d+); it is in other: "
        r"train.py:(\d+) in save_checkpoint\. Rank 1 waits in barrier #(\d+) \(train.py:(\d+) in <module>\)\.$",
        v,
    )
    assert m, v
    assert int(m.group(1)) >= timeout and m.group(2) == m.group(4), v
    assert int(m.group(3)) in (_line("SAVE-LOOP"), _line("SAVE-ONE")), v
    assert int(m.group(5)) == _line("BARRIER"), v
    for rank in (0, 1):
        # One report per rank for the whole 20 s (not one per timeout), after step 5.
        (doc,) = hangs(run, rank)
        assert doc["reason"] == "stalled" and doc["step"] == 5 and doc["timeout_s"] == timeout, doc
        assert doc["stalled_s"] >= timeout, doc
        # Only past the timeout, counted from the step's end as the script saw it
        # (0.5 s for the step's end hook to return to the script: its clock is read after)...
        assert doc["time"] - save["step_end"] >= timeout - 0.5, (doc["time"], save)
        # ... and while rank 0 still saved: said during the save, not after it.
        assert save["began"] < doc["time"] < save["ended"], (doc["time"], save)
    s0 = hangs(run, 0)[0]["summary"]
    assert s0["where"]["function"] == "save_checkpoint" and s0["collective"] is None, s0
    s1 = hangs(run, 1)[0]["summary"]
    assert s1["collective"]["op"] == "barrier" and s1["collective"]["site"]["line"] == _line("BARRIER"), s1
    said = json.loads((run / ".hang-verdict").read_text())
    assert said["rank"] == 0 and save["began"] < said["time"] < save["ended"], (said, save)
    # The job went on after the save and ended well; each rank's account has the one report.
    for rank in (0, 1):
        acct = json.loads((run / f"rank{rank}" / "profiler.json").read_text())["hang"]
        assert [r["reason"] for r in acct["reports"]] == ["stalled"], acct
    assert json.loads((run / "rank0" / "profiler.json").read_text())["hang"]["verdicts"] == [v[len("fastprof: ") :]]
