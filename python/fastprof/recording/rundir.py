"""Which run directory a recording takes.

``<out_dir>/<run_name>`` when no other run is there; when one is (a second
run of the same script, ``fastprof run --run-name x`` twice, the same
timestamped default name in the same second), the first of
``<run_name>-2``, ``-3``, ... that is free, said on stderr: two runs are
never mixed by accident. ``resume`` (``FASTPROF_RESUME=1``) appends on
purpose (a job restarted after preemption): the recording then says how long
this rank was idle since its earlier recording (``otherData.config.resumed``
and the counter :data:`fastprof.recording.names.RESUME_GAP`), which the report shows as idle time, not
as a step.

What is "another run": the directory's claim, ``.fastprof-run``
(:data:`fastprof.recording.names.RUN_CLAIM`; JSON: the
job that took it, and the host, boot and pid of the process that wrote it),
names another job and the directory holds a recording (a rank's segments,
``profiler.json`` or done marker, or the unified trace) or its claimant may
still be alive; or there is no claim and it holds a recording (a run of an
older fastprof). A directory left empty, or claimed by a process of this
host that is gone and recorded nothing, is free. The claim is read and
written under ``flock``, so two processes starting at once take two
directories.

Every rank of a job must land in the same directory. The job is named the
same on every rank without talking (:func:`job_identity`): under torchrun
by its rendezvous id and restart count (the id ``none``, one node: the
agent's attempt directory, ``TORCHELASTIC_ERROR_FILE``'s, or the agent
process), with a process group and no torchrun by a token the group's
store hands the first rank that asks, alone by this process; and by the
how-many-th choice of this process it is (a second Recorder or Profiler of
the same process is a second run). A directory claimed by this job is
this job's unless this rank's own folder there already holds a recording
(the same rendezvous id reused by a requeued job). With a process group,
rank 0 decides and shares the name through the store (other ranks wait
for it, :data:`STORE_WAIT_S` at most). Ranks of a job with no shared name
(several nodes with the rendezvous id ``none`` and no process group yet,
or a launcher other than torchrun) judge only their own rank folder, which
agrees as long as every rank recorded in the earlier run.

DataLoader workers and a Recorder joining ``fastprof run``'s record into
their parent's directory and make no choice here.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastprof import _dist
from fastprof._process import PROCESS
from fastprof.recording.names import (
    DONE_MARKER,
    OPEN_SUFFIX,
    PROFILER_JSON,
    RANK_DIR,
    RUN_CLAIM,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    UNIFIED_TRACE,
)

__all__ = [
    "Choice",
    "choose",
    "in_rank_dir",
    "job_identity",
    "object_url",
    "process_identity",
    "release",
]

#: Seconds a rank other than 0 waits for rank 0's choice in the store.
STORE_WAIT_S = 60.0
#: Suffixes tried before giving up and appending (said on stderr).
MAX_SUFFIX = 10_000
#: Files of a rank folder that mean a recording was there.
_SEGMENT_SUFFIXES = (SEGMENT_SUFFIX, SEGMENT_SUFFIX + OPEN_SUFFIX)
_RANK_FILES = (PROFILER_JSON, DONE_MARKER)


def in_rank_dir(path: str) -> str:
    """A path's or URL's part from its last ``rank{R}`` folder on
    (``rank0/torch/ep0-ba4.pt.trace.json.gz``), "" when it has none."""
    parts = path.replace(os.sep, "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if RANK_DIR.match(parts[i]):
            return "/".join(parts[i:])
    return ""


def object_url(recorded: str, run_url: str) -> str | None:
    """A file a rank of a run on object storage recorded in its spool
    (profiler.json and triggers.json name it by that path), as the URL of its
    object under ``run_url``; None when the path has no rank folder."""
    tail = in_rank_dir(recorded)
    return f"{run_url.rstrip('/')}/{tail}" if tail else None


@dataclass(frozen=True)
class Choice:
    """Where a recording goes, and why."""

    run_name: str
    #: The name asked for, when an earlier run held it and a suffix was taken.
    moved_from: str | None = None
    #: With resume: this rank's earlier recording (``earlier_end_ns``, epoch
    #: ns of its last write, and ``idle_s`` since then); None when there was none.
    resumed: dict[str, Any] | None = None
    #: The claim this choice wrote for a directory no run held before, and
    #: whether it made the directory: undone by :func:`release` when the
    #: recording cannot start there after all.
    claimed: tuple[Path, str, bool] | None = None


# ------------------------------------------------------------ identities


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "host:" + socket.gethostname()


def _proc_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (None when it
    does not exist or /proc cannot say)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _me() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": pid, "pid_start": _proc_start(pid)}


def process_identity() -> dict[str, Any]:
    """This process (host, boot, pid, pid_start), and ``id``, a name for a
    job that is this process alone."""
    me = _me()
    return {**me, "id": f"process:{me['boot']}:{me['pid']}:{me['pid_start']}"}


def job_identity(env: Mapping[str, str], world_size: int, local_world_size: int) -> str | None:
    """The name every rank of this job gives it without talking (without the
    choice count), or None where the ranks share none (see the module)."""
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id is not None:
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0").strip() or "0"
        if run_id.strip() not in ("", "none"):
            return f"torchrun:{run_id.strip()}:{restart}"
        if local_world_size >= world_size:
            # One node: the agent's attempt folder (…/<id>_<random>/attempt_<n>/<local rank>/error.json)
            # is shared by its ranks and new for each torchrun and each restart.
            error_file = env.get("TORCHELASTIC_ERROR_FILE", "").strip()
            if error_file:
                return f"torchrun:{_boot_id()}:{Path(error_file).parent.parent}"
            ppid = os.getppid()
            return f"torchrun:{_boot_id()}:{ppid}:{_proc_start(ppid)}:{restart}"
    token = _store_token()
    if token is not None:
        return f"group:{token}"
    if run_id is not None or world_size > 1:
        return None
    return str(process_identity()["id"])


def _store() -> Any:
    return _dist.default_store()


def _store_token() -> str | None:
    """A name for this process group's job: the first rank to ask sets it."""
    store = _store()
    if store is None:
        return None
    try:
        return bytes(store.compare_set("fastprof/job", "", uuid.uuid4().hex)).decode()
    except Exception:  # noqa: BLE001 - a store that cannot answer: no shared name
        return None


