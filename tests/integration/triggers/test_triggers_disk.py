"""``max_disk`` holds while a flight dump or a triggered torch window is
written, not only once it is counted (issue #34, item 8).

A real job under a 1 MiB cap whose flight window holds many MiB: a flight
dump asked for with ``fastprof trigger --flight``, then a capture and a dump
asked for with SIGUSR2, while a thread of this test sums the rank
directory's files every millisecond or so, temporaries included. Before,
the dump was written whole (10 MB and more) and deleted after, and torch's
JSON sat uncompressed in ``torch/`` before its gzip was written."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

CAP = 1 << 20

# Fills the flight window with poorly compressing instants (many MiB of it),
# says so, then runs quiet steps (no more segments to rotate: a dump stays
# on disk until the next file needs its room), each with enough small torch
# ops that a two-step torch window's JSON is larger than the cap.
JOB = textwrap.dedent(
    """
    import os, sys, time
    import torch, fastprof

    out = sys.argv[1]
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    flight_on = os.environ.get("FLIGHT_ON", "trigger")
    ops = int(os.environ.get("OPS", "800"))
    trig = fastprof.Triggers(poll_s=0.05, min_interval_s=0, steps=2, anomaly=False, flight_on=flight_on)
    prof = fastprof.Profiler(
        out, "run", schedule="never", sync_clocks=False, merge=False, triggers=trig, sample_hz=0,
        segment_size="256KiB", max_disk="1MiB", window_seconds=3600, window_bytes="64MiB",
    )
    with prof:
        for i in range(300_000):
            fastprof.instant("tick", i=i, noise=f"{(i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFF:x}")
        print("full", flush=True)
        while not os.path.exists(os.path.join(out, "stop")):
            y = m(x)
            for _ in range(ops):
                y = y + 1
            y.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    """
)

#: What the cap does not bound: the rank's small bookkeeping files.
BOOKKEEPING = {"live.json", "triggers.json", "profiler.json", ".fastprof.lock", "TRIGGER"}


def _capped_bytes(rank_dir: Path) -> int:
    """Bytes of what ``max_disk`` bounds, as they are this instant: the
    segments (open and closed), and everything under flight/ and torch/,
    hidden temporaries and pipes included. A file renamed or deleted
    between the listing and its stat is skipped; one seen under two names
    counts once."""
    sizes: dict[int, int] = {}
    for root, _dirs, names in os.walk(rank_dir):
        for name in names:
            if name in BOOKKEEPING or name.lstrip(".").split(".tmp")[0] in BOOKKEEPING:
                continue  # and their temporaries (".triggers.json.tmp-<pid>")
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


class Watcher(threading.Thread):
    """Sums the rank directory's capped files as often as it can (a listing
    and a stat each: every millisecond or two) and keeps the most seen."""

    def __init__(self, rank_dir: Path) -> None:
        super().__init__(daemon=True)
        self.rank_dir = rank_dir
        self.most = 0
        self.most_names: list[str] = []
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if self.rank_dir.is_dir():
                n = _capped_bytes(self.rank_dir)
                self.samples += 1
                if n > self.most:
                    self.most = n
                    self.most_names = sorted(str(p.relative_to(self.rank_dir)) for p in self.rank_dir.rglob("*"))
            time.sleep(0.0005)


def _state(rank_dir: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((rank_dir / "triggers.json").read_text())
        return doc
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait_for(what: str, check: Any, limit: float = 120.0) -> Any:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Job:
    """The job, started, with a watcher on its rank directory."""

    def __init__(self, tmp_path: Path, flight_on: str, ops: int = 800) -> None:
        (tmp_path / "job.py").write_text(JOB)
        self.out = tmp_path / "out"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
        self.env.update(OMP_NUM_THREADS="1", FLIGHT_ON=flight_on, OPS=str(ops))
        self.run = self.out / "run"
        self.rank_dir = self.run / "rank0"
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "job.py"), str(self.out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self.watcher = Watcher(self.rank_dir)
        self.watcher.start()
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "full\n", self.proc.communicate()

    def stop(self) -> str:
        """Stop the job and the watcher; the job's stderr."""
        try:
            (self.out / "stop").touch()
            _out, err = self.proc.communicate(timeout=120)
        finally:
            self.watcher.done.set()
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        self.watcher.join()
        assert self.proc.returncode == 0, err
        assert self.watcher.samples > 100
        return err

    def kill(self) -> None:
        self.watcher.done.set()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def test_a_flight_dump_under_max_disk_keeps_the_newest_events_that_fit_and_never_passes_it(tmp_path: Path) -> None:
    job = Job(tmp_path, "trigger")
    try:
        cli = subprocess.run(
            [sys.executable, "-m", "fastprof", "trigger", str(job.run), "--flight", "--wait", "120"],
            capture_output=True,
            text=True,
            env=job.env,
            timeout=180,
        )
        (dump,) = _state(job.rank_dir)["flight_dumps"]
        doc: dict[str, Any] = {}
        if cli.returncode == 0:
            # Read now: quiet steps rotate no segment, so nothing needs its room yet.
            with gzip.open(dump["path"], "rt") as f:
                doc = json.load(f)
        # A second one, by the signal (a capture's dump: not coalesced into the first).
        os.kill(job.proc.pid, signal.SIGUSR2)
        _wait_for(
            "the second dump",
            lambda: (
                len(_state(job.rank_dir).get("flight_dumps", [])) == 2
                and all("dump_s" in d for d in _state(job.rank_dir)["flight_dumps"])
            ),
        )
        err = job.stop()
    finally:
        job.kill()
    most = job.watcher.most
    assert most <= CAP, f"{most} bytes under the rank directory: {job.watcher.most_names}"
    assert cli.returncode == 0, cli.stdout + cli.stderr

    # The newest of the window, as much as the cap leaves.
    window = doc["otherData"]["window"]
    cut = window["left_out_for_disk"]
    assert dump["left_out_events"] == cut["events"] > 0
    ticks = [e["args"]["i"] for e in doc["traceEvents"] if e.get("name") == "tick"]
    assert ticks == list(range(300_000 - len(ticks), 300_000)), "a contiguous suffix, ending at the newest"
    assert dump["bytes"] <= cut["limit_bytes"] < CAP
    assert dump["bytes"] > CAP // 4, "the room the cap leaves is used"
    assert "max_disk" in dump["note"]
    dumps = json.loads((job.rank_dir / "profiler.json").read_text())["triggers"]["flight_dumps"]
    assert len(dumps) == 2 and all(d.get("left_out_events") for d in dumps), dumps

    # Said once on stderr, in fastprof's own line.
    said = [ln for ln in err.splitlines() if "left out" in ln]
    assert len(said) == 1 and said[0].startswith("fastprof: flight dump"), err


