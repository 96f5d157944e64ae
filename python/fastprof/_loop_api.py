"""The Profiler as the parts around its training loop see it.

:class:`fastprof.Profiler` (``fastprof/profiler/loop.py``) owns the loop;
other parts work beside it: its drivers (:mod:`fastprof.profiler.drivers`, the triggers),
exit and SIGTERM handling (:mod:`fastprof.profiler.exits`), the end of a run
(:mod:`fastprof.profiler.outputs`), out-of-memory capture
(:mod:`fastprof.memory.oom`) and ``fastprof run``'s zero-code host
(:mod:`fastprof.run`). Each types the Profiler as one of the protocols
here, which name everything it may use; none touches a private attribute
of the Profiler, and none imports the Profiler's module (so no import
circle, not even a type-only one, runs through it). The Profiler implements
them all; mypy checks that where it hands itself to a part.

The protocols, each adding to :class:`LoopHost` what one part needs:

* :class:`LoopHost`: where the run records, the position of the loop,
  whether the Profiler runs, and on which thread;
* :class:`TriggerHost`: the format variables of file names;
* :class:`ExitHost`: closing for a way out, the flight recorder's last seconds;
* :class:`RunEndHost`: the account of the run and what the merge needs;
* :class:`RunHost`: ``fastprof run``'s inferred steps and timed loader passes.

This module may import only what imports nothing of the parts above: the
protocols are read by them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fastprof.recording.recorder import Recorder

__all__ = ["ExitHost", "LoopHost", "RunEndHost", "RunHost", "TriggerHost", "Window"]

T = TypeVar("T")


class Window(Protocol):
    """One torch.profiler window, as the Profiler's summary lists it
    (``fastprof.profiler.torch_windows.WindowRecord``)."""

    last_step: int
    path: str | None
    error: str | None

    def to_dict(self) -> dict[str, Any]: ...


class LoopHost(Protocol):
    """What every part may read of the Profiler."""

    @property
    def recorder(self) -> Recorder:
        """The recorder the run records into (the Profiler's own, or one it borrows)."""

    @property
    def run_dir(self) -> Path: ...

    @property
    def rank_dir(self) -> Path: ...

    @property
    def rank(self) -> int: ...

    @property
    def batch(self) -> int:
        """The global step of the current step (steps ended so far)."""

    @property
    def epoch(self) -> int: ...

    @property
    def batch_in_epoch(self) -> int: ...

    @property
    def running(self) -> bool:
        """Started and not yet closing (False before ``start()``, once
        ``stop()`` began, and when the run directory could not be written)."""

    @property
    def stopped(self) -> bool:
        """Closed (``stop()`` is over)."""

    def on_training_thread(self) -> bool:
        """Whether the caller runs on the thread that started the Profiler
        (the training loop's: steps are counted there only)."""


class TriggerHost(LoopHost, Protocol):
    """What the drivers that name files (the triggers, memory, torch windows) use."""

    def format_variables(self) -> dict[str, Any]:
        """The file-name format variables now (``{run_name}``, ``{rank}``, ``{epoch}``...)."""


class ExitHost(LoopHost, Protocol):
    """What exit and SIGTERM handling (:mod:`fastprof.profiler.exits`) use."""

    def close(self, reason: str | None = None) -> Path | None:
        """``stop()``, for a way out that is not a normal end (``"exit"``,
        ``"SIGTERM"``, ``"exception: <type>"``); a Profiler not running is left alone."""

    def dump_flight_recorder(self, reason: str) -> None:
        """An event ending the run (``"sigterm"``, ``"exception"``, ``"oom"``):
        the flight recorder's last seconds are dumped now, when the triggers
        ask for it."""


class RunEndHost(LoopHost, Protocol):
    """What the end of a run (:mod:`fastprof.profiler.outputs`) uses."""

    merge_enabled: bool
    merge_timeout: float
    #: Set by the merge: the unified trace and what the merger said.
    trace_path: Path | None
    #: A URL run's unified trace in the store, once put there (trace_path is then None).
    trace_url: str | None
    merge_summary: dict[str, Any] | None

    @property
    def owns_recorder(self) -> bool:
        """Whether the Profiler started its recorder (one it borrows is
        neither stopped nor merged by it)."""

    @property
    def exit_reason(self) -> str | None:
        """How the run ended, None for a normal ``stop()`` (see :meth:`ExitHost.close`)."""

    def account(self) -> dict[str, Any]:
        """``profiler.json``'s account of the run: steps, schedule, memory,
        torch windows, triggers, clock syncs (the disk cap and the exit are
        added by :mod:`fastprof.profiler.outputs`)."""


class RunHost(LoopHost, Protocol):
    """What ``fastprof run`` (:mod:`fastprof.run`) uses: the framework-loop
    API for the steps it infers, and the pieces of :meth:`Profiler.loader`
    for the DataLoader passes it times."""

    merge_enabled: bool
    #: Steps ended by an optimizer step (profiler.json's ``steps_by_optimizer``).
    steps_by_optimizer: int

    @property
    def successor(self) -> LoopHost | None:
        """The script's own Profiler that took the loop (the latest), None when none did."""

    def start(self, *, defer_step: bool = False) -> object: ...

    def close_after(self, exc: BaseException | None) -> None:
        """Close as ``with prof:`` does when its block ends with ``exc`` (an
        out-of-memory error captured first, the reason recorded)."""

    def begin_epoch(self, epoch_len: int | None = None) -> None: ...

    def end_epoch(self) -> None: ...

    def begin_step(self) -> None: ...

    def step(self) -> None: ...

    def remove_optimizer_hook(self) -> None:
        """The Profiler's own ``optimizer.step()`` hook goes (``fastprof run``
        installs one that replaces it, so each optimizer step counts once)."""

    def hook_torch_phases(self) -> None:
        """Time each step's phases once torch is imported (``fastprof run``
        calls it when the job imports torch after the Profiler started)."""

    def quiet_torch_windows(self) -> None:
        """Keep Kineto's log lines of the windows triggers open out of the
        job's stderr (a script that asked for no window)."""

    def open_pass(
        self, it: Iterable[T], name: str, train: bool, opener: Callable[[Iterable[T]], Iterator[T]] = ...
    ) -> Iterator[T]:
        """A pass over ``it`` begins (workers instrumented, batch size
        counted, ``loader.<name>.iter`` timed around ``opener(it)``); returns
        the pass's iterator."""

    def timed(self, iterator: Iterator[T], name: str) -> Iterator[T]:
        """``iterator`` with each ``next()`` timed as ``loader.<name>.next``,
        without step bookkeeping."""

    def sync_clocks_once(self, phase: str) -> None:
        """The clock sync of ``phase`` across ranks, unless clock syncs are
        off or that phase's is done (``fastprof run``: the start sync, once
        the script made its process group)."""

    def host_run(self, on_step_aside: Callable[[], None]) -> None:
        """Make this Profiler ``fastprof run``'s host: a Profiler the script
        starts on its recorder takes the loop, and ``on_step_aside`` is called
        then to unhook the inferred steps."""
