"""When a slow step is the host's doing, not the job's (issue #36, item 1):
one rule, here, for the live anomaly trigger (:mod:`fastprof.profiler.drivers.triggers`)
and the reports that print its verdicts.

The kernel counts, per thread, the time it waited for a CPU while it was
runnable (``run_delay`` in ``/proc/self/task/<tid>/schedstat``). A slow step
(:mod:`fastprof.profiler.slow_step`) of the training thread is **host
contention** when the job did nothing slow in it and the host did::

    own     = duration - waited                 (running, sleeping, blocked)
    usual   = own x rate / (1 - rate)           (the wait the usual rate gives it)
    host contention  <=>  not slow(own)                                    (c)
                      and ( own <= (1 + SHARE) x median                    (a)
                            or  waited - usual >= SHARE x (duration - median) )  (b)

(a) its own time is within 1.5x of the median step (which holds the usual
wait too): whatever made it slow was waiting for a CPU; a preemption is
lumpy, so a 1.8 ms step that waited 4 ms of its 5.8 on a host busy all
along is the host's, though such a host "usually" makes a step wait more
than that in proportion. (b) its wait for a CPU beyond the usual explains
at least :data:`SHARE` (half) of its excess over the median: a step of 30x
the work under a steady 60% share also waits 30x as long, and that
proportional wait is not what made it slow (its own time alone is 25x the
median), so (b) takes it off. (c) a step whose own time alone is a slow
step by the slow-step rule's factor and floor (more than
:data:`~fastprof.profiler.slow_step.FACTOR` x the median and at least
:data:`~fastprof.profiler.slow_step.MIN_EXCESS_NS` more) is the job's,
however long it also waited: a preemption does not triple a step's own time,
while a short-lived usual rate can leave (b) to the wait alone (30x a step's
work beside a CPU hog, benches/bench_verdicts.py: 24.7 ms, 17.7 ms of it
waiting at a usual share of 40%, its own time 12x the median).

``rate`` is the share of wall time the thread usually spent waiting for a
CPU before the step: the median over the watcher's 20 ms intervals of the
:data:`BASELINE_S` seconds before it (0 on a quiet host; at most
:data:`MAX_RATE`; a burst that fills less than half of those seconds does
not move it). The usual wait is taken off because a host that has been
busy all along slows every step in proportion: a step of 30x the work under
a steady 50% share also waits 30x as long, and that is not what made this
one step slow. It is counted from the step's own time, not its duration,
because a preemption is lumpy: a sub-millisecond step that waited 4 ms of
its 4.4 ms did nothing slow itself, however busy the host was before. A
step that slept, waited for data, a collective or the GPU, or computed
more does not wait for a CPU beyond the usual (sleeping and blocking are
not runnable), so it stays an anomaly of the job.

The wait is read by a watcher thread (never on the step path): it counts
from the watcher's last reading at or before the step's begin, so it may
include up to one watch period before the step; it is capped at the step's
duration. The job's own threads and processes pinned to the same CPUs (a
DataLoader worker, intra-op threads) make the training thread wait too:
they count as contention, as the kernel cannot tell them apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastprof.profiler.slow_step import FACTOR, MIN_EXCESS_NS

__all__ = ["BASELINE_S", "MAX_RATE", "SHARE", "Contention", "judge", "rule", "text"]

#: A slow step is host contention when its wait for a CPU beyond the usual
#: is at least this share of its excess over the median.
SHARE = 0.5
#: Seconds before a slow step its thread's usual wait rate is taken over.
BASELINE_S = 2.0
#: The usual wait rate is taken as at most this (a thread that waited 95%
#: of the time would make any step's wait "usual").
MAX_RATE = 0.9


@dataclass(frozen=True)
class Contention:
    """A slow step's wait for a CPU and the verdict (ns)."""

    dur_ns: int
    median_ns: int
    waited_ns: int
    usual_ns: int  # the wait the usual rate gives the step's own time
    contention: bool

    @property
    def excess_ns(self) -> int:
        return max(self.dur_ns - self.median_ns, 0)


def judge(dur_ns: int, median_ns: int, run_delay_ns: int, usual_rate: float = 0.0) -> Contention:
    """The verdict on a slow step of ``dur_ns`` against ``median_ns``
    whose thread waited ``run_delay_ns`` for a CPU over it, and usually
    waits ``usual_rate`` of the wall time."""
    dur = int(dur_ns)
    waited = max(min(int(run_delay_ns), dur), 0)
    rate = min(max(float(usual_rate), 0.0), MAX_RATE)
    own = dur - waited
    usual = round(own * rate / (1.0 - rate))
    median = int(median_ns)
    excess = max(dur - median, 0)
    own_slow = own > FACTOR * median and own - median >= MIN_EXCESS_NS  # (c): the job's work alone is slow
    host = excess > 0 and not own_slow and (own <= (1.0 + SHARE) * median or waited - usual >= SHARE * excess)
    return Contention(dur, median, waited, usual, host)


def rule() -> str:
    """The rule, as the records and the report say it."""
    return (
        f"a slow step is host contention when its own time (less its wait for a CPU) is within {1 + SHARE:g}x the "
        f"median, or its wait beyond the usual (its own time at the median wait share of the {BASELINE_S:g} s "
        f"before it) is at least {SHARE:g} x its excess over the median; never when its own time alone is over "
        f"{FACTOR:g}x the median and {MIN_EXCESS_NS / 1e6:g} ms more"
    )


def text(step: int, duration_ms: float, waited_ms: float) -> str:
    """How a contention step is said, everywhere it is said."""
    waited = f"{waited_ms:.0f}" if waited_ms >= 10 else f"{waited_ms:.1f}"
    return f"step {step}: {duration_ms:.1f} ms, of which {waited} ms waiting for a CPU: host contention"
