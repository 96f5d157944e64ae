"""Type stubs for the compiled module ``fastprof._core`` (see rust/fastprof-py)."""

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar, final

_F = TypeVar("_F", bound=Callable[..., Any])

__version__: str

class FastprofError(Exception): ...
class FastprofWarning(UserWarning): ...
class ConfigError(FastprofError, ValueError): ...
class AlreadyRunningError(FastprofError, RuntimeError): ...
class NotRunningError(FastprofError, RuntimeError): ...

class TraceError(FastprofError, ValueError):
    path: str
    offset: int
    reason: str

class FastprofFileNotFoundError(FastprofError, FileNotFoundError): ...
class FastprofPermissionError(FastprofError, PermissionError): ...
class FastprofOSError(FastprofError, OSError): ...

@final
class Name:
    """An interned name: a reusable span context manager and decorator."""

    @property
    def name(self) -> str: ...
    @property
    def id(self) -> int: ...
    def begin(self) -> None: ...
    def __enter__(self) -> Name: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        _exc: BaseException | None = None,
        _tb: TracebackType | None = None,
    ) -> bool: ...
    def __call__(self, func: _F) -> _F: ...

@final
class ArgSpan:
    """A span carrying args (made per call)."""

    def __enter__(self) -> ArgSpan: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        _exc: BaseException | None = None,
        _tb: TracebackType | None = None,
    ) -> bool: ...
    def __call__(self, func: _F) -> _F: ...

@final
class _NullSpan:
    """Enter and exit do nothing (benchmark floor)."""

    def __init__(self) -> None: ...
    def __enter__(self) -> _NullSpan: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        _exc: BaseException | None = None,
        _tb: TracebackType | None = None,
    ) -> bool: ...

def span(name: str | Name, **args: Any) -> Name | ArgSpan: ...
def name_id(name: str | Name) -> Name: ...
def end() -> None: ...
def instant(name: str | Name, **args: Any) -> None: ...
def counter(name: str | Name, value: float | Mapping[str, float]) -> None: ...
def start(
    trace_dir: str,
    run_name: str,
    rank: int,
    world_size: int,
    local_rank: int,
    buffer_size: int,
    flush_interval: float,
    segment_size: int,
    segment_seconds: float,
    compression_level: int,
    extra_config_json: str,
    sample_hz: float = 0.0,
    sample_per_cpu: bool = False,
    sample_gpus: list[str] | None = None,
    sample_history: int = 65536,
    sample_host: bool = True,
    sample_system_hz: float = 10.0,
) -> None: ...
def stop() -> dict[str, Any]: ...
def is_active() -> bool: ...
def _after_fork_in_child() -> None: ...
def _noop() -> None: ...
def sampler_series() -> dict[str, tuple[Any, Any]]: ...
def sampler_info() -> dict[str, Any] | None: ...
def energy_between(gpu: str, t0_ns: int, t1_ns: int) -> tuple[float, str] | None: ...
def merge(
    inputs: list[str],
    output: str,
    *,
    force: bool = False,
    ranks: list[int] | None = None,
    start: float | None = None,
    end: float | None = None,
    steps: tuple[int, int] | None = None,
    include_categories: list[str] = ...,
    exclude_categories: list[str] = ...,
    max_bytes: int | None = None,
    threads: int = 0,
    compression_level: int = 1,
    progress: bool = False,
) -> dict[str, Any]: ...
def read_trace(path: str) -> tuple[Any, list[str], bool, int]: ...
def read_columns(
    paths: list[str],
    *,
    names: list[str] | None = None,
    name_prefixes: list[str] = ...,
    categories: list[str] | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    spans: bool = True,
    instants: bool = True,
    counters: bool = True,
) -> dict[str, Any]: ...
