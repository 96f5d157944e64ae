"""One answer to "which phase made this step slow" (issue #35, item 3): the
live anomaly trigger's (``Anatomy.explain``, which ``Profiler.explain_step``
asks) and the report's slow steps (``reports.anatomy.slow_steps``) name the
same phase with the same factor on the same steps."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from fastprof.profiler.anatomy import TIMED, Anatomy
from fastprof.profiler.slow_step import SlowStepRule
from fastprof.reports.anatomy import slow_steps

# Per step (ticks, as the anatomy keeps them): the step's four timed phases.
# Step 3's backward is 90 against a median of 20 over the other steps; with
# the step itself in the baseline its median would be 25 (3.6x, not 4.5x).
ROWS = [
    {"forward": 5.0, "backward": 10.0, "optimizer": 4.0, "communication": 0.0},
    {"forward": 5.0, "backward": 20.0, "optimizer": 4.0, "communication": 0.0},
    {"forward": 6.0, "backward": 30.0, "optimizer": 4.0, "communication": 0.0},
    {"forward": 5.0, "backward": 90.0, "optimizer": 5.0, "communication": 0.0},
]
SLOW = 3


def _live(rows: list[dict[str, float]], step: int, excess: float | None = None) -> str | None:
    """The anatomy's answer, from its recent steps' rows (ticks per phase of TIMED)."""
    anatomy = Anatomy()
    recent = OrderedDict((i, [int(r[p]) for p in TIMED]) for i, r in enumerate(rows))
    anatomy.recent = lambda: recent  # type: ignore[method-assign]
    return anatomy.explain(step, excess)


#: The report judges a step by the slow-step rule (issue #36, item 3): the
#: steps before the last are the others repeated, so that it has a baseline
#: (these tick-sized steps need no excess floor, and their spread a small MAD factor).
RULE = SlowStepRule(factor=2.0, window=8, mads=1.0, min_excess_ns=0)
REPEAT = 3


def _report(rows: list[dict[str, float]]) -> list[dict[str, object]]:
    rows = rows[:-1] * REPEAT + rows
    per_step = {p: np.array([r[p] for r in rows], dtype=np.int64) for p in rows[0]}
    dur = sum(per_step.values())
    return slow_steps(dur, per_step, 0, RULE)


def test_the_trigger_and_the_report_name_the_same_phase_with_the_same_factor() -> None:
    (slow,) = _report(ROWS)
    assert slow["step"] == REPEAT * (len(ROWS) - 1) + SLOW and slow["phase"] == "backward"
    assert slow["phase_median_ns"] == 20.0 and slow["phase_factor"] == 4.5
    assert _live(ROWS, SLOW) == "backward 4.5x its median"


def test_where_no_timed_phase_stands_out_the_trigger_says_so() -> None:
    # Every phase of the step is 1.4x its median: none made it slow by itself
    # (the live anatomy never sees the loader's wait or the rest of the step).
    rows = [{"forward": 10.0, "backward": 10.0, "optimizer": 10.0, "communication": 0.0} for _ in range(5)]
    rows.append({"forward": 14.0, "backward": 14.0, "optimizer": 14.0, "communication": 0.0})
    assert _live(rows, 5) == (
        "not forward, backward, optimizer or communication: the data loader's wait or the rest of the step"
    )


def test_a_phase_absent_from_the_other_steps_is_named_as_such() -> None:
    rows = [{"forward": 5.0, "backward": 10.0, "optimizer": 4.0, "communication": 0.0} for _ in range(4)]
    rows.append({"forward": 5.0, "backward": 10.0, "optimizer": 4.0, "communication": 40.0})
    assert _live(rows, 4) == "communication (absent from other steps)"
    (slow,) = _report(rows)
    assert slow["phase"] == "communication" and slow["phase_factor"] is None


def test_a_phase_that_holds_little_of_the_steps_excess_is_not_named() -> None:
    """A rank that slept 300 ms before a collective whose own wait was 10 ms
    over its median (5.6x) was "slow in communication" (issue #36): the
    phase must hold at least half of the step's time over the median step."""
    rows = [{"forward": 5.0, "backward": 10.0, "optimizer": 4.0, "communication": 2.0} for _ in range(6)]
    rows.append({"forward": 5.0, "backward": 10.0, "optimizer": 4.0, "communication": 12.0})
    assert _live(rows, 6) == "communication 6.0x its median"
    # The step was 300 over the median step: communication's 10 made little of it.
    assert _live(rows, 6, excess=300.0) == (
        "not forward, backward, optimizer or communication: the data loader's wait or the rest of the step"
    )
    # Where communication holds the step's excess, it is named.
    assert _live(rows, 6, excess=12.0) == "communication 6.0x its median"
    # The report, which sees the rest of the step, names it there.
    report_rows = [{**r, "other": 3.0} for r in rows[:-1]] + [{**rows[-1], "other": 303.0}]
    (slow,) = _report(report_rows)
    assert slow["phase"] == "other"
