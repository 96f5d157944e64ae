"""Triggers for long jobs (issue #17): flight-recorder dumps and torch.profiler
captures asked for while the job runs, by a signal, a trigger file, another
rank, a slow step, an exception, an out-of-memory error or SIGTERM.

``Profiler(triggers=fastprof.Triggers(...))`` (on by default; ``triggers=False``
or ``FASTPROF_TRIGGERS=0`` turns it off). What asks, and what it gets:

=====================  ==============================================  ==========================
source                 how                                             gets
=====================  ==============================================  ==========================
signal                 ``kill -USR2 <pid>`` (``signal``, default        a capture of ``steps``
                       SIGUSR2; every rank)                             steps, a flight dump
run trigger file       ``<run>/TRIGGER`` (``fastprof trigger RUN``)     the same, on every rank
rank trigger file      ``<run>/rank{R}/TRIGGER``                        the same, on rank R only
anomaly                a step beyond ``anomaly_factor`` x the median    an ``anomaly`` instant, a
                       of the last ``anomaly_window`` steps (and        flight dump, a capture
                       beyond 6 MADs and 1 ms; a burst counts once)     (at most ``anomaly_max``)
host contention        a slow step the training thread spent waiting    an ``anomaly`` instant
                       for a CPU (another process had it; the rule:     (``cause``), counted; no
                       :mod:`fastprof.profiler.contention`)             capture unless
                                                                        ``anomaly_on_contention``
exception / OOM        leaving ``with Profiler`` (or Lightning's fit)   a flight dump
SIGTERM                preemption, torchrun's teardown                  a flight dump
=====================  ==============================================  ==========================

How it stays cheap and safe (Kineto removed its SIGUSR2 trigger after signal
storms aborted jobs, kineto#1408):

* The signal handler and the poller thread only record the request and set
  one flag in the core (``_core._attention_set``); the step loop reads that
  flag with one relaxed atomic load at each step's begin, also on quiet
  stretches that never enter Python, and only then calls the Profiler. A
  step costs nothing more while no trigger is pending.
* Requests are coalesced: one pending at a time, and none starts within
  ``min_interval_s`` of the previous capture, nor a flight-only one within
  2 s of the previous dump (each dropped one is counted and on the timeline
  as a ``trigger.coalesced`` instant). Without torch windows every request
  is flight-only, and coalesced as one. One coalesced
  into a capture armed and coming, or a flight-only one into the dump just
  taken, is answered by it: its record's ``answered_by`` is that request's
  ``seq``, and ``fastprof trigger`` answers with those files.
* The trigger files and the process group's store are read by one daemon
  thread every ``poll_s`` seconds, never by the training thread; only a
  regular file is opened there (a FIFO would block the thread in open()):
  anything else is said once and left alone. A flight dump is written by a
  thread of its own (the core releases the GIL), which rewrites
  ``triggers.json`` once the file is there; a torch window's export wakes
  the poller to do the same.
* Flight dumps and torch windows count under the recorder's disk cap
  (``max_disk``) with its segments: the writer thread deletes the oldest
  of them all to stay under it, and says so where it says segments. The
  cap holds while they are written: a dump keeps the newest events that
  fit in what the cap leaves (``left_out_events``; none fit: not written,
  its ``error`` says why; the first such dump of a run is said once on
  stderr), and a torch window's JSON is piped into its gzip, whose room
  is held as it grows.
* A capture is a torch.profiler window of ``steps`` steps that begins at a
  step boundary. The Profiler's action plan (:mod:`fastprof.profiler.plan`)
  merges it with the schedule: its steps are recorded whatever the schedule
  says, and a capture that meets the schedule's own window shares it (one
  window, one file, saved where the later of the two ends; its record says
  ``with_schedule_window``), so torch never sees a window go back to warm-up.
  Under ``torch.distributed`` the rank that got the request posts it to the
  process group's store with a start step ``lead`` steps ahead (enough for
  every rank's poller to see it: two polls' worth of the measured step
  time), and every rank captures the same step indices. Nobody waits for
  anybody: a rank that is dead or late never blocks another; a rank that
  sees the proposal after its start step captures from its next step and
  says how late it was.
* The user's own handler for the signal, installed before fastprof, is
  still called (after the request is recorded); one installed after
  replaces fastprof's, as Python's semantics say. A signal already handled
  outside Python (a C handler) or ignored (SIG_IGN) is left alone, said
  once; the trigger file still works. When the Profiler stops, the job's
  handler is given back; a signal the job left at its default (which
  kills) stays harmless for the rest of the process instead, so that a
  trigger sent while the job finishes never ends it (``fastprof._signals``).

Every request, capture, dump and anomaly is in ``rank{R}/triggers.json``
(rewritten as they happen; ``fastprof trigger`` waits on it and the report
lists them) and in ``profiler.json``'s ``triggers``. While the Profiler runs,
``rank{R}/live.json`` says which pid and signal to use.

The parts, one module each: :mod:`.config` (the options, the request a
trigger file holds), :mod:`.state` (what the parts share: records, the
request queue, ``triggers.json``), :mod:`.signals` (the trigger signal),
:mod:`.requests` (trigger files and a URL run's trigger objects),
:mod:`.store` (the ranks agree through the process group's store),
:mod:`.captures` (requests taken at a step boundary, anomalies),
:mod:`.flight` (flight dumps), and :mod:`.driver` (the Profiler's driver
that puts them together, and the poller thread).
"""

from fastprof.profiler.drivers.triggers.config import (
    DEFAULT_FLIGHT_SECONDS,
    LIVE_FILE,
    OPTIONS,
    REMOTE_POLL_S,
    STATE_FILE,
    TRIGGER_FILE,
    Triggers,
    new_request_id,
    parse_request,
)

__all__ = [
    "DEFAULT_FLIGHT_SECONDS",
    "LIVE_FILE",
    "OPTIONS",
    "REMOTE_POLL_S",
    "STATE_FILE",
    "TRIGGER_FILE",
    "Triggers",
    "new_request_id",
    "parse_request",
]
