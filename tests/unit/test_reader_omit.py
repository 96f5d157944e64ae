"""``read_columns(omit=...)`` (#38, item 1's memory): columns left out are
never stored, every other column of every table is the same as a full read
of the same real recordings (two ranks, so a left-out pid must still give
each row its rank), and every column the reader hands back holds exactly its
rows (no spare capacity of a growing vector kept alive by numpy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastprof
from fastprof.readers.columns import KINDS


def record(out_dir: Path, rank: int, steps: int) -> None:
    rec = fastprof.start(out_dir=out_dir, run_name="run", rank=rank, flush_interval=0.05)
    for i in range(steps):
        with fastprof.span("step", step=i):
            with fastprof.span("forward"):
                fastprof.counter("loss", 1.0 / (i + 1))
            fastprof.instant("grad_ready", i=i)
            fastprof.counter("mem", {"alloc": i * 1024 + rank, "reserved": 4096})
    rec.stop()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("omit")
    record(out, 0, 4)
    record(out, 1, 6)
    return out / "run"


OPTIONAL = ("cat", "pid", "tid", "file")


def test_omitted_columns_are_absent_and_the_rest_unchanged(run_dir: Path) -> None:
    full = fastprof.read_columns(run_dir, step_column=False)
    lean = fastprof.read_columns(run_dir, step_column=False, omit=[f"{k}.{c}" for k in KINDS for c in OPTIONAL])
    assert lean.warnings == full.warnings
    assert lean.names == full.names
    # The category table lists what kept columns use: none here.
    assert full.categories == ["user"] and lean.categories == []
    for kind in KINDS:
        f, g = getattr(full, kind), getattr(lean, kind)
        assert len(f["ts"]) > 0
        assert set(f) - set(g) == set(OPTIONAL)
        for col, values in g.items():
            np.testing.assert_array_equal(values, f[col], err_msg=f"{kind}.{col}")
            assert values.dtype == f[col].dtype
        # Both ranks are there: the rank came from the pid not kept.
        assert set(np.unique(g["rank"]).tolist()) == {0, 1}
    # One table's columns only.
    some = fastprof.read_columns(run_dir, step_column=False, omit="counters.pid")
    assert set(full.counters) - set(some.counters) == {"pid"}
    for col in full.spans:
        np.testing.assert_array_equal(some.spans[col], full.spans[col])


def test_every_column_is_exactly_its_rows(run_dir: Path) -> None:
    for cols in (
        fastprof.read_columns(run_dir),
        fastprof.read_columns(run_dir, step_column=False, omit="counters.tid"),
        fastprof.read_columns(run_dir, kinds=("spans",)),
    ):
        assert cols.exact == {"spans": True, "instants": True, "counters": True}
        assert len(cols.spans["ts"]) > 0


def test_bad_omit_is_a_config_error(run_dir: Path) -> None:
    with pytest.raises(fastprof.ConfigError, match="omit"):
        fastprof.read_columns(run_dir, omit="spans.ts")
    with pytest.raises(fastprof.ConfigError, match="omit"):
        fastprof.read_columns(run_dir, omit="nothing")
    # A left-out pid needs step_column=False (a row's step is found by its pid).
    with pytest.raises(fastprof.ConfigError, match="omit"):
        fastprof.read_columns(run_dir, omit="spans.pid")
