"""Host and process counters through psutil, for hosts without /proc.

On Linux the Rust sampler reads /proc itself (no GIL). Where
that is impossible (macOS, Windows), or when asked with
``host_sampler="psutil"``, this Python thread takes the same readings under
the same metric names and records them as counters, while the Rust sampler
keeps NVML. It needs the GIL, so it is the slower path, and its rate is
capped at 100 Hz. Like the Rust sampler it reads system-wide CPU, load,
memory, swap, disk and network only ``system_hz`` times a second.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np
import psutil

from fastprof import _core

MAX_HZ = 100.0


class PsutilHostSampler:
    def __init__(self, hz: float, history: int, system_hz: float = 10.0) -> None:
        hz = min(hz, MAX_HZ)
        self.period = 1.0 / hz
        self.system_every = max(1, round(hz / min(system_hz, hz)))
        self.ticks = 0
        self.history = history
        self.series: dict[str, collections.deque[tuple[int, float]]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fastprof-psutil-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def snapshot(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        with self._lock:
            items = [(k, list(v)) for k, v in self.series.items()]
        out = {}
        for name, rows in items:
            ts = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            vals = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
            ts.flags.writeable = False
            vals.flags.writeable = False
            out[name] = (ts, vals)
        return out

    def _emit(self, now: int, name: str, value: float) -> None:
        _core.counter(name, value)
        q = self.series.get(name)
        if q is None:
            q = self.series[name] = collections.deque(maxlen=self.history)
        q.append((now, float(value)))

    def _run(self) -> None:
        proc = psutil.Process()
        prev: dict[str, Any] = {}
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                self._tick(proc, prev)
            except Exception:  # noqa: BLE001 - a sampling failure must never reach the job
                pass
            nxt += self.period
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def _tick(self, proc: psutil.Process, prev: dict[str, Any]) -> None:
        now = time.monotonic_ns()
        dt = (now - prev["t"]) / 1e9 if "t" in prev else 0.0
        system = self.ticks % self.system_every == 0
        self.ticks += 1
        vm, sw = (psutil.virtual_memory(), psutil.swap_memory()) if system else (None, None)
        disk, net = (psutil.disk_io_counters(), psutil.net_io_counters()) if system else (None, None)
        sys_dt = (now - prev["sys_t"]) / 1e9 if system and "sys_t" in prev else 0.0
        cpu_t, mem, ctx = proc.cpu_times(), proc.memory_info(), proc.num_ctx_switches()
        try:
            pio = proc.io_counters()
            io = (pio.read_bytes, pio.write_bytes)
        except (AttributeError, psutil.Error):
            io = None  # macOS has no per-process I/O counters
        kids = []
        for c in proc.children(recursive=True):
            try:
                t = c.cpu_times()
                kids.append((c.pid, t.user + t.system, c.memory_info().rss))
            except psutil.Error:
                continue
        with self._lock:
            emit = self._emit
            if vm is not None and sw is not None:
                emit(now, "sys.cpu [%]", psutil.cpu_percent())
                emit(now, "sys.mem_used [B]", vm.total - vm.available)
                emit(now, "sys.mem_available [B]", vm.available)
                emit(now, "sys.swap_used [B]", sw.used)
                emit(now, "sys.load1", psutil.getloadavg()[0])
            emit(now, "proc.rss [B]", mem.rss)
            emit(now, "proc.threads", proc.num_threads())
            emit(now, "children.count", len(kids))
            emit(now, "children.rss [B]", sum(k[2] for k in kids))
            if dt > 0:
                p = prev
                emit(now, "proc.cpu_user [%]", 100 * (cpu_t.user - p["cpu"].user) / dt)
                emit(now, "proc.cpu_system [%]", 100 * (cpu_t.system - p["cpu"].system) / dt)
                emit(now, "proc.ctx_switches [1/s]", (sum(ctx) - sum(p["ctx"])) / dt)
                if sys_dt > 0 and disk is not None and p["disk"] is not None:
                    emit(now, "sys.disk_read [B/s]", (disk.read_bytes - p["disk"].read_bytes) / sys_dt)
                    emit(now, "sys.disk_write [B/s]", (disk.write_bytes - p["disk"].write_bytes) / sys_dt)
                if sys_dt > 0 and net is not None and p["net"] is not None:
                    emit(now, "sys.net_rx [B/s]", (net.bytes_recv - p["net"].bytes_recv) / sys_dt)
                    emit(now, "sys.net_tx [B/s]", (net.bytes_sent - p["net"].bytes_sent) / sys_dt)
                if io is not None and p["io"] is not None:
                    emit(now, "proc.read [B/s]", (io[0] - p["io"][0]) / dt)
                    emit(now, "proc.write [B/s]", (io[1] - p["io"][1]) / dt)
                before = p["kids"]
                cpu = sum(k[1] - before[k[0]] for k in kids if k[0] in before)
                emit(now, "children.cpu [%]", 100 * cpu / dt)
        prev.update(t=now, cpu=cpu_t, ctx=ctx, io=io, kids={k[0]: k[1] for k in kids})
        if system:
            prev.update(sys_t=now, disk=disk, net=net)
