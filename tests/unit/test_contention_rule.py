"""The host-contention rule (issue #36, item 1) on the readings of real runs
(tests/integration/triggers/test_contention.py's job on a loaded 2-vCPU VM):
each case is a slow step the kernel's run delay was read for."""

from __future__ import annotations

import pytest

from fastprof.profiler import contention

MS = 1_000_000


def _judge(dur_ms: float, median_ms: float, waited_ms: float, rate: float = 0.0) -> contention.Contention:
    return contention.judge(round(dur_ms * MS), round(median_ms * MS), round(waited_ms * MS), rate)


def test_a_step_that_only_waited_is_contention() -> None:
    # Four CPU hogs beside the job on its CPU, on a host quiet before.
    c = _judge(54.9, 10.8, 54.9)
    assert c.contention
    assert c.usual_ns == 0


def test_a_step_that_did_not_wait_is_the_jobs() -> None:
    # A sleep or more compute on a quiet host: no wait for a CPU.
    assert not _judge(150.0, 5.0, 0.2).contention


def test_a_busy_host_all_along_does_not_make_more_work_contention() -> None:
    # 30x the work while the thread waited half the time all along: it also
    # waited 30x as long, but its own time alone (41 ms) is 8.6x the median.
    c = _judge(104.8, 4.8, 63.6, rate=0.503)
    assert c.own_ns > 3 * c.median_ns
    assert not c.contention
    # Half the excess was waiting: the wait's share does not decide.
    assert c.waited_ns >= 0.5 * c.excess_ns


def test_a_preempted_sub_millisecond_step_on_a_busy_host_is_contention() -> None:
    # A 0.36 ms step preempted for 4 ms while the host had taken 72% of the
    # thread's time: its own time is nothing, whatever the usual rate.
    assert _judge(4.468, 0.355, 4.468, rate=0.72).contention


def test_a_preempted_ms_step_whose_own_time_is_the_median_is_contention() -> None:
    # A 1.8 ms step that waited 4 ms of its 5.8 on a host at 61% all along:
    # in proportion its own time "usually" waits 2.8 ms, but it did nothing slow.
    c = _judge(5.84, 1.838, 4.022, rate=0.608)
    assert c.waited_ns > c.usual_ns
    assert c.contention  # own time 1.82 ms: the median


def test_a_preempted_sub_ms_step_of_a_steady_loop_is_contention() -> None:
    # benches/bench_verdicts.py's steady class, run 2 (issue #36): step 159,
    # 5.4 ms of a 0.58 ms median, waited 4.0 ms at a usual share of 75%.
    # Its own time, 1.4 ms (2.4x), is not a slow step: the host made it one.
    # The old rule ((a) own within 1.5x, or (b) the wait beyond the usual
    # share half the excess) called it the job's and captured it.
    c = _judge(5.4, 0.58, 4.0, rate=0.75)
    assert c.usual_ns > c.waited_ns  # (b) said the job
    assert c.own_ns > 1.5 * c.median_ns  # (a) said the job
    assert c.contention


def test_the_rule_is_the_slow_step_rule_on_the_own_time() -> None:
    # The step would not have been slow without its wait: contention, at
    # any share of the excess waited and any usual share.
    assert _judge(31.0, 10.0, 0.1).contention is False  # own 30.9 ms: over 3x and 1 ms more
    assert _judge(31.0, 10.0, 1.0).contention  # own 30 ms: not over 3x
    assert _judge(30.5, 10.0, 10.0, rate=0.9).contention  # own 20.5 ms
    assert not _judge(100.0, 10.0, 60.0, rate=0.0).contention  # own 40 ms: 4x


def test_the_wait_is_capped_at_the_step_and_the_rate_bounded() -> None:
    c = _judge(5.0, 1.0, 9.0)  # the wait counted from a reading before the step
    assert c.waited_ns == 5 * MS
    c = _judge(5.0, 1.0, 1.0, rate=1.0)  # a thread that only ever waited
    assert c.usual_ns == pytest.approx(4 * MS * contention.MAX_RATE / (1 - contention.MAX_RATE), rel=1e-6)
    assert not _judge(1.0, 1.0, 1.0).contention  # no excess: nothing to explain


def test_the_text() -> None:
    assert contention.text(84, 254.84, 212.2) == (
        "step 84: 254.8 ms, of which 212 ms waiting for a CPU: host contention"
    )
    # Under 10 ms the wait keeps a decimal (never "7.8 ms, of which 8 ms").
    assert contention.text(10, 7.842, 7.842) == "step 10: 7.8 ms, of which 7.8 ms waiting for a CPU: host contention"


def test_a_step_whose_own_time_alone_is_slow_is_the_jobs() -> None:
    # benches/bench_verdicts.py's slow_work (30x a step's work in forward)
    # beside a CPU hog on a loaded 2-vCPU VM: 24.7 ms, of which 17.7 ms
    # waiting for a CPU at a usual share of 40%. Its own time, 7.0 ms, is 12x
    # the median 0.565 ms: a slow step by the slow-step rule without any wait.
    c = _judge(24.712, 0.565, 17.693, rate=0.396)
    assert not c.contention
    # Own time just under the slow-step rule's factor, or less than its 1 ms
    # over the median: the host's.
    assert _judge(10.0, 1.0, 7.1, rate=0.0).contention  # own 2.9x the median
    assert _judge(4.0, 0.2, 3.2, rate=0.0).contention  # own 4x, 0.6 ms over


