"""The rank index (``reports.data._Groups``) placed by counting a chunk of
rows at a time (issue #38, item 1): the same order, keys and bounds as the
stable sort of every row's key at once, in ~4 bytes a row (the order
itself) where the sort's temporaries were ~20."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fastprof.reports import data as data_module
from fastprof.reports.data import _Groups


def _columns(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    name = rng.integers(0, 40, n).astype(np.uint32)
    rank = rng.integers(3, 70, n).astype(np.int32)
    ts = np.cumsum(rng.integers(0, 1000, n)).astype(np.int64)
    ts[rng.random(n) < 0.01] -= 5_000  # a few rows out of start order
    return name, rank, ts


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_placed_by_counting_is_the_stable_sort(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    name, rank, ts = _columns(50_000, seed=chunk)
    monkeypatch.setattr(data_module, "_DENSE_KEYS", 0)  # the sort
    want = _Groups.build(name, rank, ts)
    monkeypatch.setattr(data_module, "_DENSE_KEYS", 1 << 22)
    monkeypatch.setattr(data_module, "_CHUNK", chunk)
    got = _Groups.build(name, rank, ts)
    assert got.order.dtype == want.order.dtype == np.int32
    np.testing.assert_array_equal(got.order, want.order)
    np.testing.assert_array_equal(got.keys, want.keys)
    np.testing.assert_array_equal(got.bounds, want.bounds)
    assert (got.stride, got.rank_lo) == (want.stride, want.rank_lo)


def _peak(n: int) -> int:
    name, rank, ts = _columns(n)
    tracemalloc.start()
    try:
        _Groups.build(name, rank, ts)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_by_the_order_and_a_few_bytes_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_module, "_CHUNK", 1 << 14)
    small, large = 500_000, 1_500_000
    grow = (_peak(large) - _peak(small)) / (large - small)
    assert grow <= 6, f"{grow:.1f} bytes a row"
