"""The triggers as one of the Profiler's drivers: its parts (the signal,
the trigger files, the ranks' store, the captures, the flight dumps) put
together, the poller thread that reads the files and the store, and the
records (``rank{R}/triggers.json``, ``live.json``, ``profiler.json``'s
``triggers``). Hooks named like the protocol's run on the training thread."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from typing import Any

import numpy as np

from fastprof import _core
from fastprof._loop_api import TriggerHost, Window
from fastprof.memory._files import write_atomic
from fastprof.memory.oom import add_oom_listener, is_oom, remove_oom_listener
from fastprof.profiler import contention
from fastprof.profiler.anatomy import TIMED
from fastprof.profiler.driver import Closing, Driver
from fastprof.profiler.drivers.anatomy import AnatomyDriver
from fastprof.profiler.drivers.triggers.captures import Captures
from fastprof.profiler.drivers.triggers.config import (
    ANOMALY_MADS,
    ANOMALY_MIN_EXCESS_NS,
    LIVE_FILE,
    MAX_RECORDS,
    OPTIONS,
    Triggers,
)
from fastprof.profiler.drivers.triggers.contention import ContentionWatch
from fastprof.profiler.drivers.triggers.flight import FlightDumps
from fastprof.profiler.drivers.triggers.requests import TriggerFiles
from fastprof.profiler.drivers.triggers.signals import SignalTrigger
from fastprof.profiler.drivers.triggers.state import Board
from fastprof.profiler.drivers.triggers.store import RankStore
from fastprof.profiler.drivers.windows import WindowsDriver
from fastprof.profiler.schedule import Action
from fastprof.profiler.slow_step import SlowStepRule

__all__ = ["TriggerDriver"]


class TriggerDriver(Driver):
    """One Profiler's triggers while it runs (see :mod:`fastprof.profiler.drivers.triggers`).
    ``windows``, ``anatomy``: the Profiler's drivers a capture records with
    and an anomaly is explained by (None when off)."""

    key = "triggers"

    def __init__(
        self, cfg: Triggers, prof: TriggerHost, windows: WindowsDriver | None, anatomy: AnatomyDriver | None
    ) -> None:
        self.cfg = cfg
        self.prof = prof
        self.windows = windows
        self.anatomy = anatomy
        self.board: Board | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._exported: set[int] = set()  # captures whose window's file is in triggers.json
        self.contention = ContentionWatch()
        self._tick0 = (0, 0)

    # ------------------------------------------------------------ lifecycle

    def start(self, steps: Any) -> None:
        prof, cfg = self.prof, self.cfg
        rec = prof.recorder
        # The core's clock runs by now (ticks: TSC or ns): its rate is measured from here.
        self._tick0 = (_core._ticks(), time.monotonic_ns())
        b = self.board = Board(cfg, prof.rank, int(rec.options.world_size), prof.rank_dir, prof.run_dir)
        b.summary = self.summary
        self.flight = FlightDumps(b, prof.run_dir / str(cfg.folder).format(**prof.format_variables()), rec)
        self.store = RankStore(b, str(rec.options.run_name))
        spool = rec.spool
        remote = spool.open() if spool is not None else None
        self.files = TriggerFiles(b, remote, str(rec.options.run_name), self._reads_run_file)
        self.signal = SignalTrigger(b)
        self.captures = Captures(
            b, self.flight, self.store, self._has_windows, self._last_window, self._explain, self.contention.judge
        )
        if cfg.anomaly:
            # The wait for a CPU of this thread (the one that runs the steps).
            self.contention.start()
            if self.contention.error:
                b.notes.append(self.contention.error)
            # The one slow-step rule (the report replays it over every step).
            rule = SlowStepRule(float(cfg.anomaly_factor), int(cfg.anomaly_window), ANOMALY_MADS, ANOMALY_MIN_EXCESS_NS)
            steps.anomaly_detector(rule.window, rule.factor, rule.mads, rule.min_excess_ns)
        if not self.flight.ok and cfg.flight_events:
            b.notes.append(
                "flight dumps unavailable: the recorder keeps no window (window_seconds=0); "
                "the segments on disk hold the run"
            )
        self.signal.install()
        add_oom_listener(self._on_oom)
        self.store.connect()
        self._write_live()
        self._thread = threading.Thread(target=self._poll, name="fastprof-triggers", daemon=True)
        self._thread.start()

    def _has_windows(self) -> bool:
        return self.windows is not None and self.windows.windows is not None

    def _last_window(self) -> Window | None:
        records = [] if self.windows is None else self.windows.records()
        return records[-1] if records else None

    def _explain(self, step: int, excess_ns: int) -> tuple[str | None, int]:
        """Which phase made step ``step``, ``excess_ns`` over the median
        step, slow (the anatomy's line), and what the phases the ranks wait
        in took in it over their medians over the recent steps (ns;
        :data:`fastprof.profiler.contention.RANK_PHASES`)."""
        if self.anatomy is None:
            return None, 0
        per_tick = self._ns_per_tick()
        recent = self.anatomy.anatomy.recent()
        row = recent.get(step)
        others = [r for s, r in recent.items() if s != step]
        rank_phases = 0.0
        if row is not None and others:
            for p in contention.RANK_PHASES:
                i = TIMED.index(p)
                rank_phases += max(row[i] - float(np.median([r[i] for r in others])), 0.0)
        return self.anatomy.explain(step, excess_ns / per_tick), round(rank_phases * per_tick)

    def _ns_per_tick(self) -> float:
        """The core's ticks in ns, measured from the start (the anatomy's rows are in ticks)."""
        t0, n0 = self._tick0
        dt = _core._ticks() - t0
        return (time.monotonic_ns() - n0) / dt if dt > 0 else 1.0

    def _reads_run_file(self) -> bool:
        # The run's own file is read by one rank: rank 0 when the ranks can
        # agree through the store, else by each.
        b = self.board
        assert b is not None
        return b.rank == 0 or b.world == 1 or self.store.store is None

    def finish(self, closing: Closing) -> None:
        self.stop()

    def step_aside(self) -> None:
        self.stop()

    def stop(self) -> None:
        """The Profiler is closing: no more requests; the handler given back,
        the poller joined (bounded), the dumps waited for (bounded)."""
        b = self.board
        if b is None or b.stopping:
            return
        b.stopping = True
        # live.json first: `fastprof trigger --signal` must not send a signal
        # whose handler is about to be given back (SIGUSR2's default kills).
        with contextlib.suppress(OSError):
            (b.rank_dir / LIVE_FILE).unlink()
        self.signal.uninstall()
        remove_oom_listener(self._on_oom)
        self._stop.set()
        b.wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self.flight.join()
        self.captures.stop()
        self.contention.stop()
        b.write_state()

    def summary(self) -> dict[str, Any]:
        b, c = self.board, self.captures
        assert b is not None
        return {
            "config": {o.name: getattr(self.cfg, o.name) for o in OPTIONS},
            "signal": self.signal.name,
            "requests": b.requests[-MAX_RECORDS:],
            "captures": [x.to_dict() for x in c.captures[-MAX_RECORDS:]],
            "anomalies": c.anomalies[-MAX_RECORDS:],
            "contention": self.contention.summary() if self.cfg.anomaly else None,
            "flight_dumps": self.flight.dumps[-MAX_RECORDS:],
            "coalesced": b.coalesced,
            "notes": b.notes,
        }

    def account(self) -> Any:
        return None if self.board is None else self.summary()

    def _write_live(self) -> None:
        b = self.board
        assert b is not None
        installed = self.signal.installed
        live = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rank": b.rank,
            "world_size": b.world,
            "signal": None if installed is None else signal.Signals(installed).name,
            "trigger_files": self.files.paths() if self.cfg.file else [],
            "poll_s": self.cfg.poll_s,
            "started": time.time(),
        }
        try:
            b.rank_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(b.rank_dir / LIVE_FILE, json.dumps(live, indent=1))
        except OSError as e:
            b.notes.append(f"could not write {b.rank_dir / LIVE_FILE}: {e}")

    # -------------------------------------------------------------- poller

    def _poll(self) -> None:
        b = self.board
        assert b is not None
        while not self._stop.is_set():
            try:
                self.store.send()
                if self.cfg.file:
                    self.files.poll()
                self.store.read()
                self._refresh_exports()
            except Exception as e:  # noqa: BLE001 - the poller never takes the job down
                msg = f"trigger poller: {type(e).__name__}: {e}"
                if msg not in b.notes and len(b.notes) < 50:
                    b.notes.append(msg)
            b.wake.wait(float(self.cfg.poll_s))
            b.wake.clear()
        with contextlib.suppress(Exception):
            self.store.send()

    def window_saved(self) -> None:
        """A torch window's export ended (on the exporter thread): the poller
        rewrites triggers.json now rather than at its next poll, so that
        ``fastprof trigger`` answers as soon as the file is there."""
        if self.board is not None:
            self.board.wake.set()

    def _refresh_exports(self) -> None:
        """A captured window's export finished (its path or error is known):
        rewrite triggers.json so that ``fastprof trigger`` sees the file."""
        fresh = False
        for c in list(self.captures.captures):
            w = c.window
            if w is not None and c.seq not in self._exported and (w.path is not None or w.error):
                self._exported.add(c.seq)
                fresh = True
        if fresh and self.board is not None:
            self.board.write_state()

    def _on_oom(self, prof: Any, exc: BaseException | None) -> None:
        """fastprof.memory captured an OOM: one the job caught (torch's
        observer, ``exc`` None) gets a flight dump at the next boundary; one
        leaving the Profiler is dumped by :meth:`on_exit_event`."""
        b = self.board
        if prof is self.prof and exc is None and b is not None and not b.stopping:
            b.queue_request({"source": "oom", "scope": "rank", "capture": False, "flight": True})

    # ------------------------------------------------------- step boundary

    def capture(self, batch: int, epoch: int) -> tuple[int, int] | None:
        if _core._attention_take():
            self._boundary(batch)
        # The (first, last) steps of the capture armed or running: the plan
        # merges them with the schedule's windows, and keeps the step loop
        # asking at the first.
        c = self.captures.pending
        return None if c is None else (c.start, c.last)

    def _boundary(self, batch: int) -> None:
        """At a step's begin, when the core's flag was set: take the requests
        and the anomaly the flag stands for."""
        b = self.board
        if b is None:
            return
        found = _core._anomaly_take()
        if found is not None:
            self.captures.on_anomaly(batch, *found)
        signals = self.signal.take()
        if signals and self.cfg.file:
            # `fastprof trigger --signal` writes its request, then signals:
            # the signal is its wake-up (no wait for the poller), and the
            # file's request (its id, steps) is the one taken.
            self.files.read(flag=False)
        queued = b.take_queue()
        if signals and not any(q.get("source") == "file" for q in queued):
            queued.insert(0, {"source": "signal", "scope": "run", "count": signals})
        for req in queued:
            self.captures.take(req, batch)
        b.write_state()

    def end(
        self, action: Action, epoch: int, batch: int, batch_in_epoch: int, closed: bool, with_schedule: bool
    ) -> None:
        c = self.captures.pending
        if c is None or batch < c.start:
            return  # no capture running (Captures.on_step_end's first test, inline)
        if self.captures.on_step_end(batch, closed, with_schedule) and self.board is not None:
            self.board.write_state()

    # ------------------------------------------------------ the run's end

    def on_exception(self, exc: BaseException) -> None:
        self.on_exit_event("oom" if is_oom(exc) else "exception")

    def on_exit_event(self, reason: str) -> None:
        """An exception, an OOM or SIGTERM is ending the run: dump now."""
        b = self.board
        if b is None or b.stopping:
            return
        try:
            # The step running now, from the core's step loop (quiet steps
            # never enter Python: the last one the Profiler saw begin is not it).
            self.flight.dump(reason, self.prof.batch, wait=True)
            b.write_state()
        except Exception as e:  # noqa: BLE001
            b.notes.append(f"flight dump at {reason} failed: {type(e).__name__}: {e}")
