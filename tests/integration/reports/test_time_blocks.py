"""The time table of a long run on one rank (issue #38, item 1): a rank
with more kept span rows than a block (``time._BLOCK_ROWS``) is grouped a
few whole names at a time, so the table's sort and its temporaries are a
block's, not the run's, and the rows are the same as all at once. A real
run: the Profiler records 100,000 tiny steps (a loader wait, forward,
backward and optimizer spans) in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from fastprof.reports import time as time_report_module
from fastprof.reports.data import load

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benches"))

from _util import PACED_RUN

STEPS = 100_000


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("time_blocks")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    cmd = [sys.executable, "-c", PACED_RUN, str(STEPS), str(tmp), "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp / "run"


def test_one_ranks_names_in_blocks_give_the_rows_of_all_at_once_in_a_blocks_memory(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = load(run)
    rows = len(data.cols.spans["ts"])
    assert rows >= 5 * STEPS
    data._span_groups()  # the rank index other sections build: not the table's memory
    monkeypatch.setattr(time_report_module, "_BLOCK_ROWS", 10**9)
    whole = time_report_module.time_report(data)
    monkeypatch.setattr(time_report_module, "_BLOCK_ROWS", STEPS + 10)
    tracemalloc.start()
    try:
        blocks = time_report_module.time_report(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert blocks == whole
    names = {r["name"] for r in whole["rows"]}
    assert {"step", "forward", "backward", "optimizer"} <= names
    assert all(r["count"] == STEPS for r in whole["rows"] if r["name"] in ("forward", "backward", "optimizer"))
    # A name (STEPS rows) at a time: a few bytes a row for the masks, the
    # block's sort; all rows at once took ~100 bytes a row.
    assert peak <= 12 * rows + 60 * STEPS, f"{peak / rows:.0f} bytes a row"
