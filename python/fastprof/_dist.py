"""Ranks and clocks: where this process sits in a distributed job, and how its
CLOCK_REALTIME relates to rank 0's.

:func:`dist_info` reads ``torch.distributed`` when a process group is
initialised, else torchrun's environment through the options table (the same
parsing and checks as the recorder's rank). It never runs a collective.

:func:`sync_clocks` is a collective, called by every rank of the group at the
start and at the end of a run (not per window, not per step): NTP-style timed
round trips between rank 0 and one rank per clock, over gloo point-to-point
sends of int64 tensors, keeping the tightest. Ranks that share a kernel with
rank 0 (same ``boot_id``) share its CLOCK_REALTIME: their offset is 0 by
construction and nothing is measured for them. The merge applies the offsets
(:func:`apply_to_recorder` writes them into the trace metadata).

Test-only: ``FASTPROF_TEST_CLOCK_SKEW_NS`` adds that many ns to the
timestamps this rank reports in the exchange (read at each call), as if its
clock were off by that much; ranks with a skew are measured even on rank 0's
host. The recorder's own times are not skewed, so applying such an offset
shifts the rank's events by it. Never set it outside tests.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastprof._core import ConfigError
from fastprof.recording.options import BY_NAME, _value

__all__ = [
    "SKEW_ENV",
    "ClockSample",
    "ClockSync",
    "DistInfo",
    "apply_to_recorder",
    "default_store",
    "dist_info",
    "drift_ppm",
    "process_group",
    "sync_clocks",
]

#: Test-only: ns added to this rank's clock readings in :func:`sync_clocks`.
SKEW_ENV = "FASTPROF_TEST_CLOCK_SKEW_NS"
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    #: torchrun's GROUP_RANK (0 outside torchrun).
    node_rank: int
    #: The process group's backend ("gloo", "nccl", ...) or None without one.
    backend: str | None
    hostname: str
    #: "torch.distributed", "environment" (torchrun's variables) or "default".
    source: str


def process_group() -> Any:
    """``torch.distributed`` when a default process group exists, else None.
    Without torch imported there can be no process group, so torch is never
    imported here."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def default_store() -> Any:
    """The default process group's key-value store (what rank 0 shares with
    the other ranks through, without a collective), or None without one."""
    dist = process_group()
    if dist is None:
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - a group without a store (or one torn down)
        return None


def dist_info(env: Mapping[str, str] | None = None) -> DistInfo:
    """Rank, world size and backend from ``torch.distributed`` when a process
    group is initialised; local rank, local world size and node rank (and,
    without a process group, rank and world size) from torchrun's variables
    RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / GROUP_RANK, read and
    checked by the options table (``FASTPROF_RANK`` wins over RANK, as for the
    recorder). A bad value raises :class:`fastprof.ConfigError` naming it."""
    env = os.environ if env is None else env
    v = {name: _value(BY_NAME[name], None, env) for name in ("rank", "world_size", "local_rank", "local_world_size")}
    v["node_rank"] = _value(BY_NAME["node_rank"], None, env)
    v["world_size"] = max(v["world_size"], v["rank"] + 1)
    backend: str | None = None
    dist = process_group()
    if dist is not None:
        source = "torch.distributed"
        v["rank"], v["world_size"] = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend())
    elif any(env.get(k, "").strip() for k in (*_TORCHRUN_VARS, "FASTPROF_RANK")):
        source = "environment"
    else:
        source = "default"
    return DistInfo(backend=backend, hostname=socket.gethostname(), source=source, **v)


# ------------------------------------------------------------------ clocks


@dataclass(frozen=True)
class ClockSample:
    """One round trip: the client (this rank) sends at t0 and receives the reply
    at t3 on its clock; rank 0 receives at t1 and replies at t2 on its clock."""

    t0: int
    t1: int
    t2: int
    t3: int

    @property
    def rtt_ns(self) -> int:
        """Time on the wire both ways (rank 0's turnaround excluded)."""
        return (self.t3 - self.t0) - (self.t2 - self.t1)

    @property
    def offset_ns(self) -> int:
        """Rank 0's clock minus this rank's, if both ways took equally long."""
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) // 2


