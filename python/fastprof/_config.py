"""Recorder options: defaults, ``FASTPROF_*`` environment overrides, and the
torchrun environment (RANK, WORLD_SIZE, ...). Explicit arguments win over the
environment, which wins over defaults, so a launcher can set options for a
script that does not pass them."""

from __future__ import annotations

import datetime as _dt
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastprof._core import ConfigError

T = TypeVar("T")

DEFAULT_OUT_DIR = "fastprof_runs"
#: Events per thread ring; 24 bytes each, pages committed only as used.
DEFAULT_BUFFER_SIZE = 1 << 20
#: Seconds between writer flushes: the most a killed process can lose.
DEFAULT_FLUSH_INTERVAL = 1.0
#: Compressed bytes per segment before rotating.
DEFAULT_SEGMENT_SIZE = 256 << 20
DEFAULT_SEGMENT_SECONDS = 0.0
DEFAULT_COMPRESSION_LEVEL = 1
#: Sampler ticks per second (0 = off): cheap enough to leave on in long jobs.
DEFAULT_SAMPLE_HZ = 10.0
#: Reads per second of system-wide CPU, load, memory and swap (at most sample_hz).
DEFAULT_SAMPLE_SYSTEM_HZ = 10.0
#: Samples kept in memory per metric for Recorder.counters() (the trace keeps all).
DEFAULT_SAMPLE_HISTORY = 1 << 16

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"64MiB"``, ``"64M"``, ``"65536"`` -> bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 65536, 64K, 256MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class Options:
    """Resolved recorder options (what ``fastprof.start`` runs with)."""

    out_dir: Path
    run_name: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    buffer_size: int
    flush_interval: float
    segment_size: int
    segment_seconds: float
    compression_level: int
    sample_hz: float
    #: System-wide CPU, load, memory and swap reads per second (<= sample_hz).
    sample_system_hz: float
    sample_per_cpu: bool
    #: None = every visible GPU, [] = no NVML, else NVML indices / UUIDs.
    sample_gpus: list[str] | None
    sample_history: int
    #: "procfs" (Rust reads /proc) or "psutil" (a Python thread, for non-Linux hosts).
    host_sampler: str

    @property
    def run_dir(self) -> Path:
        return self.out_dir / self.run_name

    @property
    def trace_dir(self) -> Path:
        return self.run_dir / f"rank{self.rank}"


