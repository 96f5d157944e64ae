"""Which phase made a step slow: one answer for the live anomaly trigger
(:meth:`fastprof.profiler.anatomy.Anatomy.explain`, which
``Profiler.explain_step`` asks) and for the report's slow steps
(:func:`fastprof.reports.anatomy.slow_steps`), so that the trigger's line and
the report never name two phases for one step.

The answer is the phase furthest above its own median over the other steps
(the step itself left out of its baseline); it made the step slow when it is
at least :data:`MIN_FACTOR` times that median, or absent from the others.
The two callers give it the phases they have: the report all six, the live
anatomy the four it times (it never sees the loader's wait or the rest).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: A phase this many times its median made the step slow (less is the
#: jitter of a step that is slow as a whole).
MIN_FACTOR = 1.5
#: Other steps needed for a median worth comparing with.
MIN_OTHERS = 3


@dataclass(frozen=True)
class SlowPhase:
    """The phase furthest above its median in one step."""

    phase: str
    #: The step's time in the phase.
    took: float
    #: The phase's median time over the other steps (same unit).
    median: float

    @property
    def factor(self) -> float | None:
        """The step's time in the phase over its median; None where the
        phase is absent from the other steps."""
        return self.took / self.median if self.median > 0 else None

    @property
    def stands_out(self) -> bool:
        """Whether this phase made the step slow (see :data:`MIN_FACTOR`)."""
        return self.took > self.median and (self.median <= 0 or self.took >= MIN_FACTOR * self.median)

    def __str__(self) -> str:
        factor = self.factor
        return f"{self.phase} (absent from other steps)" if factor is None else f"{self.phase} {factor:.1f}x its median"


def slow_phase(step: Mapping[str, float], others: Mapping[str, Any]) -> SlowPhase | None:
    """The phase of ``step`` (its time per phase) furthest above its median
    over the other steps, ``others[phase]`` being that phase's time in each
    of them (sequences of one length, 0 where a step had none of it; a phase
    missing from ``others`` is absent from them). Ties go to the phase first
    in ``step``. None with fewer than
    :data:`MIN_OTHERS` other steps or no phase."""
    n = max((len(v) for v in others.values()), default=0)
    if n < MIN_OTHERS:
        return None
    best: SlowPhase | None = None
    excess = 0.0
    for phase, took in step.items():
        values = others.get(phase)
        median = float(np.median(values)) if values is not None and len(values) else 0.0
        if best is None or float(took) - median > excess:
            best, excess = SlowPhase(phase, float(took), median), float(took) - median
    return best
