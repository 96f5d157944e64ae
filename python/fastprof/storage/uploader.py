"""The background upload of a rank's spool directory to object storage
(issue #26).

A rank records into a local spool folder as it would into a local run
directory; an :class:`Uploader` thread mirrors that folder to the store, one
whole file at a time, once the file is closed, and deletes from the spool what
it has sent and fastprof never rewrites: the local disk holds only what is
still open or not yet sent, however long the job runs.

What is closed: a file whose name starts with neither ``.`` nor ends with
``.tmp``/``.part`` (the writers' temporary names, renamed when complete),
that has not changed since the previous pass (a file written in place is not
taken half-written), and that is not the newest ``fastprof.N.json.gz`` of its
folder while recording goes on (the newest segment may still be written to;
it is closed once a higher N exists). :meth:`Uploader.close` sends everything,
the newest segment and an open segment (``fastprof.N.json.gz.part``, what a
killed writer leaves and the merge salvages) included.

The training thread never waits on the network: it starts the thread, reads
:meth:`Uploader.stats` (a copy taken under a lock held for no I/O), and at the
end calls :meth:`Uploader.close` with a time bound. Nothing here raises into
the job: a failed upload is counted, retried with exponential backoff (one
clock for the whole store: an outage is not hammered file by file), and what
could not be sent stays in the spool for ``fastprof upload``.

A job that runs for days must not learn at its end that nothing went up: with
``warn`` given (the node's local rank 0), an outage is said on stderr while
the job runs, once :data:`WARN_AFTER_FAILURES` tries in a row have failed
(botocore has retried each already), again at most every ``remind_s`` with
what waits in the spool, and once more when uploads resume.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastprof.recording.names import OPEN_SUFFIX, SEGMENT, TRIGGER_FILE
from fastprof.storage.store import REWRITTEN, Store, StoreConflictError

__all__ = ["Uploader", "closed_files", "is_candidate"]

_TEMP_SUFFIXES = (".tmp", OPEN_SUFFIX)
#: Names that are commands to the job (``fastprof trigger``), not its output.
_INPUTS = frozenset({TRIGGER_FILE})
#: Failed tries in a row before an outage is said (the third comes after 1 + 2 s
#: of backoff at the defaults: a blip that the next try gets through is not
#: worth a line).
WARN_AFTER_FAILURES = 3


def is_candidate(name: str, *, final: bool) -> bool:
    """Whether a file named ``name`` is one to upload at all: not hidden, not
    a temporary name (``.NAME.tmp-PID`` is hidden too), not a trigger. An
    open segment (``fastprof.N.json.gz.part``) only in the ``final`` pass."""
    if name.startswith(".") or name in _INPUTS:
        return False
    if final and SEGMENT.match(name):
        return True
    return not name.endswith(_TEMP_SUFFIXES) and ".tmp-" not in name


def closed_files(root: Path, *, final: bool) -> list[tuple[str, os.stat_result]]:
    """``(relative path with /, stat)`` of the files under ``root`` that are
    closed by name (:func:`is_candidate`; while not ``final``, without each
    folder's newest ``fastprof.N.json.gz``), oldest segment first. A folder or
    file that vanishes while walked (deleted by the disk cap) is skipped."""
    out: list[tuple[str, os.stat_result]] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        held: str | None = None
        if not final:
            numbered = [(int(m.group(1)), n) for n in names if (m := SEGMENT.match(n))]
            if numbered:
                newest = max(numbered)[1]
                # A higher N open as .part means this one is closed for good.
                held = newest if not newest.endswith(OPEN_SUFFIX) else None
        rel_folder = os.path.relpath(folder, root)
        for n in sorted(names, key=_order):
            if n == held or not is_candidate(n, final=final):
                continue
            try:
                st = os.stat(os.path.join(folder, n))
            except OSError:
                continue
            out.append(((n if rel_folder == "." else f"{rel_folder}/{n}").replace(os.sep, "/"), st))
    return out


def _order(name: str) -> tuple[int, str]:
    m = SEGMENT.match(name)
    return (int(m.group(1)) if m else -1, name)


@dataclass
class _Totals:
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    already_there: int = 0
    failures: int = 0
    conflicts: int = 0
    deleted_local: int = 0
    last_error: str | None = None
    last_error_time: float | None = None
    backoff_s: float = 0.0


class Uploader:
    """Mirrors ``local_dir`` (one rank's spool folder) to ``store`` under
    ``prefix`` (``<run_name>/rank3``), from a daemon thread.

    ``interval_s`` is the pause between passes over the folder: how long a
    closed file waits at most (plus the one pass it must stay unchanged);
    ``backoff_s``/``backoff_cap_s`` the first wait after a failed upload and
    its ceiling (doubled per failure in a row, with jitter so that many ranks
    do not retry in step); ``rewritten`` the file names fastprof rewrites
    (uploaded again on change, kept in the spool)."""

    def __init__(
        self,
        local_dir: str | os.PathLike[str],
        store: Store,
        prefix: str,
        *,
        interval_s: float = 1.0,
        backoff_s: float = 1.0,
        backoff_cap_s: float = 30.0,
        rewritten: Collection[str] = REWRITTEN,
        warn: Callable[[str], None] | None = None,
        remind_s: float = 3600.0,
        claim: Callable[[], str | None] | None = None,
    ) -> None:
        self.local_dir = Path(local_dir)
        self.store = store
        self.prefix = prefix.strip("/")
        self.interval_s = interval_s
        self.backoff_s = backoff_s
        self.backoff_cap_s = backoff_cap_s
        self.rewritten = frozenset(rewritten)
        self.warn = warn
        self.remind_s = remind_s
        #: Claims the run name in the store before the first upload (the
        #: store was unreachable when the job started): None when the name is
        #: this job's, else who holds it, and then nothing is ever sent.
        self._claim = claim
        self._claim_holder: str | None = None
        self._lock = threading.Lock()  # guards _totals and nothing else: held for no I/O
        self._totals = _Totals()
        self._wake = threading.Event()
        self._stop = False
        self._final_deadline: float | None = None
        self._thread: threading.Thread | None = None
        # Owned by the upload thread alone (no lock needed):
        self._sent: dict[str, tuple[int, int]] = {}  # rel -> (size, mtime_ns) last uploaded
        self._seen: dict[str, tuple[int, int]] = {}  # rel -> signature at the previous pass
        self._refused: dict[str, tuple[int, int]] = {}  # conflicts: not retried until the file changes
        self._fails_in_row = 0
        self._next_try = 0.0
        self._outage_since: float | None = None  # monotonic time of the outage's first failure
        self._outage_failures = 0
        self._warned_at: float | None = None  # when the outage was last said (None: not yet)

    # ------------------------------------------------------------ public

    def start(self) -> Uploader:
        """Start the thread (a daemon: it never keeps the process alive)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fastprof-uploader", daemon=True)
            self._thread.start()
        return self

    def stats(self) -> dict[str, Any]:
        """Counters for ``profiler.json``: what was sent, what failed, what
        is waiting. Cheap: a copy under a lock held for no I/O."""
        with self._lock:
            t = _Totals(**vars(self._totals))
        return {
            "url": self.store.url_of(self.prefix),
            "uploaded_files": t.uploaded_files,
            "uploaded_bytes": t.uploaded_bytes,
            "already_there": t.already_there,
            "failures": t.failures,
            "conflicts": t.conflicts,
            "deleted_local": t.deleted_local,
            "backoff_s": round(t.backoff_s, 3),
            "last_error": t.last_error,
            "last_error_time": t.last_error_time,
        }

    def close(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """A last pass over every file, the newest segment included, within
        ``timeout_s`` (past it, a transfer under way is left to finish on its
        own and what is not sent stays in the spool). Returns :meth:`stats`
        with ``left_in_spool`` (files, bytes), ``spool`` and ``timed_out``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        self._final_deadline = deadline
        self._stop = True
        if self._thread is None or not self._thread.is_alive():
            # Never started (or ended): the last pass runs in a thread all the
            # same, so that a store that hangs cannot hold the caller past
            # the deadline.
            self._thread = threading.Thread(target=self._final, name="fastprof-uploader", daemon=True)
            self._thread.start()
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        out = self.stats()
        out["timed_out"] = self._thread.is_alive()
        files, size = self._left()
        out["left_in_spool"] = {"files": files, "bytes": size}
        out["spool"] = str(self.local_dir)
        return out

    # ------------------------------------------------------------ thread

    def _run(self) -> None:
        while not self._stop:
            self._pass(final=False)
            self._wake.wait(self._pause())
            self._wake.clear()
        self._final()

    def _final(self) -> None:
        self._next_try = 0.0  # one more try for everything, whatever the backoff said
        self._pass(final=True)

    def _pause(self) -> float:
        return max(self.interval_s, self._next_try - time.monotonic())

    def _pass(self, *, final: bool) -> None:
        """One pass over the folder. Stops at the first failure that is not
        the file's own (the store is down: the next file would fail too)."""
        try:
            if not self._claimed():
                return
            files = closed_files(self.local_dir, final=final) if self.local_dir.is_dir() else []
            seen, self._seen = self._seen, {rel: (st.st_size, st.st_mtime_ns) for rel, st in files}
            for rel, sig in self._seen.items():
                if self._expired() or time.monotonic() < self._next_try:
                    return
                if self._sent.get(rel) == sig or self._refused.get(rel) == sig:
                    continue
                if not final and seen.get(rel) != sig:
                    continue  # changed since the last pass: maybe still being written
                if not self._upload(rel, sig):
                    return
        except Exception as e:  # noqa: BLE001 - the job must never see an uploader's error
            self._failed(f"{type(e).__name__}: {e}")

    def _claimed(self) -> bool:
        """Whether this job may send into the run's name in the store: the
        claim, made once (retried with the backoff while the store fails).
        A name another job holds: nothing is sent, said once; the files stay
        in the spool."""
        if self._claim_holder is not None:
            return False
        if self._claim is None:
            return True
        if time.monotonic() < self._next_try or self._expired():
            return False
        try:
            holder = self._claim()
        except Exception as e:  # noqa: BLE001 - the store failed: retried with backoff
            self._failed(f"claiming {self.store.url_of(self.prefix)}: {type(e).__name__}: {' '.join(str(e).split())}")
            return False
        if holder is None:
            self._claim = None
            return True
        self._claim_holder = holder
        message = (
            f"{self.store.url_of(self.prefix.rsplit('/', 1)[0])} is {holder}'s run, not this job's "
            f"(both started under one name while the store could not be asked); nothing is sent there, "
            f"the files stay in the spool {self.local_dir}"
        )
        with self._lock:
            self._totals.conflicts += 1
            self._totals.last_error = message
            self._totals.last_error_time = time.time()
        self._say(message)
        return False

    def _expired(self) -> bool:
        return self._final_deadline is not None and time.monotonic() >= self._final_deadline

    def _upload(self, rel: str, sig: tuple[int, int]) -> bool:
        """Send one file; False when the store failed (stop this pass)."""
        name = rel.rsplit("/", 1)[-1]
        rewritable = name in self.rewritten
        local = self.local_dir / rel
        key = f"{self.prefix}/{rel}" if self.prefix else rel
        try:
            result = self.store.put(local, key, rewritable=rewritable)
        except FileNotFoundError as e:
            if not local.exists():
                return True  # deleted meanwhile (the disk cap took it): nothing to send
            self._failed(f"{key}: {type(e).__name__}: {e}")
            return False
        except StoreConflictError as e:
            # The file's fault, not the store's: not retried until it changes.
            self._refused[rel] = sig
            with self._lock:
                self._totals.conflicts += 1
                self._totals.last_error = str(e)
                self._totals.last_error_time = time.time()
            return True
        except Exception as e:  # noqa: BLE001 - botocore, aiohttp, OSError: all "the store failed"
            self._failed(f"{key}: {type(e).__name__}: {' '.join(str(e).split())}")
            return False
        self._sent[rel] = sig
        self._fails_in_row = 0
        self._next_try = 0.0
        self._outage_over()
        deleted = False
        if not rewritable:
            deleted = self._delete_if_unchanged(local, sig)
        with self._lock:
            t = self._totals
            if result.action == "same":
                t.already_there += 1
            else:
                t.uploaded_files += 1
                t.uploaded_bytes += result.size
            t.deleted_local += deleted
            t.backoff_s = 0.0
        return True

    def _delete_if_unchanged(self, local: Path, sig: tuple[int, int]) -> bool:
        """Free the spool of a file that is safely in the store, unless it
        changed while it was being sent (then the next pass sends it again)."""
        try:
            st = local.stat()
            if (st.st_size, st.st_mtime_ns) != sig:
                return False
            local.unlink()
        except OSError:
            return False
        return True

    def _failed(self, message: str) -> None:
        self._fails_in_row += 1
        delay = min(self.backoff_cap_s, self.backoff_s * 2 ** (self._fails_in_row - 1))
        delay *= random.uniform(0.8, 1.2)
        self._next_try = time.monotonic() + delay
        with self._lock:
            t = self._totals
            t.failures += 1
            t.last_error = message
            t.last_error_time = time.time()
            t.backoff_s = delay
        self._outage_goes_on(message)

    # ------------------------------------------------------------ outages

    def _outage_goes_on(self, message: str) -> None:
        """Count a failure into the outage, and say it (then remind of it)
        while the job runs: at the end, :meth:`close`'s caller says what is
        left in the spool."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since, self._outage_failures = now, 0
        self._outage_failures += 1
        if self.warn is None or self._stop or self._outage_failures < WARN_AFTER_FAILURES:
            return
        where = self.store.url_of(self.prefix)
        if self._warned_at is None:
            self._say(
                f"uploads to {where} are failing ({self._outage_failures} tries in a row; last error: {message}); "
                f"retrying with backoff up to {self.backoff_cap_s:g} s, the files wait in the spool {self.local_dir}"
            )
        elif now - self._warned_at >= self.remind_s:
            files, size = self._left()
            self._say(
                f"uploads to {where} still failing after {_duration(now - self._outage_since)} "
                f"({self._outage_failures} tries; last error: {message}); {files} file(s), {size / 1e6:.1f} MB "
                f"wait in the spool {self.local_dir}"
            )
        else:
            return
        self._warned_at = now

    def _outage_over(self) -> None:
        if self._outage_since is not None and self._warned_at is not None:
            self._say(
                f"uploads to {self.store.url_of(self.prefix)} resumed after "
                f"{_duration(time.monotonic() - self._outage_since)} ({self._outage_failures} failed tries)"
            )
        self._outage_since, self._outage_failures, self._warned_at = None, 0, None

    def _say(self, message: str) -> None:
        try:
            if self.warn is not None:
                self.warn(message)
        except Exception:  # noqa: BLE001 - a line on stderr is never worth the upload thread
            pass

    def _left(self) -> tuple[int, int]:
        """Files (and bytes) of the spool folder the store does not have in
        their current version: what ``fastprof upload`` would send."""
        files = size = 0
        try:
            for rel, st in closed_files(self.local_dir, final=True) if self.local_dir.is_dir() else []:
                if self._sent.get(rel) != (st.st_size, st.st_mtime_ns):
                    files += 1
                    size += st.st_size
        except Exception:  # noqa: BLE001 - a count for a message, never an error of its own
            pass
        return files, size


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
