"""Long-run mode: the recorder's disk cap (``max_disk``, ``keep_segments``).

Real recordings with small segments rotate for real: the rank's segment
files are summed on disk while recording, what is left is read back with
gzip + json, and the merge and the report of the rotated run are run through
the CLI and their outputs parsed with ``json``."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import fastprof
from fastprof import ConfigError
from fastprof.cli.main import main
from fastprof.reports import SCHEMA_PATH

SEGMENT = 64 << 10
CAP = 4 * SEGMENT
SEG_RE = re.compile(r"^fastprof\.(\d+)\.json\.gz(\.part)?$")


def _disk(rank_dir: Path) -> int:
    """Bytes of the rank's segment files now (a file renamed or deleted
    between the listing and its stat is skipped; one listed under both its
    names, `.part` and final, counts once)."""
    sizes: dict[int, int] = {}
    for e in os.scandir(rank_dir):
        if SEG_RE.match(e.name):
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


def _indices(rank_dir: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in rank_dir.iterdir() if (m := SEG_RE.match(p.name)) and not m.group(2))


def _load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _record(rec: fastprof.Recorder, until_deleted: int, cap: int | None = CAP) -> tuple[int, int]:
    """Numbered instants (args that compress poorly) until the cap has
    deleted ``until_deleted`` segments, summing the disk after every batch
    (never above ``cap``). Returns (instants recorded, most bytes seen on disk)."""
    i = 0
    most = 0
    rank_dir = rec.trace_dir
    while True:
        for _ in range(500):
            fastprof.instant("tick", i=i, noise=f"{(i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFF:x}")
            i += 1
        disk = _disk(rank_dir)
        most = max(most, disk)
        assert cap is None or disk <= cap, f"{disk} bytes on disk after {i} instants, cap {cap}"
        present = _indices(rank_dir)
        if present and present[0] >= until_deleted:
            return i, most
        assert i < 2_000_000, "the cap never deleted a segment"


def test_disk_stays_under_the_cap_and_the_newest_data_is_kept(tmp_path: Path) -> None:
    rec = fastprof.Recorder(tmp_path, "rot", segment_size="64KiB", max_disk=CAP, flush_interval=0.01)
    with rec:
        n, most = _record(rec, until_deleted=6)
    stats = rec.stats
    assert stats is not None and stats.rotated is not None
    rank_dir = rec.trace_dir
    assert _disk(rank_dir) <= CAP
    left = _indices(rank_dir)
    assert not list(rank_dir.glob("*.part"))
    # A fresh directory: this recording wrote 0..max; the others are the deleted ones.
    deleted = sorted(set(range(max(left) + 1)) - set(left))
    assert deleted == list(range(left[0])), "only the oldest segments go"
    assert stats.rotated["segments"] == len(deleted) >= 6
    listed = [d["segment"] for d in stats.rotated["deleted"]]
    assert listed == deleted[-len(listed) :]
    assert stats.rotated["bytes"] > 0 and stats.rotated["max_disk"] == CAP
    assert sorted(stats.segments) == sorted(rank_dir / f"fastprof.{k}.json.gz" for k in left)
    assert most <= CAP

    segs = [_load(rank_dir / f"fastprof.{k}.json.gz") for k in left]
    ticks = [e["args"]["i"] for s in segs for e in s["traceEvents"] if e.get("name") == "tick"]
    # The newest data is all there, with no hole; the oldest is gone.
    assert ticks == list(range(ticks[0], n)), "kept instants are a contiguous suffix"
    assert ticks[0] > 0
    # Every deleted event is counted: deleted + kept = written.
    kept_events = sum(s["otherData"]["segment_events"] for s in segs)
    assert stats.rotated["events"] + kept_events == stats.events_written
    assert stats.rotated["events"] == ticks[0]
    # Each later segment's metadata counts what was deleted before it closed.
    counts = [s["otherData"].get("rotated", {}).get("segments", 0) for s in segs]
    assert counts == sorted(counts) and counts[-1] == len(deleted)
    # The deleted time range ends before the first kept instant (one thread, in order).
    first_kept = min(e["ts"] for s in segs for e in s["traceEvents"] if e.get("name") == "tick")
    assert 0 <= stats.rotated["ts_start"] <= stats.rotated["ts_end"] <= first_kept


def test_keep_segments_keeps_that_many_closed_beside_the_open_one(tmp_path: Path) -> None:
    rec = fastprof.Recorder(tmp_path, "keep", segment_size="64KiB", keep_segments=2, flush_interval=0.01)
    with rec:
        _record(rec, until_deleted=3, cap=None)
        # Two closed beside the open one (three for the instant between a
        # segment's close and the deletion it makes due, before the next opens).
        assert len(_indices(rec.trace_dir)) <= 3
    left = _indices(rec.trace_dir)
    # At stop the open segment closed too: the two closed ones and it.
    assert len(left) == 3
    assert rec.stats is not None and rec.stats.rotated is not None
    assert rec.stats.rotated["segments"] == left[0] >= 3


def test_merge_and_report_of_a_rotated_run_say_what_was_rotated_away(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = fastprof.Profiler(out_dir=tmp_path, run_name="run", segment_size="64KiB", max_disk=CAP, flush_interval=0.01)
    with prof:
        rank_dir = prof.recorder.trace_dir
        step = 0
        while not _indices(rank_dir) or _indices(rank_dir)[0] < 4:
            with fastprof.span("work"):
                for i in range(2000):
                    fastprof.instant("tick", i=i, step=step, noise=f"{(i * 0x9E3779B97F4A7C15 + step) & 0xFFFFFFFF:x}")
            prof.step()
            step += 1
            assert _disk(rank_dir) <= CAP
            assert step < 500
    run = tmp_path / "run"
    left = _indices(rank_dir)
    deleted = left[0]
    # profiler.json counts what the disk cap deleted.
    summary = json.loads((rank_dir / "profiler.json").read_text())
    rot = summary["rotation"]
    assert rot["recorder_stopped"] and rot["max_disk"] == CAP
    assert rot["segments_deleted"] == deleted >= 4
    assert rot["ts_start"] is not None and rot["ts_end"] >= rot["ts_start"]

    # The Profiler's own merge, then the CLI's: both say it in otherData.
    capsys.readouterr()
    out = tmp_path / "merged.json.gz"
    assert main(["merge", str(run), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"rotated away: rank 0: the disk cap deleted {deleted} segment\(s\)", err), err
    for trace in (run / "trace.json.gz", out):
        doc = _load(trace)
        (r,) = doc["otherData"]["rotated"]
        assert r["rank"] == 0 and r["segments"] == deleted
        assert r["events"] == rot["events_deleted"] and r["bytes"] == rot["bytes_deleted"]
        # Epoch ns of the range: the recording's base + trace time.
        kept_ticks = [e for e in doc["traceEvents"] if e.get("name") == "tick"]
        first_kept = doc["baseTimeNanoseconds"] + min(round(float(e["ts"]) * 1000) for e in kept_ticks)
        assert r["start_ns"] <= r["end_ns"] <= first_kept
        assert r["end_s"] == pytest.approx((r["end_ns"] - doc["baseTimeNanoseconds"]) / 1e9)

    # The report: report.json (valid against its schema) and the terminal.
    capsys.readouterr()
    assert main(["report", str(run), "-o", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    jsonschema.validate(rep, json.loads(SCHEMA_PATH.read_text()))
    (r,) = rep["source"]["rotated"]
    assert r["rank"] == 0 and r["segments"] == deleted and r["events"] == rot["events_deleted"]
    assert r["start_s"] is not None and r["start_s"] <= r["end_s"]
    assert r["end_ns"] <= rep["wall"]["end_ns"]
    assert f"rotated away: rank 0: the disk cap deleted {deleted} segment(s)" in printed, printed
    page = (tmp_path / "rep" / "report.html").read_text()
    assert f"rotated away: rank 0: the disk cap deleted {deleted} segment(s)" in page

    # Without the unified trace the report reads the segments left, whose
    # ledgers say the same (in their own trace time, placed on the wall clock).
    (run / "trace.json.gz").unlink()
    assert main(["report", str(run), "-o", str(tmp_path / "rep2"), "-q"]) == 0
    rep2 = json.loads((tmp_path / "rep2" / "report.json").read_text())
    jsonschema.validate(rep2, json.loads(SCHEMA_PATH.read_text()))
    assert "merged" not in {f["kind"] for f in rep2["source"]["inputs"]}
    (r2,) = rep2["source"]["rotated"]
    assert {k: r2[k] for k in ("rank", "segments", "bytes", "events", "start_ns", "end_ns")} == {
        k: r[k] for k in ("rank", "segments", "bytes", "events", "start_ns", "end_ns")
    }


class _NoisyData:
    """A dataset whose every item records poorly compressing instants (in
    the DataLoader worker that fetches it)."""

    def __len__(self) -> int:
        return 60

    def __getitem__(self, item: int) -> int:
        for i in range(1000):
            fastprof.instant(
                "fetch.tick", item=item, i=i, noise=f"{(i * 0x9E3779B97F4A7C15 + item) & 0xFFFFFFFFFFFF:x}"
            )
        return item


def test_dataloader_workers_keep_the_cap_given_in_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker records as long as it lives (a persistent one, as long as
    the job): the cap given to the Profiler in code, not only through
    FASTPROF_MAX_DISK, holds its recording too."""
    torch = pytest.importorskip("torch")
    for name in ("FASTPROF_MAX_DISK", "FASTPROF_KEEP_SEGMENTS", "FASTPROF_SEGMENT_SIZE"):
        monkeypatch.delenv(name, raising=False)
    loader = torch.utils.data.DataLoader(_NoisyData(), batch_size=None, num_workers=1)
    prof = fastprof.Profiler(tmp_path, "workers", torch=False, segment_size="64KiB", max_disk=CAP, sample_hz=0)
    with prof:
        for _ in prof.loader(loader):
            pass
    (worker,) = (prof.rank_dir / "workers").iterdir()
    left = _indices(worker)
    assert left and left[0] >= 1, f"the worker's recording rotated nothing: {sorted(os.listdir(worker))}"
    assert _disk(worker) <= CAP
    last = _load(worker / f"fastprof.{left[-1]}.json.gz")["otherData"]
    assert last["config"]["max_disk"] == CAP and last["config"]["segment_size"] == SEGMENT
    # (a deletion made by the final close is in no segment closed before it)
    assert 1 <= last["rotated"]["segments"] <= left[0]
    # What is left is the newest: the last item's fetches are kept, the first's rotated away.
    items = {
        e["args"]["item"]
        for n in left
        for e in _load(worker / f"fastprof.{n}.json.gz")["traceEvents"]
        if e["name"] == "fetch.tick"
    }
    assert items and max(items) == len(_NoisyData()) - 1 and 0 not in items, sorted(items)


