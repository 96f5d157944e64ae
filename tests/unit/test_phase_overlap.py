"""The anatomy's one overlap rule (issue #36, item 4) on steps built by hand:
the phases tile the step, and where spans overlapped the split is said."""

from __future__ import annotations

import numpy as np

from fastprof.reports.phases import PRECEDENCE, split


def _a(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def test_nested_phases_are_counted_once_each_by_the_rule() -> None:
    # One step [0, 100): loader [0, 5), forward [10, 30), backward [40, 90)
    # with a recomputed forward [50, 70) and a collective [80, 85) inside it,
    # the optimizer [90, 98).
    spans = {
        "dataloader": [(_a(0), _a(5))],
        "forward": [(_a(10, 50), _a(30, 70))],
        "backward": [(_a(40), _a(90))],
        "communication": [(_a(80), _a(85))],
        "optimizer": [(_a(90), _a(98))],
    }
    got = split(_a(0), _a(100), spans)
    per = {p: int(v[0]) for p, v in got.per_step.items()}
    assert per == {"dataloader": 5, "forward": 20, "backward": 45, "optimizer": 8, "communication": 5, "other": 17}
    assert sum(per.values()) == 100
    given = {k: int(v[0]) for k, v in got.given.items()}
    assert given == {("forward", "backward"): 20, ("backward", "communication"): 5}


def test_a_span_belongs_to_the_step_it_starts_in_and_ends_with_it() -> None:
    # Two steps [0, 10) and [10, 20); a backward span [5, 15) crosses the boundary;
    # two user optimizer spans of one phase overlap each other in step 2.
    spans = {
        "backward": [(_a(5), _a(15))],
        "optimizer": [(_a(12), _a(16)), (_a(14), _a(18))],
    }
    got = split(_a(0, 10), _a(10, 10), spans)
    assert got.per_step["backward"].tolist() == [5, 0]
    assert got.per_step["optimizer"].tolist() == [0, 6]
    assert got.per_step["other"].tolist() == [5, 4]
    for i in range(2):
        assert sum(int(got.per_step[p][i]) for p in got.per_step) == 10
    assert got.given == {}


def test_the_rule_names_every_phase_once() -> None:
    assert sorted(PRECEDENCE) == sorted(["dataloader", "forward", "backward", "optimizer", "communication"])
