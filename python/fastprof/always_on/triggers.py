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
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import stat
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastprof import _core, _dist, _signals
from fastprof._core import ConfigError, FastprofWarning
from fastprof._loop_api import TriggerHost
from fastprof.memory._files import write_atomic
from fastprof.memory.oom import add_oom_listener, remove_oom_listener
from fastprof.recording.options import Option, _bool, _float, _int, _str, _value, check_format, prefixed

__all__ = ["LIVE_FILE", "OPTIONS", "STATE_FILE", "TRIGGER_FILE", "TriggerDriver", "Triggers", "parse_request"]

#: The trigger file's name (in the run directory for every rank, in a rank's folder for that rank).
TRIGGER_FILE = "TRIGGER"
#: Seconds between two looks at a URL run's trigger objects in the store.
REMOTE_POLL_S = 10.0
#: Written in a rank's folder while its Profiler runs (pid, host, signal).
LIVE_FILE = "live.json"
#: A rank's record of requests, captures, dumps and anomalies.
STATE_FILE = "triggers.json"
#: The flight window the Profiler turns on when triggers dump and the recorder keeps none.
DEFAULT_FLIGHT_SECONDS = 30.0
_FLIGHT_EVENTS = ("trigger", "anomaly", "exception", "oom", "sigterm")
#: Bounds, so that nothing grows with a long run's requests.
_MAX_RECORDS = 200
_MAX_LEAD = 10_000
#: An anomaly is also beyond this many (scaled) MADs of the median ...
_ANOMALY_MADS = 6.0
#: ... and at least this much slower than it (microsecond steps are noise at 3x).
_ANOMALY_MIN_EXCESS_NS = 1_000_000
#: Flight-only requests closer than this to the previous dump are coalesced.
_FLIGHT_MIN_INTERVAL_S = 2.0


_opt = prefixed("TRIGGERS")

#: Triggers' options; each has a FASTPROF_TRIGGERS_<NAME> variable.
OPTIONS: tuple[Option, ...] = (
    _opt(
        "signal",
        "str",
        "SIGUSR2",
        "a signal name or number, or off",
        "The signal that asks for a capture and a flight dump (off: none).",
        _str,
    ),
    _opt("file", "bool", True, "a boolean", "Watch <run>/TRIGGER and <run>/rank{R}/TRIGGER.", _bool),
    _opt(
        "poll_s",
        "float",
        1.0,
        "seconds from 0.05 to 3600",
        "How often the trigger files and the store are read (by a thread of their own).",
        _float,
        lambda v: 0.05 <= v <= 3600,
    ),
    _opt(
        "steps",
        "int",
        5,
        "an integer from 1 to 10000",
        "Steps of a triggered torch.profiler capture.",
        _int,
        lambda v: 1 <= v <= 10_000,
    ),
    _opt("flight", "bool", True, "a boolean", "A trigger also dumps the flight recorder.", _bool),
    _opt(
        "flight_on",
        "str",
        ",".join(_FLIGHT_EVENTS),
        f"a comma list of {', '.join(_FLIGHT_EVENTS)} (or none)",
        "Which events dump the flight recorder.",
        _str,
    ),
    _opt(
        "min_interval_s",
        "float",
        30.0,
        "seconds from 0 to 86400",
        "No capture starts within this time of the previous one; requests in between are coalesced.",
        _float,
        lambda v: 0 <= v <= 86400,
    ),
    _opt(
        "anomaly",
        "bool",
        True,
        "a boolean",
        "Judge each step's time against the recent steps (one comparison per step, in the core).",
        _bool,
    ),
    _opt(
        "anomaly_factor",
        "float",
        3.0,
        "a number from 1.5 to 1000",
        "A step slower than this many times the median of the recent steps is an anomaly.",
        _float,
        lambda v: 1.5 <= v <= 1000,
    ),
    _opt(
        "anomaly_window",
        "int",
        64,
        "an integer from 8 to 100000",
        "Recent steps the median is taken over (an anomaly needs half of them seen first).",
        _int,
        lambda v: 8 <= v <= 100_000,
    ),
    _opt(
        "anomaly_max",
        "int",
        3,
        "an integer from 0 to 1000",
        "Captures and dumps anomalies may start in a run (0: anomalies are only recorded).",
        _int,
        lambda v: 0 <= v <= 1000,
    ),
    _opt(
        "folder",
        "str",
        "rank{rank}/flight",
        "a folder (format variables allowed)",
        "Where flight dumps go, under the run directory.",
        _str,
    ),
)
_BY_NAME = {o.name: o for o in OPTIONS}