def _group_rank() -> int | None:
    dist = _dist.process_group()
    if dist is None or dist.get_world_size() < 2:
        return None
    return int(dist.get_rank())


# --------------------------------------------------------- the directory


def _recorded(rank_dir: Path) -> int | None:
    """The last write (epoch ns) of a recording in a rank folder: its
    segments, profiler.json or done marker; None when it holds none."""
    newest: int | None = None
    try:
        entries = list(os.scandir(rank_dir))
    except OSError:
        return None
    for e in entries:
        name = e.name
        ours = name in _RANK_FILES or (name.startswith(SEGMENT_PREFIX) and name.endswith(_SEGMENT_SUFFIXES))
        if not ours:
            continue
        try:
            t = e.stat().st_mtime_ns
        except OSError:
            continue
        newest = t if newest is None else max(newest, t)
    return newest


def _holds_run(run_dir: Path) -> bool:
    """Whether any rank folder of ``run_dir`` holds a recording, or the
    unified trace is there."""
    if (run_dir / UNIFIED_TRACE).is_file():
        return True
    try:
        ranks = [e for e in os.scandir(run_dir) if e.name.startswith("rank") and e.is_dir()]
    except OSError:
        return False
    return any(_recorded(Path(e.path)) is not None for e in ranks)


def _gone(claim: Mapping[str, Any]) -> bool:
    """The claimant is a process of this host (kernel) that no longer runs."""
    if claim.get("boot") != _boot_id():
        return False
    pid = claim.get("pid")
    return not isinstance(pid, int) or _proc_start(pid) != claim.get("pid_start")


