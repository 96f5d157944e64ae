"""MemoryHistory (issue #16): its options, and the window logic of its
driver. The allocator here is a stand-in: a CUDA allocator cannot exist on
this machine (the real one runs in benches/gpu_check.py); the driver's
calls, bounds, files and timings are what is checked."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import Any

import pytest

from fastprof import ConfigError
from fastprof.memory.history import (
    ENTRIES_PER_STEP,
    MAX_DEFAULT_ENTRIES,
    CudaAllocator,
    HistoryDriver,
    MemoryHistory,
)


class Allocator:
    """Records the driver's calls; its history keeps at most max_entries."""

    def __init__(self, events_per_step: int = 10, fail: str = "") -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.on = False
        self.bound = 0
        self.recorded = 0
        self.per_step = events_per_step
        self.fail = fail
        self.writer_threads: set[str] = set()
        self.total = 0  # every event, recorded or not (the allocator's own counts)

    def available(self) -> str | None:
        return None

    def initialized(self) -> bool:
        return True

    def events(self) -> int:
        return self.total

    def start(self, max_entries: int, stacks: str, context: str) -> None:
        self.calls.append(("start", max_entries, stacks, context))
        self.on, self.bound, self.recorded = True, max_entries, 0

    def step(self) -> None:
        self.total += self.per_step
        if self.on:
            self.recorded += self.per_step

    def snapshot(self) -> dict[str, Any]:
        self.calls.append(("snapshot",) if self.on else ("state",))
        if self.fail == "snapshot":
            raise RuntimeError("allocator busy")
        segments = [{"total_size": 2 << 20, "allocated_size": 1 << 20, "blocks": []}]
        if not self.on:  # history off: the state alone
            return {"segments": segments, "device_traces": []}
        kept = min(self.recorded, self.bound)
        return {"segments": segments, "device_traces": [[{"action": "alloc", "size": 512}] * kept]}

    def stop(self) -> None:
        self.calls.append(("stop",))
        self.on = False

    def html(self, snapshot: dict[str, Any]) -> str:
        self.writer_threads.add(threading.current_thread().name)
        return "<html>memory</html>"


def _run(drv: HistoryDriver, alloc: Allocator, tmp: Path, steps: int, window: tuple[int, int]) -> None:
    """Steps 0..steps-1; the window is steps window[0]..window[1] (inclusive)."""
    first, last = window
    for b in range(steps):
        drv.begin(first <= b <= last, last - first + 1, b, 0)
        alloc.step()
        drv.end(b == last, tmp / f"ep0-ba{b}.history.pickle", b)
    drv.close(None, steps - 1)


def test_history_is_on_for_the_window_only_and_dumped_off_thread(tmp_path: Path) -> None:
    alloc = Allocator(events_per_step=100)
    drv = HistoryDriver(MemoryHistory(html=True, env={}), alloc)
    _run(drv, alloc, tmp_path, steps=10, window=(3, 6))
    # On at the window's first step with the bound of 4 steps, off at its last.
    assert alloc.calls == [("start", 4 * ENTRIES_PER_STEP, "python", "all"), ("snapshot",), ("stop",)]
    (w,) = drv.summary()["windows"]
    assert (w["first_step"], w["last_step"], w["entries"], w["at_bound"]) == (3, 6, 400, False)
    path = tmp_path / "ep0-ba6.history.pickle"
    assert w["path"] == str(path) and w["bytes"] == path.stat().st_size
    with open(path, "rb") as f:
        assert len(pickle.load(f)["device_traces"][0]) == 400
    assert (tmp_path / "ep0-ba6.history.html").read_text() == "<html>memory</html>"
    assert alloc.writer_threads == {"fastprof-history"}  # written off the training thread
    assert w["snapshot_s"] >= 0 and w["write_s"] >= 0 and "error" not in w


def test_the_bound_holds_and_is_reported(tmp_path: Path) -> None:
    alloc = Allocator(events_per_step=1000)
    drv = HistoryDriver(MemoryHistory(max_entries=1500, env={}), alloc)
    _run(drv, alloc, tmp_path, steps=5, window=(1, 3))
    (w,) = drv.summary()["windows"]
    assert alloc.calls[0] == ("start", 1500, "python", "all")
    assert (w["entries"], w["max_entries"], w["at_bound"]) == (1500, 1500, True)
    # The allocator's own counts say how many the bound dropped.
    assert (w["events"], w["dropped"]) == (3000, 1500)


def test_a_window_open_at_the_end_is_dumped_and_failures_are_kept_not_raised(tmp_path: Path) -> None:
    alloc = Allocator()
    drv = HistoryDriver(MemoryHistory(env={}), alloc)
    for b in range(3):  # the window (1..5) never reaches its last step
        drv.begin(b >= 1, 5, b, 0)
        drv.end(False, tmp_path / "unused", b)
    drv.close(tmp_path / "last.history.pickle", 2)
    (w,) = drv.summary()["windows"]
    assert (w["first_step"], w["last_step"]) == (1, 2) and (tmp_path / "last.history.pickle").is_file()
    assert alloc.calls[-1] == ("stop",)

    broken = Allocator(fail="snapshot")
    drv = HistoryDriver(MemoryHistory(env={}), broken)
    _run(drv, broken, tmp_path / "b", steps=4, window=(0, 1))
    (w,) = drv.summary()["windows"]
    assert w["error"] == "snapshot failed: RuntimeError: allocator busy" and broken.calls[-1] == ("stop",)


