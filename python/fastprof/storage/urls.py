"""The URL rules of object storage (issue #26): which text names a place
through fsspec (``s3://bucket/runs``) rather than a local path, which URLs
name no place and are refused before anything runs, and which fastprof
extra brings a protocol's package.

Nothing here imports fsspec unless a URL is checked against the protocols
it serves, so a local run never loads it.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from fastprof._core import ConfigError
from fastprof._package import pip_install
from fastprof.recording.names import is_url

__all__ = [
    "EXTRAS",
    "absolute",
    "check_local_dir",
    "check_location",
    "check_store_url",
    "check_url",
    "is_url",
    "load_fsspec",
    "missing",
    "needs_spool",
]


#: Protocol -> (the fastprof extra that installs it, the package it needs).
EXTRAS: dict[str, tuple[str, str]] = {
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "gcs": ("gcs", "gcsfs"),
    "az": ("azure", "adlfs"),
    "abfs": ("azure", "adlfs"),
    "abfss": ("azure", "adlfs"),
}


#: Protocols whose first path component is a bucket (a container, an
#: account): a URL without one names no place. The local ones (``file``,
#: ``local``) need a path, ``memory`` nothing.
_LOCAL = frozenset({"file", "local"})
_NO_BUCKET = frozenset({"memory", "data", "http", "https"}) | _LOCAL
#: What the first component of each such protocol is called, for the message.
_BUCKET_WORD = {"az": "container", "abfs": "container", "abfss": "container", "adl": "store"}
#: ``s3:/bucket`` (one slash): a URL that lost a slash, which as a local path
#: would make a folder named ``s3:`` (group 1 the scheme).
_ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):/?(?!/)")


def load_fsspec() -> Any:
    """fsspec: the storage package imports it here only, once a URL is
    used (a local run never loads it). ImportError without it."""
    import fsspec

    return fsspec


def _served() -> frozenset[str]:
    """Protocols some filesystem serves: fsspec's known and registered
    implementations (installed or not: a missing package is the extra's
    line, not an unknown protocol), or without fsspec the ones fastprof
    knows of."""
    try:
        fsspec = load_fsspec()
    except ImportError:
        return frozenset(EXTRAS) | _NO_BUCKET
    # available_protocols(): the known implementations; fsspec.registry: the registered ones.
    return frozenset(fsspec.available_protocols()) | frozenset(fsspec.registry)


def check_url(url: str, what: str = "out_dir") -> str:
    """Refuse, before anything is created or run, a URL that names no place:
    a scheme no filesystem serves (``foo://x``), an object store's URL
    without its bucket (``s3://``, ``s3:///runs``), ``file://`` without a
    path. Raises a one-line :class:`ConfigError` naming ``what`` (the
    setting it came from) and the URL; returns ``url`` unchanged."""
    links = url.split("::")
    served = _served()
    for link in links:
        proto = link.split("://", 1)[0].lower() if "://" in link else link.lower()
        if proto not in served:
            raise ConfigError(
                f"{what} {url}: no filesystem serves {proto}:// (expected s3://BUCKET/prefix, gs://..., az://..., file:///path)"
            )
    last = links[-1]
    if "://" not in last:
        raise ConfigError(f"{what} {url}: the chain ends without a URL (expected e.g. simplecache::s3://BUCKET/prefix)")
    proto, rest = last.split("://", 1)
    proto = proto.lower()
    if proto in _LOCAL:
        if not rest.strip("/"):
            raise ConfigError(f"{what} {url}: {proto}:// needs a path: {proto}:///absolute/path")
    elif proto not in _NO_BUCKET and not rest.split("/", 1)[0].strip():
        word = _BUCKET_WORD.get(proto, "bucket")
        raise ConfigError(f"{what} {url}: {proto}:// needs a {word}: {proto}://{word.upper()}/prefix")
    return url


def check_location(text: str | os.PathLike[str], what: str) -> str | os.PathLike[str]:
    """:func:`check_url` for a URL; for a local path, refuse one whose first
    folder is a storage scheme (``s3:/bucket/x``, a URL that lost a slash),
    which would otherwise become a local folder named ``s3:``. Returns
    ``text`` unchanged."""
    if is_url(text):
        return check_url(os.fspath(text), what)
    m = _ONE_SLASH.match(os.fspath(text))
    if m and m.group(1).lower() in _served() - {"file", "local"}:
        raise ConfigError(
            f"{what} {os.fspath(text)}: a local path that starts with the storage scheme {m.group(1)}: "
            f"(a URL needs two slashes: {m.group(1)}://...; a folder of that name: ./{os.fspath(text)})"
        )
    return text


def needs_spool(out_dir: str | os.PathLike[str]) -> bool:
    """Whether a recording into ``out_dir`` is made in a local spool whose
    closed files are uploaded (a place in a store), rather than in place."""
    return is_url(out_dir)


def check_local_dir(text: str | os.PathLike[str], what: str) -> str | os.PathLike[str]:
    """Refuse, as :class:`ConfigError` naming ``what``, a place that must be
    a local directory (a spool) but is a URL, or a local path that is a URL
    with a slash lost; returns ``text`` unchanged."""
    if is_url(text):
        raise ConfigError(f"invalid {what}: expected a local directory, got the URL {os.fspath(text)}")
    return check_location(text, what)


def check_store_url(text: str, what: str) -> str:
    """:func:`check_location`, and refuse a local path: ``text`` must name a
    place in a store. Returns ``text`` unchanged."""
    check_location(text, what)
    if not is_url(text):
        raise ConfigError(
            f"{what} {text}: not a storage URL (expected s3://BUCKET/prefix, gs://..., az://..., file:///path)"
        )
    return text


def absolute(location: str) -> str:
    """A local path made absolute (a process that changes directory must not
    move what is written there); a URL as it is, the store's."""
    return location if is_url(location) else os.path.abspath(location)


def _protocol(url: str) -> str:
    """The storage protocol of ``url``: a chain's last link
    (``simplecache::s3://b/x`` is stored on s3)."""
    return url.split("::")[-1].split("://", 1)[0].lower()


def missing(url: str, what: str, e: BaseException) -> ConfigError:
    """The one line for a URL whose protocol cannot be used here."""
    proto = _protocol(url)
    if proto in EXTRAS:
        extra, package = EXTRAS[proto]
        why = "is not installed" if importlib.util.find_spec(package) is None else f"cannot be imported: {e}"
        return ConfigError(f"{what} {url} needs the {extra} extra: {pip_install(extra)} ({package} {why})")
    if isinstance(e, ImportError):
        return ConfigError(f"{what} {url}: the {proto}:// protocol needs a package that is not installed ({e})")
    return ConfigError(f"{what} {url}: unknown storage protocol {proto!r} ({e})")
