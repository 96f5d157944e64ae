"""Which run directory a run takes (``fastprof.recording.rundir``): a second run under
the same run name records in ``<run_name>-2`` (said on stderr) instead of
appending to the first; ``resume=True`` / ``FASTPROF_RESUME=1`` appends on
purpose and the report shows the time between the runs as idle.

Real processes throughout: the same script run twice, processes started at
the same instant, ``fastprof run`` twice, DataLoader workers, and a real
two-rank torchrun job (gloo) run several times into one run name."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fastprof
from fastprof.reports import SCHEMA_PATH

RECORDER = """
import sys, fastprof
out, name = sys.argv[1], sys.argv[2]
kw = {"resume": True} if "resume" in sys.argv[3:] else {}
with fastprof.Recorder(out_dir=out, run_name=name, flush_interval=0.05, **kw) as rec:
    with fastprof.span("work"):
        pass
print(rec.run_dir)
"""


def _pids(rank_dir: Path, traces: Any) -> set[int]:
    """The processes whose recordings a rank folder holds (one per run)."""
    return {int(s.other["pid"]) for s in traces.read(rank_dir).segments}


def _runs(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.is_dir())


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPROF_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", FASTPROF_SAMPLE_HZ="0", **extra)
    return env


def _py(script: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 90) -> Any:
    r = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or _env(),
        cwd=script.parent,
    )
    assert r.returncode == 0, r.stderr
    return r


def test_a_script_run_twice_takes_a_new_directory_and_says_so(pyscript, traces, tmp_path):
    script = pyscript.write(RECORDER)
    out = tmp_path / "runs"
    first = _py(script, str(out), "exp1")
    second = _py(script, str(out), "exp1")
    third = _py(script, str(out), "exp1")
    assert [Path(r.stdout.strip()).name for r in (first, second, third)] == ["exp1", "exp1-2", "exp1-3"]
    assert _runs(out) == ["exp1", "exp1-2", "exp1-3"]
    # One run per directory: each holds the recording of one process.
    pids = [_pids(out / name / "rank0", traces) for name in _runs(out)]
    assert all(len(p) == 1 for p in pids) and len(set.union(*pids)) == 3, pids
    assert "fastprof:" not in first.stderr
    said = [line for line in second.stderr.splitlines() if line.startswith("fastprof:")]
    assert len(said) == 1 and f"{out / 'exp1'} holds an earlier run" in said[0], second.stderr
    assert f"records in {out / 'exp1-2'}" in said[0] and "FASTPROF_RESUME=1" in said[0]


def test_resume_appends_to_the_earlier_run(pyscript, traces, tmp_path):
    script = pyscript.write(RECORDER)
    out = tmp_path / "runs"
    _py(script, str(out), "exp1")
    by_env = _py(script, str(out), "exp1", env=_env(FASTPROF_RESUME="1"))
    by_arg = _py(script, str(out), "exp1", "resume")
    assert _runs(out) == ["exp1"]
    assert Path(by_env.stdout.strip()).name == Path(by_arg.stdout.strip()).name == "exp1"
    assert "resuming the run in" in by_env.stderr and "resuming the run in" in by_arg.stderr
    run = traces.read(out / "exp1" / "rank0")
    assert len({int(s.other["pid"]) for s in run.segments}) == 3
    # Each resumed recording says how long the rank recorded nothing before it.
    gaps = run.of("C", "fastprof.resume_gap [s]")
    assert len(gaps) == 2 and all(g["args"]["value"] > 0 for g in gaps), gaps
    resumed = [s.other["config"]["resumed"] for s in run.segments if "resumed" in s.other["config"]]
    assert len({r["earlier_end_ns"] for r in resumed}) == 2


WINDOWED = """
import sys, torch, fastprof
out = sys.argv[1]
model = torch.nn.Linear(4, 4)
with fastprof.Profiler(out, "job", sample_hz=0, resume=True,
                       schedule=fastprof.schedule.steps([(1, 2)], warmup=0)) as prof:
    for _ in range(4):
        model(torch.randn(2, 4)).sum().backward()
        prof.step()
