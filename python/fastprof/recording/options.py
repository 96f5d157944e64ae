"""The one table of recorder options.

Each option is written once, here: its name, type, default, environment
variable(s), the values it accepts (with the sentence an error prints) and the
trade-off it controls. Everything else is derived from the table:

* :func:`resolve`: explicit argument > ``FASTPROF_*`` variable > default, plus
  torchrun's RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / GROUP_RANK,
  with every check made here, before anything starts;
* the options section of :class:`fastprof.Recorder`'s docstring;
* README's options table (``python -m fastprof.recording.options_doc``, kept apart so
  that ``-m`` does not run a module the package has already imported; a test
  fails when README differs).

Ranges are those the Rust core accepts (``Config::validate`` in
``rust/fastprof-core/src/runtime/config.rs`` and the u32/usize/u64 parameters of
``_core.start``), or narrower, so a value accepted here never fails later
with an ``OverflowError`` or a core error.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import string
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastprof._core import DEFAULT_BUFFER_GROWTH, DEFAULT_SAMPLE_HZ, ConfigError
from fastprof.storage import urls as _urls

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
#: config.rs MIN_SEGMENT_SIZE: below it the per-segment metadata dominates.
MIN_SEGMENT_SIZE = 64 << 10
#: config.rs MAX_BUFFER_SIZE: 2^26 slots is 1.5 GiB per thread.
MAX_BUFFER_SIZE = 1 << 26
#: 16 bytes per sample per metric: 2^24 samples are 256 MiB per metric, 19 days at 10 Hz.
MAX_SAMPLE_HISTORY = 1 << 24

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"64MiB"``, ``"64M"``, ``"65536"`` -> bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 65536, 64K, 256MiB)")
    whole, _, frac = m.group(1).partition(".")
    unit = _UNITS[m.group(2).lower()]
    # Exact integer arithmetic: float would round sizes above 2**53.
    num = int(whole + frac) * unit
    den: int = 10 ** len(frac)
    if num % den:
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return num // den


# ----------------------------------------------------------- value parsers
# Each turns an argument or an environment string into the option's type, or
# raises TypeError / ValueError / OverflowError (reported with the option's
# `expect` sentence, so the reasons need not be worded here).


def _int(v: object) -> int:
    if isinstance(v, bool):
        raise TypeError("a bool is not an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        return int(v.strip(), 10)
    raise TypeError(f"not an integer: {v!r}")


def _size(v: object) -> int:
    return parse_size(v) if isinstance(v, str) else _int(v)


def _float(v: object) -> float:
    if isinstance(v, bool):
        raise TypeError("a bool is not a number")
    if isinstance(v, (int, float, str)):
        return float(v)  # OverflowError for ints beyond a double
    raise TypeError(f"not a number: {v!r}")


def _bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str):
        text = v.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    raise ValueError(f"not a boolean: {v!r}")


def _str(v: object) -> str:
    if isinstance(v, (str, os.PathLike)):
        return str(os.fspath(v))
    raise TypeError(f"not a string: {v!r}")


def _choice(*choices: str) -> Callable[[object], str]:
    def parse(v: object) -> str:
        text = _str(v).strip().lower()
        if text not in choices:
            raise ValueError(text)
        return text

    return parse


def _gpus(v: object) -> str | list[str]:
    """``"auto"``/``"all"``/``"none"``, or a list of NVML indices / UUIDs."""
    if isinstance(v, str):
        text = v.strip().lower()
        if text in ("auto", "all", "none"):
            return text
        items: list[object] = [x.strip() for x in v.split(",") if x.strip()]
    elif isinstance(v, int):
        items = [v]
    elif isinstance(v, (list, tuple)):
        items = list(v)
    else:
        raise TypeError(f"not a GPU selection: {v!r}")
    out = []
    for x in items:
        if isinstance(x, str) and x[:1].isalpha() and x.isprintable() and " " not in x and "," not in x:
            out.append(x)  # a UUID ("GPU-..." / "MIG-..."), looked up by NVML
        elif 0 <= _int(x) <= U32_MAX:
            out.append(str(_int(x)))
        else:
            raise ValueError(f"not a device index: {x!r}")
    if not out and isinstance(v, str):
        raise ValueError("no device given")
    return out  # [] (an empty list): no NVML, as "none"


# ------------------------------------------------------------------ checks


def _between(lo: float, hi: float) -> Callable[[Any], bool]:
    return lambda v: math.isfinite(v) and lo <= v <= hi


def _zero_or_between(lo: float, hi: float) -> Callable[[Any], bool]:
    return lambda v: math.isfinite(v) and (v == 0 or lo <= v <= hi)


def _anything(v: Any) -> bool:
    return True


# ------------------------------------------------------------------- table


@dataclass(frozen=True)
class Option:
    """One recorder option."""

    name: str
    #: For the docs: int, size, float, bool, str, path, choice, gpus.
    type: str
    #: The value when neither an argument nor the environment gives one
    #: (None: computed in :func:`resolve`, as the run name is).
    default: Any
    #: Environment variables, first set wins.
    env: tuple[str, ...]
    #: What a good value is; errors say "expected <expect>".
    expect: str
    #: The trade-off the option controls.
    doc: str
    #: The default as the docs show it.
    default_doc: str
    parse: Callable[[object], Any]
    check: Callable[[Any], bool] = _anything


_FASTPROF = "FASTPROF_"

#: The options of :class:`fastprof.Recorder`, in its signature's order.
OPTIONS: tuple[Option, ...] = (
    Option(
        "out_dir",
        "path",
        "fastprof_runs",
        ("FASTPROF_OUT_DIR",),
        "a directory path or a storage URL: s3://, gs://, az://, file:// (format variables allowed)",
        "Parent of the run directory `<out_dir>/<run_name>/rank{R}/`. A URL records into `spool_dir` and "
        "uploads each closed file there "
        "(needs `fastprof-torch[s3]`, `[gcs]` or `[azure]`; see docs/object-storage.md).",
        "`fastprof_runs`",
        _str,
        lambda v: v != "",
    ),
    Option(
        "run_name",
        "str",
        None,
        ("FASTPROF_RUN_NAME",),
        "a plain directory name (format variables allowed)",
        "The run directory's name; every rank of a job must agree on it. When an earlier run holds it, "
        "this run takes `<run_name>-2` (`-3`, ...) and says so on stderr (see `resume`).",
        "`run-<timestamp>` (torchrun: `run-<run id>`)",
        _str,
    ),
    Option(
        "rank",
        "int",
        0,
        ("FASTPROF_RANK", "RANK"),
        f"an integer between 0 and {U32_MAX - 1}",
        "This process's rank (segments go to `rank{R}/`); torchrun sets RANK.",
        "0",
        _int,
        _between(0, U32_MAX - 1),
    ),
    Option(
        "resume",
        "bool",
        False,
        ("FASTPROF_RESUME",),
        "a boolean (1/0, true/false, yes/no, on/off)",
        "Append to an earlier run of the same `run_name` (a job restarted after preemption) instead of "
        "recording in `<run_name>-2`; the report shows the time between the runs as idle.",
        "off (a new `<run_name>-N`)",
        _bool,
    ),
    Option(
        "buffer_size",
        "size",
        1 << 20,
        ("FASTPROF_BUFFER_SIZE",),
        f"a number of events between 16 and {MAX_BUFFER_SIZE} (2**26; accepts 1M)",
        "Events per thread ring, rounded up to a power of two: 24 B of address space "
        "per slot per recording thread (committed as used); bigger survives longer bursts without drops.",
        "1Mi events",
        _size,
        _between(16, MAX_BUFFER_SIZE),
    ),
    Option(
        "buffer_growth",
        "size",
        DEFAULT_BUFFER_GROWTH,
        ("FASTPROF_BUFFER_GROWTH",),
        "bytes between 0 and 64Gi (accepts 256M; 0 = never grow)",
        "Memory every thread's ring may grow into together when full (a burst the writer cannot keep up "
        "with) instead of dropping events; given back once the writer has caught up. Drops are counted past it.",
        f"{DEFAULT_BUFFER_GROWTH >> 20} MiB",
        _size,
        _between(0, 64 << 30),
    ),
    Option(
        "flush_interval",
        "float",
        1.0,
        ("FASTPROF_FLUSH_INTERVAL",),
        "seconds between 0.001 and 3600",
        "Seconds between writer flushes: the most a killed process loses; "
        "shorter costs more syscalls and slightly worse compression.",
        "1.0 s",
        _float,
        _between(0.001, 3600),
    ),
    Option(
        "segment_size",
        "size",
        256 << 20,
        ("FASTPROF_SEGMENT_SIZE",),
        "a size in bytes between 65536 (64KiB) and 2**64 - 1 (accepts 256MiB)",
        "Compressed bytes per segment file before the next begins: smaller bounds what "
        "one corrupt file takes with it; each segment repeats the metadata.",
        "256 MiB",
        _size,
        _between(MIN_SEGMENT_SIZE, U64_MAX),
    ),
    Option(
        "segment_seconds",
        "float",
        0.0,
        ("FASTPROF_SEGMENT_SECONDS",),
        "0 (off) or a number of seconds above 0",
        "Also close a segment after this many seconds, so closed files appear at a steady pace.",
        "0 (off)",
        _float,
        lambda v: math.isfinite(v) and v >= 0,
    ),
    Option(
        "max_disk",
        "size",
        0,
        ("FASTPROF_MAX_DISK",),
        "0 (unbounded) or a size in bytes of at least two segments (2 x segment_size; accepts 10GiB)",
        "Most bytes this rank's segment files take together: beyond it the oldest closed segments "
        "are deleted (never the open one), so a long job keeps its newest data in bounded disk; "
        "each deletion is recorded in the metadata and said by merge and report.",
        "0 (unbounded)",
        _size,
        _between(0, U64_MAX),
    ),
    Option(
        "keep_segments",
        "int",
        0,
        ("FASTPROF_KEEP_SEGMENTS",),
        f"0 (all) or a number of segments between 1 and {U32_MAX}",
        "Most closed segments kept besides the open one; older ones are deleted first, as for `max_disk`.",
        "0 (all)",
        _int,
        _between(0, U32_MAX),
    ),
    Option(
        "compression_level",
        "int",
        1,
        ("FASTPROF_COMPRESSION_LEVEL",),
        "an integer between 1 and 9",
        "gzip level, 1 = fastest, 9 = smallest: the writer thread's CPU against disk.",
        "1",
        _int,
        _between(1, 9),
    ),
    Option(
        "sample_hz",
        "float",
        DEFAULT_SAMPLE_HZ,
        ("FASTPROF_SAMPLE_HZ",),
        "0 (off) or ticks per second between 1 and 1000",
        "Sampler ticks per second for this process, its children and its GPUs: "
        "finer readings against the sampler thread's CPU (~40-80 us per tick).",
        f"{DEFAULT_SAMPLE_HZ:g} (0 = off)",
        _float,
        _zero_or_between(1, 1000),
    ),
    Option(
        "sample_system_hz",
        "float",
        10.0,
        ("FASTPROF_SAMPLE_SYSTEM_HZ",),
        "reads per second between 0.1 and 1000",
        "Reads per second of the host-wide CPU, load, memory, swap, disk and network "
        "(at most `sample_hz`): /proc/stat counts CPU in 10 ms units per core, so "
        "faster reads of system CPU are mostly quantisation noise.",
        "10",
        _float,
        _between(0.1, 1000),
    ),
    Option(
        "sample_per_cpu",
        "bool",
        False,
        ("FASTPROF_SAMPLE_PER_CPU",),
        "a boolean (1/0, true/false, yes/no, on/off)",
        "Also one utilisation track per core: one more series per core in the trace.",
        "off",
        _bool,
    ),
    Option(
        "sample_gpus",
        "gpus",
        "auto",
        ("FASTPROF_SAMPLE_GPUS",),
        '"auto", "all", "none", or NVML indices / UUIDs (e.g. "0,1")',
        "GPUs NVML samples: `auto` is the device this rank uses (every visible one in a "
        "single process); indices match CUDA's only under CUDA_DEVICE_ORDER=PCI_BUS_ID.",
        "`auto`",
        _gpus,
    ),
    Option(
        "sample_history",
        "size",
        1 << 16,
        ("FASTPROF_SAMPLE_HISTORY",),
        f"a number of samples between 2 and {MAX_SAMPLE_HISTORY}",
        "Samples kept in memory per metric for `Recorder.counters()` (16 B each); the trace keeps every sample.",
        "65536",
        _size,
        _between(2, MAX_SAMPLE_HISTORY),
    ),
    Option(
        "host_sampler",
        "choice",
        "auto",
        ("FASTPROF_HOST_SAMPLER",),
        '"auto", "procfs" or "psutil"',
        "Who reads the host: `procfs` (Rust, Linux, never needs the GIL) or `psutil` "
        "(a Python thread, for other OSes); `auto` picks procfs on Linux.",
        "`auto`",
        _choice("auto", "procfs", "psutil"),
    ),
    Option(
        "window_seconds",
        "float",
        0.0,
        ("FASTPROF_WINDOW_SECONDS",),
        "0 (off) or seconds between 1 and 86400",
        "Flight recorder: keep the last T seconds of events in memory, to dump on demand; "
        "longer windows hold more memory (bounded by `window_bytes`).",
        "0 (off)",
        _float,
        _zero_or_between(1, 86400),
    ),
    Option(
        "window_bytes",
        "size",
        64 << 20,
        ("FASTPROF_WINDOW_BYTES",),
        "a size in bytes between 1MiB and 16GiB (accepts 64MiB)",
        "Compressed bytes the flight-recorder window may hold; when full, the oldest events go first.",
        "64 MiB",
        _size,
        _between(1 << 20, 16 << 30),
    ),
    Option(
        "spool_dir",
        "path",
        None,
        ("FASTPROF_SPOOL_DIR",),
        "a directory path (format variables allowed)",
        "With `out_dir` a URL (`s3://`, `gs://`, `az://`, `file://`): the local folder a rank records into "
        "before its files are uploaded (each file leaves it once in the store), `<spool_dir>/<run_name>/rank{R}/`.",
        "`<tempdir>/fastprof-spool/<bucket and path>`",
        _str,
        lambda v: v != "",
    ),
    Option(
        "upload_timeout",
        "float",
        20.0,
        ("FASTPROF_UPLOAD_TIMEOUT",),
        "seconds between 0 and 3600",
        "With `out_dir` a URL: the most seconds the end of a recording (a normal end, SIGTERM) waits for "
        "the last uploads; what is not sent by then stays in the spool, and stderr names the command that sends it.",
        "20 s",
        _float,
        _between(0, 3600),
    ),
)

#: ``segment_seconds`` when ``out_dir`` is a URL and it is not given: a
#: segment closes, and so is uploaded, at least this often (at the default
#: ``segment_size`` a rank's segment would otherwise stay open for hours).
URL_SEGMENT_SECONDS = 300.0

#: Read from torchrun's environment only (no argument, no FASTPROF_ variable).
TORCHRUN: tuple[Option, ...] = (
    Option(
        "world_size",
        "int",
        1,
        ("WORLD_SIZE",),
        f"an integer between 1 and {U32_MAX}",
        "Processes in the job.",
        "1",
        _int,
        _between(1, U32_MAX),
    ),
    Option(
        "local_rank",
        "int",
        0,
        ("LOCAL_RANK",),
        f"an integer between 0 and {U32_MAX}",
        "This process's rank on its node (picks its GPU).",
        "0",
        _int,
        _between(0, U32_MAX),
    ),
    Option(
        "local_world_size",
        "int",
        1,
        ("LOCAL_WORLD_SIZE",),
        f"an integer between 1 and {U32_MAX}",
        "Processes on this node.",
        "1",
        _int,
        _between(1, U32_MAX),
    ),
    Option(
        "node_rank",
        "int",
        0,
        ("GROUP_RANK",),
        f"an integer between 0 and {U32_MAX}",
        "This node's rank.",
        "0",
        _int,
        _between(0, U32_MAX),
    ),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS + TORCHRUN}
#: Every environment variable the options read.
ENV_VARS: tuple[str, ...] = tuple(v for o in OPTIONS + TORCHRUN for v in o.env)


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
    #: Append to an earlier run of the same name instead of taking a new ``<run_name>-N``.
    resume: bool
    buffer_size: int
    #: Bytes the rings may grow into together when full (0: never).
    buffer_growth: int
    flush_interval: float
    segment_size: int
    segment_seconds: float
    #: Disk cap of this rank's segments in bytes (0 = unbounded), and most closed segments kept (0 = all).
    max_disk: int
    keep_segments: int
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
    #: Flight-recorder window in seconds (0 = off) and the compressed bytes it may hold.
    window_seconds: float
    window_bytes: int
    #: With a URL ``out_dir``: the local spool root (``out_dir`` is then
    #: ``<spool_dir>``: everything is written there first) and the bound of
    #: the last uploads.
    spool_dir: Path | None
    upload_timeout: float
    #: The URL ``out_dir`` was given as (None: a local run directory). The
    #: run's objects go to ``<out_url>/<run_name>/rank{R}/...``.
    out_url: str | None = None

    @property
    def run_url(self) -> str | None:
        """``<out_url>/<run_name>``, or None for a local run."""
        return None if self.out_url is None else f"{self.out_url}/{self.run_name}"

    @property
    def rank_url(self) -> str | None:
        """``<out_url>/<run_name>/rank{R}`` (where this rank's objects go), or None for a local run."""
        return None if self.out_url is None else f"{self.run_url}/rank{self.rank}"

    @property
    def run_dir(self) -> Path:
        return self.out_dir / self.run_name

    @property
    def trace_dir(self) -> Path:
        return self.run_dir / f"rank{self.rank}"


# -------------------------------------------------------------- resolution


def _origin(opt: Option, given: object, env: Mapping[str, str]) -> str:
    """Where a value came from, as an error message names it."""
    if given is None:
        for var in opt.env:
            raw = env.get(var)
            if raw is not None and raw.strip() != "":
                return f"environment variable {var}={raw!r} (option {opt.name})"
    return f"option {opt.name}"


def _parsed(opt: Option, raw: object) -> tuple[bool, Any]:
    """``(True, value)`` when ``raw`` parses and passes the option's check."""
    try:
        v = opt.parse(raw)
        return bool(opt.check(v)), v
    except (TypeError, ValueError, OverflowError):
        return False, None


def prefixed(prefix: str) -> Callable[..., Option]:
    """The maker of a config object's options (``TorchWindows``,
    ``MemoryHistory``, ``Triggers``): each one's variable is
    ``FASTPROF_<PREFIX>_<NAME>`` and its documented default its repr."""

    def make(name: str, kind: str, default: Any, expect: str, doc: str, parse: Any, check: Any = None) -> Option:
        args = (name, kind, default, (f"FASTPROF_{prefix}_{name.upper()}",), expect, doc, repr(default), parse)
        return Option(*args) if check is None else Option(*args, check)

    return make


#: The variables a config object's folder or file name may use.
FORMAT_VARIABLES = (
    "run_name",
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "epoch",
    "batch",
    "batch_in_epoch",
)


def check_format(option: str, text: str, owner: str) -> None:
    """Check a config object's format-string option (a folder or file name
    over :data:`FORMAT_VARIABLES`); errors name ``owner`` (the config object,
    e.g. ``TorchWindows``), the option and the text."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise ConfigError(f"{owner}: invalid {option} {text!r}: {e}") from None
    for f in fields:
        if f not in FORMAT_VARIABLES:
            known = ", ".join("{" + k + "}" for k in FORMAT_VARIABLES)
            raise ConfigError(f"{owner}: invalid {option} {text!r}: unknown format variable {{{f}}} (known: {known})")


def _value(opt: Option, given: object, env: Mapping[str, str]) -> Any:
    """Explicit argument > first set environment variable > default, checked."""
    if given is not None:
        ok, v = _parsed(opt, given)
        if not ok:
            raise ConfigError(f"invalid option {opt.name}: expected {opt.expect}, got {given!r}")
        return v
    for var in opt.env:
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            continue
        ok, v = _parsed(opt, raw)
        if not ok:
            raise ConfigError(f"invalid environment variable {var}={raw!r} (option {opt.name}): expected {opt.expect}")
        return v
    return opt.default


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


def _format(key: str, text: str, fmt: Mapping[str, Any], given: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """Fill the file-name format variables ({rank}, {run_name}, ...) of out_dir / run_name."""
    try:
        return text.format(**fmt)
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        origin = _origin(BY_NAME[key], given.get(key), env)
        known = ", ".join("{" + k + "}" for k in fmt)
        raise ConfigError(f"invalid {origin}: unknown or malformed format variable {e} (known: {known})") from None


def spool_name(url: str) -> str:
    """The default spool folder of ``url``: its bucket and path as one
    plain name (``s3://b/runs`` -> ``s3-b-runs``), so jobs writing to
    different places on one host never share a spool."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", url).strip("-.") or "store"


def _explicit(opt: Option, given: object, env: Mapping[str, str]) -> object:
    """The value given for ``opt`` by argument or environment, None when
    neither gave one (its default applies)."""
    if given is not None:
        return given
    for var in opt.env:
        raw = env.get(var)
        if raw is not None and raw.strip() != "":
            return raw
    return None


def resolve(
    out_dir: str | os.PathLike[str] | None = None,
    run_name: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    **given: Any,
) -> Options:
    """Resolve every option from arguments (None = not given), ``FASTPROF_*``
    variables and torchrun's environment, and check each; raises
    :class:`fastprof.ConfigError` naming the option (and the variable)."""
    env = os.environ if env is None else env
    unknown = sorted(set(given) - {o.name for o in OPTIONS})
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(unknown)}")
    given = {**given, "out_dir": out_dir, "run_name": run_name}
    v: dict[str, Any] = {o.name: _value(o, given.get(o.name), env) for o in TORCHRUN + OPTIONS}
    # A rank given by hand outside torchrun implies a world at least that big
    # (rank <= 2**32 - 2, so this still fits the core's u32).
    v["world_size"] = max(v["world_size"], v["rank"] + 1)
    fmt: dict[str, Any] = {k: v[k] for k in ("rank", "local_rank", "world_size", "local_world_size", "node_rank")}
    v["run_name"] = _format(
        "run_name", v["run_name"] or _default_run_name(env, v["world_size"], Path(v["out_dir"])), fmt, given, env
    )
    name = fmt["run_name"] = v["run_name"]
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        origin = _origin(BY_NAME["run_name"], given["run_name"], env)
        raise ConfigError(f"invalid {origin}: expected {BY_NAME['run_name'].expect}, got {name!r}")
    if v["max_disk"] and v["max_disk"] < 2 * v["segment_size"]:
        origin = _origin(BY_NAME["max_disk"], given.get("max_disk"), env)
        seg = v["segment_size"]
        raise ConfigError(
            f"invalid {origin}: expected 0 (no cap) or room for at least two segments of segment_size "
            f"({seg} bytes each: the open one and a closed one), so at least {2 * seg} bytes, got "
            f"{v['max_disk']}; raise max_disk or lower segment_size"
        )
    out = _format("out_dir", v["out_dir"], fmt, given, env)
    v["out_url"] = None
    # A URL that names no place (s3:// with no bucket, a scheme nobody
    # serves) is refused here, before a spool or a local folder named after
    # it (./s3:/run) exists.
    _urls.check_location(out, _origin(BY_NAME["out_dir"], given.get("out_dir"), env))
    if _urls.needs_spool(out):
        # Records into a local spool; the uploader sends what closes.
        v["out_url"] = out.rstrip("/")
        spool = (
            _format("spool_dir", v["spool_dir"], fmt, given, env)
            if v["spool_dir"]
            else os.path.join(tempfile.gettempdir(), "fastprof-spool", spool_name(out))
        )
        # A URL, or s3:/x (a local folder named s3:), is refused.
        _urls.check_local_dir(spool, _origin(BY_NAME["spool_dir"], given.get("spool_dir"), env))
        v["spool_dir"] = Path(spool)
        out = spool
        if _explicit(BY_NAME["segment_seconds"], given.get("segment_seconds"), env) is None:
            v["segment_seconds"] = URL_SEGMENT_SECONDS
    elif v["spool_dir"] is not None:
        v["spool_dir"] = Path(_format("spool_dir", v["spool_dir"], fmt, given, env))  # used only with a URL
    v["out_dir"] = Path(out)
    v["sample_gpus"] = resolve_gpus(v["sample_gpus"], env, v["local_rank"], v["world_size"])
    if v["host_sampler"] == "auto":
        v["host_sampler"] = "procfs" if sys.platform.startswith("linux") else "psutil"
    return Options(**v)


# -------------------------------------------------------------------- docs


def _env_doc(o: Option) -> str:
    return ", then ".join(f"``{e}``" for e in o.env)


def docstring() -> str:
    """The options section of :class:`fastprof.Recorder`'s docstring."""
    lines = ["Options:"]
    for o in OPTIONS:
        rst = o.doc.replace("`", "``")
        text = f"{o.name}: {rst} ({_env_doc(o)}; default {o.default_doc.replace('`', '``')}; accepts {o.expect})"
        lines += textwrap.wrap(text, 96, initial_indent="    ", subsequent_indent="        ")
    return "\n".join(lines) + "\n"