def _signal_number(text: str) -> int | None:
    t = str(text).strip()
    if t.lower() in ("", "off", "none", "0", "false", "no"):
        return None
    try:
        num = int(t)
    except ValueError:
        name = t.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals):
            raise ConfigError(
                f"Triggers: invalid signal {text!r}: not a signal name (e.g. SIGUSR2) or number"
            ) from None
        num = int(sig)
    if num in (signal.SIGKILL, signal.SIGSTOP):
        raise ConfigError(f"Triggers: invalid signal {text!r}: {signal.Signals(num).name} cannot be caught")
    if num in (signal.SIGTERM, signal.SIGINT):
        raise ConfigError(
            f"Triggers: invalid signal {text!r}: {signal.Signals(num).name} ends jobs; use SIGUSR1, SIGUSR2 or another"
        )
    if not 0 < num < signal.NSIG:
        raise ConfigError(f"Triggers: invalid signal {text!r}: out of range 1..{signal.NSIG - 1}")
    return num


@dataclass(frozen=True)
class Triggers:
    """What asks for captures and flight dumps, and what they get (see the
    module documentation). Options not given (None) come from
    ``FASTPROF_TRIGGERS_<NAME>`` variables, then defaults; a bad value is a
    :class:`fastprof.ConfigError` here, before training."""

    # Each None here is resolved in __post_init__ (its variable, then its
    # default), so every field holds a checked value of its option's type.
    signal: Any = None
    file: Any = None
    poll_s: Any = None
    steps: Any = None
    flight: Any = None
    flight_on: Any = None
    min_interval_s: Any = None
    anomaly: Any = None
    anomaly_factor: Any = None
    anomaly_window: Any = None
    anomaly_max: Any = None
    folder: Any = None
    env: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        env = os.environ if self.env is None else self.env
        for opt in OPTIONS:
            v = getattr(self, opt.name)
            if opt.name == "signal" and isinstance(v, int) and not isinstance(v, bool):
                v = str(v)
            object.__setattr__(self, opt.name, _value(opt, v, env))
        _signal_number(str(self.signal))
        events = self.flight_events
        unknown = sorted(events - set(_FLIGHT_EVENTS))
        if unknown:
            raise ConfigError(
                f"Triggers: invalid flight_on {self.flight_on!r}: unknown {', '.join(unknown)} "
                f"(expected a comma list of {', '.join(_FLIGHT_EVENTS)}, or none)"
            )
        check_format("folder", str(self.folder), "Triggers")

    @property
    def signal_number(self) -> int | None:
        return _signal_number(str(self.signal))

    @property
    def flight_events(self) -> set[str]:
        text = str(self.flight_on).strip().lower()
        if text in ("", "none", "off"):
            return set()
        return {p.strip() for p in text.split(",") if p.strip()}


