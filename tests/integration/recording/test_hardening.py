"""Recording under bad values and faults: a recording call never raises for a
value it was given, nothing already recorded is lost, failures are said at
the time, and several processes in one rank directory never overwrite each
other. Traces are read with gzip + json (conftest), never fastprof's reader.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings

import pytest

import fastprof


def test_surrogates_never_raise_and_are_counted(tmp_path, traces):
    bad = os.fsdecode(b"caf\xe9")  # a lone surrogate, as os.fsdecode makes it
    rec = fastprof.start(tmp_path, "surrogates")
    with fastprof.span(f"span-{bad}", **{f"key-{bad}": f"value-{bad}"}):
        fastprof.instant(f"instant-{bad}", path=bad)
    fastprof.counter(f"counter-{bad}", 1.0)
    fastprof.counter("mapping", {f"series-{bad}": 2.0})
    rec.stop()
    run = traces.read(rec.trace_dir)
    names = {e["name"] for e in run.data_events()}
    assert {"span-caf\ufffd", "instant-caf\ufffd", "counter-caf\ufffd", "mapping"} <= names
    (span,) = run.of("X", "span-caf\ufffd")
    assert span["args"] == {"key-caf\ufffd": "value-caf\ufffd"}
    (m,) = run.of("C", "mapping")
    assert m["args"] == {"series-caf\ufffd": 2.0}
    # span name, its arg key and value, instant name and arg, counter name, series key.
    assert run.final["replaced_values"] >= 7


def test_non_finite_numbers_are_kept(tmp_path, traces):
    rec = fastprof.start(tmp_path, "nan")
    fastprof.counter("loss", float("nan"))
    fastprof.counter("grad_norm", float("inf"))
    fastprof.counter("pair", {"lo": float("-inf"), "hi": 1.5})
    fastprof.instant("diverged", loss=float("nan"))
    rec.stop()
    run = traces.read(rec.trace_dir)  # Python's json parses the file
    assert run.of("C", "loss")[0]["args"] == {"value": "NaN"}
    assert run.of("C", "grad_norm")[0]["args"] == {"value": "Infinity"}
    assert run.of("C", "pair")[0]["args"] == {"lo": "-Infinity", "hi": 1.5}
    assert run.of("i", "diverged")[0]["args"] == {"loss": "NaN"}
    cols = fastprof.read_columns(rec.run_dir, kinds=("counters",))
    by = {
        (n, s): v
        for n, s, v in zip(
            cols.names_of(cols.counters["name"]),
            cols.names_of(cols.counters["series"]),
            cols.counters["value"],
            strict=True,
        )
    }
    assert math.isnan(by[("loss", "value")]) and by[("grad_norm", "value")] == math.inf
    assert by[("pair", "lo")] == -math.inf and by[("pair", "hi")] == 1.5


def test_values_of_the_wrong_kind_are_dropped_with_one_warning(tmp_path, traces):
    rec = fastprof.start(tmp_path, "kinds")

    class Unprintable:
        def __str__(self):
            raise RuntimeError("no str for you")

    with pytest.warns(fastprof.FastprofWarning, match="dropped and counted") as caught:
        fastprof.counter("c", "not a number")
        fastprof.counter("c", object())
        with fastprof.span(12345):  # not a name: a span that records nothing
            pass
        fastprof.instant(None)
        fastprof.instant("ok", thing=Unprintable())  # replaced, not dropped
    assert len(caught) == 1
    rec.stop()
    run = traces.read(rec.trace_dir)
    assert [e["name"] for e in run.data_events()] == ["ok"]
    assert run.of("i", "ok")[0]["args"]["thing"] == "<unprintable Unprintable>"
    assert run.final["replaced_values"] >= 5


PROCESS = """
import os, sys, time, fastprof
out, k, n, procs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rec = fastprof.start(out, "shared", segment_size="64KiB", flush_interval=0.01)
# All record at once (on a loaded machine they would otherwise run one
# after another): each waits here, recording, until every one has started.
open(os.path.join(out, f"started.{k}"), "w").close()
t = time.monotonic()
while len([f for f in os.listdir(out) if f.startswith("started.")]) < procs and time.monotonic() - t < 60:
    time.sleep(0.01)
for i in range(n):
    with fastprof.span("work", proc=k, i=i, pad=os.urandom(48).hex()):  # incompressible: segments rotate
        pass