"""


def test_a_resumed_run_keeps_the_earlier_runs_torch_windows_and_adds_its_own(pyscript, tmp_path):
    # A job restarted after preemption must start: the earlier part's torch
    # traces are no reason to refuse (the overwrite check), and none is overwritten.
    script = pyscript.write(WINDOWED)
    out = tmp_path / "runs"
    _py(script, str(out), timeout=180)
    _py(script, str(out), timeout=180)
    traces = sorted((out / "job" / "rank0" / "torch").glob("*.pt.trace.json.gz"))
    assert len(traces) == 2, traces
    for t in traces:
        with gzip.open(t, "rt") as f:
            assert any(str(e.get("name", "")).startswith("ProfilerStep#") for e in json.load(f)["traceEvents"])


def test_resume_into_a_new_name_is_a_plain_run(pyscript, traces, tmp_path):
    script = pyscript.write(RECORDER)
    r = _py(script, str(tmp_path / "runs"), "fresh", env=_env(FASTPROF_RESUME="1"))
    assert "fastprof:" not in r.stderr
    assert not traces.read(tmp_path / "runs" / "fresh" / "rank0").of("C", "fastprof.resume_gap [s]")


def test_processes_starting_at_once_never_share_a_directory(pyscript, traces, tmp_path):
    """The same explicit name, and the default timestamped name, taken by
    four processes in the same instant: four directories."""
    source = """
    import sys, time, fastprof
    out, at, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    time.sleep(max(0.0, at - time.time()))   # every process starts its recorder now
    rec = fastprof.start(out, None if name == "-" else name, flush_interval=0.05)
    with fastprof.span("work"):
        time.sleep(0.2)                      # all four record at the same time
    fastprof.stop()
    print(rec.run_dir)
    """
    script = pyscript.write(source)
    for name in ("same", "-"):
        out = tmp_path / ("named" if name == "same" else "default")
        at = f"{time.time() + 2.0:.3f}"
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(out), at, name],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(),
            )
            for _ in range(4)
        ]
        done = [p.communicate(timeout=90) for p in procs]
        assert all(p.returncode == 0 for p in procs), [e for _, e in done]
        dirs = sorted(Path(o.strip()).name for o, _ in done)
        assert len(set(dirs)) == 4 and _runs(out) == dirs, (dirs, _runs(out))
        for d in dirs:
            assert len(_pids(out / d / "rank0", traces)) == 1, d
        if name == "same":
            assert dirs == ["same", "same-2", "same-3", "same-4"]


def test_same_process_a_new_recorder_is_a_new_run_a_restart_is_not(tmp_path, traces):
    with fastprof.Recorder(tmp_path, "x") as first:
        fastprof.instant("a")
    first.start()  # the same Recorder again: its own run goes on
    fastprof.instant("b")
    first.stop()
    with fastprof.Recorder(tmp_path, "x") as second:
        fastprof.instant("c")
    assert (first.run_dir.name, second.run_dir.name) == ("x", "x-2")
    assert {e["name"] for e in traces.read(first.trace_dir).of("i")} == {"a", "b"}
    assert {e["name"] for e in traces.read(second.trace_dir).of("i")} == {"c"}


def test_what_is_not_an_earlier_run(tmp_path, traces):
    # A directory left empty, with an empty rank folder.
    (tmp_path / "empty" / "rank0").mkdir(parents=True)
    # A claim by a process of this host that is gone and recorded nothing
    # (killed between its claim and its first segment).
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(dead.stdout)
    (tmp_path / "stale").mkdir()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    claim = {"job": f"process:{boot}:{gone}:1#0", "host": socket.gethostname(), "boot": boot, "pid": gone}
    (tmp_path / "stale" / ".fastprof-run").write_text(json.dumps({**claim, "pid_start": 1}))
    for name in ("empty", "stale"):
        with fastprof.Recorder(tmp_path, name) as rec:
            fastprof.instant("here")
        assert rec.run_dir == tmp_path / name
        assert traces.read(rec.trace_dir).of("i", "here")
    # An earlier fastprof's run (segments, no claim) is a run: nothing is written into it.
    with fastprof.Recorder(tmp_path, "old"):
        pass
    (tmp_path / "old" / ".fastprof-run").unlink()
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "old").rglob("*"))
    with fastprof.Recorder(tmp_path, "old") as rec:
        pass
    assert rec.run_dir == tmp_path / "old-2"
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "old").rglob("*")) == before


def test_a_reused_torchrun_id_is_a_new_run(pyscript, traces, tmp_path):
    """A requeued job keeps its rendezvous id (and restarts at restart count
    0): the rank folder holding the earlier job's recording tells them apart."""
    script = pyscript.write(RECORDER)
    env = _env(TORCHELASTIC_RUN_ID="job42", TORCHELASTIC_RESTART_COUNT="0")
    first = _py(script, str(tmp_path / "runs"), "x", env=env)
    second = _py(script, str(tmp_path / "runs"), "x", env=env)
    assert [Path(r.stdout.strip()).name for r in (first, second)] == ["x", "x-2"]


