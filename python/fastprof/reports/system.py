"""System and energy report from the sampler's counter tracks.

Counter names are the sampler's (rust/fastprof-core/src/runtime/sampler): per GPU
``gpu{i}.util [%]``, ``.mem_used [B]``, ``.mem_total [B]``, ``.power [W]``,
``.energy [J]``; host ``sys.cpu [%]``, ``sys.disk_read|write [B/s]``,
``sys.net_rx|tx [B/s]``; this process ``proc.cpu_user|system [%]``,
``proc.rss [B]``; its children (DataLoader workers) ``children.cpu [%]``,
``children.rss [B]``, ``children.count``. Fastprof's own cost comes from the
recordings' ``otherData`` (sampler self-cost, drops) and ``profiler.json``
(torch window stalls).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from fastprof.reports.data import F64, RunData, step_spans

_GPU = re.compile(r"^gpu(\d+)\.util \[%\]$")


def _stats(v: F64) -> tuple[float | None, float | None]:
    if not len(v):
        return None, None
    return float(v.mean()), float(v.max())


def _trapezoid(y: F64, x: F64) -> float:
    return float(np.sum((y[1:] + y[:-1]) * 0.5 * np.diff(x)))


def _energy(data: RunData, rank: int, gpu: str, t0: int, t1: int) -> tuple[float | None, float | None, str]:
    """(energy over the whole recording, energy in [t0, t1]) in J and its source."""
    ts, e = data.counter(f"{gpu}.energy [J]", rank)
    if len(e) >= 2:
        whole = float(e[-1] - e[0])
        inside = float(np.interp(t1, ts, e) - np.interp(t0, ts, e)) if t1 > t0 else None
        return whole, inside, "energy_counter"
    ts, p = data.counter(f"{gpu}.power [W]", rank)
    if len(p) >= 2:
        sec = (ts - ts[0]).astype(np.float64) / 1e9
        whole = _trapezoid(p, sec)
        inside = None
        if t1 > t0:
            grid = np.concatenate([[t0], ts[(ts > t0) & (ts < t1)], [t1]])
            pw = np.interp(grid, ts, p)
            g = (grid - t0).astype(np.float64) / 1e9
            inside = _trapezoid(pw, g)
        return whole, inside, "integrated_power"
    return None, None, "none"


def _gpu_reason(data: RunData) -> str:
    for other in data.other.values():
        sampler = other.get("sampler") or {}
        nvml = sampler.get("nvml") or {}
        if nvml.get("reason"):
            return f"no GPU: {nvml['reason']}"
        inv = (other.get("config") or {}).get("gpu_inventory") or {}
        if inv.get("reason"):
            return f"no GPU: {inv['reason']}"
    return "no GPU: the trace has no GPU counters"


def system_report(data: RunData, bs: int | None) -> dict[str, Any]:
    counters = data.counter_names()
    gpus = sorted({m.group(1) for n in counters if (m := _GPU.match(n))}, key=int)
    devices: list[dict[str, Any]] = []
    hosts: list[dict[str, Any]] = []
    for r in data.ranks:
        steps, _src = step_spans(data, r)
        t0 = int(steps.ts[0]) if len(steps.ts) else 0
        t1 = int(steps.end.max()) if len(steps.ts) else 0
        n_steps = len(steps.ts)
        for g in gpus:
            label = f"gpu{g}"
            _, util = data.counter(f"{label}.util [%]", r)
            if not len(util):
                continue
            _, mem = data.counter(f"{label}.mem_used [B]", r)
            _, total = data.counter(f"{label}.mem_total [B]", r)
            _, power = data.counter(f"{label}.power [W]", r)
            whole, inside, source = _energy(data, r, label, t0, t1)
            per_step = inside / n_steps if inside is not None and n_steps else None
            u_mean, u_max = _stats(util)
            m_mean, m_max = _stats(mem)
            p_mean, p_max = _stats(power)
            devices.append(
                {
                    "rank": r,
                    "gpu": label,
                    "util_mean_pct": u_mean,
                    "util_max_pct": u_max,
                    "mem_used_mean_b": m_mean,
                    "mem_used_peak_b": m_max,
                    "mem_total_b": float(total.max()) if len(total) else None,
                    "power_mean_w": p_mean,
                    "power_max_w": p_max,
                    "energy_j": whole,
                    "energy_steps_j": inside,
                    "energy_per_step_j": per_step,
                    "energy_per_sample_j": per_step / bs if per_step is not None and bs else None,
                    "energy_source": source,
                }
            )
        hosts.append(_host(data, r))
    w0, w1 = data.wall()
    return {
        "duration_s": (w1 - w0) / 1e9,
        "gpu": {
            "available": bool(devices),
            "reason": None if devices else _gpu_reason(data),
            "devices": devices,
        },
        "host": hosts,
        "overhead": [_overhead(data, r) for r in data.ranks],
    }


def _mean(data: RunData, name: str, r: int) -> tuple[float | None, float | None]:
    _, v = data.counter(name, r)
    return _stats(v)


def _host(data: RunData, r: int) -> dict[str, Any]:
    cpu_mean, cpu_max = _mean(data, "sys.cpu [%]", r)
    _, user = data.counter("proc.cpu_user [%]", r)
    _, system = data.counter("proc.cpu_system [%]", r)
    n = min(len(user), len(system))
    proc = user[:n] + system[:n]
    w_mean, w_max = _mean(data, "children.cpu [%]", r)
    _, rss = data.counter("proc.rss [B]", r)
    _, wrss = data.counter("children.rss [B]", r)
    _, wcount = data.counter("children.count", r)
    _, sysmem = data.counter("sys.mem_used [B]", r)
    rates = {}
    for key, name in (
        ("disk_read", "sys.disk_read [B/s]"),
        ("disk_write", "sys.disk_write [B/s]"),
        ("net_rx", "sys.net_rx [B/s]"),
        ("net_tx", "sys.net_tx [B/s]"),
    ):
        mean, peak = _mean(data, name, r)
        rates[f"{key}_mean_bps"] = mean
        rates[f"{key}_max_bps"] = peak
    return {
        "rank": r,
        "cpu_mean_pct": cpu_mean,
        "cpu_max_pct": cpu_max,
        "process_cpu_mean_pct": float(proc.mean()) if n else None,
        "process_cpu_max_pct": float(proc.max()) if n else None,
        "rss_peak_b": float(rss.max()) if len(rss) else None,
        "workers_max": int(wcount.max()) if len(wcount) and np.isfinite(wcount.max()) else None,
        "workers_cpu_mean_pct": w_mean,
        "workers_cpu_max_pct": w_max,
        "workers_rss_peak_b": float(wrss.max()) if len(wrss) else None,
        "system_mem_used_peak_b": float(sysmem.max()) if len(sysmem) else None,
        **rates,
    }


def _overhead(data: RunData, r: int) -> dict[str, Any]:
    other = data.other.get(r)
    w0, w1 = data.wall(r)
    out: dict[str, Any] = {
        "rank": r,
        "source": "otherData of the rank's last fastprof segment" if other else "not in the input",
        "sampler_thread_cpu_s": None,
        "sampler_cpu_pct_of_wall": None,
        "sampler_cpu_ns_per_tick": None,
        "sampler_ticks": None,
        "sampler_late_ticks": None,
        "drops": None,
        "worker_drops": None,
        "torch_window_stall_s": None,
        "torch_window_export_s": None,
    }
    if other:
        cost = (other.get("sampler") or {}).get("self_cost") or {}
        cpu_s = cost.get("thread_cpu_s")
        out["sampler_thread_cpu_s"] = cpu_s
        if cpu_s is not None and w1 > w0:
            out["sampler_cpu_pct_of_wall"] = 100.0 * float(cpu_s) / ((w1 - w0) / 1e9)
        out["sampler_cpu_ns_per_tick"] = cost.get("cpu_ns_per_tick_mean")
        out["sampler_ticks"] = cost.get("ticks")
        out["sampler_late_ticks"] = cost.get("late_ticks")
        out["drops"] = (other.get("drops") or {}).get("total")
    workers = data.worker_other.get(r)
    if workers:
        out["worker_drops"] = sum(int((w.get("drops") or {}).get("total") or 0) for w in workers)
    prof = data.profiler.get(r)
    windows = ((prof or {}).get("torch") or {}).get("windows") or []
    if windows:
        out["torch_window_stall_s"] = float(
            sum(float(w.get("start_stall_s") or 0) + float(w.get("stop_stall_s") or 0) for w in windows)
        )
        out["torch_window_export_s"] = float(sum(float(w.get("export_s") or 0) for w in windows))
    return out
