"""Recommendations: rules over the measured numbers, each quoting the number
that triggered it. Every rule is listed in ``checks`` with its status
(``fired``, ``ok``, or ``not_evaluated`` and why), so a quiet report says
what it looked at.

One story per report (issue #36, item 3): a share of step time comes from
the every-step anatomy where the run has one; the step-time breakdown (torch
windows: often a few steps captured after an anomaly) is used only for what
the anatomy does not measure, and its figures are quoted with the steps they
come from (``breakdown.steps_from``)."""

from __future__ import annotations

from typing import Any

from fastprof.memory.leaks import MIN_GROWTH_BYTES

LOADER_SHARE_PCT = 5.0
GPU_UTIL_PCT = 50.0
MEMORY_PCT = 90.0
COMM_PCT = 10.0
HOST_CPU_PCT = 90.0
WORKERS_CPU_PCT = 100.0  # at least one core busy in the workers


def _check(rule: str, status: str, measured: float | None, threshold: float, message: str) -> dict[str, Any]:
    return {"rule": rule, "status": status, "measured": measured, "threshold": threshold, "message": message}


def _mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _breakdown_share(breakdown: dict[str, Any] | None, part: str) -> float | None:
    """A role's share of all steps' time (%), from the breakdown when present."""
    if not breakdown:
        return None
    ranks = breakdown.get("per_rank") or []
    total = sum(float(r.get("duration_ns") or 0) for r in ranks)
    if total <= 0:
        return None
    return 100.0 * sum(float(r.get(part) or 0) for r in ranks) / total


def _breakdown_mean(breakdown: dict[str, Any] | None, key: str) -> float | None:
    """A per-step GPU figure's mean over every rank's steps with GPU activity."""
    if not breakdown:
        return None
    pairs = [(r[key], r.get("gpu_steps") or 0) for r in breakdown.get("per_rank") or [] if r.get(key) is not None]
    n = sum(w for _, w in pairs)
    return sum(float(v) * w for v, w in pairs) / n if n else None


def _anatomy_share(anatomy: dict[str, Any] | None, phase: str) -> float | None:
    """A phase's share of all ranks' step time (%), from the every-step anatomy."""
    ranks = (anatomy or {}).get("per_rank") or []
    total = sum(int(r["step_total_ns"]) for r in ranks)
    if total <= 0:
        return None
    return 100.0 * sum(int(r["phases"][phase]["total_ns"]) for r in ranks) / total


def _anatomy_source(anatomy: dict[str, Any]) -> str:
    steps = sum(int(r["steps"]) for r in anatomy["per_rank"])
    return f"step anatomy, every step: {steps} steps"


def _breakdown_source(breakdown: dict[str, Any]) -> str:
    return f"step-time breakdown, in {breakdown.get('steps_from') or 'the steps of its torch windows'}"


