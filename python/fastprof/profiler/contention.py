"""When a slow step is the host's doing, not the job's (issue #36, item 1):
one rule, here, for the live anomaly trigger (:mod:`fastprof.profiler.drivers.triggers`)
and the reports that print its verdicts.

The kernel counts, per thread, the time it waited for a CPU while it was
runnable (``run_delay`` in ``/proc/self/task/<tid>/schedstat``) and its time
on a CPU. Two rules, one sentence each:

**Host contention.** A slow step (:mod:`fastprof.profiler.slow_step`) of the
training thread is the host's when it would not have been slow without its
wait for a CPU: its own time (its duration less that wait) is not a slow step
by the slow-step rule's factor and floor (more than
:data:`~fastprof.profiler.slow_step.FACTOR` x the median and at least
:data:`~fastprof.profiler.slow_step.MIN_EXCESS_NS` more)::

    own = duration - waited
    host contention  <=>  duration > median  and  not (own > FACTOR x median and own - median >= MIN_EXCESS)

A step of 30x the work beside a CPU hog waits in proportion too, but its own
time alone is 12x the median: the job's. A sub-millisecond step preempted
for 4 ms did 1.4 ms of its own at most, 2.4x a 0.58 ms median: the host's
(the wait of a preempted step also slows what follows it: caches, the
other hyperthread). The usual share of wall time the thread waited before
the step (the median over the watcher's 20 ms intervals of the
:data:`BASELINE_S` seconds before it) is recorded beside the verdict, and is
not part of it: a 2.4x own time under a 75% usual share is what the host
makes of a sub-millisecond step, not what the job did. What the rule gives
up: a step of 3 to 3/(1-share) times the work under a steady share of
waiting (3-6x at 50%) is called the host's.

**Waited for another rank.** On a run of more than one rank, the step's
wait for the others is its time blocked (neither on a CPU nor waiting for
one), up to what the phases where the ranks wait for each other
(``communication``; ``backward``, where DDP all-reduces the gradients) took
over their medians in it. The two rules
are one: a slow step is the job's only when what is left of it, less its
wait for a CPU and its wait for the other ranks, is still a slow step;
otherwise the larger of the two waits is its cause, and it is recorded, not
captured. The rank that was late judges its own step: its own slow work,
batch or sleep is the job's there (a sleep before a collective is not time
in a phase the ranks wait in), and its wait for a CPU the host's. One
rank's host contention otherwise became the other's anomaly; and a step
that waited 9 ms for a CPU and 6 ms for the other rank, 2 ms on a CPU of a
2.5 ms median, was neither rule's alone.

The wait and the time on a CPU are the step's own: a watcher thread (never
on the step path) reads them every 20 ms, and of the reading interval that
straddles the step's begin only the part after the begin may count (the
most the step can have waited in it), the intervals after it whole
(``runwait.rs``). The job's own threads and processes pinned to the same
CPUs (a DataLoader worker, intra-op threads) make the training thread wait
too: they count as contention, as the kernel cannot tell them apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastprof.profiler.slow_step import FACTOR, MIN_EXCESS_NS

__all__ = ["BASELINE_S", "MAX_RATE", "RANK_PHASES", "Contention", "judge", "rank_wait_ns", "rule", "text"]

#: Seconds before a slow step its thread's usual wait rate is taken over
#: (recorded beside the verdict).
BASELINE_S = 2.0
#: The usual wait rate is taken as at most this.
MAX_RATE = 0.9
#: The phases in which a rank waits for the others: its collectives, and
#: backward, where DDP's reducer all-reduces the gradients and waits.
RANK_PHASES = ("communication", "backward")

HOST = "host contention"
RANK = "another rank"
JOB = "the job"


@dataclass(frozen=True)
class Contention:
    """A slow step's waits and the verdict (ns)."""

    dur_ns: int
    median_ns: int
    waited_ns: int  # for a CPU
    usual_ns: int  # the wait the usual rate gives the step's own time (recorded, not judged)
    cause: str  # HOST, RANK or JOB
    rank_wait_ns: int = 0  # for the other ranks

    @property
    def contention(self) -> bool:
        return self.cause == HOST

    @property
    def excess_ns(self) -> int:
        return max(self.dur_ns - self.median_ns, 0)

    @property
    def own_ns(self) -> int:
        """What is left of the step less its waits."""
        return self.dur_ns - self.waited_ns - self.rank_wait_ns


def judge(dur_ns: int, median_ns: int, run_delay_ns: int, usual_rate: float = 0.0, rank_wait: int = 0) -> Contention:
    """The verdict on a slow step of ``dur_ns`` against ``median_ns``
    whose thread waited ``run_delay_ns`` for a CPU over it and
    ``rank_wait`` for the other ranks (:func:`rank_wait_ns`); it usually
    waits ``usual_rate`` of the wall time (recorded only)."""
    dur = int(dur_ns)
    waited = max(min(int(run_delay_ns), dur), 0)
    ranks = max(min(int(rank_wait), dur - waited), 0)
    rate = min(max(float(usual_rate), 0.0), MAX_RATE)
    usual = round((dur - waited) * rate / (1.0 - rate))
    median = int(median_ns)
    own = dur - waited - ranks
    own_slow = own > FACTOR * median and own - median >= MIN_EXCESS_NS
    if dur <= median or own_slow:
        cause = JOB
    else:
        cause = HOST if waited >= ranks else RANK
    return Contention(dur, median, waited, usual, cause, ranks)


def rank_wait_ns(dur_ns: int, waited_ns: int, on_cpu_ns: int, rank_phases_excess_ns: int, world: int) -> int:
    """A slow step's wait for the other ranks: its time blocked (``dur_ns``
    less its wait for a CPU and its time on one), up to
    ``rank_phases_excess_ns``, what the phases the ranks wait in
    (:data:`RANK_PHASES`) took in it over their medians; 0 on one rank."""
    if world < 2:
        return 0
    blocked = int(dur_ns) - int(waited_ns) - max(int(on_cpu_ns), 0)
    return max(min(blocked, int(rank_phases_excess_ns)), 0)


def rule() -> str:
    """The rule, as the records and the report say it."""
    return (
        "a slow step is the job's only when what is left of it, less its wait for a CPU and (on more than one "
        "rank) its time blocked, up to what the phases the ranks wait in "
        f"({', '.join(RANK_PHASES)}) took over their medians, is still a slow step (over {FACTOR:g}x the median and "
        f"{MIN_EXCESS_NS / 1e6:g} ms more); otherwise the larger wait is its cause: host contention or another rank"
    )


def text(step: int, duration_ms: float, waited_ms: float) -> str:
    """How a contention step is said, everywhere it is said."""
    waited = f"{waited_ms:.0f}" if waited_ms >= 10 else f"{waited_ms:.1f}"
    return f"step {step}: {duration_ms:.1f} ms, of which {waited} ms waiting for a CPU: host contention"