@pytest.mark.parametrize("ops", [800, 4000])
def test_a_torch_windows_json_never_reaches_the_disk_and_its_gzip_stays_under_max_disk(
    tmp_path: Path, ops: int
) -> None:
    """A capture whose JSON (two steps of ``ops`` small ops each: MBs) is
    larger than the cap: before, torch wrote it whole into torch/ and the
    gzip beside it. With 800 ops the gzip fits beside the open segment;
    with 4000 it does not, and is not written (said at the end)."""
    job = Job(tmp_path, "none", ops)
    try:
        os.kill(job.proc.pid, signal.SIGUSR2)
        _wait_for(
            "the capture's steps",
            lambda: any(c.get("status") == "done" for c in _state(job.rank_dir).get("captures", [])),
        )
        err = job.stop()  # the Profiler waits for the export before its summary
    finally:
        job.kill()
    most = job.watcher.most
    assert most <= CAP, f"{most} bytes under the rank directory: {job.watcher.most_names}"
    summary = json.loads((job.rank_dir / "profiler.json").read_text())
    (cap,) = summary["triggers"]["captures"]
    w = cap["window"]
    torch_dir = job.rank_dir / "torch"
    if ops == 800:
        assert w["saved"] and w["error"] is None and 0 < w["bytes"] < CAP, w
        with gzip.open(w["path"], "rt") as f:
            events = json.load(f)["traceEvents"]
        assert sum(1 for e in events if e.get("name") == "aten::add") >= 2 * ops
    else:
        assert not w["saved"] and w["error"].startswith("not written: larger than the disk cap"), w
        assert not Path(w["path"]).exists()
        said = [ln for ln in err.splitlines() if "not written" in ln]
        assert len(said) == 1 and f"fastprof: torch window {w['path']}: not written" in said[0], err
    assert not [p for p in torch_dir.iterdir() if p.name.startswith(".")], "no temporary left"
    assert not list(job.rank_dir.glob("flight/*")), "flight_on=none: no dump"
