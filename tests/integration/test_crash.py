"""A recording process killed with SIGKILL leaves an open ``.part`` segment
that ``fastprof.read_trace`` salvages (with a ``FastprofWarning``), losing at
most about one flush interval of events.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

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
    # CLOCK_MONOTONIC is shared by every process on the machine.
    print(i, time.monotonic(), flush=True)
    i += 1
    time.sleep(0.001)
"""


def _read_lines(stream, lines: list[str]) -> None:
    for line in stream:
        lines.append(line.strip())


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
    try:
        deadline = time.monotonic() + 60
        while "started" not in lines:
            assert proc.poll() is None, f"recorder exited early: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "recorder did not start within 60 s"
            time.sleep(0.01)
        time.sleep(2.0)
        kill_time = time.monotonic()
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
        parts = line.split()
        if len(parts) == 2:  # the last line may be cut by the kill
            try:
                printed.append((int(parts[0]), float(parts[1])))
            except ValueError:
                pass
    assert len(printed) > 200, f"only {len(printed)} ticks printed in 2 s"

    trace_dir = out / "crash" / "rank0"
    parts = sorted(trace_dir.glob("*.part"))
    assert [p.name for p in parts] == ["fastprof.0.json.gz.part"]
    assert not list(trace_dir.glob("*.json.gz")), "a segment was closed although the process was killed"

    part = parts[0]
    with pytest.warns(fastprof.FastprofWarning) as caught:
        doc = fastprof.read_trace(part)
    messages = [str(w.message) for w in caught]
    assert any(part.name in m for m in messages), messages
    assert any(re.search(r"\bbytes?\b", m) and "unused" in m for m in messages), messages

    ticks = [e["args"]["i"] for e in doc["traceEvents"] if e.get("name") == "tick" and e.get("ph") == "i"]
    # Contiguous from 0, in order, nothing invented.
    assert ticks == list(range(len(ticks)))
    assert ticks, "nothing salvaged"
    last_printed = printed[-1][0]
    assert ticks[-1] <= last_printed + 1

    # Everything recorded well before the kill is there: at most about one
    # flush interval is lost; allow two plus scheduling slack.
    cutoff = kill_time - 2 * FLUSH - 0.3
    must_have = [i for i, t in printed if t < cutoff]
    assert must_have, "no tick printed before the cutoff"
    assert ticks[-1] >= must_have[-1], (
        f"salvaged ticks end at {ticks[-1]}, but tick {must_have[-1]} was recorded "
        f"{kill_time - dict(printed)[must_have[-1]]:.3f} s before the kill"
    )
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
