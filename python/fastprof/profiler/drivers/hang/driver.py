"""The hang driver (issue #37): starts the core's watchdog thread
(``_core._HangWatch``, no GIL: see ``fastprof_core::runtime::hang``) and a
helper thread that answers its events.

When no step has ended for the timeout (:mod:`.config`), or ``fastprof
trigger RUN --stacks`` asks, the watchdog dumps every thread's stack without
the GIL and wakes the helper, which claims the event and writes the full
evidence (:mod:`.evidence`); when the interpreter cannot answer within the
grace (a thread holds the GIL), the watchdog writes the evidence itself from
its dump. For a stall, rank 0 (or, when it cannot, the first rank that can)
then joins the ranks' evidence through the run directory, never through a
collective, and prints one verdict on stderr while the job is still hung
(:func:`.verdict.verdict`). With ``hang_action="abort"``
each hung rank then ends with :data:`.config.HANG_EXIT_STATUS`.

A SIGTERM that lands while the rank has made no progress for a while (ten
typical steps and at least 10 s) writes the evidence too, from the handler,
before the job's own handling of the signal goes on. When Python cannot run
the handler (the main thread waits in a collective's C call), the core's
hook under the interpreter's SIGTERM handler tells the watchdog, whose event
this helper thread answers (the GIL is free); then, when the job's SIGTERM
disposition under fastprof's handler is the default, the core ends the
process by SIGTERM, as it would have ended without fastprof.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import warnings
from typing import Any

from fastprof import _core
from fastprof._core import FastprofWarning
from fastprof._loop_api import LoopHost
from fastprof._process import PROCESS
from fastprof.profiler import collectives
from fastprof.profiler.driver import Closing, Driver
from fastprof.profiler.drivers.hang import evidence
from fastprof.profiler.drivers.hang.config import HANG_EXIT_STATUS, HangConfig
from fastprof.profiler.drivers.hang.store import CLOSED_KEY, RankBridge, bridge_of
from fastprof.profiler.drivers.hang.verdict import (
    CLOSED_FILE,
    WATCH_FILE,
    closed_ranks,
    evidence_files,
    gone_ranks,
    join,
    left_loop,
    verdict,
)

__all__ = ["HangDriver"]

#: A verdict is said once per stall across ranks: the first rank to create
#: this file in the run directory (holding the stall's time) says it.
VERDICT_LOCK = ".hang-verdict"


def _sigterm_ends_by_default() -> bool:
    """Whether SIGTERM ends the process by its default action once fastprof's
    handler is done: that handler is SIGTERM's, over the default."""
    h = signal.getsignal(signal.SIGTERM)
    if not callable(h) or getattr(h, "previous", None) is not signal.SIG_DFL:
        return False
    return getattr(h, "__func__", h) in PROCESS.signals.own


