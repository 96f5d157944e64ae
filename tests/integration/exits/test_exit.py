"""A process that starts recording and never calls ``stop`` still leaves a
finalized trace when it exits normally (atexit): closed segments only, no
``.part``, final ``otherData`` with ``final: true``, every event present.
"""

from __future__ import annotations

import os

import pytest

import fastprof

EXIT_WITHOUT_STOP = """
import sys, threading
import fastprof

mode = sys.argv[2]
fastprof.start(out_dir=sys.argv[1], run_name="exit", flush_interval=5.0)

def work():
    for i in range(1000):
        with fastprof.span("thread_span", i=i):
            pass

t = threading.Thread(target=work, name="side")
t.start()
for i in range(3000):
    with fastprof.span("main_span"):
        fastprof.instant("main_instant", i=i)
fastprof.counter("main_counter", 42)
t.join()
print(threading.get_native_id(), flush=True)

if mode == "sys_exit":
    sys.exit(3)
elif mode == "exception":
    raise RuntimeError("the job failed")
elif mode == "open_span":
    fastprof.span("left_open").__enter__()
"""


@pytest.mark.parametrize(
    ("mode", "code"),
    [("normal", 0), ("sys_exit", 3), ("exception", 1), ("open_span", 0)],
)
def test_exit_without_stop_finalizes(mode, code, tmp_path, pyscript, traces):
    proc = pyscript.run(EXIT_WITHOUT_STOP, str(tmp_path / "runs"), mode, timeout=60, name="exit.py")
    assert proc.returncode == code, proc.stderr
    if mode == "exception":
        assert "the job failed" in proc.stderr
    main_tid = int(proc.stdout.split()[0])

    trace_dir = tmp_path / "runs" / "exit" / "rank0"
    assert not list(trace_dir.glob("*.part"))
    run = traces.read(trace_dir)
    final = run.final
    assert final["final"] is True
    assert all(o["final"] is False for o in run.others[:-1])
    assert final["drops"]["total"] == 0

    assert len(run.of("X", "main_span", main_tid)) == 3000
    assert [e["args"]["i"] for e in run.of("i", "main_instant")] == list(range(3000))
    side = run.of("X", "thread_span")
    assert sorted(e["args"]["i"] for e in side) == list(range(1000))
    assert all(e["tid"] != main_tid for e in side)
    (counter,) = run.of("C", "main_counter")
    assert counter["args"] == {"value": 42}
    assert "side" in run.thread_names().values()

    if mode == "open_span":
        (left,) = run.of("X", "left_open")
        assert left["args"]["unclosed"] is True
        assert final["unclosed_spans"] == 1
    else:
        assert not run.of("X", "left_open")
        assert final["unclosed_spans"] == 0
    expected = 3000 + 3000 + 1000 + 1 + (mode == "open_span")
    assert final["events_written"] == expected == len(run.data_events())
    traces.nesting(run)
    for seg in run.segments:
        traces.time_format(seg.text)


DAEMON_AT_EXIT = """
import sys, threading, time
import fastprof

fastprof.start(out_dir=sys.argv[1], run_name="daemon", flush_interval=0.05)
started = threading.Event()

def forever():
    started.set()
    while True:
        with fastprof.span("daemon_span"):
            fastprof.instant("daemon_tick")

threading.Thread(target=forever, name="daemon-rec", daemon=True).start()
started.wait()
time.sleep(0.05)
with fastprof.span("main_done"):
    pass
"""


def test_exit_while_a_daemon_thread_records(tmp_path, pyscript, traces):
    """Interpreter shutdown with a daemon thread still inside the recorder."""
    proc = pyscript.run(DAEMON_AT_EXIT, str(tmp_path / "runs"), timeout=60, name="daemon.py")
    assert proc.returncode == 0, proc.stderr
    run = traces.read(tmp_path / "runs" / "daemon" / "rank0")
    assert run.final["final"] is True
    assert len(run.of("X", "main_done")) == 1
    assert len(run.of("X", "daemon_span")) > 0
    # Every daemon span recorded before stop is balanced; at most the one it
    # was inside when recording stopped is unclosed.
    assert run.final["unclosed_spans"] <= 1
    traces.nesting(run)


def test_no_thread_left_behind_after_stop(tmp_path):
    """stop() joins the writer: the process has as many OS threads as before start."""
    before = len(os.listdir("/proc/self/task"))
    fastprof.start(out_dir=tmp_path, run_name="threads")
    with fastprof.span("x"):
        pass
    assert len(os.listdir("/proc/self/task")) > before
    fastprof.stop()
    assert len(os.listdir("/proc/self/task")) == before