def test_without_cuda_the_history_is_unavailable_once_with_the_reason() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    drv = HistoryDriver(MemoryHistory(env={}), CudaAllocator(torch))
    drv.begin(True, 4, 0, 0)
    drv.end(True, Path("/nonexistent/x.pickle"), 0)
    s = drv.summary()
    assert s["available"] is False and s["reason"] == "no CUDA device (torch.cuda.is_available() is False)"
    assert s["windows"] == []


def test_options_from_arguments_environment_and_their_errors() -> None:
    assert MemoryHistory(env={}).entries_for(4) == 4 * ENTRIES_PER_STEP
    assert MemoryHistory(env={}).entries_for(1000) == MAX_DEFAULT_ENTRIES
    env = {"FASTPROF_MEMORY_HISTORY_MAX_ENTRIES": "5000", "FASTPROF_MEMORY_HISTORY_STACKS": "all"}
    h = MemoryHistory(env=env)
    assert (h.max_entries, h.stacks, h.entries_for(50)) == (5000, "all", 5000)
    for bad, match in (
        ({"stacks": "cpp"}, "stacks"),
        ({"context": "everything"}, "context"),
        ({"max_entries": -1}, "max_entries"),
        ({"filename": "a/b.pickle"}, "filename"),
        ({"filename": "{nope}.pickle"}, r"^MemoryHistory: invalid filename .*unknown format variable"),
        ({"state_every": -1}, "state_every"),
        ({"state_filename": "x/{batch}.pickle"}, "state_filename"),
    ):
        with pytest.raises(ConfigError, match=match):
            MemoryHistory(env={}, **bad)
    assert MemoryHistory(env={"FASTPROF_MEMORY_HISTORY_STATE_EVERY": "50"}).state_every == 50
    with pytest.raises(ConfigError, match="FASTPROF_MEMORY_HISTORY_MAX_ENTRIES"):
        MemoryHistory(env={"FASTPROF_MEMORY_HISTORY_MAX_ENTRIES": "many"})


def test_state_only_snapshots_every_n_steps_between_windows(tmp_path: Path) -> None:
    """Every 3rd step's end outside the window (4..6): steps 2, 8 and 11;
    step 5's falls in the window (whose own dump holds the state). Pickled
    off the training thread, the stall measured, everything in the summary."""
    alloc = Allocator(events_per_step=10)
    drv = HistoryDriver(MemoryHistory(state_every=3, env={}), alloc)
    assert MemoryHistory(env={}).state_every == 0  # off unless asked
    taken = []
    for b in range(12):
        drv.begin(4 <= b <= 6, 3, b, 0)
        alloc.step()
        if drv.state_due(b):
            taken.append(b)
            drv.state(tmp_path / f"ep0-ba{b}.state.pickle", b, 0)
            drv.close(None, b)  # the writer done before the next (else a busy skip)
        drv.end(b == 6, tmp_path / f"ep0-ba{b}.history.pickle", b)
    drv.close(None, 11)
    assert taken == [2, 8, 11]
    assert [c[0] for c in alloc.calls] == ["state", "start", "snapshot", "stop", "state", "state"]
    s = drv.summary()["state"]
    assert (s["every"], s["count"], s["busy"]) == (3, 3, 0)
    assert [e["step"] for e in s["snapshots"]] == [2, 8, 11]
    for e in s["snapshots"]:
        path = Path(e["path"])
        with open(path, "rb") as f:
            snap = pickle.load(f)
        assert snap["device_traces"] == [] and e["bytes"] == path.stat().st_size
        assert (e["segments"], e["reserved_b"], e["allocated_b"]) == (1, 2 << 20, 1 << 20)
        assert e["snapshot_s"] >= 0 and e["write_s"] >= 0 and "error" not in e
    assert s["bytes_total"] == sum(e["bytes"] for e in s["snapshots"])
    assert s["stall_s_max"] == max(e["snapshot_s"] for e in s["snapshots"])


def test_a_state_snapshot_while_the_last_is_still_written_is_skipped_and_counted(tmp_path: Path) -> None:
    gate = threading.Event()

    class Slow(Allocator):
        def snapshot(self) -> dict[str, Any]:
            return {"segments": [], "device_traces": [], "_wait": _Wait(gate)}

    alloc = Slow()
    drv = HistoryDriver(MemoryHistory(state_every=1, env={}), alloc)
    drv.state(tmp_path / "a.pickle", 0, 0)
    drv.state(tmp_path / "b.pickle", 1, 0)  # the first is still pickling
    gate.set()
    drv.close(None, 1)
    s = drv.summary()["state"]
    assert (s["count"], s["busy"]) == (1, 1) and (tmp_path / "a.pickle").is_file()
    assert not (tmp_path / "b.pickle").exists()


class _Wait:
    """Pickling this waits for ``gate``: a slow disk, in the writer thread."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def __reduce__(self) -> tuple[Any, ...]:
        self.gate.wait(10)
        return (int, (0,))
