"""The recorder: a Python handle on one recording session of the Rust core
(start/stop, pause/resume, clock offset, steps, window dump, sampler data),
the stop report, and the process hooks (atexit, fork).

Each ``Recorder`` owns its ``_core.Session``: its sampler readings and
metadata stay with it after ``stop``, so two recorders never see each other's
data. One session records at a time; the module-level ``fastprof.span`` etc.
record into it."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import sys
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastprof import _core
from fastprof._dist import process_group
from fastprof._process import PROCESS
from fastprof._warning_display import said
from fastprof.recording import rundir as _rundir
from fastprof.recording.gpu import inventory
from fastprof.recording.names import FIRST_INDEX_FILE, RESUME_GAP
from fastprof.recording.options import Options, resolve
from fastprof.recording.options import docstring as options_docstring
from fastprof.recording.psutil_sampler import PsutilHostSampler
from fastprof.storage.spool import Spool

# The recorder running now, fastprof run's and those that joined it:
# PROCESS.recorders (fastprof._process).


@dataclass
class RunStats:
    """What the writer reports when a recorder stops."""

    events_written: int
    dropped: int
    dropped_per_thread: dict[int, int]
    segments: list[Path]
    unclosed_spans: int
    bytes_compressed: int
    error: str | None = None
    run_dir: Path | None = None
    #: Why the sampler stopped early, if it failed (recording went on).
    sampler_error: str | None = None
    #: Of ``dropped``: events whose args or name found the payload budget spent.
    payload_dropped: int = 0
    #: What the disk cap (``max_disk``, ``keep_segments``) deleted: ``segments``,
    #: ``bytes``, ``events``, the time range ``ts_start``/``ts_end`` (µs of trace
    #: time) and the newest deletions one by one (``deleted``); None when nothing was.
    rotated: dict[str, Any] | None = None
    #: With ``out_dir`` a URL: what was uploaded, what failed and what is
    #: left in the spool (:meth:`fastprof.storage.uploader.Uploader.close`); None
    #: for a local run, or until a Profiler that owns the upload ends it.
    upload: dict[str, Any] | None = None


def _distributed_info(rank: int, world_size: int) -> dict[str, Any]:
    """Kineto's ``distributedInfo``: the rank and world size this recorder
    writes under, and the process group's backend when one exists."""
    info: dict[str, Any] = {"rank": rank, "world_size": world_size}
    dist = process_group()
    if dist is not None:
        try:
            info["backend"] = str(dist.get_backend())
        except (RuntimeError, ValueError):  # a group being torn down: the rank is what matters
            pass
    return info