def recommend(
    speed: dict[str, Any],
    system: dict[str, Any],
    breakdown: dict[str, Any] | None,
    memory: dict[str, Any] | None = None,
    anatomy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []

    # DataLoader share of step time: every step's where the anatomy has it.
    share = _anatomy_share(anatomy, "dataloader")
    source = "" if anatomy is None else _anatomy_source(anatomy)
    if share is None and breakdown:
        share = _breakdown_share(breakdown, "dataloader_ns")
        source = _breakdown_source(breakdown)
    if share is None:
        share = _mean_of(speed["train"]["per_rank"], "loader_share_pct")
        source = "time in loader.train.next inside steps"
    if share is None:
        checks.append(_check("dataloader", "not_evaluated", None, LOADER_SHARE_PCT, "no train loader or no steps"))
    elif share > LOADER_SHARE_PCT:
        checks.append(
            _check(
                "dataloader",
                "fired",
                share,
                LOADER_SHARE_PCT,
                f"DataLoader takes {share:.1f}% of step time ({source}; threshold {LOADER_SHARE_PCT:g}%): "
                "use more DataLoader workers (num_workers), pin_memory=True, a larger prefetch_factor, "
                "or cheaper per-sample work in __getitem__",
            )
        )
    else:
        checks.append(
            _check("dataloader", "ok", share, LOADER_SHARE_PCT, f"DataLoader {share:.1f}% of step time ({source})")
        )

    # GPU utilisation.
    devices = system["gpu"]["devices"]
    util = _mean_of(devices, "util_mean_pct")
    bd_util = _breakdown_mean(breakdown, "gpu_util")
    util_source = "the sampler's GPU readings over the run"
    if bd_util is not None and breakdown is not None:
        util = 100.0 * bd_util
        util_source = _breakdown_source(breakdown)
    if util is None:
        checks.append(_check("gpu_utilization", "not_evaluated", None, GPU_UTIL_PCT, system["gpu"]["reason"] or ""))
    elif util < GPU_UTIL_PCT:
        checks.append(
            _check(
                "gpu_utilization",
                "fired",
                util,
                GPU_UTIL_PCT,
                f"GPU utilisation is {util:.1f}% ({util_source}; threshold {GPU_UTIL_PCT:g}%): "
                "try a larger batch size, and look for host-side stalls (data loading, synchronisation) "
                "between kernels",
            )
        )
    else:
        checks.append(
            _check("gpu_utilization", "ok", util, GPU_UTIL_PCT, f"GPU utilisation {util:.1f}% ({util_source})")
        )

    # Peak device memory.
    peaks = [
        100.0 * d["mem_used_peak_b"] / d["mem_total_b"]
        for d in devices
        if d.get("mem_used_peak_b") and d.get("mem_total_b")
    ]
    if not peaks:
        checks.append(
            _check("gpu_memory", "not_evaluated", None, MEMORY_PCT, system["gpu"]["reason"] or "no memory counters")
        )
    elif max(peaks) > MEMORY_PCT:
        checks.append(
            _check(
                "gpu_memory",
                "fired",
                max(peaks),
                MEMORY_PCT,
                f"peak GPU memory is {max(peaks):.1f}% of the device (threshold {MEMORY_PCT:g}%): use activation "
                "checkpointing or mixed precision (AMP) to make room, or a smaller batch",
            )
        )
    else:
        checks.append(_check("gpu_memory", "ok", max(peaks), MEMORY_PCT, f"peak GPU memory {max(peaks):.1f}%"))

    # Communication: the anatomy's where it timed collectives, else the breakdown's (GPU kernels).
    comm = _anatomy_share(anatomy, "communication")
    comm_source = "" if anatomy is None else _anatomy_source(anatomy)
    if not comm and breakdown:
        comm = _breakdown_share(breakdown, "communication_ns")
        comm_source = _breakdown_source(breakdown)
    if comm is None:
        checks.append(
            _check(
                "communication",
                "not_evaluated",
                None,
                COMM_PCT,
                "needs the step anatomy or the step-time breakdown (torch windows)",
            )
        )
    elif comm > COMM_PCT:
        checks.append(
            _check(
                "communication",
                "fired",
                comm,
                COMM_PCT,
                f"communication takes {comm:.1f}% of step time ({comm_source}; threshold {COMM_PCT:g}%): "
                "overlap it with compute "
                "(DDP bucket size, gradient accumulation with no_sync), compress gradients, or check the interconnect",
            )
        )
    else:
        checks.append(
            _check("communication", "ok", comm, COMM_PCT, f"communication {comm:.1f}% of step time ({comm_source})")
        )

    # Host CPU saturated by DataLoader workers.
    hosts = system["host"]
    cpu = max((h["cpu_max_pct"] for h in hosts if h.get("cpu_max_pct") is not None), default=None)
    cpu_mean = _mean_of(hosts, "cpu_mean_pct")
    workers = _mean_of(hosts, "workers_cpu_mean_pct")
    if cpu_mean is None or workers is None:
        checks.append(_check("host_cpu", "not_evaluated", None, HOST_CPU_PCT, "no host CPU or worker counters"))
    elif cpu_mean > HOST_CPU_PCT and workers >= WORKERS_CPU_PCT:
        checks.append(
            _check(
                "host_cpu",
                "fired",
                cpu_mean,
                HOST_CPU_PCT,
                f"host CPU is {cpu_mean:.1f}% busy on average (peak {cpu:.1f}%) with DataLoader workers using "
                f"{workers:.0f}% of a core: use fewer workers, or faster decoding/augmentation",
            )
        )
    else:
        checks.append(
            _check(
                "host_cpu", "ok", cpu_mean, HOST_CPU_PCT, f"host CPU {cpu_mean:.1f}%, workers {workers:.0f}% of a core"
            )
        )

    # Tensor cores (AMP).
    tc_share = _breakdown_mean(breakdown, "tensor_core_share")
    tc = None if tc_share is None else 100.0 * tc_share
    if tc is None:
        checks.append(
            _check("tensor_cores", "not_evaluated", None, 50.0, "needs the step-time breakdown with GPU kernels")
        )
    elif tc < 50.0:
        checks.append(
            _check(
                "tensor_cores",
                "fired",
                tc,
                50.0,
                f"only {tc:.1f}% of kernel time uses tensor cores ({_breakdown_source(breakdown or {})}): "
                "enable mixed precision (torch.autocast / AMP)",
            )
        )
    else:
        checks.append(_check("tensor_cores", "ok", tc, 50.0, f"tensor cores in {tc:.1f}% of kernel time"))

    checks.append(_memory_growth(memory))
    return {"items": [c for c in checks if c["status"] == "fired"], "checks": checks}


def _memory_growth(memory: dict[str, Any] | None) -> dict[str, Any]:
    """Memory that grows step over step (``fastprof.memory.leaks``)."""
    threshold = float(MIN_GROWTH_BYTES)
    every = (memory or {}).get("per_rank") or []
    ranks = [r for r in every if r.get("growth_b_per_step") is not None]
    if not ranks:
        why = f"rank {every[0]['rank']}: {every[0]['verdict']}" if every else "needs per-step memory statistics"
        return _check("memory_growth", "not_evaluated", None, threshold, why)
    # A rank still growing outranks one whose larger growth ended (a filled cache).
    worst = max([r for r in ranks if r["leak"]] or ranks, key=lambda r: float(r["growth_total_b"]))
    total = float(worst["growth_total_b"])
    if worst["leak"]:
        return _check(
            "memory_growth",
            "fired",
            total,
            threshold,
            f"{worst['series']} grows {worst['growth_b_per_step'] / 2**20:.2f} MiB per step on rank "
            f"{worst['rank']} from step {worst['began_at_step']} ({total / 2**20:.0f} MiB over the run): look "
            "for tensors kept across steps (a list of losses without .item(), a cache, retained graphs, "
            "hooks that store outputs)",
        )
    return _check(
        "memory_growth", "ok", total, threshold, f"{worst['series']} on rank {worst['rank']}: {worst['verdict']}"
    )