@dataclass(frozen=True)
class ClockSync:
    """How this rank's CLOCK_REALTIME relates to rank 0's (group rank 0)."""

    #: Add to this rank's clock to read rank 0's.
    offset_ns: int
    #: The true offset lies within offset_ns +- uncertainty_ns (half the round
    #: trip of the sample kept; 0 when the clock is shared by construction).
    uncertainty_ns: int
    #: Round trip of the sample kept (0 when nothing was measured).
    rtt_ns: int
    #: Same kernel (boot_id) as rank 0, hence the same CLOCK_REALTIME.
    same_host: bool
    #: True when an exchange measured the offset (this rank, or the first rank
    #: of its host that does not share rank 0's clock, measured it).
    measured: bool
    rank: int
    world_size: int
    #: This rank's own round trips (empty when another rank measured for it).
    samples: tuple[ClockSample, ...] = ()
    #: Every rank's (offset_ns, uncertainty_ns), by group rank.
    offsets: tuple[tuple[int, int], ...] = ()
    #: ``time.time_ns()`` when the sync finished (unskewed), for :func:`drift_ppm`.
    taken_ns: int = field(default_factory=time.time_ns)

    def to_dict(self) -> dict[str, Any]:
        """The metadata form (no samples)."""
        return {
            "offset_ns": self.offset_ns,
            "uncertainty_ns": self.uncertainty_ns,
            "rtt_ns": self.rtt_ns,
            "same_host": self.same_host,
            "measured": self.measured,
            "rank": self.rank,
            "world_size": self.world_size,
            "rounds": len(self.samples),
            "taken_ns": self.taken_ns,
        }


def drift_ppm(start: ClockSync, end: ClockSync, elapsed_ns: int | None = None) -> float:
    """How fast this rank's clock drifts from rank 0's, in parts per million
    (positive: rank 0's clock runs faster), from a sync at the start and one at
    the end; ``elapsed_ns`` defaults to the time between the two syncs."""
    elapsed = end.taken_ns - start.taken_ns if elapsed_ns is None else elapsed_ns
    if elapsed <= 0:
        raise ConfigError(f"drift_ppm: invalid elapsed_ns: expected a positive duration, got {elapsed}")
    return (end.offset_ns - start.offset_ns) / elapsed * 1e6


def apply_to_recorder(rec: Any, sync: ClockSync) -> None:
    """Write the offset into ``rec``'s trace metadata (``otherData.clock``),
    where ``fastprof merge`` applies it."""
    rec.set_clock_offset(sync.offset_ns, sync.uncertainty_ns)


def _skew_ns() -> int:
    raw = os.environ.get(SKEW_ENV, "").strip()
    if not raw:
        return 0
    try:
        return int(raw, 10)
    except ValueError:
        raise ConfigError(f"invalid environment variable {SKEW_ENV}={raw!r}: expected an integer (ns)") from None


