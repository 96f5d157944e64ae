"""Requests taken at a step boundary: each becomes a flight dump and a
capture (a torch.profiler window of ``steps`` steps the Profiler's plan
records from a step boundary on), unless coalesced with the one before;
slow steps (the core's anomaly detector) become requests of their own."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastprof import _core
from fastprof._loop_api import Window
from fastprof.profiler import contention
from fastprof.profiler.drivers.triggers.config import FLIGHT_MIN_INTERVAL_S, MAX_LEAD, MAX_RECORDS
from fastprof.profiler.drivers.triggers.contention import Judged
from fastprof.profiler.drivers.triggers.flight import FlightDumps
from fastprof.profiler.drivers.triggers.state import Board
from fastprof.profiler.drivers.triggers.store import RankStore

__all__ = ["Capture", "Captures"]


@dataclass
class Capture:
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

    def to_dict(self) -> dict[str, Any]:
        d = {
            "seq": self.seq,
            "source": self.source,
            "request_id": self.request_id,
            "first_step": self.start,
            "steps": self.steps,
            "status": self.status,
        }
        if self.late_by:
            d["late_by_steps"] = self.late_by
        if self.with_schedule:
            d["with_schedule_window"] = True
        if self.ended_early:
            d["ended_early"] = "the run ended while it ran (its window holds the steps it had)"
        if self.window is not None:
            d["window"] = self.window.to_dict()
        return d


class Captures:
    """``has_windows()``: the Profiler drives torch.profiler windows (else a
    capture has nothing to record with); ``last_window()``: the latest one
    begun; ``explain(step, excess_ns)``: which phase made a step slow (the anatomy's
    line, and what the phases the ranks wait in took in it over their
    medians, ns)."""

    def __init__(
        self,
        board: Board,
        flight: FlightDumps,
        store: RankStore,
        has_windows: Callable[[], bool],
        last_window: Callable[[], Window | None],
        explain: Callable[[int, int], tuple[str | None, int]],
        judge: Callable[[int, int, int, int], Judged] | None = None,
    ) -> None:
        self.board = board
        self.flight = flight
        self.store = store
        self.has_windows = has_windows
        self.last_window = last_window
        self.explain = explain
        self.judge = judge
        self.pending: Capture | None = None
        self.captures: list[Capture] = []
        self.anomalies: list[dict[str, Any]] = []
        self._seq = 0
        self._last_capture_t = -math.inf
        self._anomaly_captures = 0
        # The burst of slow steps going on: its last step, and whether one of
        # its steps was the job's (the burst's one anomaly).
        self._burst_last = -2
        self._burst_jobs = False
        self.burst_steps = 0  # slow steps left out as a burst of the job's
        self._t_start = time.monotonic()

    def on_anomaly(self, batch_seen: int, batch: int, dur_ns: int, median_ns: int, mad_ns: int) -> None:
        """A slow step (the core publishes every one). A burst of slow steps
        (each right after the last) is one anomaly of the job, at its first
        step the job slowed: the steps before it are judged (host contention,
        a wait for another rank), the steps after it are not."""
        burst = batch == self._burst_last + 1
        self._burst_last = batch
        if burst and self._burst_jobs:
            self.burst_steps += 1
            return
        if not burst:
            self._burst_jobs = False
        text, rank_phases = self.explain(batch, max(dur_ns - median_ns, 0))
        judged = None if self.judge is None else self.judge(dur_ns, median_ns, rank_phases, self.board.world)
        host = judged is not None and judged.cause == contention.HOST
        other_rank = judged is not None and judged.cause == contention.RANK
        rec: dict[str, Any] = {
            "step": batch,
            "duration_ms": round(dur_ns / 1e6, 3),
            "median_ms": round(median_ns / 1e6, 3),
            "mad_ms": round(mad_ns / 1e6, 3),
            "factor": round(dur_ns / median_ns, 2) if median_ns else None,
            # The phase a preemption landed in made nothing slow: not named.
            "phase": None if host else text,
        }
        if judged is not None:
            rec.update(judged.record)
        if other_rank:
            w = float(rec.get("rank_wait_ms") or 0.0)
            rec["said"] = f"step {batch}: {dur_ns / 1e6:.1f} ms, of which {w:.1f} ms waiting for another rank"
        if host:
            rec["said"] = contention.text(batch, dur_ns / 1e6, float(rec.get("waited_ms") or 0.0))
        rec["time"] = time.time()
        _core.instant("anomaly", **{k: v for k, v in rec.items() if k != "time"})
        cfg = self.board.cfg
        if host and not cfg.anomaly_on_contention:
            rec["action"] = "recorded only (host contention)"
            if len(self.anomalies) < MAX_RECORDS:
                self.anomalies.append(rec)
            return
        if other_rank:
            # The rank that was late judges its own step (it captures it if
            # the job slowed it there).
            rec["action"] = "recorded only (waited for another rank)"
            if len(self.anomalies) < MAX_RECORDS:
                self.anomalies.append(rec)
            return
        self._burst_jobs = True
        act = self._anomaly_captures < int(cfg.anomaly_max)
        rec["action"] = "captured" if act else f"recorded only (anomaly_max={cfg.anomaly_max} reached)"
        if len(self.anomalies) < MAX_RECORDS:
            self.anomalies.append(rec)
        if act:
            taken = self.take({"source": "anomaly", "scope": "run", "anomaly_step": batch}, batch_seen)
            if taken:
                self._anomaly_captures += 1
            else:
                rec["action"] = "recorded only (coalesced with another capture)"

    def take(self, req: dict[str, Any], batch: int) -> bool:
        """One request at the boundary of step ``batch``: a flight dump and a
        capture, unless coalesced. True when acted on."""
        b = self.board
        cfg = b.cfg
        now = time.monotonic()
        remote = bool(req.get("remote"))
        rec = {k: v for k, v in req.items() if k not in ("remote",)}
        rec["step"] = batch
        rec["time"] = time.time()
        if len(b.requests) < MAX_RECORDS:
            b.requests.append(rec)
        if b.stopping:
            rec["action"] = "ignored: the run is ending"
            return False
        source = str(req.get("source"))
        want_flight = bool(req.get("flight", cfg.flight))
        kind = source if source in ("anomaly", "oom") else "trigger"
        capture = bool(req.get("capture", True))
        if capture and not self.has_windows():
            # Flight-only from here on, coalescing included: a capture that
            # cannot happen must not exempt its dump from the flight rule
            # (without torch windows every signal of a storm dumped).
            capture = False
            note = "captures unavailable: the Profiler has no torch.profiler windows (torch=False or no torch)"
            if note not in b.notes:
                b.notes.append(note)
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
            elif not capture and now - self.flight.last_t < FLIGHT_MIN_INTERVAL_S:
                why = f"the last flight dump was {now - self.flight.last_t:.1f} s ago"
                answered_by = self.flight.last_seq
            if why is not None:
                b.coalesced += 1
                rec["action"] = f"coalesced: {why}"
                if answered_by is not None:
                    rec["answered_by"] = answered_by
                _core.instant("trigger.coalesced", source=source, step=batch)
                return False
        self._seq += 1
        seq = self._seq
        rec["seq"] = seq
        if want_flight and kind in cfg.flight_events:
            self.flight.last_t = now
            self.flight.last_seq = seq
            self.flight.dump(kind, batch, wait=False, request_id=req.get("id"), seq=seq)
        if remote:
            start = int(req.get("start", batch))
            late = max(0, batch - start)
            start = max(start, batch)
        else:
            late = 0
            start = batch
            if self.store.store is not None and req.get("scope") == "run":
                # Every rank: the same steps, far enough ahead for all to see it.
                if capture:
                    start = batch + self._lead(batch)
                self.store.post(
                    {
                        "from_rank": b.rank,
                        "source": source,
                        "start": start,
                        "steps": n_steps,
                        "flight": want_flight,
                        "capture": capture,
                        "id": req.get("id"),
                    }
                )
        if not capture:
            rec["action"] = "flight dump" if want_flight else "nothing to do"
            return True
        if self.pending is not None:
            # A remote proposal while one is armed: the earlier one stands,
            # and answers it.
            b.coalesced += 1
            rec["action"] = f"coalesced: {self._armed()}"
            rec["answered_by"] = self.pending.seq
            return False
        self.pending = Capture(seq, source, start, n_steps, req.get("id"), late_by=late)
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
        return max(2, min(MAX_LEAD, math.ceil(2.0 * float(self.board.cfg.poll_s) * 1e9 / med) + 1))

    def on_step_end(self, batch: int, closed: bool, with_schedule: bool) -> bool:
        """Step ``batch`` ended (the Profiler's action plan records every
        step of the capture from its first): the first makes the capture
        running; the step that closed its window (``closed``: saved, or
        left by the schedule) makes it done, with that window
        (``with_schedule``: one the schedule's own window shared). True
        when a capture ended here."""
        c = self.pending
        if c is None or batch < c.start:
            return False
        c.status = "running"
        if not closed:
            return False
        self.pending = None
        c.status = "done"
        c.with_schedule = with_schedule
        self._take_window(c)
        self.captures.append(c)
        _core._anomaly_hold(max(10, 2 * c.steps))
        return True

    def stop(self) -> None:
        """The run ends: the capture armed never started; one running was
        stopped and saved with the steps it had (its window says which)."""
        c, self.pending = self.pending, None
        if c is not None and c.status == "armed":
            c.status = "not started: the run ended first"
            self.captures.append(c)
        elif c is not None:
            c.status = "done"
            c.ended_early = True
            self._take_window(c)
            self.captures.append(c)

    def _take_window(self, c: Capture) -> None:
        """The torch window that holds capture ``c``: the driver's last, when
        it reached the capture's first step (not an earlier one: torch failed)."""
        w = self.last_window()
        if w is not None and w.last_step >= c.start:
            c.window = w
