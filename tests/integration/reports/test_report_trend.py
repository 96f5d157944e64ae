"""The step-time trend (issue #34, item 15) end to end: small training loops
under fastprof.Profiler whose steps are topped up to a known time with
time.sleep, then `fastprof report`, report.json read with Python's json and
the steps read back from trace.json.gz with gzip and json.

The report's trend must be what a user computes by hand from the recorded
steps (exactly), and read the run's known trend within bounds that a loaded
machine cannot break: on this 2-core machine beside other jobs a 10 ms sleep
overshot by ~3-4 ms in up to 40% of the steps (a bare loop without fastprof
as much), which moved a flat run's medians by up to 20%. The issue's tighter
bounds (+60% to +110%, within 10%, -75% to -100%) are held on arrays of
exactly those steps in tests/unit/test_trend.py. The terminal and
report.html say the value and how it was taken."""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fastprof
from fastprof.cli.main import main
from fastprof.reports.speed import TREND_DEFINITION

PYTHON = Path(fastprof.__file__).resolve().parents[1]

# Each run's step durations in seconds: about 4 s of steps in all. The first
# measured step also holds the first iteration's time after its
# optimizer.step() (before the first Profiler.step() call an optimizer step
# ends a step); the medians pass over it.
SCRIPT = textwrap.dedent(
    """
    import sys, time, torch, fastprof

    RUNS = {
        "grow": [0.010 + 0.010 * i / 99 for i in range(100)],
        "spike": [0.5 if i == 95 else 0.010 for i in range(100)],
        "drop": [0.100 if i < 10 else 0.010 for i in range(30)],
        "short": [0.010] * 8,
    }
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)

    def train_step():
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        train_step()  # torch's first calls, before any recording
    for name, steps in RUNS.items():
        with fastprof.Profiler(out_dir=sys.argv[1], run_name=name, torch=None, sample_hz=20) as prof:
            for d in steps:
                t0 = time.perf_counter()
                train_step()
                time.sleep(max(0.0, d - (time.perf_counter() - t0)))
                prof.step()
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("trend")
    (tmp / "train.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(PYTHON))
    subprocess.run(
        [sys.executable, str(tmp / "train.py"), str(tmp / "out")], check=True, env=env, capture_output=True, timeout=100
    )
    return tmp / "out"


def report(runs: Path, name: str, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str, str]:
    out = runs.parent / f"reports-{name}"
    assert main(["report", str(runs / name), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "report.json").read_text())
    return doc, printed, (out / "report.html").read_text(encoding="utf-8")


def by_hand(run: Path, warmup: int, without_longest: bool = False) -> float:
    """The trend as its definition says, from the unified trace's step spans:
    the median of the last tenth (at least 3) of the steps after the warm-up
    against the first tenth's (``without_longest``: of the steps less the
    longest one)."""
    with gzip.open(run / "trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((e["ts"], e["dur"]) for e in events if e.get("name") == "step" and e.get("ph") == "X")
    dur = [d for _ts, d in steps][warmup:]
    if without_longest:
        dur.remove(max(dur))
    k = max(3, math.ceil(len(dur) / 10))
    first, last = statistics.median(dur[:k]), statistics.median(dur[-k:])
    return float(100.0 * (last - first) / first)


@pytest.mark.parametrize(
    ("name", "low", "high", "measured", "k"),
    [
        # 10 ms growing evenly to 20 ms (~+86%; the fitted slope read ~+50%). It grows: beside a
        # CPU hog, sleeps overshoot more as the steps lengthen (+156% seen), so no upper bound
        # short of that; the value itself is checked against the definition by hand.
        ("grow", 25.0, 400.0, 99, 10),
        # 10 ms flat, one 0.5 s step among the last tenth (it read ~+170%): against the run less that step.
        ("spike", -50.0, 50.0, 99, 10),
        ("drop", -100.0, -75.0, 29, 3),  # 100 ms for the first 10 steps, then 10 ms (it read ~-315%)
    ],
)
def test_a_run_with_a_known_trend_reads_it_as_checked_by_hand(
    runs: Path, name: str, low: float, high: float, measured: int, k: int, capsys: pytest.CaptureFixture[str]
) -> None:
    doc, printed, page = report(runs, name, capsys)
    speed: dict[str, Any] = doc["speed"]  # type: ignore[assignment]
    trend = speed["step_time"]["trend"]
    pct = trend["change_pct_over_run"]
    assert speed["warmup"]["steps_excluded"] == 1
    assert [r["steps_measured"] for r in speed["train"]["per_rank"]] == [measured]
    assert pct == pytest.approx(by_hand(runs / name, 1), rel=1e-6, abs=1e-9), trend
    if name == "spike":
        # One 0.5 s step moves the trend by no more than the flat steps' own
        # drift: compared with the same steps less that one, not with a fixed
        # range (beside a CPU hog the 10 ms sleeps of the last tenth overshot
        # enough to read +59% with or without it).
        without = by_hand(runs / name, 1, without_longest=True)
        assert abs(pct - without) <= 25.0, (trend, without)
    else:
        assert low <= pct <= high, (name, trend)
    # The report says the value and, with the run's own numbers, how it was taken.
    how = f"the median of the last {k} of the {measured} measured steps against the median of the first {k} ("
    flat = " ".join(printed.split())
    assert f"{pct:+.1f}%" in flat and how in flat and "1 warm-up step(s) left out" in flat
    assert f"{pct:+.1f}%" in page and how in page


def test_a_run_of_fewer_than_10_measured_steps_has_no_trend_and_says_why(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc, printed, page = report(runs, "short", capsys)
    trend = doc["speed"]["step_time"]["trend"]  # type: ignore[index]
    assert trend == {"slope_s_per_step": None, "change_pct_over_run": None}
    assert "none (7 measured steps, fewer than 10)" in printed
    assert "none (7 measured steps, fewer than 10)" in page
    assert " ".join(TREND_DEFINITION.split()) in " ".join(printed.split())
