"""Object storage for run directories (issue #26): a run's files on S3, GCS,
Azure or any other fsspec filesystem, reached by URL.

fastprof never talks to a storage service itself: it goes through fsspec and
the protocol's own package (s3fs, gcsfs, adlfs), so credentials, endpoints,
profiles and retries come from the environment and config files users already
keep for that library (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``,
``GOOGLE_APPLICATION_CREDENTIALS``, ...), never from fastprof options.

Objects are written once. A run's file names carry the rank and the segment
number (``<run>/rank3/fastprof.12.json.gz``), so two nodes writing the same
run never name the same object; :meth:`Store.put` refuses an object that is
already there with other content instead of replacing it (on S3 with a
conditional ``If-None-Match`` write, so two writers racing cannot both win),
except for the few files fastprof itself rewrites (``profiler.json``,
``triggers.json``, ...), whose newest version is the one to keep.
"""

from __future__ import annotations

import builtins
import hashlib
import os
from dataclasses import dataclass
from typing import IO, Any

from fastprof._core import FastprofError
from fastprof.recording.names import (
    LIVE_JSON,
    MODEL_SUMMARY_JSON,
    OOM_JSON,
    OPERATORS_JSON,
    PROFILER_JSON,
    TRIGGERS_JSON,
    UNIFIED_TRACE,
)
from fastprof.storage.urls import check_url, load_fsspec, missing

__all__ = [
    "REWRITTEN",
    "Store",
    "StoreConflictError",
    "open_store",
    "store_failure",
]

#: File names fastprof writes again while a run goes on (state that is
#: replaced, not appended): their newest version replaces the object.
#: Everything else is written once and never changes after it is closed.
REWRITTEN = frozenset(
    {
        PROFILER_JSON,
        TRIGGERS_JSON,
        LIVE_JSON,
        # Memory summaries, rewritten by a later collection or OOM of the run.
        "collected.json",
        "collected.yaml",
        MODEL_SUMMARY_JSON,
        "model_summary.txt",
        OPERATORS_JSON,
        "operators.csv",
        OOM_JSON,
        # Rank 0's unified trace, rebuilt by a later merge (fastprof merge --force).
        UNIFIED_TRACE,
    }
)

#: Bytes fsspec fetches per ranged read (its read-ahead block) of an object
#: being read, instead of the filesystem's default (s3fs: 50 MiB, which
#: would fetch most segments whole). What one open object holds in memory,
#: besides the core's 1 MiB scanning buffer; a merge has one open per worker.
READ_BLOCK = 4 << 20

#: Bytes of one part of a multipart upload to S3 (its minimum is 5 MiB).
PUT_PART = 8 << 20

#: Bytes read at a time when a local file is compared with its object.
_COMPARE_BLOCK = 4 << 20


class StoreConflictError(FastprofError, FileExistsError):
    """An object is already in the store under this name with other content:
    another writer's file (two nodes given the same rank) or an earlier run's.
    It is left as it is; the local file stays where it was."""


@dataclass(frozen=True)
class PutResult:
    """What :meth:`Store.put` did: ``"uploaded"``, or ``"same"`` (the object
    was already there with this content: nothing sent)."""

    action: str
    size: int