class HangDriver(Driver):
    key = "hang"

    def __init__(self, prof: LoopHost, timeout: float | None = None, action: str = "report") -> None:
        """``timeout`` and ``action``: the Profiler's ``hang_timeout`` (None:
        auto, 0: off) and ``hang_action``, resolved by its options."""
        self.prof = prof
        self.error: str | None = None
        try:
            config = HangConfig.with_grace(timeout, action)
        except ValueError as e:
            self.error = str(e)
            warnings.warn(f"fastprof: {e}; the hang watchdog uses its default grace", FastprofWarning, stacklevel=2)
            config = HangConfig(timeout=timeout, action=action)
        self.config = config
        self.watch: Any = None
        self.thread: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.pid = os.getpid()
        self.training: int | None = None
        self.reports: list[dict[str, Any]] = []
        self.said: list[str] = []
        #: Ranks whose process was gone when an exception left this rank's loop.
        self.peers_gone: list[dict[str, Any]] = []
        #: Ranks that had left their training loop then (``rank``, ``step``, ``skipped``).
        self.peers_left: list[dict[str, Any]] = []
        #: A URL run's link to the store (its ranks may share no directory).
        self.bridge: RankBridge | None = None

    def start(self, steps: Any) -> None:
        if not self.config.enabled:
            return
        try:
            p = self.prof
            self.rank = p.rank
            self.world_size = int(getattr(p.recorder.options, "world_size", 1) or 1)
            self.training = threading.get_ident()
            #: This Profiler's, in its watch file and closed file (another Profiler
            #: of the process, in the same folder, writes its own).
            self.token = f"{self.pid}-{time.monotonic_ns()}"
            watch = {
                "token": self.token,
                "rank": self.rank,
                "pid": self.pid,
                "host": socket.gethostname(),
                "training_thread": self.training,
                "world_size": self.world_size,
                "started": time.time(),
            }
            evidence.write(p.rank_dir / WATCH_FILE, watch)
            with contextlib.suppress(OSError):
                (p.rank_dir / CLOSED_FILE).unlink()  # an earlier Profiler's, in the same folder
            c = self.config
            self.watch = _core._HangWatch(
                str(p.rank_dir),
                self.rank,
                c.timeout or 0.0,
                c.grace,
                c.poll,
                HANG_EXIT_STATUS if c.action == "abort" else None,
                self._abort_wait(),
                sigterm_hook=True,
                sigterm_default=_sigterm_ends_by_default(),
            )
            self.thread = threading.Thread(target=self._serve, name="fastprof-hang-helper", daemon=True)
            self.thread.start()
            self.bridge = bridge_of(p, self.rank)
            if self.bridge is not None:
                self.bridge.start()
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            self.error = f"{type(e).__name__}: {e}"
            warnings.warn(f"fastprof: the hang watchdog did not start: {self.error}", FastprofWarning, stacklevel=2)

    def _abort_wait(self) -> float:
        """How long a hung rank waits, before ending, for the other ranks'
        evidence and the verdict."""
        return max(10.0, 2 * self.config.grace + 5.0)

    # The helper thread.

    def _serve(self) -> None:
        while not self.stop_event.is_set():
            w = self.watch
            if w is None:
                return
            try:
                # Woken by an event or the close: no periodic GIL taking.
                event = w.next(30.0)
                if event is None:
                    continue
                self._answer(event)
            except Exception as e:  # noqa: BLE001
                self.error = f"{type(e).__name__}: {e}"
                warnings.warn(f"fastprof: hang evidence failed: {self.error}", FastprofWarning, stacklevel=1)

    def _answer(self, event: dict[str, Any]) -> None:
        w = self.watch
        claimed = w is not None and w.claim(event["n"])
        path = self.prof.rank_dir / f"hang-{event['n']}.json"
        if claimed:
            doc = evidence.gather(event, self.rank, self.world_size, self.training, rank_dir=self.prof.rank_dir)
            evidence.write(path, doc)
            self.reports.append({"n": event["n"], "reason": event["reason"], "by": "python"})
            if w is not None:
                w.done(event["n"])
        else:
            self.reports.append({"n": event["n"], "reason": event["reason"], "by": "watchdog"})
        if claimed and event.get("stacks"):
            with contextlib.suppress(OSError):
                os.unlink(event["stacks"])  # the full evidence has the stacks
        if self.bridge is not None and path.exists():
            self.bridge.put(path, path.name)  # in the store before the verdict joins it
        if event["reason"] != "stalled":
            return
        self._say(event)
        if self.config.action == "abort":
            sys.stderr.flush()
            os._exit(HANG_EXIT_STATUS)

    def _say(self, event: dict[str, Any]) -> None:
        """Join the ranks' evidence and print the verdict, if this rank is the
        first that can (rank 0 at once; rank r after r grace periods)."""
        run_dir = self.prof.run_dir
        window = max(30.0, float(event["timeout_s"]))
        deadline = time.monotonic() + max(10.0, 2 * self.config.grace + 4.0)
        # Through the store, when the ranks may share no directory (a look a second).
        pause = 0.25 if self.bridge is None else 1.0
        states = self._join(event["time"], window)
        while time.monotonic() < deadline and any(s["state"] == "silent" for s in states.values()):
            if self.stop_event.wait(pause):
                return
            states = self._join(event["time"], window)
        if self.rank != 0 and self.stop_event.wait(self.config.grace * self.rank):
            return
        v = verdict(self._join(event["time"], window))
        if self.bridge is not None and not self.bridge.claim_verdict(v["step"], event["time"], window):
            return
        if not self._take_lock(run_dir / VERDICT_LOCK, event["time"], window) and self.bridge is None:
            return
        self.said.append(v["text"])
        print(f"fastprof: {v['text']}", file=sys.stderr, flush=True)

    def _join(self, t: float, window: float) -> dict[int, dict[str, Any]]:
        if self.bridge is not None:
            return self.bridge.join(t, window, self.world_size, self.prof.run_dir)
        return join(self.prof.run_dir, t, window, world_size=self.world_size)

    def _take_lock(self, path: Any, t: float, window: float) -> bool:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                other = float(json.loads(path.read_text()).get("time", 0.0))
            except (OSError, ValueError, AttributeError):
                return False
            if abs(other - t) <= window:
                return False  # another rank said this stall's verdict
            with contextlib.suppress(OSError):
                path.unlink()
            return self._take_lock(path, t, window)
        except OSError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump({"time": t, "rank": self.rank}, f)
        return True

    # The loop's end, a peer's process gone, SIGTERM and the close.

    def unhook(self) -> None:
        """The loop ends (the close's first phase). In a job of several ranks,
        the rank's last step and collective wavefront go to
        ``rank{R}/.hang-closed.json``: the watchdog stops with the Profiler, and
        a rank that left its loop while the others wait (it skipped one of
        their collectives, or had fewer batches) is still named by the verdict."""
        if self.watch is None or self.world_size < 2:
            return
        doc = {
            "rank": self.rank,
            "pid": self.pid,
            "token": self.token,
            "time": time.time(),
            "step": _core._hang_last_step(),
            "collectives": collectives.snapshot(),
        }
        try:
            evidence.write(self.prof.rank_dir / CLOSED_FILE, doc)
            if self.bridge is not None:
                self.bridge.send(self.prof.rank_dir / CLOSED_FILE, CLOSED_KEY, rewritable=True)
        except Exception as e:  # noqa: BLE001 - profiling never takes the job down
            self.error = f"{type(e).__name__}: {e}"

    def on_exception(self, exc: BaseException) -> None:
        """A rank whose process ends outside its launcher (SIGKILL, the OOM
        killer) is no hang with gloo: its sockets close and the others'
        collective raises ("Connection closed by peer"). So is a rank that
        left its training loop and ended while the others still wait (it
        skipped one of their collectives, or had fewer batches): under
        ``fastprof run`` its process ends with its script, at once. When an
        exception leaves this rank's loop, the ranks of the run that left
        their loop (``.hang-closed.json``: a skipped collective named as
        such) and those whose process (on this host) is otherwise gone are
        named on stderr and in ``profiler.json``."""
        if self.watch is None or self.world_size < 2:
            return
        try:
            left = left_loop(
                self.rank,
                _core._hang_last_step(),
                collectives.snapshot(),
                closed_ranks(self.prof.run_dir, exclude=self.rank),
            )
            gone = gone_ranks(self.prof.run_dir, exclude=self.rank)
        except Exception:  # noqa: BLE001 - profiling never takes the job down
            return
        if not gone and not left:
            return
        self.peers_left = [{k: p[k] for k in ("rank", "step", "skipped")} for p in left]
        self.peers_gone = [{"rank": r, "pid": pid} for r, pid in gone]
        reasons = [p["text"] for p in left]
        if gone:
            names = ", ".join(f"rank {r} (pid {pid})" for r, pid in gone)
            reasons.append(
                f"the process of {names} is gone, ended outside the launcher (killed, the OOM killer); "
                "see the node's kernel log (dmesg) for that pid"
            )
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        print(
            f"fastprof: rank {self.rank} stops on {type(exc).__name__}"
            + (f" ({first})" if first else "")
            + ": "
            + "; ".join(reasons),
            file=sys.stderr,
            flush=True,
        )

    # SIGTERM and the close.

    def on_exit_event(self, reason: str) -> None:
        if reason != "sigterm" or self.watch is None:
            return
        if not _core._hang_sigterm_take():
            return  # the watchdog answered this SIGTERM (the main thread was in C)
        stalled, typical = self.watch.stall()
        if stalled < max(10.0, 10 * (typical or 1.0)):
            return
        try:
            # After every number used: in a URL run the uploader frees the spool's copies.
            n = max([k for k, _ in evidence_files(self.prof.rank_dir)] + [int(r["n"]) for r in self.reports] + [0])
            event = {
                "n": n + 1,
                "reason": "sigterm",
                "request": None,
                "step": _core._hang_last_step(),
                "stalled_s": stalled,
                "timeout_s": self.config.timeout or 0.0,
                "typical_step_s": typical,
                "time": time.time(),
            }
            # The handler runs on the training thread: its stack, less the handler's frames.
            doc = evidence.gather(
                event, self.rank, self.world_size, self.training, here=True, rank_dir=self.prof.rank_dir
            )
            evidence.write(self.prof.rank_dir / f"hang-{event['n']}.json", doc)
            self.reports.append({"n": event["n"], "reason": "sigterm", "by": "python"})
        except Exception as e:  # noqa: BLE001
            self.error = f"{type(e).__name__}: {e}"

    def close(self, closing: Closing) -> None:
        self.release()

    def release(self) -> None:
        self.stop_event.set()
        w, self.watch = self.watch, None
        if w is not None and os.getpid() == self.pid:
            w.stop()
        t, self.thread = self.thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        b, self.bridge = self.bridge, None
        if b is not None and os.getpid() == self.pid:
            b.stop()
            if b.error and not self.error:
                self.error = f"store: {b.error}"

    def account(self) -> Any:
        c = self.config
        return {
            "enabled": c.enabled,
            "timeout": "auto" if c.timeout is None else c.timeout,
            "action": c.action,
            "reports": self.reports,
            "verdicts": self.said,
            "peers_gone": self.peers_gone,
            "peers_left": self.peers_left,
            "error": self.error,
        }