rec.stop()
"""


def test_processes_sharing_a_rank_directory_lose_nothing(pyscript, tmp_path, traces):
    import subprocess
    import sys

    script = pyscript.write(PROCESS, "proc.py")
    n, procs = 3000, 6
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPROF_", "RANK"))}
    # Sharing on purpose (without it, each process would take its own shared-N).
    env["FASTPROF_RESUME"] = "1"
    children = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "runs"), str(k), str(n), str(procs)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in range(procs)
    ]
    errs = [c.communicate(timeout=120)[1] for c in children]
    assert all(c.returncode == 0 for c in children), errs
    run = traces.read(tmp_path / "runs" / "shared" / "rank0")
    assert len(run.segments) > procs  # they rotated, many times
    per_proc = {}
    for e in run.of("X", "work"):
        per_proc.setdefault(e["args"]["proc"], set()).add(e["args"]["i"])
    assert {k: len(v) for k, v in per_proc.items()} == dict.fromkeys(range(procs), n)
    # Sharing was noticed and said (by whichever processes overlapped).
    assert any("also recording into" in e for e in errs), errs


def test_a_disk_full_is_said_at_the_time(pyscript):
    r = pyscript.run(
        """
        import os, resource, signal, sys, time, warnings
        import fastprof
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # writes past the limit fail with EFBIG
        rec = fastprof.start(sys.argv[1], "full", flush_interval=0.02)
        with fastprof.span("before"):
            pass
        time.sleep(0.1)
        part = next(p for p in os.listdir(rec.trace_dir) if p.endswith(".part"))
        size = os.path.getsize(os.path.join(rec.trace_dir, part))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, resource.RLIM_INFINITY))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            deadline = time.monotonic() + 20
            i = 0
            while not caught and time.monotonic() < deadline:
                fastprof.instant("filler", i=i, pad="y" * 500)   # the next API call says it
                i += 1
                time.sleep(0.001)
            active = fastprof.is_active()
        assert caught and "File too large" in str(caught[0].message), [str(w.message) for w in caught]
        assert "recording stopped" in str(caught[0].message)
        assert not active and not rec.active
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            stats = rec.stop()
        assert stats.error and "File too large" in stats.error
        print("OK")
        """,
        str(pyscript.tmp_path / "runs"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "File too large" in r.stderr  # on stderr too, when it happened


def test_a_deleted_run_directory_stops_recording_at_once(tmp_path):
    rec = fastprof.start(tmp_path, "gone", flush_interval=0.02)
    with fastprof.span("before"):
        pass
    shutil.rmtree(rec.run_dir)
    deadline = time.monotonic() + 20
    with pytest.warns(fastprof.FastprofWarning, match="deleted") as caught:
        while fastprof.is_active() and time.monotonic() < deadline:
            time.sleep(0.01)
        fastprof.instant("after")  # the next API call says why
    assert not fastprof.is_active() and not rec.active
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = rec.stop()
    assert stats.error and "deleted" in stats.error


def test_a_failed_start_leaves_nothing_half_made(pyscript):
    r = pyscript.run(
        """
        import os, resource, signal, sys
        import fastprof
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        out = sys.argv[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))   # a full disk
        try:
            fastprof.start(out, "nostart")
        except OSError as e:
            assert isinstance(e, fastprof.FastprofError), type(e)
            print("refused:", e)
        else:
            raise SystemExit("start did not fail")
        left = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs]
        assert left == [], left
        assert not os.path.exists(os.path.join(out, "nostart", "rank0")), os.listdir(os.path.join(out, "nostart"))
        assert not fastprof.is_active()
        print("OK")
        """,
        str(pyscript.tmp_path / "runs"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused:" in r.stdout and "File too large" in r.stdout


def test_payload_in_flight_is_bounded(pyscript):
    """Instants with 100 KB of args as fast as a thread can make them: the
    payload kept in flight stays under its 64 MiB bound instead of filling
    every ring slot (1 Mi slots x 100 KB)."""
    r = pyscript.run(
        """
        import json, resource, sys, warnings
        import fastprof
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
        big = "z" * 100_000
        rec = fastprof.start(sys.argv[1], "payload", flush_interval=5)   # the writer drains late
        before, peak = rss(), 0
        for i in range(3000):                  # 300 MB of args offered
            fastprof.instant("big", i=i, blob=big)
            if i % 100 == 0:
                peak = max(peak, rss() - before)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stats = rec.stop()
        msgs = [str(w.message) for w in caught]
        print(json.dumps({"peak": peak, "dropped": stats.dropped, "payload": stats.payload_dropped,
                          "written": stats.events_written, "msgs": msgs}))
        """,
        str(pyscript.tmp_path / "runs"),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["payload"] > 0 and got["payload"] == got["dropped"], got
    assert got["written"] + got["dropped"] == 3000
    assert got["peak"] < 64 * 2**20 + 40 * 2**20, got["peak"]  # the bound plus Python's own churn
    assert any("64 MiB of payload" in m for m in got["msgs"]), got["msgs"]


def test_dataloader_workers_say_once_that_they_record_nothing(pyscript):
    r = pyscript.run(
        """
        import sys, torch
        from torch.utils.data import DataLoader, Dataset
        import fastprof

        class D(Dataset):
            def __len__(self):
                return 16
            def __getitem__(self, i):
                with fastprof.span("item"):
                    fastprof.instant("inside")
                return torch.tensor([i])

        if __name__ == "__main__":
            rec = fastprof.start(sys.argv[1], "workers")
            for ctx in ("fork", "spawn"):
                for _ in DataLoader(D(), batch_size=4, num_workers=2, multiprocessing_context=ctx):
                    pass
            rec.stop()
            print("OK")
        """,
        str(pyscript.tmp_path / "runs"),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # Each worker says it once on stderr (2 fork + 2 spawn workers), however
    # many items it fetched; the Python warning repeats it unless filtered.
    said = r.stderr.count("fastprof: this process")
    assert said == 4, r.stderr[-3000:]


def test_async_spans_of_interleaved_tasks_keep_their_own_durations(tmp_path, traces):
    """Two tasks whose spans cross (A opens first, B closes first), driven
    step by step with events, never by sleeps: each begin and end carries its
    own task's id, so a viewer pairing them gets each task's own span (the
    bug closed the other task's span: 40 ms and 101 ms for 60 and 80)."""
    import asyncio

    gate: dict[str, asyncio.Event] = {}
    reached: dict[str, asyncio.Event] = {}

    def ev(table, key):
        return table.setdefault(key, asyncio.Event())

    @fastprof.span("outer_task")
    async def work(tag):
        await inner(tag)
        ev(reached, f"{tag}.inner_done").set()
        await ev(gate, f"{tag}.outer").wait()
        return tag

    @fastprof.span("inner")
    async def inner(tag):
        ev(reached, f"{tag}.inner_open").set()
        await ev(gate, f"{tag}.inner").wait()

    @fastprof.span("fails", kind="test")
    async def fails():
        await asyncio.sleep(0)
        raise KeyError("boom")

    async def step(open_gate, wait_for):
        ev(gate, open_gate).set()
        await ev(reached, wait_for).wait()

    async def main():
        a = asyncio.ensure_future(work("A"))
        await ev(reached, "A.inner_open").wait()
        b = asyncio.ensure_future(work("B"))
        await ev(reached, "B.inner_open").wait()
        await step("A.inner", "A.inner_done")
        await step("B.inner", "B.inner_done")
        ev(gate, "B.outer").set()
        got = [await b]
        ev(gate, "A.outer").set()
        got.append(await a)
        with pytest.raises(KeyError):
            await fails()
        forever = asyncio.ensure_future(work("C"))  # still open when recording stops
        await ev(reached, "C.inner_open").wait()
        return got, forever

    rec = fastprof.start(tmp_path, "async", sample_hz=0)
    loop = asyncio.new_event_loop()
    try:
        got, forever = loop.run_until_complete(main())
        assert got == ["B", "A"]
        rec.stop()
        forever.cancel()
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(forever)
    finally:
        loop.close()
    run = traces.read(rec.trace_dir)
    base = run.segments[0].base_ns
    evs = [e for e in run.events if e.get("cat") == "async" and e["ph"] in "be"]
    # One thread recorded them all: the file keeps their order, and so do the clocks.
    ts = [e["ts"] for e in evs]
    assert ts == sorted(ts), "async events out of time order"
    # Name each id by the task whose outer span opened it (A, B, then C).
    task = {}
    for e in evs:
        if e["ph"] == "b" and e["name"] == "outer_task":
            task[e["id"]] = "ABC"[len(task)]
    closed = [(e["ph"], e["name"], task.get(e["id"])) for e in evs if not e.get("args", {}).get("unclosed")]
    assert closed[:8] == [
        ("b", "outer_task", "A"),
        ("b", "inner", "A"),
        ("b", "outer_task", "B"),
        ("b", "inner", "B"),
        ("e", "inner", "A"),
        ("e", "inner", "B"),
        ("e", "outer_task", "B"),
        ("e", "outer_task", "A"),
    ], closed
    # Pair b/e per (id, name) with a stack, as a viewer does: every begin has its end.
    open_, spans = {}, []
    for e in evs:
        key = (e["id"], e["name"])
        if e["ph"] == "b":
            open_.setdefault(key, []).append(e)
        else:
            spans.append((e["name"], e["id"], open_[key].pop(), e))
    assert all(not v for v in open_.values()), "every async begin has its end"
    # Three tasks, three ids (two finished, one left open); the inner span shares its task's id.
    assert len(task) == 3 and {i for n, i, *_ in spans if n == "inner"} == set(task)
    (f,) = [(b, e) for n, _, b, e in spans if n == "fails"]
    assert f[0]["args"] == {"kind": "test"} and f[1]["args"] == {"exception": True}
    left = [e for *_, e in spans if e.get("args", {}).get("unclosed")]
    assert sorted((e["name"], task[e["id"]]) for e in left) == [("inner", "C"), ("outer_task", "C")]
    assert all(base + traces.us_to_ns(e["ts"]) > base for e in left)


class _Weird:
    def __repr__(self):
        raise ValueError("no repr")

    __str__ = __repr__


class _BadMapping:
    def items(self):
        raise RuntimeError("items() fails")


class _HalfBad(dict):
    pass


HOSTILE_ARGS = [
    {"big": "x" * (4 << 20)},  # one 4 MiB arg
    {"nested": {"a": [{"b": {"c": [1, 2, {"d": None}]}}] * 50}},  # nesting written via str()
    {"huge_int": 2**100, "neg": -(2**70)},
    {"bytes": b"\x00\xff\xfe", "bytearray": bytearray(b"abc")},
    {"weird": _Weird()},
    {"ctrl": '\x00\x01\x1f"\\\n\t', "emoji": "🔥" * 100},
    {"surrogate_key" + os.fsdecode(b"\xff"): 1},
    {"float_edge": 5e-324, "float_big": 1.7976931348623157e308, "negzero": -0.0},
]

HOSTILE_COUNTERS = [
    float("nan"),
    -float("inf"),
    2**1000,  # not an f64: dropped and counted
    "3.5",
    None,
    [1, 2],
    _BadMapping(),
    _HalfBad(a=1, b="x", c=float("nan")),  # the good series are kept
    {os.fsdecode(b"\xfe"): 1.0},
    True,
]


def test_hostile_values_never_raise_and_the_trace_stays_valid_json(tmp_path, traces):
    rec = fastprof.start(tmp_path, "hostile", flush_interval=0.02)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for i, args in enumerate(HOSTILE_ARGS):
            with fastprof.span(f"span{i}", **args):
                fastprof.instant(f"instant{i}", **args)
        for i, value in enumerate(HOSTILE_COUNTERS):
            fastprof.counter(f"counter{i}", value)
        for name in (None, 3, b"bytes", ("t",), os.fsdecode(b"\x80name"), "", "x" * 100_000):
            with fastprof.span(name):
                fastprof.instant(name)
            fastprof.counter(name, 1.0)
        stats = rec.stop()
    run = traces.read(rec.trace_dir)  # every segment parses with Python's json
    traces.nesting(run)
    spans = {e["name"] for e in run.of("X")}
    assert {f"span{i}" for i in range(len(HOSTILE_ARGS))} <= spans
    assert run.of("X", "span0")[0]["args"]["big"] == "x" * (4 << 20)
    assert run.of("X", "span2")[0]["args"] == {"huge_int": str(2**100), "neg": str(-(2**70))}
    assert run.of("X", "span4")[0]["args"]["weird"] == "<unprintable _Weird>"
    assert run.of("X", "span5")[0]["args"]["ctrl"] == '\x00\x01\x1f"\\\n\t'
    half = run.of("C", "counter7")[0]["args"]
    assert half == {"a": 1, "c": "NaN"}  # "b" was not a number
    assert run.of("X", "x" * 100_000) and run.of("X", "")
    assert stats.dropped == 0
    assert run.final["replaced_values"] >= 10
