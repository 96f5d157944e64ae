"""Triggers' options (:class:`Triggers`), their constants, and the request a
trigger file holds (:func:`parse_request`)."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastprof._core import ConfigError
from fastprof.profiler import slow_step
from fastprof.recording import names
from fastprof.recording.options import Option, _bool, _float, _int, _str, _value, check_format, prefixed

__all__ = [
    "DEFAULT_FLIGHT_SECONDS",
    "LIVE_FILE",
    "OPTIONS",
    "REMOTE_POLL_S",
    "STATE_FILE",
    "TRIGGER_FILE",
    "Triggers",
    "new_request_id",
    "parse_request",
]

#: The trigger file's name (in the run directory for every rank, in a rank's folder for that rank).
TRIGGER_FILE = names.TRIGGER_FILE
#: Seconds between two looks at a URL run's trigger objects in the store.
REMOTE_POLL_S = 10.0
#: Written in a rank's folder while its Profiler runs (pid, host, signal).
LIVE_FILE = names.LIVE_JSON
#: A rank's record of requests, captures, dumps and anomalies.
STATE_FILE = names.TRIGGERS_JSON
#: The flight window the Profiler turns on when triggers dump and the recorder keeps none.
DEFAULT_FLIGHT_SECONDS = 30.0
FLIGHT_EVENTS = ("trigger", "anomaly", "exception", "oom", "sigterm")
#: Bounds, so that nothing grows with a long run's requests.
MAX_RECORDS = 200
MAX_LEAD = 10_000
#: An anomaly is a slow step by the one rule (:mod:`fastprof.profiler.slow_step`):
#: also beyond this many (scaled) MADs of the median ...
ANOMALY_MADS = slow_step.MADS
#: ... and at least this much slower than it (microsecond steps are noise at 3x).
ANOMALY_MIN_EXCESS_NS = slow_step.MIN_EXCESS_NS
#: Flight-only requests closer than this to the previous dump are coalesced.
FLIGHT_MIN_INTERVAL_S = 2.0


_opt = prefixed("TRIGGERS")

#: Triggers' options; each has a FASTPROF_TRIGGERS_<NAME> variable.
OPTIONS: tuple[Option, ...] = (
    _opt(
        "signal",
        "str",
        "SIGUSR2",
        "a signal name or number, or off",
        "The signal that asks for a capture and a flight dump (off: none).",
        _str,
    ),
    _opt("file", "bool", True, "a boolean", "Watch <run>/TRIGGER and <run>/rank{R}/TRIGGER.", _bool),
    _opt(
        "poll_s",
        "float",
        1.0,
        "seconds from 0.05 to 3600",
        "How often the trigger files and the store are read (by a thread of their own).",
        _float,
        lambda v: 0.05 <= v <= 3600,
    ),
    _opt(
        "steps",
        "int",
        5,
        "an integer from 1 to 10000",
        "Steps of a triggered torch.profiler capture.",
        _int,
        lambda v: 1 <= v <= 10_000,
    ),
    _opt("flight", "bool", True, "a boolean", "A trigger also dumps the flight recorder.", _bool),
    _opt(
        "flight_on",
        "str",
        ",".join(FLIGHT_EVENTS),
        f"a comma list of {', '.join(FLIGHT_EVENTS)} (or none)",
        "Which events dump the flight recorder.",
        _str,
    ),
    _opt(
        "min_interval_s",
        "float",
        30.0,
        "seconds from 0 to 86400",
        "No capture starts within this time of the previous one; requests in between are coalesced.",
        _float,
        lambda v: 0 <= v <= 86400,
    ),
    _opt(
        "anomaly",
        "bool",
        True,
        "a boolean",
        "Judge each step's time against the recent steps (one comparison per step, in the core).",
        _bool,
    ),
    _opt(
        "anomaly_factor",
        "float",
        slow_step.FACTOR,
        "a number from 1.5 to 1000",
        "A step slower than this many times the median of the recent steps is an anomaly.",
        _float,
        lambda v: 1.5 <= v <= 1000,
    ),
    _opt(
        "anomaly_window",
        "int",
        slow_step.WINDOW,
        "an integer from 8 to 100000",
        "Recent steps the median is taken over (an anomaly needs half of them seen first).",
        _int,
        lambda v: 8 <= v <= 100_000,
    ),
    _opt(
        "anomaly_max",
        "int",
        3,
        "an integer from 0 to 1000",
        "Captures and dumps anomalies may start in a run (0: anomalies are only recorded).",
        _int,
        lambda v: 0 <= v <= 1000,
    ),
    _opt(
        "anomaly_on_contention",
        "bool",
        False,
        "a boolean",
        "A slow step the host caused (the training thread waited for a CPU: fastprof.profiler.contention's rule) "
        "also captures and dumps; off, it is only recorded and counted.",
        _bool,
    ),
    _opt(
        "folder",
        "str",
        "rank{rank}/flight",
        "a folder (format variables allowed)",
        "Where flight dumps go, under the run directory.",
        _str,
    ),
)
_BY_NAME = {o.name: o for o in OPTIONS}


def _signal_number(text: str) -> int | None:
    t = str(text).strip()
    if t.lower() in ("", "off", "none", "0", "false", "no"):
        return None
    try:
        num = int(t)
    except ValueError:
        name = t.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals):
            raise ConfigError(
                f"Triggers: invalid signal {text!r}: not a signal name (e.g. SIGUSR2) or number"
            ) from None
        num = int(sig)
    if num in (signal.SIGKILL, signal.SIGSTOP):
        raise ConfigError(f"Triggers: invalid signal {text!r}: {signal.Signals(num).name} cannot be caught")
    if num in (signal.SIGTERM, signal.SIGINT):
        raise ConfigError(
            f"Triggers: invalid signal {text!r}: {signal.Signals(num).name} ends jobs; use SIGUSR1, SIGUSR2 or another"
        )
    if not 0 < num < signal.NSIG:
        raise ConfigError(f"Triggers: invalid signal {text!r}: out of range 1..{signal.NSIG - 1}")
    return num


@dataclass(frozen=True)
class Triggers:
    """What asks for captures and flight dumps, and what they get (see the
    module documentation). Options not given (None) come from
    ``FASTPROF_TRIGGERS_<NAME>`` variables, then defaults; a bad value is a
    :class:`fastprof.ConfigError` here, before training."""

    # Each None here is resolved in __post_init__ (its variable, then its
    # default), so every field holds a checked value of its option's type.
    signal: Any = None
    file: Any = None
    poll_s: Any = None
    steps: Any = None
    flight: Any = None
    flight_on: Any = None
    min_interval_s: Any = None
    anomaly: Any = None
    anomaly_factor: Any = None
    anomaly_window: Any = None
    anomaly_max: Any = None
    anomaly_on_contention: Any = None
    folder: Any = None
    env: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        env = os.environ if self.env is None else self.env
        for opt in OPTIONS:
            v = getattr(self, opt.name)
            if opt.name == "signal" and isinstance(v, int) and not isinstance(v, bool):
                v = str(v)
            object.__setattr__(self, opt.name, _value(opt, v, env))
        _signal_number(str(self.signal))
        events = self.flight_events
        unknown = sorted(events - set(FLIGHT_EVENTS))
        if unknown:
            raise ConfigError(
                f"Triggers: invalid flight_on {self.flight_on!r}: unknown {', '.join(unknown)} "
                f"(expected a comma list of {', '.join(FLIGHT_EVENTS)}, or none)"
            )
        check_format("folder", str(self.folder), "Triggers")

    @property
    def signal_number(self) -> int | None:
        return _signal_number(str(self.signal))

    @property
    def flight_events(self) -> set[str]:
        text = str(self.flight_on).strip().lower()
        if text in ("", "none", "off"):
            return set()
        return {p.strip() for p in text.split(",") if p.strip()}


def parse_request(text: str, where: str) -> dict[str, Any]:
    """A trigger file's content: empty (the defaults) or a JSON object with
    any of ``id`` (str), ``steps`` (int >= 1), ``flight`` (bool), ``capture``
    (bool). Raises ValueError naming ``where`` and what is wrong."""
    text = text.strip()
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f'{where}: expected a JSON object such as {{"steps": 5}}, got {type(obj).__name__}')
    out: dict[str, Any] = {}
    if "id" in obj:
        out["id"] = str(obj["id"])[:100]
    if "steps" in obj:
        s = obj["steps"]
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 10_000:
            raise ValueError(f"{where}: steps must be an integer from 1 to 10000, got {s!r}")
        out["steps"] = s
    for key in ("flight", "capture"):
        if key in obj:
            if not isinstance(obj[key], bool):
                raise ValueError(f"{where}: {key} must be true or false, got {obj[key]!r}")
            out[key] = obj[key]
    unknown = sorted(set(obj) - {"id", "steps", "flight", "capture", "time", "from"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (expected id, steps, flight, capture)")
    return out


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]