def test_a_run_that_rotated_nothing_says_nothing(tmp_path: Path) -> None:
    rec = fastprof.Recorder(tmp_path, "calm", segment_size="64KiB", max_disk=CAP)
    with rec:
        fastprof.instant("one")
    assert rec.stats is not None and rec.stats.rotated is None
    (seg,) = rec.trace_dir.glob("fastprof.*.json.gz")
    other = _load(seg)["otherData"]
    assert "rotated" not in other
    assert other["config"]["max_disk"] == CAP and other["config"]["keep_segments"] == 0


@pytest.mark.parametrize(
    ("given", "env", "says"),
    [
        ({"max_disk": -1}, {}, "invalid option max_disk: expected 0 (unbounded)"),
        ({"max_disk": "lots"}, {}, "invalid option max_disk"),
        (
            {"segment_size": "64KiB", "max_disk": "100KiB"},
            {},
            "invalid option max_disk: expected 0 (no cap) or room for at least two segments of segment_size "
            "(65536 bytes each: the open one and a closed one), so at least 131072 bytes, got 102400",
        ),
        ({}, {"FASTPROF_MAX_DISK": "1KiB"}, "environment variable FASTPROF_MAX_DISK='1KiB' (option max_disk)"),
        ({"keep_segments": -2}, {}, "invalid option keep_segments"),
        ({}, {"FASTPROF_KEEP_SEGMENTS": "two"}, "FASTPROF_KEEP_SEGMENTS='two'"),
    ],
)
def test_a_bad_cap_is_one_config_error_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: dict[str, Any], env: dict[str, str], says: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as e:
        fastprof.Profiler(out_dir=tmp_path, run_name="bad", **given)
    assert says in str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "bad").exists(), "nothing is created before the options are checked"