# On more than one rank, the wait for the others counts too (one rule).
# Numbers of benches/bench_verdicts.py's runs on the loaded 2-vCPU VM beside
# a CPU hog (issue #36). "Over their medians": what communication and
# backward took in the step over their medians, as the anatomy timed them.


def test_a_rank_that_waited_for_another_in_a_collective_is_not_the_jobs_anomaly() -> None:
    # slow_collective, rank 0, step 60: rank 1 slept 0.2 s before the loss's
    # all-reduce. 202.9 ms of a 2.5 ms median, 0.2 ms waiting for a CPU,
    # 2.2 ms on one, communication 372.8x its median (~200 ms over).
    ranks = contention.rank_wait_ns(round(202.853 * MS), round(0.199 * MS), round(2.171 * MS), round(199 * MS), 2)
    assert ranks == round(199 * MS)  # blocked 200.5 ms, up to the phases' excess
    c = contention.judge(round(202.853 * MS), round(2.513 * MS), round(0.199 * MS), 0.0, ranks)
    assert c.cause == contention.RANK and not c.contention
    # The old verdict: the job's, captured (less its CPU wait alone it is 80x).
    assert contention.judge(round(202.853 * MS), round(2.513 * MS), round(0.199 * MS)).cause == contention.JOB


def test_a_wait_in_two_phases_counts_in_both() -> None:
    # intermittent run 1, rank 0, step 44: rank 1 slept 24 ms in forward;
    # rank 0 waited in DDP's backward (14.7x its median, 39.5 ms over) and in
    # the loss's all-reduce (~10 ms over). 52.5 ms of a 3.3 ms median,
    # 0.1 ms waiting for a CPU, 3.0 ms on one, 49.4 ms blocked. Backward's
    # excess alone left 12.9 ms (3.9x): "the job", captured.
    dur, median, waited, on_cpu = round(52.549 * MS), round(3.321 * MS), round(0.116 * MS), round(3.013 * MS)
    one = contention.rank_wait_ns(dur, waited, on_cpu, round(39.473 * MS), 2)
    assert contention.judge(dur, median, waited, 0.0, one).cause == contention.JOB
    both = contention.rank_wait_ns(dur, waited, on_cpu, round(49.5 * MS), 2)
    assert both == dur - waited - on_cpu  # all its blocked time
    assert contention.judge(dur, median, waited, 0.0, both).cause == contention.RANK


def test_the_rank_that_was_late_is_the_jobs() -> None:
    # slow_collective, rank 1, step 60: it slept 0.2 s outside the phases the
    # ranks wait in; they took ~5 ms over their medians, and it was blocked
    # 199.5 ms: only those 5 ms are a wait for the other rank.
    ranks = contention.rank_wait_ns(round(204.641 * MS), round(0.563 * MS), round(4.596 * MS), round(5 * MS), 2)
    assert ranks == round(5 * MS)
    c = contention.judge(round(204.641 * MS), round(2.535 * MS), round(0.563 * MS), 0.0, ranks)
    assert c.cause == contention.JOB


def test_both_waits_together_are_not_the_jobs() -> None:
    # slow_collective run 1, rank 1, step 80: 17.7 ms of a 2.5 ms median,
    # 9.2 ms waiting for a CPU, 2.1 ms on one, 6.4 ms blocked in DDP's
    # backward (11.4x its median, ~10 ms over). Less its CPU wait alone it is
    # 8.5 ms, a slow step: it was captured as the job's.
    assert contention.judge(round(17.688 * MS), round(2.535 * MS), round(9.222 * MS)).cause == contention.JOB
    ranks = contention.rank_wait_ns(round(17.688 * MS), round(9.222 * MS), round(2.093 * MS), round(10 * MS), 2)
    c = contention.judge(round(17.688 * MS), round(2.535 * MS), round(9.222 * MS), 0.0, ranks)
    assert abs(c.own_ns - round(2.093 * MS)) <= 1  # its time on a CPU: under the median
    assert c.cause == contention.HOST  # the larger of the two waits


def test_what_is_not_a_wait_for_another_rank() -> None:
    # One rank: there is no other to wait for.
    assert contention.rank_wait_ns(round(9.1 * MS), 0, round(2.6 * MS), round(6 * MS), world=1) == 0
    # The rank's own slow backward: on a CPU, not blocked.
    ranks = contention.rank_wait_ns(round(9.1 * MS), round(0.3 * MS), round(8.5 * MS), round(6 * MS), 2)
    assert ranks == round(0.3 * MS)  # blocked 0.3 ms
    assert contention.judge(round(9.1 * MS), round(2.0 * MS), round(0.3 * MS), 0.0, ranks).cause == contention.JOB
    # Blocked, but the phases the ranks wait in took no more than usual (a sleep of its own).
    assert contention.rank_wait_ns(round(204.6 * MS), 0, round(4.6 * MS), 0, 2) == 0