# ----------------------------------------------------------- the Profiler

PROFILER = """
import sys, time
import fastprof
out = sys.argv[1]
with fastprof.Profiler(out, "exp", torch=False, sync_clocks=False) as prof:
    for i in range(5):
        with fastprof.span("work", i=i):
            time.sleep(0.01)
        prof.step()
print(prof.run_dir)
"""


def _events(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(gzip.decompress(path.read_bytes()))["traceEvents"])


def test_report_of_a_resumed_run_shows_the_idle_time(pyscript, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    script = pyscript.write(PROFILER)
    out = tmp_path / "runs"
    for k in range(3):
        if k:
            time.sleep(0.5)  # idle between the runs: longer than any step
        _py(script, str(out), env=_env(**({"FASTPROF_RESUME": "1"} if k else {})))
    assert _runs(out) == ["exp"]
    run = out / "exp"
    # The unified trace holds the three runs' steps (rank 0's done marker of an
    # earlier run did not stand in for the resumed one's), none across a gap.
    doc = json.loads(gzip.decompress((run / "trace.json.gz").read_bytes()))
    base = int(doc["baseTimeNanoseconds"])
    steps = sorted(
        (base + round(e["ts"] * 1000), base + round((e["ts"] + e["dur"]) * 1000))
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e["name"] == "step"
    )
    assert len(steps) == 15
    rep = fastprof.report(run, formats=("json",))
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.validate(json.loads((run / "reports" / "report.json").read_text()), schema)
    idle = rep["source"]["resumed"]
    assert [e["rank"] for e in idle] == [0, 0]
    # mtime comes from the kernel's coarse clock: up to a tick behind the recorder's.
    coarse = 20_000_000
    for e, (before, after) in zip(idle, [(4, 5), (9, 10)], strict=True):
        # Each stretch lies between one run's last step and the next run's first:
        # idle time, longer than any step, and no step holds it.
        assert steps[before][1] <= e["start_ns"] + coarse and e["end_ns"] <= steps[after][0], (e, steps)
        assert e["seconds"] == pytest.approx((e["end_ns"] - e["start_ns"]) / 1e9)
        assert e["seconds"] > rep["speed"]["step_time"]["max_s"], (e, rep["speed"]["step_time"])
    # % wall leaves the idle time out.
    (row,) = [r for r in rep["time"]["rows"] if r["name"] == "step"]
    wall = rep["wall"]["duration_s"] - sum(e["seconds"] for e in idle)
    assert row["count"] == 15
    assert row["pct_wall"] == pytest.approx(100 * row["total_s"] / wall, rel=1e-6)


# ---------------------------------------------------- fastprof run, workers

OWN_PROFILER = """
import fastprof
with fastprof.Profiler(torch=False) as prof:
    for i in range(3):
        with fastprof.span("work", i=i):
            pass
        prof.step()
"""


@pytest.mark.parametrize("script", ["plain", "own profiler"])
def test_fastprof_run_twice_under_one_run_name(tmp_path, traces, script):
    (tmp_path / "train.py").write_text("print('hello')\n" if script == "plain" else OWN_PROFILER)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fastprof", "run", "-o", str(out), "--run-name", "x", "train.py"]
    said = []
    for _ in range(2):
        r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        said.append(r.stderr)
    # The script's own Profiler is the run's: one directory per fastprof run.
    assert _runs(out) == ["x", "x-2"]
    assert "recorded in" in said[1] and f"{os.sep}x-2" in said[1].split("recorded in")[1].splitlines()[0]
    assert "holds an earlier run" in said[1] and "holds an earlier run" not in said[0]
    for name in ("x", "x-2"):
        assert len(_pids(out / name / "rank0", traces)) == 1
    r = subprocess.run([*cmd[:4], "--resume", *cmd[4:]], cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _runs(out) == ["x", "x-2"] and len(_pids(out / "x" / "rank0", traces)) == 2


WORKERS = """
import sys
import torch
from torch.utils.data import DataLoader
import fastprof
out = sys.argv[1]
loader = DataLoader(list(range(8)), batch_size=2, num_workers=2)
with fastprof.Profiler(out, "w", torch=False, sync_clocks=False) as prof:
    for batch in prof.loader(loader):
        prof.step()
print(prof.run_dir)
"""


def test_dataloader_workers_record_in_their_parents_new_directory(pyscript, tmp_path):
    pytest.importorskip("torch")
    script = pyscript.write(WORKERS)
    out = tmp_path / "runs"
    dirs = [Path(_py(script, str(out), timeout=120).stdout.strip()).name for _ in range(2)]
    assert dirs == ["w", "w-2"]
    for name in dirs:
        workers = sorted((out / name / "rank0" / "workers").iterdir())
        assert len(workers) == 2, workers  # this run's two workers, nowhere else
        assert not any(p.name.startswith("rank") for p in (out / name / "rank0").iterdir())
    assert not (out / "w-3").exists()


# ---------------------------------------------------------------- torchrun

DIST = """
import os, sys, time
import torch.distributed as dist
import fastprof

out, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
if mode == "before":           # the Profiler starts before the process group
    prof = fastprof.Profiler(out, "x", torch=False).start()
    dist.init_process_group("gloo")
else:                          # after it: rank 0 decides, the store says it
    dist.init_process_group("gloo")
    prof = fastprof.Profiler(out, "x", torch=False).start()
for i in range(3):
    with fastprof.span("work", rank=rank):
        time.sleep(0.01)
    prof.step()
prof.stop()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} in {prof.run_dir}|", flush=True)  # the ranks' lines may interleave
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(script: Path, out: Path, mode: str, **env: str) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(_free_port()), str(script), str(out), mode]
    e = _env(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", **env)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT"):
        e.pop(k, None)
    r = subprocess.run(cmd, cwd=script.parent, env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["before", "after"])
def test_torchrun_twice_into_one_run_name_then_resumed(tmp_path, traces, mode):
    pytest.importorskip("torch")
    script = tmp_path / "dist.py"
    script.write_text(DIST)
    out = tmp_path / "out"
    for _ in range(2):
        _torchrun(script, out, mode)
    # Every rank of each job in one directory, each job in its own.
    assert _runs(out) == ["x", "x-2"]
    for name in ("x", "x-2"):
        assert sorted(p.name for p in (out / name).iterdir() if p.is_dir()) == ["rank0", "rank1"]
        pids = [_pids(out / name / f"rank{r}", traces) for r in (0, 1)]
        assert [len(p) for p in pids] == [1, 1] and pids[0] != pids[1], (name, pids)
        steps = [e for e in _events(out / name / "trace.json.gz") if e.get("ph") == "X" and e["name"] == "step"]
        assert len(steps) == 6
    # A third job resumes the first run on purpose: both ranks append, and
    # rank 0 merges once rank 1's new recording is done.
    stdout = _torchrun(script, out, mode, FASTPROF_RESUME="1")
    assert _runs(out) == ["x", "x-2"]
    assert stdout.count(f"in {out / 'x'}|") == 2, stdout
    for r in (0, 1):
        assert len(_pids(out / "x" / f"rank{r}", traces)) == 2
        assert len(traces.read(out / "x" / f"rank{r}").of("C", "fastprof.resume_gap [s]")) == 1
    steps = [e for e in _events(out / "x" / "trace.json.gz") if e.get("ph") == "X" and e["name"] == "step"]
    assert len(steps) == 12
