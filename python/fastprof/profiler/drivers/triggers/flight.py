"""Flight dumps: the recorder's last seconds (its flight window) written to
``<folder>/flight-<n>-<reason>-ba<batch>.json.gz`` by a thread of its own
(the core releases the GIL), counted under the recorder's disk cap."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fastprof import _core
from fastprof.profiler.drivers.triggers.config import MAX_RECORDS, STATE_FILE
from fastprof.profiler.drivers.triggers.state import Board
from fastprof.recording.recorder import Recorder

__all__ = ["FlightDumps"]


class FlightDumps:
    def __init__(self, board: Board, folder: Path, recorder: Recorder) -> None:
        self.board = board
        self.folder = folder
        self.recorder = recorder
        self.dumps: list[dict[str, Any]] = []
        #: When the last dump was taken, and the request it answered.
        self.last_t = -math.inf
        self.last_seq: int | None = None
        self.ok = bool(float(recorder.options.window_seconds) > 0)
        self._cap_said = False  # a dump cut or refused by max_disk was said on stderr
        self._threads: list[threading.Thread] = []

    def dump(
        self, reason: str, batch: int, *, wait: bool, request_id: str | None = None, seq: int | None = None
    ) -> dict[str, Any] | None:
        """Dump the flight window (a thread of its own unless ``wait``, which
        rewrites triggers.json once the file is there). Recorded in the
        summary; ``seq``: the request it answers. The recorder counts the
        file under its disk cap (``deleted`` says why when the cap could not
        keep it at all)."""
        b = self.board
        if reason not in b.cfg.flight_events:
            return None
        rec: dict[str, Any] = {"reason": reason, "step": batch, "time": time.time(), "request_id": request_id}
        if seq is not None:
            rec["seq"] = seq
        if len(self.dumps) >= MAX_RECORDS:
            return None
        self.dumps.append(rec)
        if not self.ok:
            rec["error"] = "no flight window (window_seconds=0)"
            return rec
        n = len(self.dumps)
        path = self.folder / f"flight-{n:03d}-{reason}-ba{batch}.json.gz"
        rec["path"] = str(path)
        recorder = self.recorder

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
            with b.under_state_lock():  # never while triggers.json is being written from it
                rec.update(done, dump_s=round(time.perf_counter() - t0, 4))
            self._say_cap(rec)

        def work_and_say() -> None:
            work()
            # `fastprof trigger --flight` waits on triggers.json for this.
            b.write_state()

        if wait:
            work()
        else:
            t = threading.Thread(target=work_and_say, name="fastprof-flight-dump", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()
        with contextlib.suppress(Exception):
            _core.instant("flight.dump", reason=reason, step=batch)
        return rec

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=10.0)

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
        if len(self.board.notes) < 50:
            self.board.notes.append(text)
        print(f"fastprof: {text}", file=sys.stderr, flush=True)
