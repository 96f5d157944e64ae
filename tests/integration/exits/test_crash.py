"""A recording process killed with SIGKILL leaves an open ``.part`` segment
that ``fastprof.read_trace`` salvages (with a ``FastprofWarning``), losing
only what no flush had written yet: every event a flush put in the file
before the kill is read back.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

import fastprof

FLUSH = 0.2

RECORDER = """
import sys, time
import fastprof

fastprof.start(out_dir=sys.argv[1], run_name="crash", flush_interval=float(sys.argv[2]))
print("started", flush=True)
i = 0
while True:
    fastprof.instant("tick", i=i)
    print(i, flush=True)
    i += 1
    time.sleep(0.001)
"""


def _read_lines(stream, lines: list[str]) -> None:
    for line in stream:
        lines.append(line.strip())


def _ticks_in_a_copy(part: Path, copy: Path) -> list[int]:
    """The ticks a snapshot of the still-growing ``.part`` file holds."""
    try:
        shutil.copyfile(part, copy)
    except FileNotFoundError:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastprof.FastprofWarning)  # an open segment is always "cut"
        try:
            doc = fastprof.read_trace(copy)
        except fastprof.TraceError:  # not even a header flushed yet
            return []
    return [e["args"]["i"] for e in doc["traceEvents"] if e.get("name") == "tick" and e.get("ph") == "i"]


def test_sigkill_leaves_a_salvageable_part(tmp_path, pyscript):
    script = pyscript.write(RECORDER, "recorder.py")
    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), str(FLUSH)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    part = out / "crash" / "rank0" / "fastprof.0.json.gz.part"
    # What the flushes had written while the process ran, counted (never timed):
    # wait until snapshots of the file show it growing by flushes, to 200+ ticks.
    flushed: list[int] = []
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while len(set(flushed)) < 2 or flushed[-1] < 200:
            assert proc.poll() is None, f"recorder exited early: {proc.stderr.read()}"
            assert time.monotonic() < deadline, f"no flush of 200 ticks in 60 s (snapshots: {flushed[-5:]})"
            got = _ticks_in_a_copy(part, tmp_path / "snapshot.json.gz.part")
            assert got == list(range(len(got))), "a snapshot holds ticks out of order or with gaps"
            if got:
                flushed.append(len(got))
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    printed = []
    for line in lines[lines.index("started") + 1 :]:
        try:
            printed.append(int(line))
        except ValueError:  # the last line may be cut by the kill
            pass

    trace_dir = out / "crash" / "rank0"
    parts = sorted(trace_dir.glob("*.part"))
    assert [p.name for p in parts] == ["fastprof.0.json.gz.part"]
    assert not list(trace_dir.glob("*.json.gz")), "a segment was closed although the process was killed"

    with pytest.warns(fastprof.FastprofWarning) as caught:
        doc = fastprof.read_trace(part)
    messages = [str(w.message) for w in caught]
    assert any(part.name in m for m in messages), messages
    assert any(re.search(r"\bbytes?\b", m) and "unused" in m for m in messages), messages

    ticks = [e["args"]["i"] for e in doc["traceEvents"] if e.get("name") == "tick" and e.get("ph") == "i"]
    # Contiguous from 0, in order, nothing invented.
    assert ticks == list(range(len(ticks)))
    # Nothing a flush had written before the kill is lost ...
    assert len(ticks) >= max(flushed), (len(ticks), max(flushed))
    # ... and nothing is there that the process had not recorded.
    assert ticks[-1] <= printed[-1] + 1
    for e in doc["traceEvents"]:
        if e.get("ph") == "i":
            assert e["pid"] == proc.pid


def test_kill_right_after_start_salvages_an_empty_trace(tmp_path, pyscript):
    """A segment killed before its first flush still reads as a (nearly) empty trace."""
    script = pyscript.write(
        """
        import os, signal, sys
        import fastprof
        fastprof.start(out_dir=sys.argv[1], run_name="early", flush_interval=3600)
        fastprof.instant("never-flushed")
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        "early.py",
    )
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (part,) = (out / "early" / "rank0").glob("*.part")
    assert os.path.getsize(part) > 0
    with pytest.warns(fastprof.FastprofWarning):
        doc = fastprof.read_trace(part)
    assert isinstance(doc["traceEvents"], list)
