"""What a slow step is: one rule, here, for the live anomaly trigger (the
core's detector is given these numbers, ``drivers/triggers``), the report's
``slow_steps[]`` (:func:`fastprof.reports.anatomy.slow_steps` replays the
live detector over the recorded steps with :meth:`SlowStepRule.find`), the
terminal and the page (which print :meth:`SlowStepRule.text`).

A step is slow when it takes more than ``factor`` times the median of the
recent steps (the last ``window`` judged steps, the baseline recomputed
every :data:`EVERY` steps once the window is full), more than ``mads``
scaled median absolute deviations above that median, and at least
``min_excess_ns`` more than it (microsecond steps are noise at 3x). A step
is judged once half the window has been seen; a burst of slow steps (each
right after the last) is one slow step, its first that the job slowed: the
steps before it that the host slowed, or that waited for another rank
(:mod:`fastprof.profiler.contention`), are each their own, and do not hide
it (the core publishes every slow step; the trigger keeps the burst,
``drivers/triggers/captures.py``). The steps the live detector does not judge (the first
step of an epoch, steps inside a torch.profiler window, the steps just after
a triggered capture while its export competes for the CPU) are left out of
both the baseline and the verdicts.

Which phase made a slow step slow is :mod:`fastprof.profiler.slow_phase`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: A slow step takes more than this many times the recent median (the
#: trigger's ``anomaly_factor`` default).
FACTOR = 3.0
#: Recent judged steps the median is taken over (``anomaly_window``).
WINDOW = 64
#: ... more than this many scaled MADs above the median ...
MADS = 6.0
#: ... and at least this much (ns) more than the median.
MIN_EXCESS_NS = 1_000_000
#: The live detector recomputes its median and MAD every this many steps
#: once its window is full (``StepTimes::EVERY`` in the core).
EVERY = 8
#: A MAD times this is a standard deviation for normal noise.
MAD_SCALE = 1.4826


@dataclass(frozen=True)
class SlowStep:
    """One slow step: its index in the steps given, its duration, and the
    median and MAD it was judged against (ns)."""

    index: int
    dur_ns: int
    median_ns: int
    mad_ns: int


@dataclass(frozen=True)
class SlowStepRule:
    """The slow-step rule and its numbers (the module's docstring says it)."""

    factor: float = FACTOR
    window: int = WINDOW
    mads: float = MADS
    min_excess_ns: int = MIN_EXCESS_NS

    @classmethod
    def of_triggers(cls, config: Mapping[str, Any] | None) -> SlowStepRule:
        """The rule a run's triggers used (their ``config`` in
        ``profiler.json``); the defaults without one."""
        c = config or {}
        factor = c.get("anomaly_factor")
        window = c.get("anomaly_window")
        return cls(
            factor=FACTOR if factor is None else float(factor),
            window=WINDOW if window is None else int(window),
        )

    def is_slow(self, dur_ns: float, median_ns: float, mad_ns: float) -> bool:
        """Whether a step of ``dur_ns`` is slow against that median and MAD."""
        if median_ns <= 0:
            return False
        return (
            dur_ns > self.factor * median_ns
            and dur_ns > median_ns + self.mads * MAD_SCALE * mad_ns
            and dur_ns - median_ns >= self.min_excess_ns
        )

    def text(self) -> str:
        """The rule in one sentence, as the report, the terminal and the page say it."""
        return (
            f"a step is slow when it takes more than {self.factor:g}x the median of the {self.window} steps "
            f"before it, more than {self.mads:g} MADs above that median and at least "
            f"{self.min_excess_ns / 1e6:g} ms more; a burst of slow steps counts once, at its first step the job "
            "slowed (a step the host slowed, or that waited for another rank, is its own) "
            "(the live anomaly trigger's rule, replayed over every recorded step)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text(),
            "factor": self.factor,
            "window": self.window,
            "mads": self.mads,
            "min_excess_ns": self.min_excess_ns,
        }

    def find(self, dur_ns: Any, judged: Any = None, not_the_jobs: Any = ()) -> list[SlowStep]:
        """The slow steps of ``dur_ns`` (each step's duration, in order), as
        the live detector finds them: ``judged[i]`` False for a step it does
        not judge (it is then neither a verdict nor in the baseline);
        ``not_the_jobs``: the indices of the steps the trigger found the
        host slowed or that waited for another rank (each is its own slow
        step, and does not start a burst of the job's)."""
        dur = np.asarray(dur_ns, dtype=np.int64)
        idx = np.arange(len(dur)) if judged is None else np.flatnonzero(np.asarray(judged, dtype=bool))
        d = dur[idx]
        n, cap = len(d), max(int(self.window), 8)
        if n == 0:
            return []
        # After observing judged step j the detector recomputes its baseline
        # when its window is not yet full, then every EVERY steps.
        recompute = np.concatenate([np.arange(min(cap - 1, n)), np.arange(cap + EVERY - 2, n, EVERY)])
        med = np.zeros(len(recompute), np.int64)
        mad = np.zeros(len(recompute), np.int64)
        filling = int(np.searchsorted(recompute, cap - 1))
        for k, j in enumerate(recompute[:filling].tolist()):  # the window filling: under `window` steps
            m, a = _median_mad(d[None, : j + 1])
            med[k], mad[k] = int(m[0]), int(a[0])
        full = recompute[filling:]
        if len(full):
            windows = np.lib.stride_tricks.sliding_window_view(d, cap)
            for lo in range(0, len(full), BLOCK):  # bounded memory: windows in blocks
                js = full[lo : lo + BLOCK]
                m, a = _median_mad(windows[js + 1 - cap])
                med[filling + lo : filling + lo + len(js)] = m
                mad[filling + lo : filling + lo + len(js)] = a
        # Step i is judged against the last baseline computed before it, a
        # block of steps at a time (a long run's temporaries are a block's).
        hits: list[tuple[int, int, int]] = []
        for lo in range(0, n, JUDGE_BLOCK):
            pos = np.arange(lo, min(n, lo + JUDGE_BLOCK))
            at = np.searchsorted(recompute, pos, side="left") - 1
            ok = (at >= 0) & (pos >= cap // 2)
            base_med = np.where(ok, med[np.maximum(at, 0)], 0)
            base_mad = np.where(ok, mad[np.maximum(at, 0)], 0)
            di = d[lo : lo + len(pos)]
            slow = (
                (base_med > 0)
                & (di > self.factor * base_med)
                & (di > base_med + self.mads * MAD_SCALE * base_mad)
                & (di - base_med >= self.min_excess_ns)
            )
            for k in np.flatnonzero(slow).tolist():
                hits.append((lo + k, int(base_med[k]), int(base_mad[k])))
        # A burst (slow steps each right after the last) is one slow step of
        # the job, its first the job slowed; the steps before it are each
        # their own.
        others = {int(i) for i in not_the_jobs}
        out: list[SlowStep] = []
        prev, jobs = -2, False
        for i, m, a in hits:
            step = int(idx[i])
            if step != prev + 1:
                jobs = False
            prev = step
            if jobs:
                continue
            out.append(SlowStep(step, int(d[i]), m, a))
            jobs = step not in others
        return out


#: Windows whose median is taken at once (memory: BLOCK x window x 8 bytes).
BLOCK = 4096
#: Steps judged at once (their temporaries: ~60 bytes a step of a block).
JUDGE_BLOCK = 1 << 16


def _median_mad(w: Any) -> tuple[Any, Any]:
    """Each row's median and MAD as the core takes them: the element at
    sorted position n // 2 (the upper median of an even count)."""
    mid = w.shape[1] // 2
    m = np.partition(w, mid, axis=1)[:, mid]
    a = np.partition(np.abs(w - m[:, None]), mid, axis=1)[:, mid]
    return m, a
