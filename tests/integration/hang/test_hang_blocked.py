"""A SIGTERM on a rank whose main thread waits in a collective's C call
(issue #37): Python's handler cannot run there (gloo's wait releases the GIL
but never returns to the interpreter), so the core's hook under the
interpreter's handler tells the watchdog, whose helper thread writes the
evidence; the job's SIGTERM then does what it would have done without
fastprof (the default: the rank dies by the signal). A real
``torchrun --nproc-per-node 2`` job with gloo on CPU; files read back with
Python's json."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import textwrap
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from hung_job import hangs, job_env, kill, line_of, start, torchrun_cmd, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("torch")

WORKER = textwrap.dedent(
    """
    import contextlib, os, signal, sys, time
    import torch, torch.distributed as dist
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mode = sys.argv[2]
    open(os.path.join(sys.argv[1], f"pid{rank}"), "w").write(str(os.getpid()))
    if mode == "own-handler":
        def on_term(signum, frame):
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_term)

    def reload_state():
        open(os.path.join(sys.argv[1], "stuck"), "w").close()
        while True:
            time.sleep(0.05)  # STUCK-OWN

    class NoProfiler(contextlib.nullcontext):
        def step(self):
            pass

    if mode == "bare":
        prof = NoProfiler()
    else:
        prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=30)
    with prof:
        for i in range(40):
            if rank == 1 and i == 6:
                reload_state()
            t = torch.ones(4)
            dist.all_reduce(t)  # WAIT-HERE
            prof.step()
    dist.destroy_process_group()
    """
)


_line = partial(line_of, WORKER)


def _start(root: Path, mode: str, env: dict[str, str]) -> subprocess.Popen[str]:
    (root / "worker.py").write_text(WORKER)
    (root / "out").mkdir()
    return start(torchrun_cmd(str(root / "worker.py"), str(root / "out"), mode), root, job_env(env))


def _pids(out: Path) -> list[int]:
    """The ranks' pids from the files the script writes (the bare job has no
    watch files)."""
    pids = []
    for f in sorted(out.glob("pid*")):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(f.read_text()))
    return pids


def _sigterm_rank0(tmp_path: Path, mode: str) -> tuple[list[dict[str, Any]], bool, str, str]:
    """Rank 1 stops in its own function; rank 0 waits in all_reduce. After
    12 s (more than the 10 s a SIGTERM needs to count as a hang's) rank 0
    gets SIGTERM; the watchdog's timeout (600 s) never passes."""
    p = _start(tmp_path, mode, {"FASTPROF_HANG_TIMEOUT": "600", "FASTPROF_HANG_GRACE": "2"})
    run = tmp_path / "out" / "job"
    try:
        assert wait_for(lambda: (tmp_path / "out" / "stuck").exists(), 150, p), "rank 1 never stopped"
        time.sleep(12.0)
        proc = psutil.Process(int((tmp_path / "out" / "pid0").read_text()))
        proc.send_signal(signal.SIGTERM)
        if mode != "bare":
            wait_for(lambda: bool(hangs(run, 0)), 30, p)
        if mode != "own-handler":
            # rank 0 dies by the signal; torchrun then ends rank 1 and says how each ended
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=90)
        else:
            time.sleep(3.0)  # what fastprof would do after the evidence, it has done
        alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        docs = hangs(run, 0)
    finally:
        out, err = kill(p, _pids(tmp_path / "out"))
    return docs, alive, out, err


def test_sigterm_on_a_rank_blocked_in_all_reduce_writes_its_evidence_and_dies_by_the_signal(tmp_path: Path) -> None:
    docs, alive, out, err = _sigterm_rank0(tmp_path, "default")
    assert docs, f"no evidence from rank 0 after SIGTERM\nstdout:\n{out}\nstderr:\n{err}"
    (doc,) = docs
    assert doc["reason"] == "sigterm" and doc["answered_by"] == "python", doc["reason"]
    assert doc["stalled_s"] >= 10.0
    s = doc["summary"]
    assert s["where"]["line"] == _line("WAIT-HERE") and s["where"]["file"].endswith("worker.py"), s
    assert s["collective"]["op"] == "all_reduce" and s["collective"]["site"]["line"] == _line("WAIT-HERE"), s
    assert s["collective"]["seq"] == 7, s  # steps 0-5's all_reduce, then step 6's
    (main,) = [t for t in doc["threads"] if t["training"]]
    assert any(f["function"] == "all_reduce" for f in main["frames"]), main
    # Without fastprof the default action ends the rank by SIGTERM: so it does here.
    assert "exitcode  : -15" in err or "Signal 15 (SIGTERM)" in err, err
    assert not alive


def test_without_fastprof_the_same_sigterm_ends_the_rank_by_the_signal(tmp_path: Path) -> None:
    """The exit status to keep: the same job without a Profiler (the
    default SIGTERM disposition) dies by the signal at once."""
    docs, alive, _, err = _sigterm_rank0(tmp_path, "bare")
    assert docs == [] and not alive
    assert "exitcode  : -15" in err or "Signal 15 (SIGTERM)" in err, err


def test_sigterm_with_the_jobs_own_handler_writes_the_evidence_and_leaves_the_handler_pending(
    tmp_path: Path,
) -> None:
    """The job's handler (``sys.exit(7)``) cannot run while the main thread
    waits in C, with or without fastprof: the evidence is written and the
    rank stays where it was (it is not ended by fastprof)."""
    docs, alive, out, err = _sigterm_rank0(tmp_path, "own-handler")
    assert docs, f"no evidence from rank 0 after SIGTERM\nstdout:\n{out}\nstderr:\n{err}"
    (doc,) = docs
    assert doc["reason"] == "sigterm"
    assert doc["summary"]["collective"]["op"] == "all_reduce"
    assert alive, "fastprof ended a rank whose own SIGTERM handler had not run"