def _pick(
    name: str,
    value: Any,
    env: Mapping[str, str],
    var: str,
    conv: Callable[[Any], T],
    default: T,
) -> T:
    if value is not None:
        try:
            return conv(value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"invalid option {name}: {e}") from None
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        return conv(raw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid environment variable {var}={raw!r}: {e}") from None


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise TypeError("expected an integer, got a bool")
    if isinstance(v, str):
        return parse_size(v)
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(f"expected an integer, got {v}")
    return int(v)


def _float(v: Any) -> float:
    if isinstance(v, bool):
        raise TypeError("expected a number, got a bool")
    return float(v)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {v!r}")


def _gpus(v: Any) -> str | list[str]:
    if isinstance(v, str):
        text = v.strip().lower()
        if text in ("auto", "all", "none"):
            return text
        return [x.strip() for x in v.split(",") if x.strip()]
    if isinstance(v, int) and not isinstance(v, bool):
        return [str(v)]
    return [str(x) for x in v]


def resolve_gpus(choice: str | list[str], env: Mapping[str, str], local_rank: int, world_size: int) -> list[str] | None:
    """Which NVML devices to sample.

    ``auto``: in a multi-process job, the device this rank uses (entry
    LOCAL_RANK of CUDA_VISIBLE_DEVICES, or index LOCAL_RANK); in a single
    process, every visible device. ``all``: every device. ``none``: no NVML.
    CUDA_VISIBLE_DEVICES indices match NVML's only with CUDA_DEVICE_ORDER=PCI_BUS_ID;
    UUIDs always match.
    """
    if isinstance(choice, list):
        return choice
    if choice == "none":
        return []
    visible_raw = env.get("CUDA_VISIBLE_DEVICES")
    visible = None if visible_raw is None else [x.strip() for x in visible_raw.split(",") if x.strip()]
    if choice == "all":
        return None
    if world_size > 1:
        if visible is not None:
            return [visible[local_rank]] if local_rank < len(visible) else []
        return [str(local_rank)]
    return visible


def _host_sampler(v: Any) -> str:
    text = str(v).strip().lower()
    if text == "auto":
        return "procfs" if sys.platform.startswith("linux") else "psutil"
    if text not in ("procfs", "psutil"):
        raise ValueError(f"expected auto, procfs or psutil, got {v!r}")
    return text


def _default_run_name(env: Mapping[str, str], world_size: int, out_dir: Path) -> str:
    # Every rank of a torchrun job must agree on the run name without talking:
    # the elastic run id is shared; a timestamp is not.
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if world_size > 1 and run_id and run_id != "none":
        return f"run-{run_id}"
    # A single process owns its name: never land in an earlier run's directory.
    base = _dt.datetime.now().strftime("run-%Y%m%d-%H%M%S")
    name, n = base, 1
    while (out_dir / name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def resolve(
    out_dir: str | os.PathLike[str] | None = None,
    run_name: str | None = None,
    *,
    rank: int | None = None,
    buffer_size: int | None = None,
    flush_interval: float | None = None,
    segment_size: int | str | None = None,
    segment_seconds: float | None = None,
    compression_level: int | None = None,
    sample_hz: float | None = None,
    sample_system_hz: float | None = None,
    sample_per_cpu: bool | None = None,
    sample_gpus: str | int | list[str] | list[int] | None = None,
    sample_history: int | None = None,
    host_sampler: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Options:
    """Resolve options from arguments, ``FASTPROF_*`` variables and torchrun's environment."""
    env = os.environ if env is None else env
    world_size = _pick("world_size", None, env, "WORLD_SIZE", _int, 1)
    rank_v = _pick("rank", rank, env, "FASTPROF_RANK", _int, _pick("rank", None, env, "RANK", _int, 0))
    local_rank = _pick("local_rank", None, env, "LOCAL_RANK", _int, 0)
    local_world = _pick("local_world_size", None, env, "LOCAL_WORLD_SIZE", _int, 1)
    node_rank = _pick("node_rank", None, env, "GROUP_RANK", _int, 0)
    if rank_v < 0 or world_size < 1:
        raise ConfigError(f"invalid option rank: rank {rank_v} with world size {world_size}")
    # A rank given by hand outside torchrun implies a world at least that big.
    world_size = max(world_size, rank_v + 1)
    fmt = {
        "rank": rank_v,
        "local_rank": local_rank,
        "world_size": world_size,
        "local_world_size": local_world,
        "node_rank": node_rank,
    }
    out = _pick("out_dir", out_dir, env, "FASTPROF_OUT_DIR", str, DEFAULT_OUT_DIR)
    name = _pick("run_name", run_name, env, "FASTPROF_RUN_NAME", str, "")
    name = name or _default_run_name(env, world_size, Path(out))
    try:
        fmt_all = {**fmt, "run_name": name}
        out = out.format(**fmt_all)
        name = name.format(**fmt_all)
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"invalid format variable in out_dir/run_name: {e}") from None
    if not name or "/" in name or name in (".", ".."):
        raise ConfigError(f"invalid option run_name: {name!r} must be a plain directory name")
    opts = Options(
        out_dir=Path(out),
        run_name=name,
        rank=rank_v,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=node_rank,
        buffer_size=_pick("buffer_size", buffer_size, env, "FASTPROF_BUFFER_SIZE", _int, DEFAULT_BUFFER_SIZE),
        flush_interval=_pick(
            "flush_interval", flush_interval, env, "FASTPROF_FLUSH_INTERVAL", _float, DEFAULT_FLUSH_INTERVAL
        ),
        segment_size=_pick("segment_size", segment_size, env, "FASTPROF_SEGMENT_SIZE", _int, DEFAULT_SEGMENT_SIZE),
        segment_seconds=_pick(
            "segment_seconds", segment_seconds, env, "FASTPROF_SEGMENT_SECONDS", _float, DEFAULT_SEGMENT_SECONDS
        ),
        compression_level=_pick(
            "compression_level",
            compression_level,
            env,
            "FASTPROF_COMPRESSION_LEVEL",
            _int,
            DEFAULT_COMPRESSION_LEVEL,
        ),
        sample_hz=_pick("sample_hz", sample_hz, env, "FASTPROF_SAMPLE_HZ", _float, DEFAULT_SAMPLE_HZ),
        sample_system_hz=_pick(
            "sample_system_hz",
            sample_system_hz,
            env,
            "FASTPROF_SAMPLE_SYSTEM_HZ",
            _float,
            DEFAULT_SAMPLE_SYSTEM_HZ,
        ),
        sample_per_cpu=_pick("sample_per_cpu", sample_per_cpu, env, "FASTPROF_SAMPLE_PER_CPU", _bool, False),
        sample_gpus=resolve_gpus(
            _pick("sample_gpus", sample_gpus, env, "FASTPROF_SAMPLE_GPUS", _gpus, _gpus("auto")),
            env,
            local_rank,
            world_size,
        ),
        sample_history=_pick(
            "sample_history", sample_history, env, "FASTPROF_SAMPLE_HISTORY", _int, DEFAULT_SAMPLE_HISTORY
        ),
        host_sampler=_pick(
            "host_sampler", host_sampler, env, "FASTPROF_HOST_SAMPLER", _host_sampler, _host_sampler("auto")
        ),
    )
    if opts.sample_hz != 0 and not 1 <= opts.sample_hz <= 1000:
        raise ConfigError(f"invalid option sample_hz: must be 0 (off) or between 1 and 1000, got {opts.sample_hz}")
    if not 0.1 <= opts.sample_system_hz <= 1000:
        raise ConfigError(f"invalid option sample_system_hz: must be between 0.1 and 1000, got {opts.sample_system_hz}")
    for field in ("buffer_size", "segment_size", "compression_level", "sample_history"):
        if getattr(opts, field) < 0:
            raise ConfigError(f"invalid option {field}: must not be negative, got {getattr(opts, field)}")
    return opts
