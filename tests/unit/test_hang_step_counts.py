"""The step a skipped collective was left out of (issue #37): each rank's
wavefront keeps ``[step, collectives before that step's first]`` per group;
:func:`step_counts` turns it into collectives per step and
:func:`first_diff` names the first step two ranks differ in, within the
steps both kept."""

from __future__ import annotations

from typing import Any

from fastprof.profiler import collectives
from fastprof.profiler.drivers.hang.verdict import _skip_text, first_diff, step_counts


def _rank(steps: list[list[int]], entered: int) -> dict[str, Any]:
    return {"steps": {"default": steps}, "entered": {"default": {"op": "all_reduce", "seq": entered}}}


def test_counts_per_step_and_a_step_without_a_collective() -> None:
    # one all_reduce a step, none in step 6; in step 9's (the 9th) now
    steps = [[i, i] for i in range(6)] + [[i, i - 1] for i in range(7, 10)]
    counts, lo, hi = step_counts(steps, 9) or ({}, 0, 0)
    assert (lo, hi) == (0, 9)
    assert counts == {**{i: 1 for i in range(6)}, **{i: 1 for i in range(7, 10)}}
    assert 6 not in counts
    assert step_counts([], 3) is None


def test_the_first_step_whose_count_differs() -> None:
    r0 = _rank([[i, i] for i in range(40)], 40)
    r1 = _rank([[i, i] for i in range(6)] + [[i, i - 1] for i in range(7, 40)], 39)
    assert first_diff(r1, r0, "default") == {"step": 6, "mine": 0, "theirs": 1}
    assert first_diff(r0, r0, "default") is None
    assert first_diff(r1, {"steps": {}}, "default") is None
    # two collectives in step 3 on one rank (one more)
    r2 = _rank([[0, 0], [1, 1], [2, 2], [3, 3], [4, 5]], 6)
    r3 = _rank([[0, 0], [1, 1], [2, 2], [3, 3], [4, 4]], 5)
    assert first_diff(r2, r3, "default") == {"step": 3, "mine": 2, "theirs": 1}


def test_only_the_steps_both_ranks_kept_are_compared() -> None:
    # rank 1 kept steps 10-19 (its deque dropped the older); the skip was in step 4
    r0 = _rank([[i, i] for i in range(20)], 20)
    r1 = _rank([[i, i - 1] for i in range(10, 20)], 19)
    assert first_diff(r1, r0, "default") is None


def test_the_text_names_the_step() -> None:
    skip = {"group": "default", "seq": 39, "op": "all_reduce", "step": 39, "first": {"step": 6, "mine": 0, "theirs": 1}}
    text = _skip_text(1, skip, [0, 2, 3], "all_reduce #40", "has left its training loop")
    assert "first in step 6: rank 1 entered 0 collectives of the default group there where ranks 0, 2-3 entered 1" in (
        text
    )


def test_the_wavefront_keeps_one_entry_per_step_bounded() -> None:
    collectives.reset()
    try:
        for step in range(collectives.MAX_STEPS + 10):
            collectives.step_began(step, {"default": step} if step else {})
        collectives.entered("all_reduce", "default", collectives.MAX_STEPS + 10)
        collectives.entered("broadcast", "ranks 0,1", 1)
        snap = collectives.snapshot()
        assert len(snap["default"]["steps"]) == collectives.MAX_STEPS
        assert snap["default"]["steps"][0] == [10, 10]
        assert snap["ranks 0,1"]["steps"][0] == [10, 0]  # a group with none yet: 0 before each step
    finally:
        collectives.reset()