class Store:
    """An fsspec filesystem and a root inside it: keys are paths relative to
    the root (``<run>/rank0/fastprof.0.json.gz``), always with ``/``.

    Every method may block on the network; callers that must not wait (the
    training thread) go through :class:`fastprof.storage.uploader.Uploader`."""

    def __init__(self, url: str, fs: Any, root: str) -> None:
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/")
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        #: Whether the filesystem can create an object only if absent (S3's
        #: ``If-None-Match: *``): then a race between two writers has one loser.
        self.exclusive = bool(protocols & {"s3", "s3a"})
        #: A real directory tree (``file://``): folders are made before a put.
        self.folders = bool(protocols & {"file", "local"})

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def path(self, key: str) -> str:
        """The filesystem path of ``key``."""
        key = key.strip("/")
        return f"{self.root}/{key}" if key else self.root

    def url_of(self, key: str) -> str:
        """The URL of ``key``, as messages show it."""
        return f"{self.url.rstrip('/')}/{key.strip('/')}"

    def info(self, key: str) -> dict[str, Any] | None:
        """The object's metadata (``size`` at least), or None when there is no
        such object. Never from a listing cached earlier: another node may
        have written since."""
        p = self.path(key)
        self.fs.invalidate_cache(p)
        try:
            info: dict[str, Any] = self.fs.info(p)
        except FileNotFoundError:
            return None
        return info if info.get("type", "file") == "file" else None

    def exists(self, key: str) -> bool:
        """Whether an object ``key`` is there."""
        return self.info(key) is not None

    def has_any(self, prefix: str) -> bool:
        """Whether any object is under ``prefix`` (one listing of its first
        level, not of the whole tree)."""
        base = self.path(prefix)
        self.fs.invalidate_cache(base)
        try:
            return bool(self.fs.ls(base, detail=False))
        except FileNotFoundError:
            return False

    def list(self, prefix: str = "") -> list[str]:
        """Keys of every object under ``prefix`` (recursively), sorted."""
        base = self.path(prefix)
        self.fs.invalidate_cache(base)
        try:
            found = self.fs.find(base, withdirs=False)
        except FileNotFoundError:
            return []
        root = self.root + "/" if self.root else ""
        return sorted(p[len(root) :] if p.startswith(root) else p for p in found)

    def open(self, key: str, mode: str = "rb") -> IO[bytes]:
        """A file object for reading ``key``: fsspec's remote files read by
        ranges as they are consumed (and seek), so a reader streams an
        object in bounded memory without downloading it first."""
        if mode != "rb":
            raise ValueError(f"Store.open: mode {mode!r}: only 'rb' (objects are written by put)")
        # Never the size of a listing cached earlier: a rewritten object (triggers.json
        # polled by fastprof trigger) would be read at its old length.
        self.fs.invalidate_cache(self.path(key))
        # A bounded read-ahead: s3fs's default block (50 MiB) would hold an object
        # of that size whole in memory at the first read.
        f: IO[bytes] = self.fs.open(self.path(key), "rb", block_size=READ_BLOCK)
        return f

    def cat_ranges(
        self, keys: builtins.list[str], starts: builtins.list[int], ends: builtins.list[int]
    ) -> builtins.list[bytes]:
        """Byte ranges ``[start, end)`` of several objects, fetched together
        (concurrently where the filesystem is asynchronous, as s3fs is)."""
        out: builtins.list[bytes] = self.fs.cat_ranges([self.path(k) for k in keys], starts, ends)
        return out

    def create(self, key: str, data: bytes) -> bool:
        """Write ``data`` as ``key`` only if no object is there: True when
        this call created it, False when one was there already. Atomic where
        the store can do it (S3's ``If-None-Match``, a local ``O_EXCL``
        open): two writers racing have one winner. Elsewhere a check and a
        write, which a race can still pass twice."""
        target = self.path(key)
        if self.folders:
            self.fs.makedirs(self.fs._parent(target), exist_ok=True)
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        if self.exclusive:
            try:
                self.fs.pipe_file(target, data, mode="create")
            except FileExistsError:
                return False
            return True
        if self.info(key) is not None:
            return False
        self.fs.pipe_file(target, data)
        return True

    def read(self, key: str) -> bytes | None:
        """The whole (small) object ``key``, or None when there is none."""
        self.fs.invalidate_cache(self.path(key))
        try:
            data: bytes = self.fs.cat_file(self.path(key))
        except FileNotFoundError:
            return None
        return data

    def put(self, local_path: str | os.PathLike[str], key: str, *, rewritable: bool = False) -> PutResult:
        """Upload the whole file ``local_path`` to ``key``.

        An object already there with the same content is left alone (an
        upload repeated after a crash, ``fastprof upload`` run twice). One
        with other content is replaced only when ``rewritable`` (a file
        fastprof rewrites, :data:`REWRITTEN`); otherwise it raises
        :class:`StoreConflictError` and nothing is written."""
        local = os.fspath(local_path)
        size = os.path.getsize(local)
        target = self.path(key)
        if self.folders:
            self.fs.makedirs(self.fs._parent(target), exist_ok=True)
        parts = self._parts(size)
        if rewritable:
            self.fs.put_file(local, target, **parts)
            return PutResult("uploaded", size)
        if self._same(local, size, key):
            return PutResult("same", size)
        try:
            if self.exclusive:
                self.fs.put_file(local, target, mode="create", **parts)
            else:
                self.fs.put_file(local, target, **parts)
        except FileExistsError:
            # Another writer created it between our check and our write.
            if self._same(local, size, key):
                return PutResult("same", size)
            raise self._conflict(key, size) from None
        return PutResult("uploaded", size)

    def _parts(self, size: int) -> dict[str, int]:
        """s3fs sends a file below two parts in one request, read whole into
        memory (its default part is 50 MiB, so a 90 MiB breakdown.csv took
        90 MiB): parts of :data:`PUT_PART` bytes, two in flight, bound what
        an upload holds (S3 allows 10,000 parts: larger files, larger parts)."""
        if not self.exclusive:
            return {}
        return {"chunksize": max(PUT_PART, -(-size // 10_000)), "max_concurrency": 2}

    def _same(self, local: str, size: int, key: str) -> bool:
        """True when the object is there with this file's content, False when
        it is absent; a conflict when it holds something else. Never by size
        alone: a file the caller then deletes (the spool's) must really be
        in the store (:meth:`same_content`)."""
        info = self.info(key)
        if info is None:
            return False
        if not self.same_content(local, key, info):
            raise self._conflict(key, size, int(info.get("size") or 0))
        return True

    def same_content(self, local: str | os.PathLike[str], key: str, info: dict[str, Any] | None = None) -> bool:
        """Whether object ``key`` holds exactly the bytes of ``local``: sizes
        first; then S3's ETag where it is an MD5 this fastprof can compute
        (one part, or the parts :meth:`put` sends); else the object is read
        back by blocks and compared, stopping at the first difference."""
        info = self.info(key) if info is None else info
        size = os.path.getsize(local)
        if info is None or int(info.get("size") or 0) != size:
            return False
        etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
        if etag and etag in _etags(local, size, self._parts(size).get("chunksize")):
            return True
        with open(local, "rb") as mine, self.fs.open(self.path(key), "rb", block_size=_COMPARE_BLOCK) as theirs:
            while a := mine.read(_COMPARE_BLOCK):
                if theirs.read(len(a)) != a:
                    return False
            return not theirs.read(1)

    def _conflict(self, key: str, size: int, theirs: int | None = None) -> StoreConflictError:
        held = f" ({theirs} bytes)" if theirs is not None else ""
        return StoreConflictError(
            f"{self.url_of(key)} already exists with other content{held} than this {size}-byte file; "
            "not overwritten (another node with the same rank, or an earlier run in the same place?)"
        )


def _etags(local: str | os.PathLike[str], size: int, part: int | None) -> set[str]:
    """The ETags S3 gives ``local``'s content: the MD5 of the whole (one
    PUT), and with parts of ``part`` bytes the MD5 of their MD5s, ``-N``."""
    whole = hashlib.md5(usedforsecurity=False)
    parts: list[bytes] = []
    with open(local, "rb") as f:
        while chunk := f.read(part or _COMPARE_BLOCK):
            whole.update(chunk)
            if part:
                parts.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    out = {whole.hexdigest()}
    if len(parts) > 1:
        out.add(f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}")
    return out


#: The packages whose exceptions mean "the store failed" (a refused
#: connection, expired credentials, a throttled request): the storage
#: libraries fsspec reaches a store through, and their HTTP clients.
_STORE_PACKAGES = frozenset(
    {"botocore", "aiobotocore", "boto3", "s3fs", "aiohttp", "gcsfs", "google", "adlfs", "azure", "fsspec", "urllib3"}
)


def store_failure(e: BaseException) -> str | None:
    """One line for an error a storage library raised (``e`` or what caused
    it), naming what failed, or None when ``e`` is not such an error."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if type(cur).__module__.split(".", 1)[0] in _STORE_PACKAGES:
            text = " ".join(str(cur).split()) or type(cur).__name__
            return f"the store failed or cannot be reached ({type(cur).__name__}: {text})"
        cur = cur.__cause__ or cur.__context__
    return None


def open_store(url: str, what: str = "out_dir") -> Store:
    """The :class:`Store` for ``url`` (an fsspec URL, :func:`fastprof.storage.urls.is_url`).

    Nothing is contacted yet: a wrong endpoint or missing credentials show at
    the first upload. A protocol whose package is absent is a
    :class:`ConfigError` of one line naming the fastprof extra that brings
    it; ``what`` names the setting the URL came from in that line. A URL
    that names no place is refused first (:func:`fastprof.storage.urls.check_url`)."""
    check_url(url, what)
    try:
        # fsspec comes with every protocol's package (s3fs, gcsfs, adlfs).
        fs, root = load_fsspec().core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise missing(url, what, e) from None
    return Store(url, fs, root)
