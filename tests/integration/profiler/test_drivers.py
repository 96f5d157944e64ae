"""The Profiler as a coordinator of feature drivers (issue #35, item 1): a
driver's hooks are called when the protocol says (``profiler/driver.py``),
in the order the drivers were built, its ``profiler.json`` entry is its
``account()``, a driver whose start fails is said once and left out, and a
``live`` driver is called at every step, quiet ones too. Real Profiler runs
(no torch), one extra driver beside the built-in ones."""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import fastprof
from fastprof._core import FastprofWarning
from fastprof.profiler.driver import Closing, Driver
from fastprof.profiler.drivers.build import Absent
from fastprof.profiler.schedule import Action

LOOP = Path(fastprof.__file__).parent / "profiler" / "loop.py"


class Journal(Driver):
    """Writes down every hook call it gets."""

    key = "journal"

    def __init__(self, calls: list[str], live: bool = False, fail_start: bool = False) -> None:
        self.calls = calls
        self._live = live
        self.fail_start = fail_start

    @property
    def live(self) -> bool:
        return self._live

    def start(self, steps: Any) -> None:
        self.calls.append("start")
        if self.fail_start:
            raise RuntimeError("no journal today")

    def begin(self, action: Action, batch: int, epoch: int, fetched: bool) -> bool:
        self.calls.append(f"begin {batch} {action.value}")
        return False

    def end(
        self, action: Action, epoch: int, batch: int, batch_in_epoch: int, closed: bool, with_schedule: bool
    ) -> None:
        self.calls.append(f"end {batch}")

    def unhook(self) -> None:
        self.calls.append("unhook")

    def close(self, closing: Closing) -> None:
        self.calls.append(f"close {closing.reason}")

    def finish(self, closing: Closing) -> None:
        self.calls.append("finish")

    def stopped(self, closing: Closing) -> None:
        self.calls.append("stopped")

    def release(self) -> None:
        self.calls.append("release")

    def account(self) -> Any:
        return {"calls": len(self.calls)}


def _profiler(tmp_path: Path, driver: Driver, schedule: Any = None) -> fastprof.Profiler:
    prof = fastprof.Profiler(tmp_path, "r", torch=None, sample_hz=0, triggers=False, schedule=schedule)
    # The run's end stays last: profiler.json is written there, then the rank's summary.
    end = prof._drivers[-2:]
    prof._use([*prof._drivers[:-2], driver, *end])
    return prof


def test_a_drivers_hooks_run_in_the_protocols_order(tmp_path: Path) -> None:
    calls: list[str] = []
    sched = fastprof.schedule.steps([(4, 6)], warmup=0)
    with _profiler(tmp_path, Journal(calls), sched) as prof:
        for _ in prof.loader(range(10)):
            prof.step()
    # The loop calls Python only where a step needs it: never on the quiet
    # stretches before and after the window (from the second wait step on,
    # once the schedule says how many follow).
    assert calls[0] == "start"
    steps = [c for c in calls if c.startswith(("begin", "end"))]
    assert steps[-6:] == ["begin 4 active", "end 4", "begin 5 active_and_save", "end 5", "begin 6 disabled", "end 6"]
    begun = {int(c.split()[1]) for c in steps if c.startswith("begin")}
    assert begun & {2, 3, 7, 8, 9} == set() and {0, 4, 5, 6} <= begun
    # Each step that began ended, in order.
    assert [c.replace("begin", "end").split()[:2] for c in steps[::2]] == [c.split()[:2] for c in steps[1::2]]
    assert calls[-5:] == ["unhook", "close None", "finish", "stopped", "release"]
    doc = json.loads((prof.rank_dir / "profiler.json").read_text())
    assert doc["journal"] == {"calls": calls.index("stopped") + 1}  # written after its own stopped()


def test_a_live_driver_is_called_at_every_step(tmp_path: Path) -> None:
    calls: list[str] = []
    sched = fastprof.schedule.steps([50], warmup=0)
    with _profiler(tmp_path, Journal(calls, live=True), sched) as prof:
        for _ in prof.loader(range(10)):
            prof.step()
    assert [c for c in calls if c.startswith("end")] == [f"end {i}" for i in range(10)]


def test_a_driver_whose_start_fails_is_said_and_left_out(tmp_path: Path) -> None:
    calls: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _profiler(tmp_path, Journal(calls, fail_start=True)) as prof:
            for _ in prof.loader(range(3)):
                prof.step()
    said = [str(w.message) for w in caught if issubclass(w.category, FastprofWarning)]
    assert said == ["fastprof: journal off (RuntimeError: no journal today)"]
    assert calls == ["start"]  # nothing after its failed start
    doc = json.loads((prof.rank_dir / "profiler.json").read_text())
    assert doc["journal"] is None and doc["steps"] == 3


def test_features_turned_off_keep_their_entry(tmp_path: Path) -> None:
    prof = fastprof.Profiler(tmp_path, "r", torch=None, sample_hz=0, triggers=False, anatomy=False)
    absent = {d.key: d.account() for d in prof._drivers if isinstance(d, Absent)}
    assert absent == {"torch": None, "anatomy": "off (anatomy=False)", "triggers": None}


@pytest.mark.parametrize("limit", [(500, 400)])
def test_the_coordinator_stays_small(limit: tuple[int, int]) -> None:
    """A feature is a driver, not more lines in the coordinator."""
    source = LOOP.read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Profiler")
    assert len(source.splitlines()) <= limit[0]
    assert cls.end_lineno is not None and cls.end_lineno - cls.lineno + 1 <= limit[1]
