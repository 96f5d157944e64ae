"""fastprof's hang verdict beside torch's Flight Recorder and py-spy, on the
same hang (issue #37, item 7).

A 2-rank ``torchrun`` job with gloo on CPU hangs in one of two ways:

- ``skip``: rank 1 leaves out step 6's ``all_reduce``; gloo pairs the ranks'
  collectives by number, so the job runs on one collective apart until rank 1
  has ended its loop and rank 0 waits in its last ``all_reduce``;
- ``data``: rank 1 sleeps in ``Dataset.__getitem__`` at step 6; rank 0 waits in
  that step's ``all_reduce``.

On the same hung processes it then takes, in turn:

1. **fastprof**: the verdict each rank's watchdog leads to (``FASTPROF_HANG_TIMEOUT``,
   ``--timeout``), read from the job's stderr; the time is from the stall's start
   (the rank's evidence: its time less ``stalled_s``) to the line;
2. **py-spy**: ``py-spy dump --pid`` of each rank, one after the other (the pids from
   ``rank{R}/.hang-watch.json``); the time is the dumps' wall time; what it names is
   each rank's innermost frame of the job's script;
3. **Flight Recorder** (``TORCH_FR_BUFFER_SIZE``): gloo dumps nothing on a hang by
   itself, and a signal handler does not run while the main thread waits in the
   collective's C call, so the job carries what a user would add: a thread that
   writes ``_dump_fr_trace()`` to ``fr/rank_<R>`` when ``FR_DUMP`` appears. Then
   torch's analyzer ``python -m torch.distributed.flight_recorder.fr_trace fr
   --prefix rank_`` runs on the dumps. The time is the dumps' plus the analyzer's.

It prints what each names (rank, line, collective) and how long it took, and
the raw output of each, shortened. py-spy is not a dependency of fastprof
(``.venv/bin/pip install py-spy`` for this bench).

Run: .venv/bin/python benches/bench_hang_peers.py [--modes skip data] [--timeout 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from _util import machine

WORKER = textwrap.dedent(
    """
    import os, sys, threading, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    out, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def flight_recorder_on_request():
        # What a gloo job needs for a Flight Recorder dump while hung: a thread
        # (the main thread waits in the collective's C call; no handler runs).
        from torch._C._distributed_c10d import _dump_fr_trace
        while not os.path.exists(os.path.join(out, "FR_DUMP")):
            time.sleep(0.05)
        os.makedirs(os.path.join(out, "fr"), exist_ok=True)
        tmp = os.path.join(out, "fr", f".rank_{rank}")
        with open(tmp, "wb") as f:
            f.write(_dump_fr_trace())
        os.replace(tmp, os.path.join(out, "fr", f"rank_{rank}"))

    threading.Thread(target=flight_recorder_on_request, daemon=True).start()

    class Data(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            if mode == "data" and rank == 1 and i == 6:
                time.sleep(3600)  # STUCK-DATA
            return torch.ones(4)

    prof = fastprof.Profiler(out_dir=out, run_name="job", schedule="never", merge_timeout=600)
    with prof:
        for i, x in enumerate(prof.loader(DataLoader(Data(), batch_size=1))):
            t = x.sum()
            if mode == "skip" and rank == 1 and i == 6:
                pass  # SKIP: rank 1 leaves out this step's all_reduce
            else:
                dist.all_reduce(t)  # WAIT-HERE
            prof.step()
    dist.destroy_process_group()
    """
)


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(WORKER.splitlines(), 1) if marker in text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(root: Path, mode: str, timeout: float) -> tuple[subprocess.Popen[str], list[tuple[float, str]]]:
    (root / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    env.update(
        MASTER_ADDR="127.0.0.1",
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
        FASTPROF_SAMPLE_HZ="0",
        FASTPROF_HANG_TIMEOUT=str(timeout),
        FASTPROF_HANG_GRACE="2",
        TORCH_FR_BUFFER_SIZE="2000",
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(free_port()), str(root / "worker.py"), str(root / "out"), mode]
    p = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert p.stderr is not None
        for ln in p.stderr:
            lines.append((time.time(), ln.rstrip("\n")))

    threading.Thread(target=read, daemon=True).start()
    return p, lines


def kill(p: subprocess.Popen[str], run: Path) -> None:
    for w in run.glob("rank*/.hang-watch.json"):
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            proc = psutil.Process(int(json.loads(w.read_text())["pid"]))
            for c in [*proc.children(recursive=True), proc]:
                c.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(os.getpgid(p.pid), signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=60)


def wait_for(pred: Any, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def fastprof_row(run: Path, lines: list[tuple[float, str]]) -> dict[str, Any]:
    hit = next(((t, ln) for t, ln in lines if "fastprof: hang at step" in ln), None)
    if hit is None:
        return {"tool": "fastprof", "names": "no verdict", "seconds": None, "raw": ""}
    starts = []
    for d in run.glob("rank*/hang-*.json"):
        doc = json.loads(d.read_text())
        starts.append(float(doc["time"]) - float(doc["stalled_s"]))
    took = hit[0] - min(starts) if starts else None
    return {"tool": "fastprof", "names": hit[1].removeprefix("fastprof: "), "seconds": took, "raw": hit[1]}


def pyspy_row(run: Path) -> dict[str, Any]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return {"tool": "py-spy", "names": "not installed", "seconds": None, "raw": ""}
    names, raw = [], []
    t0 = time.perf_counter()
    for w in sorted(run.glob("rank*/.hang-watch.json")):
        watch = json.loads(w.read_text())
        r = subprocess.run([exe, "dump", "--pid", str(watch["pid"])], capture_output=True, text=True, timeout=120)
        raw.append(f"--- rank {watch['rank']} (rc {r.returncode})\n{r.stdout}{r.stderr}")
        main = r.stdout.split('"MainThread"', 1)[-1] if '"MainThread"' in r.stdout else r.stdout
        frames = re.findall(r"^\s+(\S+) \((\S+):(\d+)\)", main, re.M)
        mine = next(((fn, ln) for fn, f, ln in frames if f.endswith("worker.py")), None)
        top = frames[0] if frames else None
        where = f"worker.py:{mine[1]} in {mine[0]}" if mine else "no frame of the script"
        inner = f"; innermost {top[0]} ({os.path.basename(top[1])}:{top[2]})" if top else ""
        names.append(f"rank {watch['rank']}: {where}{inner}")
    took = time.perf_counter() - t0
    return {"tool": "py-spy", "names": " | ".join(names), "seconds": took, "raw": "\n".join(raw)}


def flight_recorder_row(root: Path) -> dict[str, Any]:
    out = root / "out"
    t0 = time.perf_counter()
    (out / "FR_DUMP").touch()
    dumped = wait_for(lambda: all((out / "fr" / f"rank_{r}").exists() for r in (0, 1)), 60)
    t_dump = time.perf_counter() - t0
    if not dumped:
        return {"tool": "Flight Recorder", "names": "no dump within 60 s", "seconds": t_dump, "raw": ""}
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(out / "fr"), "--prefix", "rank_"]
    t1 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    t_an = time.perf_counter() - t1
    text = (r.stdout + r.stderr).strip()
    if r.returncode != 0:
        last = text.splitlines()[-1] if text else ""
        names = f"analyzer failed (exit {r.returncode}): {last}"
    else:
        found = [ln.strip() for ln in text.splitlines() if re.search(r"mismatch|not completed|rank|missing", ln, re.I)]
        names = " / ".join(found[:4]) if found else (text.splitlines()[0] if text else "no output")
    # What the dumps themselves hold: each rank's last entry and its state.
    ends: list[str] = []
    with contextlib.suppress(Exception):
        for rk in (0, 1):
            doc = pickle.loads((out / "fr" / f"rank_{rk}").read_bytes())
            e = (doc.get("entries") or [None])[-1]
            if e is not None:
                ends.append(f"rank {rk}: {e.get('profiling_name')} seq {e.get('collective_seq_id')} {e.get('state')}")
    if ends:
        names += " [the dumps' last entries: " + "; ".join(ends) + "]"
    raw = f"$ {' '.join(cmd)}\n(exit {r.returncode})\n{text[-3000:]}"
    return {
        "tool": "Flight Recorder",
        "names": names,
        "seconds": t_dump + t_an,
        "detail": f"dump {t_dump:.2f} s + analyzer {t_an:.2f} s",
        "raw": raw,
    }


def one(mode: str, timeout: float, keep: bool) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix=f"bench-hang-{mode}-"))
    p, lines = start(root, mode, timeout)
    run = root / "out" / "job"
    try:
        if not wait_for(lambda: any("fastprof: hang at step" in ln for _, ln in lines), 200):
            raise SystemExit(f"{mode}: no fastprof verdict within 200 s\n" + "\n".join(ln for _, ln in lines[-40:]))
        rows = [fastprof_row(run, lines), pyspy_row(run), flight_recorder_row(root)]
    finally:
        kill(p, run)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    for r in rows:
        r["mode"] = mode
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["skip", "data"], choices=["skip", "data"])
    ap.add_argument("--timeout", type=float, default=10.0, help="FASTPROF_HANG_TIMEOUT for the job (s)")
    ap.add_argument("--keep", action="store_true", help="keep the jobs' folders")
    ap.add_argument("--raw", action="store_true", help="print each tool's full output")
    a = ap.parse_args()
    print(f"machine: {machine()}")
    print(
        f"the job's lines: WAIT-HERE {line_of('WAIT-HERE')}, SKIP {line_of('SKIP')}, STUCK-DATA {line_of('STUCK-DATA')}"
    )
    rows = [r for m in a.modes for r in one(m, a.timeout, a.keep)]
    print()
    print("| hang | tool | what it names | seconds |")
    print("|---|---|---|---|")
    for r in rows:
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.2f}"
        if r.get("detail"):
            secs += f" ({r['detail']})"
        print(f"| {r['mode']} | {r['tool']} | {r['names'].replace('|', '/')} | {secs} |")
    if a.raw:
        for r in rows:
            print(f"\n===== {r['mode']} / {r['tool']}\n{r['raw']}")


if __name__ == "__main__":
    main()