def _clock_key() -> int:
    """Which CLOCK_REALTIME this process reads: the kernel's boot_id (shared by
    every container of one kernel), else the hostname, hashed to an int64."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            key = "boot:" + f.read().strip()
    except OSError:
        key = "host:" + socket.gethostname()
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=True)


def _single(rank: int = 0) -> ClockSync:
    return ClockSync(
        offset_ns=0,
        uncertainty_ns=0,
        rtt_ns=0,
        same_host=True,
        measured=False,
        rank=rank,
        world_size=1,
        offsets=((0, 0),),
    )


def _cpu_group(dist: Any, group: Any, timeout: _dt.timedelta) -> Any:
    """A group whose backend moves CPU tensors: the group itself under gloo (or
    ``cpu:gloo,cuda:nccl``), else a gloo group over the same ranks (every rank
    of the world must then call, as ``new_group`` requires)."""
    backend = str(dist.get_backend(group))
    if backend in ("gloo", "mpi") or "cpu:gloo" in backend:
        return group
    ranks = None if group is None else dist.get_process_group_ranks(group)
    return dist.new_group(ranks=ranks, backend="gloo", timeout=timeout)


def sync_clocks(group: Any = None, rounds: int = 8, *, force_measure: bool = False, timeout: float = 60.0) -> ClockSync:
    """Measure this rank's CLOCK_REALTIME offset to group rank 0's. Every rank
    of ``group`` (default: the world) must call it.

    For each clock other than rank 0's (one per kernel, by boot_id), the
    lowest rank on it makes ``rounds`` timed round trips with rank 0 (plus one
    not counted, to warm the connection) and keeps the one with the smallest
    round trip: offset = ((t1 - t0) + (t2 - t3)) / 2, uncertainty = rtt / 2.
    The other ranks of that host take its result; ranks on rank 0's kernel get
    0 +- 0 by construction. ``force_measure`` (on any rank) measures every
    rank, even those sharing rank 0's clock. Each wait is bounded by
    ``timeout`` seconds (``TimeoutError``).

    Without an initialised process group: a single process (WORLD_SIZE unset
    or 1) gets 0 +- 0 without any collective; a multi-process job raises
    :class:`fastprof.ConfigError` (call it after ``init_process_group``)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"sync_clocks: invalid rounds: expected an integer >= 1, got {rounds!r}")
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < 86400):
        raise ConfigError(f"sync_clocks: invalid timeout: expected seconds between 0 and 86400, got {timeout!r}")
    skew = _skew_ns()
    dist = process_group()
    if dist is None:
        info = dist_info()
        if info.world_size == 1:
            return _single(info.rank)
        raise ConfigError(
            f"sync_clocks: torch.distributed is not initialised in a job of WORLD_SIZE={info.world_size}; "
            "call it after torch.distributed.init_process_group() on every rank"
        )
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    if world == 1:
        return _single(me)
    torch = sys.modules["torch"]  # the job's: it made the process group
    wait_for = _dt.timedelta(seconds=timeout)
    cpu = _cpu_group(dist, group, wait_for)

    def wait(work: Any, what: str) -> None:
        try:
            work.wait(timeout=wait_for)
        except RuntimeError as e:
            if "imed out" in str(e) or "imeout" in str(e):
                raise TimeoutError(f"fastprof clock sync: {what} took longer than {timeout} s: {e}") from None
            raise

    def gather(values: list[int], what: str) -> list[list[int]]:
        mine = torch.tensor(values, dtype=torch.int64)
        out = [torch.zeros_like(mine) for _ in range(world)]
        wait(dist.all_gather(out, mine, group=cpu, async_op=True), what)
        return [[int(x) for x in t.tolist()] for t in out]

    def global_rank(r: int) -> int:
        return r if cpu is None else int(dist.get_global_rank(cpu, r))

    # Who shares whose clock: the same kernel and the same (test) skew.
    ids = gather([_clock_key(), skew, int(bool(force_measure))], "gathering clock identities")
    force = any(row[2] for row in ids)
    clock = [(row[0], row[1]) for row in ids]
    leader: list[int | None] = []
    for r in range(world):
        if force:
            leader.append(r if r else None)
        elif clock[r] == clock[0]:
            leader.append(None)
        else:
            leader.append(min(q for q in range(world) if clock[q] == clock[r]))
    measurers = sorted({lead for lead in leader if lead is not None})

    def now() -> int:
        return time.time_ns() + skew

    samples: list[ClockSample] = []
    for m in measurers:
        if me == 0:
            _serve(dist, torch, cpu, global_rank(m), rounds + 1, now, wait)
        elif me == m:
            samples = _ask(dist, torch, cpu, global_rank(0), rounds + 1, now, wait)[1:]

    best = min(samples, key=lambda s: s.rtt_ns) if samples else None
    mine = [best.offset_ns, (best.rtt_ns + 1) // 2, best.rtt_ns] if best else [0, 0, 0]
    results = gather(mine, "gathering offsets")
    # A rank takes the result of the rank that measured its clock; 0 +- 0 on rank 0's.
    offsets = tuple((0, 0) if lead is None else (results[lead][0], results[lead][1]) for lead in leader)
    lead = leader[me]
    return ClockSync(
        offset_ns=offsets[me][0],
        uncertainty_ns=offsets[me][1],
        rtt_ns=results[lead][2] if lead is not None else 0,
        same_host=ids[me][0] == ids[0][0],
        measured=lead is not None,
        rank=me,
        world_size=world,
        samples=tuple(samples),
        offsets=offsets,
    )


# The two sides of the exchange. Each side posts its receive before the other
# side can send, so a message never waits in gloo for a receive to be posted:
# on a busy 2-core machine that wait made the reply path milliseconds slower
# than the request path (offsets off by half a round trip).


def _serve(dist: Any, torch: Any, group: Any, peer: int, n: int, now: Any, wait: Any) -> None:
    pings = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    reply = torch.zeros(2, dtype=torch.int64)
    pending = dist.irecv(pings[0], src=peer, group=group)
    for i in range(n):
        wait(pending, "waiting for a clock ping")
        t1 = now()
        if i + 1 < n:
            pending = dist.irecv(pings[i + 1], src=peer, group=group)
        reply[0] = t1
        reply[1] = now()
        wait(dist.isend(reply, dst=peer, group=group), "sending a clock reply")


def _ask(dist: Any, torch: Any, group: Any, peer: int, n: int, now: Any, wait: Any) -> list[ClockSample]:
    ping = torch.zeros(1, dtype=torch.int64)
    reply = torch.zeros(2, dtype=torch.int64)
    out = []
    for _ in range(n):
        pending = dist.irecv(reply, src=peer, group=group)
        t0 = now()
        wait(dist.isend(ping, dst=peer, group=group), "sending a clock ping")
        wait(pending, "waiting for a clock reply")
        t3 = now()
        out.append(ClockSample(t0, int(reply[0]), int(reply[1]), t3))
    return out