def parse_request(text: str, where: str) -> dict[str, Any]:
    """A trigger file's content: empty (the defaults) or a JSON object with
    any of ``id`` (str), ``steps`` (int >= 1), ``flight`` (bool), ``capture``
    (bool). Raises ValueError naming ``where`` and what is wrong."""
    text = text.strip()
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f'{where}: expected a JSON object such as {{"steps": 5}}, got {type(obj).__name__}')
    out: dict[str, Any] = {}
    if "id" in obj:
        out["id"] = str(obj["id"])[:100]
    if "steps" in obj:
        s = obj["steps"]
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 10_000:
            raise ValueError(f"{where}: steps must be an integer from 1 to 10000, got {s!r}")
        out["steps"] = s
    for key in ("flight", "capture"):
        if key in obj:
            if not isinstance(obj[key], bool):
                raise ValueError(f"{where}: {key} must be true or false, got {obj[key]!r}")
            out[key] = obj[key]
    unknown = sorted(set(obj) - {"id", "steps", "flight", "capture", "time", "from"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (expected id, steps, flight, capture)")
    return out


@dataclass
class _Capture:
    seq: int
    source: str
    start: int
    steps: int
    request_id: str | None
    late_by: int = 0
    status: str = "armed"
    window: Any = None  # the torch window's WindowRecord once it ran
    with_schedule: bool = False  # that window was the schedule's too
    ended_early: bool = False  # the run ended while it ran

    @property
    def last(self) -> int:
        return self.start + self.steps - 1


class TriggerDriver:
    """One Profiler's triggers while it runs (see the module documentation).
    Methods named ``on_*`` run on the training thread (from the Profiler);
    the signal handler and the poller thread only queue and set the flag."""

    def __init__(self, cfg: Triggers, prof: TriggerHost) -> None:
        self.cfg = cfg
        self.prof = prof
        self.rank = prof.rank
        self.world = int(prof.recorder.options.world_size)
        self.rank_dir = prof.rank_dir
        self.run_dir = prof.run_dir
        self.folder = prof.run_dir / str(cfg.folder).format(**prof.format_variables())
        self._lock = threading.Lock()
        self._files_lock = threading.Lock()  # the poller and a signalled boundary both read the files
        self._state_lock = threading.RLock()  # a signal may land while the thread writes
        self._exported: set[int] = set()  # captures whose window's file is in triggers.json
        self._queue: list[dict[str, Any]] = []  # requests from the handler, the poller
        self._signals = 0  # signals seen (coalesced into one request per boundary)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: Any = None
        self._signal_name: str | None = None
        self._installed: int | None = None
        self._outbox: list[dict[str, Any]] = []  # proposals for the store (posted by the poller)
        self._store: Any = None
        self._store_seen = 0
        self._key = f"fastprof/{prof.recorder.options.run_name}/trigger"
        self.pending: _Capture | None = None
        self.captures: list[_Capture] = []
        self.requests: list[dict[str, Any]] = []
        self.anomalies: list[dict[str, Any]] = []
        self.dumps: list[dict[str, Any]] = []
        self.coalesced = 0
        self.notes: list[str] = []
        self._last_capture_t = -math.inf
        self._last_dump_t = -math.inf
        self._last_dump_seq: int | None = None  # the request the last flight dump answered
        self._seq = 0
        self._anomaly_captures = 0
        self._cap_said = False  # a dump cut or refused by max_disk was said on stderr
        self._dump_threads: list[threading.Thread] = []
        self._t_start = time.monotonic()
        self._flight_ok = bool(float(prof.recorder.options.window_seconds) > 0)
        self._stopping = False
        # A URL run (issue #26): the trigger objects ``fastprof trigger <url>``
        # puts in the store, read every REMOTE_POLL_S (not every poll_s: 512
        # ranks would be 512 requests a second).
        spool = prof.recorder.spool
        self._remote = spool.open() if spool is not None else None
        self._remote_run = prof.recorder.options.run_name
        self._remote_next = 0.0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        cfg = self.cfg
        if cfg.anomaly:
            self.prof.watch_step_times(
                int(cfg.anomaly_window), float(cfg.anomaly_factor), _ANOMALY_MADS, _ANOMALY_MIN_EXCESS_NS
            )
        if not self._flight_ok and cfg.flight_events:
            self.notes.append(
                "flight dumps unavailable: the recorder keeps no window (window_seconds=0); "
                "the segments on disk hold the run"
            )
        self._install_signal()
        add_oom_listener(self._on_oom)
        if self.world > 1:
            self._store = _dist.default_store()
            if self._store is None:
                self.notes.append("no process group store: each rank answers its own triggers at its next step")
            else:
                with contextlib.suppress(Exception):
                    self._store_seen = int(self._store.add(f"{self._key}/n", 0))
        self._write_live()
        self._thread = threading.Thread(target=self._poll, name="fastprof-triggers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The Profiler is closing: no more requests; the handler given back,
        the poller joined (bounded), the dumps waited for (bounded)."""
        self._stopping = True
        # live.json first: `fastprof trigger --signal` must not send a signal
        # whose handler is about to be given back (SIGUSR2's default kills).
        with contextlib.suppress(OSError):
            (self.rank_dir / LIVE_FILE).unlink()
        self._uninstall_signal()
        remove_oom_listener(self._on_oom)
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        for t in self._dump_threads:
            t.join(timeout=10.0)
        c, self.pending = self.pending, None
        if c is not None and c.status == "armed":
            c.status = "not started: the run ended first"
            self.captures.append(c)
        elif c is not None:
            # Running when the run ended: its window was stopped and saved
            # with the steps it had (the window says which).
            c.status = "done"
            c.ended_early = True
            self._take_window(c)
            self.captures.append(c)
        self._write_state()

    def summary(self) -> dict[str, Any]:
        return {
            "config": {o.name: getattr(self.cfg, o.name) for o in OPTIONS},
            "signal": self._signal_name,
            "requests": self.requests[-_MAX_RECORDS:],
            "captures": [self._capture_dict(c) for c in self.captures[-_MAX_RECORDS:]],
            "anomalies": self.anomalies[-_MAX_RECORDS:],
            "flight_dumps": self.dumps[-_MAX_RECORDS:],
            "coalesced": self.coalesced,
            "notes": self.notes,
        }

    @staticmethod
    def _capture_dict(c: _Capture) -> dict[str, Any]:
        d = {
            "seq": c.seq,
            "source": c.source,
            "request_id": c.request_id,
            "first_step": c.start,
            "steps": c.steps,
            "status": c.status,
        }
        if c.late_by:
            d["late_by_steps"] = c.late_by
        if c.with_schedule:
            d["with_schedule_window"] = True
        if c.ended_early:
            d["ended_early"] = "the run ended while it ran (its window holds the steps it had)"
        if c.window is not None:
            d["window"] = c.window.to_dict()
        return d

    # --------------------------------------------------------------- files

    def _write_live(self) -> None:
        live = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rank": self.rank,
            "world_size": self.world,
            "signal": None if self._installed is None else signal.Signals(self._installed).name,
            "trigger_files": self._trigger_paths() if self.cfg.file else [],
            "poll_s": self.cfg.poll_s,
            "started": time.time(),
        }
        try:
            self.rank_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.rank_dir / LIVE_FILE, json.dumps(live, indent=1))
        except OSError as e:
            self.notes.append(f"could not write {self.rank_dir / LIVE_FILE}: {e}")

    def _write_state(self) -> None:
        """Rewrite triggers.json (from the training thread, the poller and a
        flight dump's thread: the newest summary is taken under the lock)."""
        try:
            with self._state_lock:
                for _ in range(3):
                    try:
                        text = json.dumps(self.summary(), indent=1, default=str)
                        break
                    except RuntimeError:  # a record grew under the encoder (another thread): again
                        continue
                else:
                    return
                write_atomic(self.rank_dir / STATE_FILE, text)
        except OSError as e:
            if not any("could not write" in n for n in self.notes):
                self.notes.append(f"could not write {self.rank_dir / STATE_FILE}: {e}")

    def _trigger_paths(self) -> list[str]:
        paths = [str(self.rank_dir / TRIGGER_FILE)]
        # The run's own file is read by one rank: rank 0 when the ranks can
        # agree through the store, else by each.
        if self.rank == 0 or self.world == 1 or self._store is None:
            paths.insert(0, str(self.run_dir / TRIGGER_FILE))
        return paths

    # -------------------------------------------------------------- signal

    def _install_signal(self) -> None:
        num = self.cfg.signal_number
        if num is None:
            return
        if threading.current_thread() is not threading.main_thread():
            self.notes.append(f"{signal.Signals(num).name} not handled: the Profiler started off the main thread")
            return
        try:
            current = _signals.job_disposition(num)
        except (ValueError, OSError) as e:
            self.notes.append(f"{signal.Signals(num).name} not handled: {e}")
            return
        name = signal.Signals(num).name
        if current is None or current is signal.SIG_IGN:
            why = "is handled outside Python" if current is None else "is ignored by the job (SIG_IGN)"
            self.notes.append(f"{name} {why}: left alone; use the trigger file (fastprof trigger)")
            warnings.warn(f"fastprof: {name} {why}; triggers use the trigger file only", FastprofWarning, stacklevel=4)
            return
        try:
            signal.signal(num, self._on_signal)
        except (ValueError, OSError) as e:
            self.notes.append(f"{name} not handled: {e}")
            return
        self._previous, self._installed = current, num
        self._signal_name = name
        if callable(current) and current is not signal.default_int_handler:
            self.notes.append(f"{name} had a handler; it is still called after fastprof's")

    def _uninstall_signal(self) -> None:
        num = self._installed
        if num is None or threading.current_thread() is not threading.main_thread():
            return
        # The job's handler goes back as it was; the default does not (a
        # trigger sent while the job finishes would kill it): the signal
        # stays harmless for the rest of the process (fastprof._signals).
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(num) == self._on_signal:
                _signals.give_back(num, self._previous)
        self._installed = None

    def _on_oom(self, prof: Any, exc: BaseException | None) -> None:
        """fastprof.memory captured an OOM: one the job caught (torch's
        observer, ``exc`` None) gets a flight dump at the next boundary; one
        leaving the Profiler is dumped by :meth:`on_exit_event`."""
        if prof is self.prof and exc is None and not self._stopping:
            self._queue_request({"source": "oom", "scope": "rank", "capture": False, "flight": True})

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only record and flag: the step boundary does the work.
        self._signals += 1
        if not self._stopping:
            _core._attention_set()
        previous = self._previous
        if callable(previous) and previous is not signal.default_int_handler:
            _signals.call_job(previous, signum, frame)

    # -------------------------------------------------------------- poller

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self._post_outbox()
                if self.cfg.file:
                    self._read_files()
                    if self._remote is not None and time.monotonic() >= self._remote_next:
                        self._remote_next = time.monotonic() + REMOTE_POLL_S
                        self._read_remote()
                if self._store is not None:
                    self._read_store()
                self._refresh_exports()
            except Exception as e:  # noqa: BLE001 - the poller never takes the job down
                msg = f"trigger poller: {type(e).__name__}: {e}"
                if msg not in self.notes and len(self.notes) < 50:
                    self.notes.append(msg)
            self._wake.wait(float(self.cfg.poll_s))
            self._wake.clear()
        with contextlib.suppress(Exception):
            self._post_outbox()

    def on_window_saved(self) -> None:
        """A torch window's export ended (on the exporter thread): the poller
        rewrites triggers.json now rather than at its next poll, so that
        ``fastprof trigger`` answers as soon as the file is there."""
        self._wake.set()

    def _refresh_exports(self) -> None:
        """A captured window's export finished (its path or error is known):
        rewrite triggers.json so that ``fastprof trigger`` sees the file."""
        fresh = False
        for c in list(self.captures):
            w = c.window
            if w is not None and c.seq not in self._exported and (w.path is not None or w.error):
                self._exported.add(c.seq)
                fresh = True
        if fresh:
            self._write_state()

    def _queue_request(self, req: dict[str, Any], flag: bool = True) -> None:
        with self._lock:
            if len(self._queue) < 16:
                self._queue.append(req)
            else:
                self.coalesced += 1
        if flag and not self._stopping:
            _core._attention_set()

    def _read_files(self, flag: bool = True) -> None:
        """Queue the request of each trigger file there is, and consume it
        (``flag``: set the core's flag for the next boundary)."""
        with self._files_lock:
            for p in self._trigger_paths():
                path = Path(p)
                text = self._read_trigger(path)
                if text is None:
                    continue
                with contextlib.suppress(OSError):
                    path.unlink()  # consumed: one request per file written
                scope = "run" if path.parent == self.run_dir else "rank"
                try:
                    req = parse_request(text, str(path))
                except ValueError as e:
                    self._warn_once(f"{e}; ignored (write {{}} or use: fastprof trigger {self.run_dir})")
                    self.requests.append({"source": "file", "file": str(path), "error": str(e), "time": time.time()})
                    continue
                self._queue_request({**req, "source": "file", "scope": scope, "file": str(path)}, flag)

    def _read_remote(self) -> None:
        """The trigger objects of a URL run: ``<url>/<run>/TRIGGER`` (read
        by the ranks that read the run's file) and ``.../rank{R}/TRIGGER``;
        each taken once (deleted), as a trigger file is. A store that fails
        is a note, never an error of the job."""
        store = self._remote
        if store is None:
            return
        run_file = self.rank == 0 or self.world == 1 or self._store is None
        keys = ([f"{self._remote_run}/{TRIGGER_FILE}"] if run_file else []) + [
            f"{self._remote_run}/rank{self.rank}/{TRIGGER_FILE}"
        ]
        for key in keys:
            if store.info(key) is None:
                continue
            with store.open(key) as f:
                text = f.read(1 << 16).decode(errors="replace")
            with contextlib.suppress(Exception):
                store.fs.rm_file(store.path(key))  # consumed: one request per object put
            url = store.url_of(key)
            scope = "rank" if "/rank" in key[len(self._remote_run) :] else "run"
            try:
                req = parse_request(text, url)
            except ValueError as e:
                self._warn_once(f"{e}; ignored (write {{}} or use: fastprof trigger {store.url_of(self._remote_run)})")
                self.requests.append({"source": "file", "file": url, "error": str(e), "time": time.time()})
                continue
            self._queue_request({**req, "source": "file", "scope": scope, "file": url})

    def _read_trigger(self, path: Path) -> str | None:
        """A trigger file's text (its first 64 KiB), or None when there is
        none to take. Only a regular file is opened: a FIFO would block this
        thread in open() until something writes into it (and every later
        trigger with it), a device may be anything. Opened non-blocking and
        checked again once open, for one swapped in meanwhile."""
        try:
            mode = os.stat(path).st_mode
            if stat.S_ISREG(mode):
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    mode = os.fstat(fd).st_mode
                    if stat.S_ISREG(mode):
                        return f.read(1 << 16).decode(errors="replace")
        except FileNotFoundError:
            return None
        except OSError as e:
            self._warn_once(f"trigger file {path}: {e}")
            return None
        what = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a file"
        self._warn_once(
            f"trigger file {path}: not a regular file ({what}); never opened, so it asks for nothing "
            "(remove it: fastprof trigger writes a regular file there)"
        )
        return None

    def _warn_once(self, text: str) -> None:
        if text in self.notes:
            return
        if len(self.notes) < 50:
            self.notes.append(text)
        print(f"fastprof: {text}", file=sys.stderr, flush=True)

    def _post_outbox(self) -> None:
        with self._lock:
            out, self._outbox = self._outbox, []
        store = self._store
        for prop in out:
            if store is None:
                continue
            seq = int(store.add(f"{self._key}/n", 1))
            store.set(f"{self._key}/{seq}", json.dumps(prop))

    def _read_store(self) -> None:
        store = self._store
        n = int(store.add(f"{self._key}/n", 0))
        while self._store_seen < n:
            key = f"{self._key}/{self._store_seen + 1}"
            if not store.check([key]):
                return  # posted but not yet written: next poll
            self._store_seen += 1
            try:
                prop = json.loads(store.get(key))
            except (ValueError, TypeError):
                continue
            if int(prop.get("from_rank", -1)) == self.rank:
                continue
            self._queue_request(
                {**prop, "source": f"rank {prop.get('from_rank')}: {prop.get('source')}", "remote": True}
            )

    # ------------------------------------------------------- step boundary

    def capture_steps(self) -> tuple[int, int] | None:
        """The (first, last) steps of the capture armed or running, None
        without one: the Profiler's action plan (fastprof.profiler.plan)
        merges them with the schedule's windows, and keeps the step loop
        asking at the first."""
        c = self.pending
        return None if c is None else (c.start, c.last)

    def on_boundary(self, batch: int, epoch: int) -> None:
        """At a step's begin, when the core's flag was set: take the requests
        and the anomaly the flag stands for."""
        found = _core._anomaly_take()
        if found is not None:
            self._on_anomaly(batch, *found)
        signals, self._signals = self._signals, 0
        if signals and self.cfg.file:
            # `fastprof trigger --signal` writes its request, then signals:
            # the signal is its wake-up (no wait for the poller), and the
            # file's request (its id, steps) is the one taken.
            self._read_files(flag=False)
        with self._lock:
            queued, self._queue = self._queue, []
        if signals and not any(q.get("source") == "file" for q in queued):
            queued.insert(0, {"source": "signal", "scope": "run", "count": signals})
        for req in queued:
            self._take(req, batch)
        self._write_state()

    def _on_anomaly(self, batch_seen: int, batch: int, dur_ns: int, median_ns: int, mad_ns: int) -> None:
        rec: dict[str, Any] = {
            "step": batch,
            "duration_ms": round(dur_ns / 1e6, 3),
            "median_ms": round(median_ns / 1e6, 3),
            "mad_ms": round(mad_ns / 1e6, 3),
            "factor": round(dur_ns / median_ns, 2) if median_ns else None,
            "phase": self.prof.explain_step(batch),
            "time": time.time(),
        }
        _core.instant("anomaly", **{k: v for k, v in rec.items() if k != "time"})
        cfg = self.cfg
        act = self._anomaly_captures < int(cfg.anomaly_max)
        rec["action"] = "captured" if act else f"recorded only (anomaly_max={cfg.anomaly_max} reached)"
        if len(self.anomalies) < _MAX_RECORDS:
            self.anomalies.append(rec)
        if act:
            taken = self._take({"source": "anomaly", "scope": "run", "anomaly_step": batch}, batch_seen)
            if taken:
                self._anomaly_captures += 1
            else:
                rec["action"] = "recorded only (coalesced with another capture)"

    def _take(self, req: dict[str, Any], batch: int) -> bool:
        """One request at the boundary of step ``batch``: a flight dump and a
        capture, unless coalesced. True when acted on."""
        cfg = self.cfg
        now = time.monotonic()
        remote = bool(req.get("remote"))
        rec = {k: v for k, v in req.items() if k not in ("remote",)}
        rec["step"] = batch
        rec["time"] = time.time()
        if len(self.requests) < _MAX_RECORDS:
            self.requests.append(rec)
        if self._stopping:
            rec["action"] = "ignored: the run is ending"
            return False
        source = str(req.get("source"))
        want_flight = bool(req.get("flight", cfg.flight))
        kind = source if source in ("anomaly", "oom") else "trigger"
        capture = bool(req.get("capture", True))
        if capture and not self.prof.has_torch_windows:
            # Flight-only from here on, coalescing included: a capture that
            # cannot happen must not exempt its dump from the flight rule
            # (without torch windows every signal of a storm dumped).
            capture = False
            note = "captures unavailable: the Profiler has no torch.profiler windows (torch=False or no torch)"
            if note not in self.notes:
                self.notes.append(note)
        n_steps = int(req.get("steps", cfg.steps))
        if not remote:
            why = None
            # The request acted on (its seq) that answers this one: a capture
            # armed and coming, or a flight dump of the last seconds.
            answered_by = None
            if capture and self.pending is not None:
                why = self._armed()
                answered_by = self.pending.seq
            elif capture and now - self._last_capture_t < float(cfg.min_interval_s):
                ago = now - self._last_capture_t
                why = f"the last capture began {ago:.1f} s ago (min_interval_s {cfg.min_interval_s:g})"
            elif not capture and now - self._last_dump_t < _FLIGHT_MIN_INTERVAL_S:
                why = f"the last flight dump was {now - self._last_dump_t:.1f} s ago"
                answered_by = self._last_dump_seq
            if why is not None:
                self.coalesced += 1
                rec["action"] = f"coalesced: {why}"
                if answered_by is not None:
                    rec["answered_by"] = answered_by
                _core.instant("trigger.coalesced", source=source, step=batch)
                return False
        self._seq += 1
        seq = self._seq
        rec["seq"] = seq
        if want_flight and kind in cfg.flight_events:
            self._last_dump_t = now
            self._last_dump_seq = seq
            self.flight_dump(kind, batch, wait=False, request_id=req.get("id"), seq=seq)
        if remote:
            start = int(req.get("start", batch))
            late = max(0, batch - start)
            start = max(start, batch)
        else:
            late = 0
            start = batch
            if self._store is not None and req.get("scope") == "run":
                # Every rank: the same steps, far enough ahead for all to see it.
                if capture:
                    start = batch + self._lead(batch)
                prop = {
                    "from_rank": self.rank,
                    "source": source,
                    "start": start,
                    "steps": n_steps,
                    "flight": want_flight,
                    "capture": capture,
                    "id": req.get("id"),
                }
                with self._lock:
                    self._outbox.append(prop)
                self._wake.set()
        if not capture:
            rec["action"] = "flight dump" if want_flight else "nothing to do"
            return True
        if self.pending is not None:
            # A remote proposal while one is armed: the earlier one stands,
            # and answers it.
            self.coalesced += 1
            rec["action"] = f"coalesced: {self._armed()}"
            rec["answered_by"] = self.pending.seq
            return False
        self.pending = _Capture(seq, source, start, n_steps, req.get("id"), late_by=late)
        self._last_capture_t = now
        rec["action"] = f"capture of steps {start}..{start + n_steps - 1}"
        _core.instant("trigger", source=source, seq=seq, first_step=start, steps=n_steps, late_by=late)
        return True

    def _armed(self) -> str:
        c = self.pending
        assert c is not None
        return f"a capture of steps {c.start}..{c.last} is {'armed' if c.status == 'armed' else c.status}"

    def _lead(self, batch: int) -> int:
        """Steps ahead for a capture every rank must see first: two polls of
        the measured step time, at least 2."""
        med = int(_core._median_step_ns())
        if med <= 0 and batch > 0:
            med = int((time.monotonic() - self._t_start) * 1e9 / batch)
        if med <= 0:
            return 10
        return max(2, min(_MAX_LEAD, math.ceil(2.0 * float(self.cfg.poll_s) * 1e9 / med) + 1))

    def on_step_end(self, batch: int, closed: bool, with_schedule: bool) -> None:
        """Step ``batch`` ended (the Profiler's action plan records every
        step of the capture from its first): the first makes the capture
        running; the step that closed its window (``closed``: saved, or
        left by the schedule) makes it done, with that window
        (``with_schedule``: one the schedule's own window shared)."""
        c = self.pending
        if c is None or batch < c.start:
            return
        c.status = "running"
        if not closed:
            return
        self.pending = None
        c.status = "done"
        c.with_schedule = with_schedule
        self._take_window(c)
        self.captures.append(c)
        _core._anomaly_hold(max(10, 2 * c.steps))
        self._write_state()

    def _take_window(self, c: _Capture) -> None:
        """The torch window that holds capture ``c``: the driver's last, when
        it reached the capture's first step (not an earlier one: torch failed)."""
        w = self.prof.last_window()
        if w is not None and w.last_step >= c.start:
            c.window = w

    # ---------------------------------------------------------- flight dump

    def flight_dump(
        self, reason: str, batch: int, *, wait: bool, request_id: str | None = None, seq: int | None = None
    ) -> dict[str, Any] | None:
        """Dump the flight window to ``<folder>/flight-<n>-<reason>-ba<batch>.json.gz``
        (a thread of its own unless ``wait``, which rewrites triggers.json
        once the file is there). Recorded in the summary; ``seq``: the
        request it answers. The recorder counts the file under its disk cap
        (``deleted`` says why when the cap could not keep it at all)."""
        if reason not in self.cfg.flight_events:
            return None
        rec: dict[str, Any] = {"reason": reason, "step": batch, "time": time.time(), "request_id": request_id}
        if seq is not None:
            rec["seq"] = seq
        if len(self.dumps) >= _MAX_RECORDS:
            return None
        self.dumps.append(rec)
        if not self._flight_ok:
            rec["error"] = "no flight window (window_seconds=0)"
            return rec
        n = len(self.dumps)
        path = self.folder / f"flight-{n:03d}-{reason}-ba{batch}.json.gz"
        rec["path"] = str(path)
        recorder = self.prof.recorder

        def work() -> None:
            t0 = time.perf_counter()
            done: dict[str, Any] = {}
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                info = recorder.dump(path)
                done = {k: info.get(k) for k in ("events", "bytes", "open_spans")}
                if info.get("deleted"):
                    done["deleted"] = info["deleted"]
                if info.get("skipped"):
                    # Nothing of the window fits beside the open segment under max_disk.
                    done = {"error": f"{info['skipped']} (max_disk {recorder.options.max_disk})", "path": None}
                elif info.get("left_out"):
                    done["left_out_events"] = info["left_out"]
                    done["note"] = (
                        f"the oldest {info['left_out']} events of the window were left out: "
                        f"the newest {info.get('events')} fit in what max_disk ({recorder.options.max_disk}) "
                        "leaves beside the open segment"
                    )
            except Exception as e:  # noqa: BLE001 - a failed dump is reported, never raised
                done = {"error": f"{type(e).__name__}: {e}"}
            with self._state_lock:  # never while triggers.json is being written from it
                rec.update(done, dump_s=round(time.perf_counter() - t0, 4))
            self._say_cap(rec)

        def work_and_say() -> None:
            work()
            # `fastprof trigger --flight` waits on triggers.json for this.
            self._write_state()

        if wait:
            work()
        else:
            t = threading.Thread(target=work_and_say, name="fastprof-flight-dump", daemon=True)
            self._dump_threads = [x for x in self._dump_threads if x.is_alive()] + [t]
            t.start()
        with contextlib.suppress(Exception):
            _core.instant("flight.dump", reason=reason, step=batch)
        return rec

    def _say_cap(self, rec: dict[str, Any]) -> None:
        """A dump the disk cap cut or refused: said once a run on stderr
        (every dump's record says its own), so that a job under a small
        ``max_disk`` learns why its dumps are short or missing."""
        why = rec.get("note") or (rec.get("error") if rec.get("path") is None else None)
        if not why or self._cap_said:
            return
        self._cap_said = True
        more = "" if rec.get("path") is None else f" ({rec['path']})"
        text = f"flight dump{more}: {why}; later dumps under the cap are only recorded in {STATE_FILE}"
        if len(self.notes) < 50:
            self.notes.append(text)
        print(f"fastprof: {text}", file=sys.stderr, flush=True)

    def on_exit_event(self, reason: str) -> None:
        """An exception, an OOM or SIGTERM is ending the run: dump now."""
        try:
            # The step running now, from the core's step loop (quiet steps
            # never enter Python: the last one the Profiler saw begin is not it).
            self.flight_dump(reason, self.prof.batch, wait=True)
            self._write_state()
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"flight dump at {reason} failed: {type(e).__name__}: {e}")


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


# fastprof's own handler: never deferred nor taken for the job's (fastprof._signals).
_signals.own(TriggerDriver._on_signal)
