"""The training thread's wait for a CPU, for the anomaly trigger (issue #36,
item 1): a watcher thread of the core (``_core._RunWait``) reads the
kernel's ``run_delay`` of the thread that runs the steps every
:data:`WATCH_MS`; the training thread reads it itself only for a step the
detector already found slow (:meth:`ContentionWatch.judge`). The rule is
:mod:`fastprof.profiler.contention`'s."""

from __future__ import annotations

import threading
from typing import Any

from fastprof import _core
from fastprof.profiler import contention

__all__ = ["WATCH_MS", "ContentionWatch", "Judged"]

#: Milliseconds between two readings of the training thread's run delay: the
#: most the wait of a slow step may include from before its begin. Each
#: reading cost ~35 us of the watcher's CPU on a loaded 2-vCPU VM (mostly
#: its wake-up): 0.17% of a core at 20 ms.
WATCH_MS = 20.0


class Judged:
    """A slow step's waits and the verdict, as recorded."""

    __slots__ = ("cause", "record")

    def __init__(self, cause: str | None, record: dict[str, Any]) -> None:
        self.cause = cause  # None: the wait could not be read
        self.record = record

    @property
    def contention(self) -> bool:
        return self.cause == contention.HOST


class ContentionWatch:
    """Watches the thread that started it (the Profiler's, which runs the
    steps); a slow step seen on another thread moves the watch there."""

    def __init__(self) -> None:
        self._watch: Any = None
        self._tid: int | None = None
        self.error: str | None = None
        self.steps = 0  # slow steps judged host contention
        self.waited_ns = 0  # their summed wait for a CPU
        self._cost: dict[str, Any] = {}

    def start(self) -> None:
        self._tid = threading.get_native_id()
        try:
            self._watch = _core._RunWait(self._tid, WATCH_MS)
        except OSError as e:
            self._watch = None
            self.error = f"the kernel's run delay is not readable ({e}): slow steps are not told apart from contention"

    def judge(self, dur_ns: int, median_ns: int, rank_phases_excess_ns: int = 0, world: int = 1) -> Judged:
        """Called on the training thread at the boundary after a slow step;
        ``rank_phases_excess_ns``: what the phases the ranks wait in took in
        it over their medians, ``world``: the run's ranks."""
        tid = threading.get_native_id()
        if self._watch is not None and tid != self._tid:
            # Steps run on another thread than the one watched: watch it
            # from now on; this step's wait was not followed.
            self.stop()
            self._tid = tid
            try:
                self._watch = _core._RunWait(tid, WATCH_MS)
            except OSError:
                self._watch = None
            return Judged(None, {"cause": None, "wait_note": "the steps moved to another thread"})
        w = None if self._watch is None else self._watch.waited(int(dur_ns), int(contention.BASELINE_S * 1e9))
        if w is None:
            return Judged(None, {"cause": None})
        rate = float(w["usual_rate"])
        dur, waited = int(dur_ns), min(int(w["run_delay_ns"]), int(dur_ns))
        on_cpu = min(int(w.get("on_cpu_ns", 0)), dur)
        ranks = contention.rank_wait_ns(dur, waited, on_cpu, rank_phases_excess_ns, world)
        c = contention.judge(dur, median_ns, waited, rate, ranks)
        rec: dict[str, Any] = {
            "cause": c.cause,
            "waited_ms": round(c.waited_ns / 1e6, 3),
            # The wait the usual rate before the step gives the step's own time.
            "usual_wait_ms": round(c.usual_ns / 1e6, 3),
            "usual_wait_share": round(rate, 3),
            # The step's time on a CPU, and neither on one nor waiting (blocked).
            "on_cpu_ms": round(on_cpu / 1e6, 3),
            "blocked_ms": round(max(c.dur_ns - c.waited_ns - on_cpu, 0) / 1e6, 3),
            # Of it, the wait for the other ranks (0 on one rank).
            "rank_wait_ms": round(c.rank_wait_ns / 1e6, 3),
            # The readings' interval that straddles the step's begin began this
            # long before the step's end (of it only the part in the step counts).
            "wait_span_ms": round((int(w["to_ns"]) - int(w["from_ns"])) / 1e6, 3),
        }
        if w.get("involuntary") is not None:
            rec["involuntary_switches"] = int(w["involuntary"])
        if c.contention:
            self.steps += 1
            self.waited_ns += c.waited_ns
        return Judged(c.cause, rec)

    def stop(self) -> None:
        w, self._watch = self._watch, None
        if w is not None:
            self._cost = dict(w.cost())
            w.stop()

    def summary(self) -> dict[str, Any]:
        cost = self._cost if self._watch is None else dict(self._watch.cost())
        out: dict[str, Any] = {
            "rule": contention.rule(),
            "steps": self.steps,
            "waited_ms": round(self.waited_ns / 1e6, 3),
            "watch_ms": WATCH_MS,
        }
        if cost:
            out["watch_readings"] = int(cost.get("readings", 0))
            out["watch_cpu_ms"] = round(int(cost.get("cpu_ns", 0)) / 1e6, 3)
        if self.error:
            out["error"] = self.error
        return out
