"""A recording whose ``out_dir`` is a URL (issue #26): what a
:class:`fastprof.Recorder` does besides recording into its local spool.

The recorder writes ``<spool_dir>/<run_name>/rank{R}/...`` exactly as into a
local run directory (so every writer, the Profiler's torch windows and memory
files included, is unchanged); a :class:`fastprof.storage.uploader.Uploader` thread
sends each closed file to ``<out_url>/<run_name>/rank{R}/...`` and frees the
spool of it. This module opens the store (a missing extra is one line on
stderr and the job trains on, its recording kept in the spool), starts and
ends the uploader within ``upload_timeout``, says on stderr what could not be
sent and the one command that sends it later, and makes the few bounded
synchronous requests the end of a run needs (the done object that tells rank 0
a rank is in the store, rank 0's unified trace).

Nothing here raises into the job, and nothing waits on the network from the
training thread except at the end, for at most ``upload_timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fastprof._core import ConfigError
from fastprof._process import PROCESS
from fastprof.recording.names import DONE_MARKER, LIVE_JSON, RUN_CLAIM, SEGMENT, STORE_CLAIM
from fastprof.recording.rundir import process_identity
from fastprof.storage import store as _storage
from fastprof.storage.uploader import Uploader

__all__ = ["Spool", "bounded", "claim_in_store", "read_store_claim", "upload_command"]

T = TypeVar("T")

#: Seconds a run-name check of the store may take at start before the name
#: is taken as it is (a store that hangs never holds the job's start longer).
CHECK_TIMEOUT_S = 10.0


def bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """``fn()`` on a daemon thread, waited for at most ``timeout_s``: a
    store that hangs (botocore retries a refused connection for seconds)
    never holds the caller longer. Raises ``TimeoutError`` naming ``what``
    past it, or what ``fn`` raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, name="fastprof-store", daemon=True)
    t.start()
    t.join(max(0.0, timeout_s))
    if t.is_alive():
        raise TimeoutError(f"{what}: no answer from the store within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def upload_command(spool_run_dir: Path | str, out_url: str) -> str:
    """The command that sends what a run left in its spool."""
    return f"fastprof upload {shlex.quote(str(spool_run_dir))} {shlex.quote(out_url)}"


def claim_key(run_name: str, rank: int, job: str | None) -> str:
    """The claim object of a run name in the store: the run's for a job
    whose ranks share a name, else this rank's folder's."""
    return f"{run_name}/{RUN_CLAIM}" if job is not None else f"{run_name}/rank{rank}/{RUN_CLAIM}"


def claim_in_store(store: _storage.Store, key: str, job: str, *, force: bool = False) -> str | None:
    """Claim ``key`` (:func:`claim_key`) for ``job``: None when the name is
    this job's (claimed now, or earlier by the same job), else who holds it.

    The claim is created only if absent (:meth:`fastprof.storage.store.Store.create`:
    on S3 a conditional write), so two jobs starting together under one name
    have one winner; the other takes ``<name>-2``. A name whose folder holds
    objects and no claim is an earlier run's (an older fastprof's). ``force``
    (resume: appending on purpose) writes the claim whatever held it."""
    body = json.dumps({"job": job, **process_identity(), "time": time.time()}).encode()
    if force:
        store.fs.pipe_file(store.path(key), body)
        return None
    held = _claim_of(store, key)
    if held is None:
        if store.has_any(key.rsplit("/", 1)[0]):
            return "an earlier run"
        if store.create(key, body):
            return None
        held = _claim_of(store, key)
    if held is not None and held.get("job") == job:
        return None
    return f"job {held.get('job')}" if held is not None else "another job"


def _claim_of(store: _storage.Store, key: str) -> dict[str, Any] | None:
    raw = store.read(key)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {"job": "(unreadable claim)"}
    return value if isinstance(value, dict) else {"job": "(unreadable claim)"}


def read_store_claim(rank_dir: Path) -> tuple[str, str] | None:
    """The (key, job) a spool's rank folder was recorded under, or None (a
    spool of an older fastprof's, or a folder that is not a rank's)."""
    try:
        value = json.loads((rank_dir / STORE_CLAIM).read_text())
        return str(value["key"]), str(value["job"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def say(message: str) -> None:
    try:
        print(f"fastprof: {message}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr is no reason to fail
        pass


class Spool:
    """One Recorder's link to the store of its URL ``out_dir``."""

    def __init__(self, out_url: str, spool_root: Path, upload_timeout: float) -> None:
        self.out_url = out_url
        self.spool_root = spool_root
        self.upload_timeout = upload_timeout
        self.store: _storage.Store | None = None
        #: Why there is no store (a missing extra): the one line already said.
        self.error: str | None = None
        self._opened = False
        self.uploader: Uploader | None = None
        self.run_name: str | None = None
        self.rank = 0
        self.rank_dir: Path | None = None
        #: What :meth:`finish` returned (None until then).
        self.result: dict[str, Any] | None = None
        #: The store claim this rank records under (key, job), and whether
        #: the store confirmed it at start.
        self._claim: tuple[str, str] | None = None
        self._claim_checked = False

    # ------------------------------------------------------------- start

    def open(self) -> _storage.Store | None:
        """The store, opened once (no request is made yet). A protocol whose
        package is missing: the line naming the extra, said once, and None:
        the job records into the spool alone."""
        if not self._opened:
            self._opened = True
            try:
                self.store = _storage.open_store(self.out_url, what="out_dir")
            except ConfigError as e:
                self.error = str(e)
                say(f"{e}; recording into the local spool {self.spool_root} instead")
        return self.store

    def claim(self, run_name: str, rank: int, job: str | None, *, force: bool = False) -> bool | None:
        """Claim ``run_name`` in the store for this job (:func:`claim_in_store`;
        ``job`` None: a job whose ranks share no name claims this rank's
        folder for this process). True when it is this job's, False when
        another job or an earlier run holds it; None when the store cannot
        tell in time (unreachable: the uploader claims it before its first
        upload, and sends nothing if it turns out to be another's)."""
        store = self.open()
        if store is None:
            return None
        key = claim_key(run_name, rank, job)
        me = job if job is not None else process_identity()["id"]
        self._claim = (key, me)
        try:
            held = bounded(
                lambda: claim_in_store(store, key, me, force=force),
                CHECK_TIMEOUT_S,
                f"claiming {store.url_of(run_name)}",
            )
        except Exception as e:  # noqa: BLE001 - the name is then taken as it is; the uploader claims it later
            say(f"could not check {store.url_of(run_name)} for an earlier run ({type(e).__name__}: {e})")
            self._claim_checked = False
            return None
        self._claim_checked = held is None
        return held is None

    def note_claim(self, run_name: str, rank: int, job: str) -> None:
        """The run name rank 0 claimed for this job: this rank's uploader
        checks the claim before its first upload."""
        self._claim = (claim_key(run_name, rank, job), job)
        self._claim_checked = False

    def next_segment(self, run_name: str, rank: int) -> int:
        """One past the highest segment number of this rank in the store
        (0 when none, or when the store cannot tell): a resumed run on a new
        node continues the numbering instead of colliding with its objects."""
        store = self.open()
        if store is None:
            return 0
        try:
            keys = bounded(lambda: store.list(f"{run_name}/rank{rank}"), CHECK_TIMEOUT_S, "listing the run")
        except Exception:  # noqa: BLE001 - a conflict then keeps the files in the spool, said at the end
            return 0
        best = -1
        for k in keys:
            m = SEGMENT.match(k.rsplit("/", 1)[-1])
            if k.count("/") == 2 and m:
                best = max(best, int(m.group(1)))
        return best + 1

    def start(self, rank_dir: Path, run_name: str, rank: int, local_rank: int) -> None:
        """Start the uploader of ``rank_dir`` (the recorder has just created it)."""
        self.run_name, self.rank, self.rank_dir = run_name, rank, rank_dir
        store = self.open()
        if store is None:
            return
        # An outage is said while the job runs by the node's local rank 0
        # alone (a store down for one rank is down for its node).
        warn = say if local_rank == 0 else None
        claim = self._claim
        if claim is not None:
            with contextlib.suppress(OSError):
                (rank_dir / STORE_CLAIM).write_text(json.dumps({"key": claim[0], "job": claim[1]}))
        check = None
        if claim is not None and not self._claim_checked:
            key, job = claim

            def check() -> str | None:
                return claim_in_store(store, key, job)

        self.uploader = Uploader(rank_dir, store, f"{run_name}/rank{rank}", warn=warn, claim=check).start()
        if local_rank == 0 and not PROCESS.spool_said:
            PROCESS.spool_said = True
            say(
                f"recording to {store.url_of(run_name)} through the local spool {self.spool_root / run_name} "
                "(spool_dir, FASTPROF_SPOOL_DIR); files leave it once uploaded"
            )

    def stats(self) -> dict[str, Any] | None:
        """The uploader's counters so far (for ``profiler.json``)."""
        if self.result is not None:
            return self.result
        if self.uploader is not None:
            return self.uploader.stats()
        if self.error is not None:
            return {"url": f"{self.out_url}/{self.run_name}/rank{self.rank}", "error": self.error}
        return None

    # --------------------------------------------------------------- end

    def put(self, local: Path, key: str, *, rewritable: bool = False, timeout_s: float | None = None) -> str | None:
        """Upload one file now, bounded; None when done, else why not."""
        store = self.open()
        if store is None:
            return self.error or "no store"
        try:
            bounded(
                lambda: store.put(local, key, rewritable=rewritable),
                self.upload_timeout if timeout_s is None else timeout_s,
                f"uploading {local}",
            )
        except Exception as e:  # noqa: BLE001 - said by the caller; the file stays in the spool
            return f"{type(e).__name__}: {' '.join(str(e).split())}"
        return None

    def finish(
        self, deadline: float | None = None, amend: Callable[[dict[str, Any]], Path | None] | None = None
    ) -> dict[str, Any]:
        """The uploader's last pass over the rank folder (every file now,
        the newest segment included) within ``upload_timeout`` (or until the
        monotonic ``deadline``); then the done object. Says on stderr what
        is left in the spool and the command that sends it; frees the spool
        of the rank folder when nothing is. Returns the upload's account.

        ``amend``, given that account, rewrites a file of the rank folder
        with it (the Profiler's ``profiler.json``) and returns its path: sent
        again at once when everything else is in the store (before the done
        object), else left in the spool with the rest for ``fastprof upload``."""
        if self.result is not None:
            return self.result
        if deadline is None:
            deadline = time.monotonic() + self.upload_timeout
        spool_run = self.spool_root / (self.run_name or "")
        if self.uploader is None:
            self.result = {"url": f"{self.out_url}/{self.run_name}/rank{self.rank}", "error": self.error}
            if self.rank_dir is not None and self.rank_dir.is_dir():
                say(
                    f"the recording of rank {self.rank} is in {self.rank_dir}; send it with: "
                    f"{upload_command(spool_run, self.out_url)}"
                )
            return self.result
        out = self.uploader.close(max(0.0, deadline - time.monotonic()))
        left = out["left_in_spool"]
        if amend is not None and self.rank_dir is not None:
            # The final account goes into the file either way: sent now when the
            # rest is in the store, else with the rest by fastprof upload.
            try:
                again = amend(out)
            except Exception:  # noqa: BLE001 - the file as first sent stands
                again = None
            if again is not None and not left["files"]:
                rel = again.relative_to(self.rank_dir).as_posix()
                why = self.put(
                    again,
                    f"{self.run_name}/rank{self.rank}/{rel}",
                    rewritable=True,
                    timeout_s=max(1.0, deadline - time.monotonic()),
                )
                if why is not None:
                    out["left_in_spool"] = left = {"files": 1, "bytes": again.stat().st_size}
                    out["last_error"] = why
        if not left["files"]:
            self._forget_live(deadline)
            done = self.rank_dir / DONE_MARKER if self.rank_dir is not None else None
            if done is not None:
                with contextlib.suppress(OSError):
                    done.write_text(str(os.getpid()))
                why = self.put(
                    done,
                    f"{self.run_name}/rank{self.rank}/{DONE_MARKER}",
                    rewritable=True,
                    timeout_s=max(1.0, deadline - time.monotonic()),
                )
                out["done_object"] = why is None
                if why is None:
                    self._free()
        else:
            last = f" (last error: {out['last_error']})" if out.get("last_error") else ""
            late = " in time" if out.get("timed_out") else ""
            say(
                f"{left['files']} file(s), {left['bytes'] / 1e6:.1f} MB, of rank {self.rank} could not be sent to "
                f"{out['url']}{late}{last}; they are in {self.rank_dir}; send them with: "
                f"{upload_command(spool_run, self.out_url)}"
            )
        self.result = out
        return out

    def _forget_live(self, deadline: float) -> None:
        """``live.json`` says a rank is running (``fastprof trigger`` asks
        it); the job removes its own at the end, and the object goes too."""
        store = self.store
        if store is None or self.rank_dir is None or (self.rank_dir / LIVE_JSON).exists():
            return
        key = f"{self.run_name}/rank{self.rank}/{LIVE_JSON}"
        with contextlib.suppress(Exception):
            bounded(lambda: store.fs.rm_file(store.path(key)), max(1.0, deadline - time.monotonic()), LIVE_JSON)

    def _free(self) -> None:
        """Remove the rank folder from the spool (every file is in the store),
        and the run's folder when that left it empty of other ranks."""
        if self.rank_dir is None:
            return
        shutil.rmtree(self.rank_dir, ignore_errors=True)
        run = self.rank_dir.parent
        with contextlib.suppress(OSError):
            if all(p.name.startswith(".") for p in run.iterdir()):
                for p in run.iterdir():
                    p.unlink()
                run.rmdir()
