"""When backward's end is a sync point for the straggler rule (issue #36,
item 2): DDP's gradient all-reduce holds the ranks inside backward, and they
leave it together. Spreads (ms) as benches/bench_verdicts.py measured them
on a loaded 2-vCPU VM beside a CPU hog."""

from __future__ import annotations

from fastprof.reports.stragglers import SYNCED_SPREAD, backward_synced

MS = 1e6


def test_a_rank_slow_before_backward_enters_late_and_leaves_together() -> None:
    # slow_forward: rank 1 enters backward 7.2 ms late, both leave 0.5 ms apart.
    assert backward_synced(7.216 * MS, 0.497 * MS, 1.055 * MS)


def test_ranks_that_enter_backward_almost_together_and_leave_together() -> None:
    # slow_backward run 1: the ranks leave the loss's all-reduce 0.92 ms apart,
    # so they enter backward 0.9 ms apart; DDP's all-reduce, inside backward,
    # lets them go 0.42 ms apart: a sync point, as tightly as a collective's.
    assert backward_synced(0.898 * MS, 0.423 * MS, 0.924 * MS)
    # A run whose begins were closer (0.6 ms): half the begin spread alone
    # said "not together", backward was no sync point, and the rank released
    # later from it was named a straggler at the next collective (1 run in 3).
    assert 0.423 > SYNCED_SPREAD * 0.6
    assert backward_synced(0.6 * MS, 0.423 * MS, 0.924 * MS)


def test_ranks_that_do_not_wait_for_each_other_in_backward() -> None:
    # No all-reduce inside backward: the ends spread as the begins do, and more.
    assert not backward_synced(0.9 * MS, 1.4 * MS, 0.92 * MS)
    # A rank slow inside backward without DDP: far apart at the end.
    assert not backward_synced(0.9 * MS, 7.0 * MS, 0.92 * MS)
    # A rank slow before it without DDP: far apart at both ends.
    assert not backward_synced(7.2 * MS, 7.3 * MS, 0.92 * MS)
    # No collective to compare with: half the begin spread, as before.
    assert not backward_synced(0.6 * MS, 0.423 * MS, None)
    assert backward_synced(7.2 * MS, 0.5 * MS, None)
    assert not backward_synced(0.0, 0.0, 0.5 * MS)
