"""Reading run directories from object storage (issue #26): the backend the
Rust core lists and opens URL inputs through (``s3://bucket/runs/run1``,
``file:///tmp/x``, ``memory://...``, ``simplecache::s3://...``), so that
``fastprof merge``, :func:`fastprof.read_columns`, the step analysis and
every report read a run on storage as they read a local directory.

The core decides what in a listing is a trace (the same rules as a
directory walk) and streams each object it reads through :meth:`open`'s
file, one ``read`` at a time: fsspec fetches it by ranges of
:data:`READ_BLOCK`, so an object is never downloaded whole first and a
reader holds about one block per object it has open.

Importing this module registers the backend (:func:`register`, once);
:mod:`fastprof` imports it. fsspec itself is imported only when a URL is
first read.
"""

from __future__ import annotations

import builtins
from typing import IO, Any

from fastprof import _core
from fastprof.storage.store import READ_BLOCK, Store, open_store

__all__ = ["READ_BLOCK", "FsspecRemote", "register"]


class FsspecRemote:
    """Lists and opens objects by URL through fsspec (the protocol's own
    package: s3fs, gcsfs, adlfs; credentials from their usual environment).

    Called by the core from whatever thread reads, the merge's workers
    included; every call may block on the network."""

    def _store(self, url: str) -> Store:
        # A protocol whose package is missing raises the one-line ConfigError
        # naming the fastprof extra that brings it.
        return open_store(url, what="input")

    def list(self, url: str) -> builtins.list[tuple[str, int]]:
        """Every object at or under ``url`` (recursively) as (URL, size),
        sorted; ``url`` alone when it names one object; empty when nothing
        is there. Each URL is ``url``'s own text (scheme, chain prefix such
        as ``simplecache::``) followed by the object's key relative to it."""
        store = self._store(url)
        fs, root = store.fs, store.root
        # Another node may have written since a listing was cached.
        fs.invalidate_cache(root)
        try:
            found: dict[str, dict[str, Any]] = fs.find(root, withdirs=False, detail=True)
        except FileNotFoundError:
            found = {}
        base = url.rstrip("/")
        prefix = root.rstrip("/") + "/"
        out: list[tuple[str, int]] = []
        for path, info in sorted(found.items()):
            if info.get("type", "file") != "file":
                continue
            size = int(info.get("size") or 0)
            if path.rstrip("/") == root.rstrip("/"):
                out.append((url, size))
            elif path.startswith(prefix):
                out.append((f"{base}/{path[len(prefix) :]}", size))
            # Anything else is not under the URL (a key that only starts
            # with the same letters, ``runs/run10`` for ``runs/run1``).
        if not out:
            try:
                info = fs.info(root)
            except FileNotFoundError:
                return []
            if info.get("type", "file") == "file":
                out.append((url, int(info.get("size") or 0)))
        return out

    def open(self, url: str) -> IO[bytes]:
        """The object ``url`` as fsspec's file, which reads it by ranges as
        it is consumed (:data:`READ_BLOCK` at a time)."""
        store = self._store(url)
        f: IO[bytes] = store.fs.open(store.root, "rb", block_size=READ_BLOCK)
        return f


_registered = False


def register() -> None:
    """Make the core read URL inputs through :class:`FsspecRemote` (once)."""
    global _registered
    if not _registered:
        _core._set_remote(FsspecRemote())
        _registered = True


register()