class Recorder:
    __doc__ = """Records spans, instants and counters of this process into
    ``<out_dir>/<run_name>/rank{R}/fastprof.{N}.json.gz``.

    Use as a context manager (``with fastprof.Recorder(...) as rec:``) or
    through :func:`fastprof.start` / :func:`fastprof.stop`. One recorder runs
    per process at a time. Options not given (None) come from ``FASTPROF_*``
    environment variables, then defaults; rank and world size come from
    torchrun's environment. Every option is checked here: a bad value raises
    :class:`fastprof.ConfigError` naming the option (and the variable).

""" + textwrap.indent(options_docstring(), "    ")

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        *,
        rank: int | None = None,
        resume: bool | None = None,
        buffer_size: int | str | None = None,
        buffer_growth: int | str | None = None,
        flush_interval: float | None = None,
        segment_size: int | str | None = None,
        segment_seconds: float | None = None,
        max_disk: int | str | None = None,
        keep_segments: int | None = None,
        compression_level: int | None = None,
        sample_hz: float | None = None,
        sample_system_hz: float | None = None,
        sample_per_cpu: bool | None = None,
        sample_gpus: str | int | list[str] | list[int] | None = None,
        sample_history: int | None = None,
        host_sampler: str | None = None,
        window_seconds: float | None = None,
        window_bytes: int | str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        upload_timeout: float | None = None,
    ) -> None:
        # The parameters are exactly the table's options (a test holds them
        # equal), so they go to resolve() by name without being listed again.
        given = {k: v for k, v in locals().items() if k != "self"}
        self.options: Options = resolve(**given)
        self.stats: RunStats | None = None
        self._started = False
        self._psutil: PsutilHostSampler | None = None
        self._session: _core.Session | None = None
        self._pid = os.getpid()
        self._trace_dir: Path | None = None
        #: fastprof run's recorder, when this one joined it (see :meth:`start`).
        self._host: Recorder | None = None
        #: The run directory's choice (see :meth:`choose_run_dir`), made once per Recorder.
        self._choice: _rundir.Choice | None = None
        #: Seconds this rank recorded nothing before a resumed recording (None: not resumed).
        self._resume_gap_s: float | None = None
        #: Extra keys for the trace's ``otherData`` (set before :meth:`start`);
        #: a ``"distributedInfo"`` entry is written at the top level, as Kineto does.
        self.metadata: dict[str, Any] = {}
        o = self.options
        #: With ``out_dir`` a URL: the spool's upload (see :mod:`fastprof.storage.spool`).
        self.spool: Spool | None = (
            Spool(o.out_url, o.spool_dir, o.upload_timeout) if o.out_url is not None and o.spool_dir else None
        )
        #: Set by a Profiler that owns this recorder: it ends the upload
        #: itself, once its own files (profiler.json, memory) are written.
        self.hold_upload = False

    @property
    def run_dir(self) -> Path:
        """``<out_dir>/<run_name>``; from :meth:`start` on, the directory this
        run took (``<run_name>-2`` when an earlier run held the name)."""
        return self.options.run_dir

    @property
    def trace_dir(self) -> Path:
        """Where the segments go: ``<run_dir>/rank{R}`` unless set (before
        :meth:`start`) to another directory, as a DataLoader worker's recorder
        sets ``rank{R}/workers/<loader>-w<id>-pid<pid>``."""
        return self.options.trace_dir if self._trace_dir is None else self._trace_dir

    @trace_dir.setter
    def trace_dir(self, path: str | os.PathLike[str]) -> None:
        if self._started:
            raise _core.AlreadyRunningError("trace_dir cannot change while this recorder runs")
        self._trace_dir = Path(path)

    @property
    def active(self) -> bool:
        """True while this recorder records (paused or not) and no failure stopped it."""
        return self._started and self._session is not None and self._session.active

    @property
    def paused(self) -> bool:
        return self._session is not None and self._started and self._session.paused

    def start(self) -> Recorder:
        """Start recording. Raises :class:`fastprof.ConfigError`,
        :class:`fastprof.AlreadyRunningError` or an ``OSError`` subclass of
        :class:`fastprof.FastprofError` before anything is recorded."""
        state = PROCESS.recorders
        host = state.run_host
        if host is not None and host is not self and host.active and os.getpid() == host._pid and not self._started:
            return self._join(host)
        self.choose_run_dir()
        o = self.options
        extra: dict[str, Any] = {**self.metadata, "out_dir": str(o.out_dir), "local_world_size": o.local_world_size}
        if o.out_url is not None:
            extra["out_url"] = o.out_url
        spool = self.spool if self._trace_dir is None else None
        if spool is not None and o.resume:
            _seed_segment_index(self.trace_dir, spool.next_segment(o.run_name, o.rank))
        if o.sample_hz and o.sample_gpus != []:
            extra["gpu_inventory"] = inventory()
        use_psutil = bool(o.sample_hz) and o.host_sampler == "psutil"
        extra["host_sampler"] = o.host_sampler if o.sample_hz else None
        # Written top-level as Kineto writes it, so that HTA finds the rank.
        extra.setdefault("distributedInfo", _distributed_info(o.rank, o.world_size))
        with state.lock, self._released_if_not_started():
            self._session = _core.Session(
                str(self.trace_dir),
                o.run_name,
                o.rank,
                o.world_size,
                o.local_rank,
                o.buffer_size,
                o.flush_interval,
                o.segment_size,
                o.segment_seconds,
                o.compression_level,
                json.dumps(extra),
                sample_hz=o.sample_hz,
                sample_per_cpu=o.sample_per_cpu,
                sample_gpus=o.sample_gpus,
                sample_history=o.sample_history,
                sample_host=not use_psutil,
                sample_system_hz=o.sample_system_hz,
                window_seconds=o.window_seconds,
                window_bytes=o.window_bytes,
                max_disk=o.max_disk,
                keep_segments=o.keep_segments,
                buffer_growth=o.buffer_growth,
            )
            self._pid = os.getpid()
            self._started = True
            if spool is not None:
                spool.start(self.trace_dir, o.run_name, o.rank, o.local_rank)
            # Processes spawned from here (DataLoader workers under spawn or
            # forkserver) learn that their spans are not recorded.
            os.environ["FASTPROF_RECORDING_PID"] = str(self._pid)
            if use_psutil:
                self._psutil = PsutilHostSampler(o.sample_hz, o.sample_history, o.sample_system_hz)
                self._psutil.start()
            for notice in self._session.take_notices():  # said on stderr by the core when it happened
                warnings.warn(said(f"fastprof: {notice}"), stacklevel=2)
            state.current = self
            if self._resume_gap_s is not None:
                # On the timeline and in the report: the time before this
                # recording that belongs to no step.
                _core.counter(RESUME_GAP, self._resume_gap_s)
                self._resume_gap_s = None
            if not state.atexit_registered:
                atexit.register(_stop_at_exit)
                state.atexit_registered = True
        return self

    @property
    def core_session(self) -> _core.Session | None:
        """The core's session this recorder records into (None before its
        first start): what a Profiler's step loop drives."""
        return self._session

    def choose_run_dir(self) -> None:
        """Take the run directory, once per Recorder (a restart of the same
        Recorder continues its own run): ``run_name``, or ``<run_name>-N``
        when an earlier run holds it, unless ``resume`` (see
        :mod:`fastprof.recording.rundir`). A Recorder whose trace_dir was set (a
        DataLoader worker's) records where it was told. :meth:`start` takes
        it; a Profiler takes it earlier, since its torch windows and memory
        files go under the run directory."""
        if self._choice is not None or self._trace_dir is not None:
            return
        o = self.options
        choice = _rundir.choose(
            o.out_dir, o.run_name, o.rank, o.world_size, o.local_world_size, o.resume, remote=self.spool
        )
        self._choice = choice
        if choice.run_name != o.run_name:
            self.options = dataclasses.replace(o, run_name=choice.run_name)
        if choice.resumed is not None:
            self.metadata["resumed"] = choice.resumed
            self._resume_gap_s = float(choice.resumed["idle_s"])

    @contextlib.contextmanager
    def _released_if_not_started(self) -> Iterator[None]:
        """A start that fails before recording leaves the run directory free
        for the next run (its claim undone, see :func:`fastprof.recording.rundir.release`)."""
        try:
            yield
        except BaseException:
            if not self._started and self._choice is not None:
                _rundir.release(self._choice)
                self._choice = None
            raise

    def _join(self, host: Recorder) -> Recorder:
        """Under ``fastprof run``: the script's own Recorder records into the
        run's (one recorder per process), which the command line placed and
        configured; this one's options are not used, and its :meth:`stop`
        leaves the run's recording going."""
        given = self.options
        self._host = host
        self._session = host._session
        self._trace_dir = host.trace_dir
        self.options = host.options
        self._started = True
        PROCESS.recorders.joined.append(self)
        if given.run_dir != host.run_dir:
            print(
                f"fastprof run: the script's Recorder records in the run, {host.trace_dir} "
                f"(its own directory, {given.run_dir}, is not used)",
                file=sys.stderr,
                flush=True,
            )
        return self

    def stop(self) -> RunStats:
        """Stop recording, close the last segment and return the report.

        Warns (:class:`fastprof.FastprofWarning`) when events were dropped or
        when a failure stopped recording early; never raises for those."""
        state = PROCESS.recorders
        if self._host is not None:
            return self._leave()
        with state.lock:
            if not self._started:
                if self.stats is not None:
                    return self.stats
                raise _core.NotRunningError("this recorder was never started")
            if self._psutil is not None:
                self._psutil.stop()
            session = self._session
            if session is None or os.getpid() != self._pid:
                # A forked child's copy: the recording belongs to the parent.
                self._started = False
                raise _core.NotRunningError("this recorder belongs to the parent process; it records nothing here")
            raw = session.stop()
            self._started = False
            if os.environ.get("FASTPROF_RECORDING_PID") == str(self._pid):
                del os.environ["FASTPROF_RECORDING_PID"]
            if state.current is self:
                state.current = None
        stats = RunStats(
            events_written=raw["events_written"],
            dropped=raw["dropped"],
            dropped_per_thread=dict(raw["dropped_per_thread"]),
            segments=[Path(p) for p in raw["segments"]],
            unclosed_spans=raw["unclosed_spans"],
            bytes_compressed=raw["bytes_compressed"],
            error=raw["error"],
            run_dir=self.run_dir,
            sampler_error=raw["sampler_error"],
            payload_dropped=raw["payload_dropped"],
            rotated=raw["rotated"],
        )
        self.stats = stats
        if self.spool is not None and not self.hold_upload:
            stats.upload = self.spool.finish()
        if stats.error:
            text = f"fastprof: stopped recording early: {stats.error}"
            # The core said the failure on stderr when it happened (a notice): not again.
            told = any(n in stats.error or stats.error in n for n in raw["notices"])
            warnings.warn(said(text) if told else _core.FastprofWarning(text), stacklevel=2)
        if stats.sampler_error:
            warnings.warn(
                f"fastprof: the sampler failed and stopped (recording went on): {stats.sampler_error}",
                _core.FastprofWarning,
                stacklevel=2,
            )
        for notice in raw["notices"]:  # said on stderr by the core when it happened
            if not stats.error or notice not in stats.error:
                warnings.warn(said(f"fastprof: {notice}"), stacklevel=2)
        if stats.payload_dropped:
            warnings.warn(
                f"fastprof: dropped {stats.payload_dropped} events whose args or names exceeded the "
                "64 MiB of payload it keeps in flight; record smaller args, or fewer per second",
                _core.FastprofWarning,
                stacklevel=2,
            )
        if stats.dropped > stats.payload_dropped:
            warnings.warn(
                f"fastprof: dropped {stats.dropped - stats.payload_dropped} events because a thread's ring "
                f"was full and the rings had grown as far as buffer_growth allows (buffer_size="
                f"{self.options.buffer_size}, buffer_growth={self.options.buffer_growth}); raise either, "
                "or record fewer events per second",
                _core.FastprofWarning,
                stacklevel=2,
            )
        return stats

    def _leave(self) -> RunStats:
        """:meth:`stop` of a Recorder that joined fastprof run's: the run
        records on (fastprof run stops it, and reports it); this one is done,
        with nothing of its own written."""
        if self.stats is None:
            joined = PROCESS.recorders.joined
            if self in joined:
                joined.remove(self)
            self._started = False
            self.stats = RunStats(0, 0, {}, [], 0, 0, run_dir=self.run_dir)
        return self.stats

    def counters(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The sampler's readings as numpy arrays, by metric name (units in the
        name, e.g. ``"proc.rss [B]"``): ``(timestamps, values)`` with
        timestamps in CLOCK_MONOTONIC ns (``time.monotonic_ns()``'s clock).
        Works while running and after stop; empty when sampling was off."""
        if self._session is None:
            return {}
        series = self._session.series()
        if self._psutil is not None:
            series.update(self._psutil.snapshot())
        return series

    def sampler_info(self) -> dict[str, Any] | None:
        """What the sampler found (host source, NVML availability and reason,
        devices, disabled fields) and its own cost per tick."""
        return None if self._session is None else self._session.sampler_info()

    def energy_j(self, t0_ns: int, t1_ns: int, gpu: str | int = 0) -> tuple[float, str] | None:
        """Joules GPU ``gpu`` used between two ``time.monotonic_ns()`` instants,
        and the source: ``"energy_counter"`` (the driver's cumulative counter)
        or ``"integrated_power"`` where that is unsupported.

        None when there is no reading of that GPU to measure with (no GPU or
        no NVML, ``sample_hz=0``, a GPU not sampled, or never started):
        ``sampler_info()["nvml"]`` says why. Not ``(0.0, ...)``, which
        would read as a measured zero."""
        label = gpu if isinstance(gpu, str) else f"gpu{gpu}"
        return None if self._session is None else self._session.energy_between(label, t0_ns, t1_ns)

    # ------------------------------------------------------------ session verbs

    def _running(self) -> _core.Session:
        if not self._started or self._session is None:
            raise _core.NotRunningError("this recorder is not running")
        return self._session

    def pause(self) -> None:
        """Stop recording new spans, instants and counters until :meth:`resume`.
        Spans already open still close; the sampler and step markers go on."""
        self._running().pause()

    def resume(self) -> None:
        self._running().resume()

    def set_clock_offset(self, offset_ns: int, uncertainty_ns: int = 0) -> None:
        """Say that this process's clock must be shifted by ``offset_ns`` (known
        to ``uncertainty_ns``) to reach the reference clock (rank 0's). Written
        into the trace metadata (``otherData.clock``); ``fastprof merge`` applies it."""
        self._running().set_clock_offset(int(offset_ns), int(uncertainty_ns))

    def mark_step(self, step: int) -> None:
        """Mark the start of training step ``step``: a ``fastprof.step`` counter
        in the trace (recorded even while paused) and the value :attr:`step` reads."""
        self._running().mark_step(int(step))

    @property
    def step(self) -> tuple[int, int]:
        """The last step marked and its ``time.monotonic_ns()``; ``(0, 0)`` before any."""
        return (0, 0) if self._session is None else self._session.step

    def dump(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Write the in-memory window (the last ``window_seconds`` of events and
        counters) to ``path`` as a complete gzip trace, without stopping.
        Spans still open are closed at this instant with ``args.unclosed``.

        With ``max_disk`` set the dump counts under the cap and is planned
        within it before a byte is written: the newest events that fit in
        what the cap leaves beside the open segment (``left_out``: the
        window's older events not written), or no file at all when not even
        the newest fit (``skipped`` says why, ``path`` is None)."""
        return self._running().dump(os.fspath(path))

    def gzip_from(self, fd: int, path: str | os.PathLike[str], level: int) -> Any:
        """Gzip what arrives on file descriptor ``fd`` (handed over: closed
        when read to its end, also on error) into ``path`` on a thread of
        the core that never takes the GIL, holding disk under ``max_disk``
        as the file grows (a torch window's JSON, piped from Kineto). Its
        ``join()`` returns ``bytes``, ``raw_bytes``, ``held`` and ``error``
        (why no file was written); count the file, or release what was held,
        with :meth:`count_file` (``release=held``)."""
        return self._running().gzip_from(int(fd), os.fspath(path), int(level))

    def count_file(self, path: str | os.PathLike[str], kind: str = "file", release: int = 0) -> str | None:
        """Count ``path``, a file written for this recording outside it (the
        Profiler's torch.profiler windows: ``kind`` "torch"), under its disk
        cap: with ``max_disk`` set, the writer thread deletes the oldest of
        the segments, flight dumps and such files to stay under it, and says
        so in ``otherData.rotated``; returns why when the cap deleted this
        file at once (larger than it leaves room for). Flight dumps
        (:meth:`dump`) count by themselves. ``release``: the bytes held for
        it while written (:meth:`gzip_from`), given back as it is counted (a
        path that is gone only gives them back). Never raises: a stopped
        recording counts nothing."""
        session = self._session
        if session is None or not self._started:
            return None
        try:
            return session.count_file(os.path.abspath(path), kind, int(release))
        except (_core.FastprofError, OSError):
            return None

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self.stop()

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        return f"<fastprof.Recorder {state} trace_dir={str(self.trace_dir)!r}>"


def _seed_segment_index(trace_dir: Path, first: int) -> None:
    """Make the recording's first segment ``fastprof.<first>.json.gz``: a
    resumed run whose earlier segments are in the store, not in this spool
    (the core reads the hidden file; see ``sink::chrome_gz::FIRST_INDEX_FILE``)."""
    if first <= 0:
        return
    try:
        trace_dir.mkdir(parents=True, exist_ok=True)
        (trace_dir / FIRST_INDEX_FILE).write_text(str(first))
    except OSError:
        pass  # the segments then collide with the store's, kept in the spool and said at the end


def start(
    out_dir: str | os.PathLike[str] | None = None,
    run_name: str | None = None,
    **options: Any,
) -> Recorder:
    """Start the process-wide recorder; see :class:`Recorder` for the options."""
    return Recorder(out_dir, run_name, **options).start()


def stop() -> RunStats | None:
    """Stop the running recorder and return its report (``None`` if none runs)."""
    state = PROCESS.recorders
    # Under fastprof run: the script's, never the run's.
    rec: Recorder | None = state.joined[-1] if state.joined else state.current
    if rec is None:
        return None
    return rec.stop()


def current() -> Recorder | None:
    """The running recorder, if any."""
    rec: Recorder | None = PROCESS.recorders.current
    return rec


def set_run_host(rec: Recorder | None) -> None:
    """``fastprof run``'s recorder (None: its run is over): a Recorder the
    script starts while it records joins it (see :meth:`Recorder.start`)."""
    state = PROCESS.recorders
    state.run_host = rec
    if rec is None:
        state.joined.clear()


def _stop_at_exit() -> None:
    # A recorder the user forgot to stop is finalized here; interpreter exit
    # must never fail because of fastprof, so everything is caught.
    rec = PROCESS.recorders.current
    if rec is None:
        return
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rec.stop()
        for w in caught:
            print(f"fastprof: {w.message}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - exit must go on
        print(f"fastprof: could not finalize the trace at exit: {e}", file=sys.stderr)