# A job whose steps record poorly compressing instants, until told to stop
# (a file): its segments rotate under the cap the whole time.
CAPPED_JOB = textwrap.dedent(
    """
    import os, sys, time
    import torch, fastprof

    out = sys.argv[1]
    m = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    trig = fastprof.Triggers(poll_s=0.05, min_interval_s=0, steps=2, anomaly=False)
    with fastprof.Profiler(out, "run", schedule="never", sync_clocks=False, triggers=trig):
        print("ready", flush=True)
        i = 0
        while not os.path.exists(os.path.join(out, "stop")):
            for k in range(20):
                fastprof.instant("tick", i=i, noise=f"{((i * 100 + k) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFF:x}")
            m(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.004)
            i += 1
    """
)


def _written(rank_dir: Path) -> int:
    """Bytes of what the cap bounds: the segments, flight dumps and torch
    windows under the rank directory (not its small bookkeeping: live.json,
    triggers.json, profiler.json, the lock)."""
    sizes: dict[int, int] = {}
    for root, _dirs, names in os.walk(rank_dir):
        for name in names:
            if root == str(rank_dir) and not SEG_RE.match(name):
                continue
            try:
                st = os.stat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_flight_dumps_and_triggered_windows_count_under_the_cap(tmp_path: Path) -> None:
    """``max_disk`` bounds everything fastprof writes for the rank, oldest
    first: segments, the flight dumps and torch windows ``fastprof trigger``
    asks for (the dumps were outside it, unbounded in number). What it
    deletes is said where segment deletions are: profiler.json, the merge,
    the report."""
    cap = 16 * SEGMENT
    (tmp_path / "job.py").write_text(CAPPED_JOB)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    env.update(
        FASTPROF_SEGMENT_SIZE=str(SEGMENT), FASTPROF_MAX_DISK=str(cap), FASTPROF_WINDOW_SECONDS="1",
        FASTPROF_SAMPLE_HZ="0", OMP_NUM_THREADS="1",
    )  # fmt: skip
    job = subprocess.Popen(
        [sys.executable, str(tmp_path / "job.py"), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    run = out / "run"
    rank_dir = run / "rank0"
    try:
        assert job.stdout is not None and job.stdout.readline() == "ready\n", job.communicate()
        answered: list[str] = []
        for _ in range(4):
            for flight in ([], ["--flight"]):
                cli = subprocess.run(
                    [sys.executable, "-m", "fastprof", "trigger", str(run), *flight, "--wait", "60"],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=120,
                )
                assert _written(rank_dir) <= cap, sorted(os.listdir(rank_dir / "flight"))
                assert cli.returncode == 0, cli.stdout + cli.stderr
                files = [ln.split(": ", 1)[1] for ln in cli.stdout.splitlines() if ln.startswith("  rank 0: /")]
                assert files and all(Path(f).is_file() for f in files), cli.stdout
                answered += [f for f in files if f not in answered]  # a flight request may get the dump just taken
            time.sleep(1.0)  # segments keep coming: the dumps age toward the front
        time.sleep(2.0)
        (out / "stop").touch()
        _out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, err
    assert _written(rank_dir) <= cap
    rot = json.loads((rank_dir / "profiler.json").read_text())["rotation"]
    assert rot["segments_deleted"] > 0 and rot["files_deleted"] > 0, rot
    gone = [d for d in rot["deleted"] if d["kind"] in ("flight", "torch")]
    assert len(gone) == rot["files_deleted"] and rot["files_bytes_deleted"] == sum(d["bytes"] for d in gone)
    assert {d["kind"] for d in gone} == {"flight", "torch"}, gone
    for d in gone:
        assert not (rank_dir / d["file"]).exists() and str(rank_dir / d["file"]) in answered, d
    # Oldest first: every file deleted is older than every file left.
    left = [p for p in answered if Path(p).exists()]
    assert answered[: len(answered) - len(left)] == [str(rank_dir / d["file"]) for d in gone]

    # The merge and the report say it, as they say the segments.
    merged = subprocess.run(
        [sys.executable, "-m", "fastprof", "merge", str(run), "-o", str(tmp_path / "m.json.gz")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert merged.returncode == 0, merged.stderr
    said = f"and {rot['files_deleted']} flight dump(s) and torch window(s)"
    assert said in merged.stderr, merged.stderr
    (r,) = _load(tmp_path / "m.json.gz")["otherData"]["rotated"]
    assert (r["files"], r["files_bytes"]) == (rot["files_deleted"], rot["files_bytes_deleted"])
    assert main(["report", str(run), "-o", str(tmp_path / "rep"), "-q"]) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    jsonschema.validate(rep, json.loads(SCHEMA_PATH.read_text()))
    (rr,) = rep["source"]["rotated"]
    assert (rr["files"], rr["files_bytes"]) == (rot["files_deleted"], rot["files_bytes_deleted"])