class _Claim:
    """The run directory's claim file, held under ``flock`` while open. Left
    by an error, it removes what it made (the file, an empty directory)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / RUN_CLAIM
        self.made_dir = not run_dir.is_dir()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.made_file = not self.path.exists()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without flock: the check is only racy, not wrong

    def read(self) -> dict[str, Any] | None:
        os.lseek(self.fd, 0, os.SEEK_SET)
        raw = b""
        while chunk := os.read(self.fd, 65536):
            raw += chunk
        try:
            value = json.loads(raw) if raw.strip() else None
        except ValueError:
            return None
        return value if isinstance(value, dict) and isinstance(value.get("job"), str) else None

    def write(self, job: str) -> None:
        body = json.dumps({"job": job, **_me(), "time": time.time()}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, body, 0)

    def close(self) -> None:
        os.close(self.fd)  # releases the lock

    def __enter__(self) -> _Claim:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and self.made_file:
            _remove(self.path, self.made_dir)
        self.close()


def _remove(claim: Path, run_dir_too: bool) -> None:
    try:
        claim.unlink(missing_ok=True)
        if run_dir_too:
            claim.parent.rmdir()  # only when empty
    except OSError:
        pass


def _takes(run_dir: Path, rank: int, job: str | None) -> tuple[bool, tuple[Path, str, bool] | None]:
    """Whether this rank of job ``job`` (None: a job with no shared name)
    records in ``run_dir``, and the claim it wrote there (when it was free)."""
    own = run_dir / f"rank{rank}"
    if job is None:
        return _recorded(own) is None, None
    if not (run_dir / RUN_CLAIM).exists() and _holds_run(run_dir):
        return False, None  # an unclaimed run (an older fastprof's): nothing is created in it
    with _Claim(run_dir) as claim:
        held = claim.read()
        if held is not None and held["job"] == job:
            # This job's; unless this rank's folder already holds a recording:
            # the same rendezvous id reused by a later job (a requeue).
            return _recorded(own) is None, None
        if (held is not None and not _gone(held)) or _holds_run(run_dir):
            return False, None
        claim.write(job)
        return True, (claim.path, job, claim.made_dir)


def _decide(
    out_dir: Path, base: str, rank: int, job: str | None, remote: Any = None
) -> tuple[str, tuple[Path, str, bool] | None]:
    for n in range(1, MAX_SUFFIX + 1):
        name = base if n == 1 else f"{base}-{n}"
        took, claimed = _takes(out_dir / name, rank, job)
        if took and remote is not None and remote.claim(name, rank, job) is False:
            # The store's name is another job's (or an earlier run's): this
            # spool folder is not taken after all.
            release(Choice(name, claimed=claimed))
            continue
        if took:
            return name, claimed
    _say(f"{out_dir / base} and {MAX_SUFFIX - 1} suffixed names hold earlier runs; this run appends to the first")
    return base, None


def release(choice: Choice) -> None:
    """Undo the claim of ``choice`` (its recording could not start): the
    directory is free again, and removed when the choice made it and it is
    empty. A claim another process took over since is left alone."""
    if choice.claimed is None:
        return
    path, job, made_dir = choice.claimed
    try:
        with _Claim(path.parent) as claim:
            held = claim.read()
            if held is None or held["job"] != job:
                return
            os.ftruncate(claim.fd, 0)
            _remove(path, made_dir)
    except OSError:
        pass


def _resume(out_dir: Path, base: str, rank: int, job: str | None) -> dict[str, Any] | None:
    """Append to ``out_dir/base``: claim it for this job, clear this rank's
    done marker (and, on rank 0, the unified trace) of the earlier run, and
    say how long this rank recorded nothing."""
    run_dir = out_dir / base
    own = run_dir / f"rank{rank}"
    earlier = _recorded(own)
    if job is not None:
        with _Claim(run_dir) as claim:
            claim.write(job)
    if earlier is None:
        return None
    # The earlier run's done marker would tell rank 0 this rank is done
    # before it is; its unified trace holds only the earlier run.
    (own / DONE_MARKER).unlink(missing_ok=True)
    if rank == 0:
        (run_dir / UNIFIED_TRACE).unlink(missing_ok=True)
    now = time.time_ns()
    return {"earlier_end_ns": earlier, "idle_s": max(0, now - earlier) / 1e9}


def choose(
    out_dir: Path,
    run_name: str,
    rank: int,
    world_size: int,
    local_world_size: int,
    resume: bool,
    env: Mapping[str, str] | None = None,
    remote: Any = None,
) -> Choice:
    """The run directory this recording takes (see the module). Never raises:
    when the directory cannot be looked at, the name asked for is kept (and
    starting the recording then says what is wrong with it)."""
    env = os.environ if env is None else env
    # Choices made by this process so far: the job's n-th run is ``<job>#<n>``.
    n = PROCESS.run_dirs_chosen
    PROCESS.run_dirs_chosen += 1
    try:
        base_job = job_identity(env, world_size, local_world_size)
        job = None if base_job is None else f"{base_job}#{n}"
        if resume:
            resumed = _resume(out_dir, run_name, rank, job)
            if remote is not None:
                remote.claim(run_name, rank, job, force=True)
            if resumed is not None and rank == 0:
                _say(
                    f"resuming the run in {out_dir / run_name}: its earlier recording ended "
                    f"{resumed['idle_s']:.1f} s ago, which the report shows as idle time"
                )
            return Choice(run_name, resumed=resumed)
        name, claimed = _shared(out_dir, run_name, rank, job, remote)
        if name != run_name:
            if rank == 0:
                _say(
                    f"{out_dir / run_name} holds an earlier run; this run records in {out_dir / name} "
                    "(resume=True or FASTPROF_RESUME=1 appends to the earlier run instead)"
                )
            return Choice(name, moved_from=run_name, claimed=claimed)
        return Choice(name, claimed=claimed)
    except OSError:
        return Choice(run_name)  # starting the recording there says what is wrong with it
    except Exception as e:  # noqa: BLE001 - profiling never takes the job down
        _say(f"could not check {out_dir / run_name} for an earlier run ({type(e).__name__}: {e}); recording there")
        return Choice(run_name)


def _shared(
    out_dir: Path, base: str, rank: int, job: str | None, remote: Any = None
) -> tuple[str, tuple[Path, str, bool] | None]:
    """:func:`_decide`, by rank 0 for every rank of a process group (shared
    through its store), by each rank itself without one."""
    group_rank = _group_rank()
    store = None if group_rank is None or job is None else _store()
    if store is None:
        return _decide(out_dir, base, rank, job, remote)
    key = f"fastprof/run_dir/{job}"
    asked = {"out_dir": str(out_dir), "run_name": base}
    if group_rank == 0:
        name, claimed = _decide(out_dir, base, rank, job, remote)
        try:
            store.set(key, json.dumps({**asked, "chosen": name}))
        except Exception as e:  # noqa: BLE001 - the other ranks decide alone
            _say(f"could not share the run directory with the other ranks ({type(e).__name__}: {e})")
        return name, claimed
    try:
        store.wait([key], _dt.timedelta(seconds=STORE_WAIT_S))
        told = json.loads(bytes(store.get(key)).decode())
    except Exception as e:  # noqa: BLE001 - rank 0 never said: decide alone
        _say(
            f"rank {group_rank}: rank 0 did not say its run directory within {STORE_WAIT_S:g} s "
            f"({type(e).__name__}); deciding alone"
        )
        return _decide(out_dir, base, rank, job, remote)
    if {k: told.get(k) for k in asked} == asked and isinstance(told.get("chosen"), str):
        if remote is not None:
            remote.note_claim(str(told["chosen"]), rank, job)
        return str(told["chosen"]), None
    return _decide(out_dir, base, rank, job, remote)  # rank 0 records elsewhere (a per-rank run_name)


def _say(message: str) -> None:
    try:
        print(f"fastprof: {message}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr is no reason to fail
        pass
