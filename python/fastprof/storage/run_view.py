"""One view of a run wherever it lives (issues #26, #35): a run directory, or
one trace, in a local folder or in a store (``s3://bucket/runs/run1``). Every
verb and report reads a run through it, so none of them asks whether a path
is a URL; this module and :mod:`fastprof.storage.urls` are where that is
decided.

:func:`open_run` names the place and reads nothing. Then:

* the location itself: :meth:`RunView.must_exist`, :meth:`RunView.read_small`,
  :meth:`RunView.open`, :meth:`RunView.modified_ns`, :meth:`RunView.same_file`,
  where a file named after it goes (:meth:`RunView.inside`,
  :meth:`RunView.beside`), and the files under it (:meth:`RunView.keys`,
  :meth:`RunView.get`, :meth:`RunView.put`);
* the run as reports read it, inside ``with view:`` (or after
  :meth:`RunView.read`): :attr:`RunView.target` (what the core's readers
  read), :attr:`RunView.folder` (its side documents, laid out as the run
  directory), :meth:`RunView.segments`, :meth:`RunView.where_now`, and the
  files it names (:meth:`RunView.open_file`, :meth:`RunView.file_size`,
  :meth:`RunView.local_copy`);
* where a report's files go: :meth:`RunView.output`.

A run in a store is read where it is: the core's input walker lists the URL
and its scanner streams each object by ranged reads
(:mod:`fastprof.storage.backend`), so a report of a bucket run holds what a
report of a local run holds, and nothing is downloaded first. Its side
documents (``profiler.json``, ``triggers.json``, the memory profiling's small
JSON files: kilobytes) are copied into a temporary folder laid out as the run
directory, so reports read them as they read a local run's. A report's files
are written locally, then put in ``<url>/reports/`` (or in ``--output``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from fastprof._core import FastprofFileNotFoundError, trace_inputs
from fastprof.recording.names import (
    LIVE_JSON,
    OOM_JSON,
    OPEN_SUFFIX,
    PROFILER_JSON,
    RANK_DIR,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    TRIGGERS_JSON,
    UNIFIED_TRACE,
    is_open_segment_name,
)
from fastprof.recording.names import SEGMENT as _SEGMENT
from fastprof.recording.rundir import in_rank_dir, object_url
from fastprof.storage.store import Store, open_store
from fastprof.storage.urls import is_url

__all__ = ["SIDE_MAX_BYTES", "LocalRun", "Output", "RunView", "StoreRun", "newest_ns", "open_run"]

#: Side documents larger than this are not copied into a store run's folder
#: (an allocator snapshot, a torch memory timeline: no report section reads those).
SIDE_MAX_BYTES = 16 << 20
#: A rank's hang evidence, ``rank{R}/hang-<n>.json`` (the hang driver's
#: ``verdict.HANG_FILE``): read by the report's ``hangs[]``.
_HANG_EVIDENCE = re.compile(r"^hang-\d+\.json$")

#: A recording's segment found under a rank folder: (the folder of its
#: recording, laid out as the run directory; its file name; where it is read).
Segment = tuple[str, str, Path | str]


def open_run(location: str | os.PathLike[str], what: str = "input") -> RunView:
    """The view of the run (or the one file) at ``location``: a local path,
    or a URL (``s3://``, ``gs://``, ``az://``, ``file://``, ``memory://``).
    Nothing is read or contacted yet; ``what`` names the location in a
    store's one-line errors (``input``, ``output``, ``run``)."""
    if is_url(location):
        return StoreRun(os.fspath(location), what)
    return LocalRun(os.fspath(location))


def newest_ns(inputs: list[str], files: list[str]) -> int | None:
    """The latest modification time (ns) of ``files``, what the core's
    walker found under ``inputs``: an object's from one listing per input
    in a store (not a request per object), a local file's from its stat.
    None when there is no file, or one of them has no time here."""
    times: dict[str, int] = {}
    for view in map(open_run, inputs):
        times.update(view._listed_times())
    newest: int | None = None
    for f in files:
        t = times.get(f)
        if t is None:
            if is_url(f):
                return None  # not in its input's listing: the caller merges again
            try:
                t = os.stat(f).st_mtime_ns
            except OSError:
                return None
        newest = t if newest is None else max(newest, t)
    return newest


def _mtime_ns(info: dict[str, Any]) -> int | None:
    """An object's modification time from the store's metadata (S3's
    ``LastModified``, a datetime; local ``mtime``, seconds)."""
    v = info.get("LastModified") or info.get("last_modified") or info.get("mtime") or info.get("created")
    if v is not None and hasattr(v, "timestamp"):
        return int(v.timestamp() * 1e9)
    return int(float(v) * 1e9) if isinstance(v, (int, float)) else None


class Output:
    """Where a verb writes its files: :attr:`folder`, a local folder. For a
    place in a store, a temporary folder whose files :meth:`deliver` puts
    there (removed when the :meth:`RunView.output` block ends)."""

    def __init__(self, folder: Path, store: Store | None = None, base: str = "", shown: str = "") -> None:
        self.folder = folder
        self._store = store
        self._base = base
        self._shown = shown

    def deliver(self, files: list[Path], say: Callable[[str], None] = lambda _: None) -> list[str]:
        """Put ``files`` (written in :attr:`folder`) where they belong,
        replacing an earlier report's: the URLs they were put as, or [] when
        they are there already (a local folder). ``say`` hears what is done."""
        if self._store is None or not files:
            return []
        say(f"putting {len(files)} files in {self._shown}")
        out = []
        for f in files:
            key = f"{self._base}/{f.name}" if self._base else f.name
            self._store.put(self.folder / f.name, key, rewritable=True)
            out.append(self._store.url_of(key))
        return out


@contextlib.contextmanager
def _store_output(store: Store, base: str, shown: str, folder: str) -> Iterator[Output]:
    """Files put in ``store`` under ``base``, written first in a temporary
    ``folder`` (named as the caller's: a page links from where it is written)."""
    local = Path(tempfile.mkdtemp(prefix="fastprof-out-"))
    try:
        yield Output(local / folder, store, base, shown)
    finally:
        shutil.rmtree(local, ignore_errors=True)


@contextlib.contextmanager
def _output_at(out_dir: str | os.PathLike[str], folder: str) -> Iterator[Output]:
    """An output folder the caller named: a local folder, or a place in a store."""
    if is_url(out_dir):
        url = os.fspath(out_dir)
        with _store_output(open_store(url, what="output"), "", url, folder) as out:
            yield out
    else:
        yield Output(Path(out_dir))


def _file_size(path: str | os.PathLike[str]) -> int:
    if not is_url(path):
        return os.path.getsize(path)
    info = open_store(os.fspath(path), what="input").info("")
    if info is None:
        raise FileNotFoundError(errno.ENOENT, "no such object", os.fspath(path))
    return int(info.get("size") or 0)


def _open_file(path: str | os.PathLike[str]) -> IO[bytes]:
    if is_url(path):
        return open_store(os.fspath(path), what="input").open("")
    return open(path, "rb")


class RunView(ABC):
    """A run directory, or one trace, where it lives (see the module's
    docstring). The run is read (a store's listed, its side documents copied)
    by ``with view:`` (or :meth:`read`), and what was copied is removed at
    the block's end (or by :meth:`close`, or with the view)."""

    def __init__(self, location: str) -> None:
        #: The location as given (a URL without its trailing slash).
        self.location = location
        self._target: Path | str | None = None
        self._folder: Path | None = None
        self._entered = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    # ------------------------------------------------------- names

    @property
    @abstractmethod
    def name(self) -> str:
        """The location as messages and report.json name it."""

    @property
    def basename(self) -> str:
        """The last component of the location's name."""
        return self.name.rstrip("/").rsplit("/", 1)[-1]

    @property
    @abstractmethod
    def local_path(self) -> Path | None:
        """The location as a path of this machine, for what only a local run
        allows (signalling its processes, writing into it atomically); None
        for a place in a store, reached by URL."""

    # ------------------------------------------------------- the location itself

    @abstractmethod
    def must_exist(self, expected: str) -> None:
        """Raise :class:`fastprof.FastprofFileNotFoundError` naming the
        location and what was ``expected`` there when a local location is
        not there. A store's is looked up when it is read (no request more),
        and its absence is that reader's error."""

    @abstractmethod
    def is_file(self) -> bool:
        """Whether the location is one file (an object, in a store)."""

    @abstractmethod
    def read_small(self, limit: int) -> bytes | None:
        """The bytes of the location when it is one file of at most
        ``limit`` bytes, else None (a folder, a larger file, nothing)."""

    @abstractmethod
    def open(self) -> IO[bytes]:
        """The location as one file, read (an object by ranged reads)."""

    @abstractmethod
    def modified_ns(self) -> int | None:
        """The location's modification time as one file (ns), None when
        nothing is there or the store does not say."""

    @abstractmethod
    def same_file(self, other: str) -> bool:
        """Whether ``other`` (a path or a URL, as the core's walker gives
        them) names the location."""

    @abstractmethod
    def names_folder(self) -> bool:
        """Whether the location is a folder (locally: is one; in a store,
        where folders are prefixes: is not named as a trace file)."""

    @abstractmethod
    def inside(self, name: str) -> Path | str:
        """Where a file ``name`` in the location (a folder) goes."""

    @abstractmethod
    def beside(self, name: str) -> Path | str:
        """Where a file ``name`` next to the location (a file) goes."""

    @abstractmethod
    def keys(self) -> list[str]:
        """Every file under the location, relative to it (``rank0/live.json``),
        sorted."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The whole (small) file ``key`` under the location, None when there
        is none."""

    @abstractmethod
    def put(self, local: Path, key: str) -> str:
        """Put the local file ``local`` at ``key`` under the location (""
        for the location itself), replacing what was there (a request, a
        merged trace); returns where it is."""

    @abstractmethod
    def show(self, key: str) -> str:
        """Where ``key`` under the location ("" for itself) is, as messages name it."""

    def _listed_times(self) -> dict[str, int]:
        """The modification times one listing gives (a store's), by the name
        the core's walker gives each file; local files are timed by stat."""
        return {}

    # ------------------------------------------------------- the run, read

    def read(self) -> RunView:
        """Read the run (a store's listed, its side documents copied); what
        was copied is removed by :meth:`close`, or with the view."""
        self._open()
        self._entered = True
        return self

    def close(self) -> None:
        """Remove what :meth:`read` copied."""
        self._close()
        self._entered = False

    def __enter__(self) -> RunView:
        return self.read()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @abstractmethod
    def _open(self) -> None:
        """Read the run: what :attr:`target` and :attr:`folder` say."""

    def _close(self) -> None:  # noqa: B027 - a local run has nothing to remove
        """Remove what reading the run copied."""

    def _read_state(self) -> None:
        if not self._entered:
            raise RuntimeError(f"{self!r}: not read yet (`with view:` or view.read())")

    @property
    def target(self) -> Path | str:
        """What the core's readers read: the run's unified ``trace.json.gz``
        when there is one, else the run (its folder or URL), or the trace."""
        self._read_state()
        assert self._target is not None
        return self._target

    @property
    def folder(self) -> Path | None:
        """A local folder laid out as the run directory, where its side
        documents are read (the run directory itself, or a store run's copy
        of them); None for a trace read alone."""
        self._read_state()
        return self._folder

    @property
    @abstractmethod
    def run_dir_name(self) -> str | None:
        """The run directory as report.json names it: a store run's URL; a
        local run's folder, None for a trace read alone."""

    @property
    def local_file(self) -> Path | None:
        """The trace read alone, as a file of this machine whose neighbours
        are read (the profiler.json beside a segment); None otherwise."""
        self._read_state()
        return None

    @abstractmethod
    def segments(self, rank_dir: Path) -> list[Segment]:
        """The fastprof segments of the recordings under ``rank_dir`` (a rank
        folder of :attr:`folder`)."""

    @abstractmethod
    def where_now(self, recorded: str) -> str:
        """Where a file a rank wrote (a torch window, a flight dump:
        profiler.json holds the path it had then) is now."""

    @contextlib.contextmanager
    def output(self, out_dir: str | os.PathLike[str] | None, folder: str = "reports") -> Iterator[Output]:
        """Where a report of the run writes its files: ``out_dir`` (a local
        folder, or a place in a store) when given, else ``folder`` in the
        run (next to a trace read alone)."""
        if out_dir is not None:
            with _output_at(out_dir, folder) as out:
                yield out
        else:
            with self._default_output(folder) as out:
                yield out

    @abstractmethod
    def _default_output(self, folder: str) -> contextlib.AbstractContextManager[Output]:
        """The output of a report given no ``out_dir``."""

    # ------------------------------------------------------- files the run names

    def open_file(self, path: str | os.PathLike[str]) -> IO[bytes]:
        """A file the run names (a segment, a torch window): a local file, or
        an object read by ranged reads."""
        return _open_file(path)

    def file_size(self, path: str | os.PathLike[str]) -> int:
        """The size of a file the run names. Raises :class:`FileNotFoundError`."""
        return _file_size(path)

    @contextlib.contextmanager
    def local_copy(self, path: str) -> Iterator[str]:
        """A local path holding the file the run names: a local file itself,
        an object copied into a temporary folder (for readers that read a
        file whole, by name)."""
        if not is_url(path):
            yield path
            return
        with tempfile.TemporaryDirectory(prefix="fastprof-copy-") as tmp:
            local = os.path.join(tmp, path.rsplit("/", 1)[-1])
            with _open_file(path) as src, open(local, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            yield local


class LocalRun(RunView):
    """A run directory or a trace on this machine: read in place."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self._path = Path(location)

    @property
    def name(self) -> str:
        return str(self._path)

    @property
    def local_path(self) -> Path:
        return self._path

    def must_exist(self, expected: str) -> None:
        if not self._path.exists():
            raise FastprofFileNotFoundError(
                errno.ENOENT, f"no such file or directory (expected {expected})", self.location
            )

    def is_file(self) -> bool:
        return self._path.is_file()

    def read_small(self, limit: int) -> bytes | None:
        if not self._path.is_file() or self._path.stat().st_size > limit:
            return None
        return self._path.read_bytes()

    def open(self) -> IO[bytes]:
        return open(self._path, "rb")

    def modified_ns(self) -> int | None:
        try:
            return self._path.stat().st_mtime_ns
        except FileNotFoundError:
            return None

    def same_file(self, other: str) -> bool:
        return str(Path(other).resolve()) == self._resolved

    @cached_property
    def _resolved(self) -> str:
        return str(self._path.resolve())

    def names_folder(self) -> bool:
        return self._path.is_dir()

    def inside(self, name: str) -> Path:
        return self._path / name

    def beside(self, name: str) -> Path:
        return self._path.with_name(name)

    def keys(self) -> list[str]:
        return sorted(p.relative_to(self._path).as_posix() for p in self._path.rglob("*") if p.is_file())

    def get(self, key: str) -> bytes | None:
        try:
            return (self._path / key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, local: Path, key: str) -> str:
        dest = self._path / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        try:
            shutil.copyfile(local, tmp)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return str(dest)

    def show(self, key: str) -> str:
        return str(self._path / key)

    def _open(self) -> None:
        p = self._path
        if not p.exists():
            raise FastprofFileNotFoundError(errno.ENOENT, "no such file or directory", str(p))
        if p.is_dir():
            unified = p / UNIFIED_TRACE
            if unified.is_file():
                # Reading the directory walks it (the core's input walker removes
                # temporary files a killed export left, as `fastprof merge` does);
                # reading the unified trace alone does not, so walk it here.
                trace_inputs([str(p)])
                self._target, self._folder = unified, p
            else:
                self._target, self._folder = p, p
        elif p.name == UNIFIED_TRACE and any(p.parent.glob(f"rank*/{PROFILER_JSON}")):
            self._target, self._folder = p, p.parent
        else:
            self._target, self._folder = p, None

    @property
    def run_dir_name(self) -> str | None:
        folder = self.folder
        return None if folder is None else str(folder)

    @property
    def local_file(self) -> Path | None:
        return self._path if self.folder is None else None

    def segments(self, rank_dir: Path) -> list[Segment]:
        return [(str(s.parent), s.name, s) for s in rank_dir.rglob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}")]

    def where_now(self, recorded: str) -> str:
        """A run directory moved or copied since it was written: the same
        ``rank{R}/...`` under where it is now; otherwise the recorded path."""
        tail = in_rank_dir(recorded)
        if os.path.exists(recorded) or not tail or self.folder is None:
            return recorded
        moved = self.folder / tail
        return str(moved) if moved.exists() else recorded

    @contextlib.contextmanager
    def _default_output(self, folder: str) -> Iterator[Output]:
        p = self._path
        yield Output(p / folder if p.is_dir() else p.parent / folder)


def _is_trace_name(name: str) -> bool:
    return name.endswith((".json", SEGMENT_SUFFIX)) or is_open_segment_name(name)


def _side(key: str) -> bool:
    """Whether object ``key`` (relative to the run) is a side document a
    report reads: not hidden, not the report folder, not a trace (but
    fastprof's own JSON, which has a trace's suffix, is)."""
    parts = key.split("/")
    name = parts[-1]
    if any(p.startswith(".") for p in parts) or parts[0] == "reports" or name.startswith("flight-"):
        return False
    if name in (PROFILER_JSON, TRIGGERS_JSON, LIVE_JSON, OOM_JSON) or _HANG_EVIDENCE.match(name):
        return True
    if "memory" in parts[:-1]:
        return name.endswith((".json", ".txt", ".yaml", ".csv"))
    return not _is_trace_name(name) and name.endswith((".json", ".txt", ".yaml"))


#: What names a trace file in a store (anything else is taken for a folder).
_TRACE_SUFFIXES = (SEGMENT_SUFFIX + OPEN_SUFFIX, SEGMENT_SUFFIX, ".json")


class StoreRun(RunView):
    """A run directory or a trace in a store, reached by URL: its traces read
    in place by ranged reads, its side documents copied into a temporary
    folder laid out as the run directory while the run is read."""

    def __init__(self, url: str, what: str) -> None:
        super().__init__(url.rstrip("/"))
        self._what = what
        self._segment_urls: list[str] = []
        self._removal: weakref.finalize[Any, Any] | None = None

    @cached_property
    def _store(self) -> Store:
        return open_store(self.location, what=self._what)

    @property
    def name(self) -> str:
        return self.location

    @property
    def local_path(self) -> None:
        return None

    def must_exist(self, expected: str) -> None:
        return None

    def is_file(self) -> bool:
        return self._store.info("") is not None

    def read_small(self, limit: int) -> bytes | None:
        info = self._store.info("")
        if info is None or int(info.get("size") or 0) > limit:
            return None
        with self._store.open("") as f:
            return f.read()

    def open(self) -> IO[bytes]:
        return self._store.open("")

    def modified_ns(self) -> int | None:
        info = self._store.info("")
        return _mtime_ns(info) if info is not None else None

    def same_file(self, other: str) -> bool:
        return other.rstrip("/") == self.location

    def names_folder(self) -> bool:
        return not self.location.endswith(_TRACE_SUFFIXES)

    def inside(self, name: str) -> str:
        return f"{self.location}/{name}"

    def beside(self, name: str) -> str:
        return f"{self.location.rsplit('/', 1)[0]}/{name}"

    def keys(self) -> list[str]:
        return self._store.list("")

    def get(self, key: str) -> bytes | None:
        try:
            with self._store.open(key) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def put(self, local: Path, key: str) -> str:
        self._store.put(local, key, rewritable=True)
        return self.show(key)

    def show(self, key: str) -> str:
        return f"{self.location}/{key}" if key else self.location

    def _listed_times(self) -> dict[str, int]:
        store = self._store
        store.fs.invalidate_cache(store.root)
        found: dict[str, dict[str, Any]] = store.fs.find(store.root, withdirs=False, detail=True)
        if not found:
            info = store.info("")
            found = {store.root: info} if info is not None else {}
        prefix = store.root.rstrip("/")
        out: dict[str, int] = {}
        for path, info in found.items():
            t = _mtime_ns(info)
            if t is not None:
                rel = path.rstrip("/")[len(prefix) :].lstrip("/")
                out[f"{self.location}/{rel}" if rel else self.location] = t
        return out

    def _open(self) -> None:
        """List the run and copy its side documents. Raises
        :class:`fastprof.FastprofFileNotFoundError` naming the URL when
        nothing is there, and the store's one-line :class:`fastprof.ConfigError`
        when its protocol's extra is missing."""
        url, store = self.location, self._store
        self._segment_urls = []
        if store.info("") is not None:  # one object: a trace read alone
            self._target, self._folder = url, None
            return
        keys = store.list("")
        if not keys:
            raise FastprofFileNotFoundError(
                errno.ENOENT, "no such file or directory (nothing stored under this URL)", url
            )
        view = Path(tempfile.mkdtemp(prefix="fastprof-view-"))
        try:
            for key in keys:
                parts = key.split("/")
                if _SEGMENT.match(parts[-1]) and RANK_DIR.match(parts[0]):
                    self._segment_urls.append(store.url_of(key))
                elif _side(key):
                    self._copy_side(key, view)
            # Rank folders with nothing copied still exist in the view (as locally).
            for key in keys:
                first = key.split("/")[0]
                if RANK_DIR.match(first) and "/" in key:
                    (view / first).mkdir(exist_ok=True)
        except BaseException:
            shutil.rmtree(view, ignore_errors=True)
            raise
        self._folder = view
        self._removal = weakref.finalize(self, shutil.rmtree, view, True)
        self._target = store.url_of(UNIFIED_TRACE) if UNIFIED_TRACE in keys else url

    def _copy_side(self, key: str, view: Path) -> None:
        meta = self._store.info(key)
        if meta is None:
            return  # gone since the listing (a live run's live.json, removed at its end)
        if int(meta.get("size") or 0) > SIDE_MAX_BYTES:
            return
        dest = view / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._store.open(key) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except FileNotFoundError:
            dest.unlink(missing_ok=True)  # gone between the two requests: as if never listed

    def _close(self) -> None:
        if self._removal is not None:
            self._removal()
        self._removal = None
        self._folder = self._target = None

    @property
    def run_dir_name(self) -> str:
        self._read_state()
        return self.location

    def segments(self, rank_dir: Path) -> list[Segment]:
        folder = self.folder
        assert folder is not None
        return [
            (str(folder / rel.rsplit("/", 1)[0]), rel.rsplit("/", 1)[1], url)
            for url in self._segment_urls
            if (rel := in_rank_dir(url)) and rel.split("/")[0] == rank_dir.name and url.endswith(".json.gz")
        ]

    def where_now(self, recorded: str) -> str:
        """Recorded in a spool the uploader emptied: the file is its object,
        ``<run URL>/rank{R}/...``."""
        return object_url(recorded, self.location) or recorded

    @contextlib.contextmanager
    def _default_output(self, folder: str) -> Iterator[Output]:
        # A run's reports go in its folder; a trace's next to it, under its own name.
        with _store_output(self._store, folder if self.folder is not None else "", "the store", folder) as out:
            yield out
