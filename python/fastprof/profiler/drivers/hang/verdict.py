"""Hangs (issue #37): what each rank's evidence says, and one verdict across
ranks. The hung job's ranks (:mod:`fastprof.profiler.drivers.hang.driver`),
``fastprof trigger --stacks`` and the report of a run killed while hung
(:mod:`fastprof.reports.hangs`) call the same functions on the same files, so
the line printed on stderr and report.json's ``hangs[]`` agree. Standard
library only: the reports import it without the Profiler's machinery.

Each rank writes ``rank{R}/hang-<n>.json`` when its watchdog sees no step end
for the timeout (or on ``fastprof trigger --stacks``): every thread's stack
(innermost frame first), the step and how long it has stalled, the DataLoader
workers, torch's Flight Recorder entries. ``answered_by`` says who wrote it:
``"python"`` (the interpreter answered: the full evidence) or ``"watchdog"``
(the Rust thread, because a thread held the GIL for the whole grace: only
the stacks, read without the GIL). ``rank{R}/.hang-watch.json`` says which
process and thread the rank's training loop is, so a rank that wrote nothing
is told apart as gone (its process ended) or unable to answer.

A rank's state, from its training thread's stack:

- ``collective``: inside a ``torch.distributed`` collective (op, and the
  user's call site);
- ``gil``: its evidence came from the watchdog alone: a thread held the GIL
  for the whole grace (spinning in a C call);
- ``elsewhere``: in its own code, the data loader, compute (``phase``);
- ``closed``: no evidence, but it left its training loop before the stall
  (``rank{R}/.hang-closed.json``: its last step and wavefront);
- ``gone``: no evidence and its process is not there;
- ``silent``: no evidence and its process is there (or on another host).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import socket
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fastprof.profiler.anatomy import COLLECTIVES

__all__ = [
    "CLOSED_FILE",
    "HANG_FILE",
    "HANG_REQUEST_FILE",
    "WATCH_FILE",
    "closed_ranks",
    "collect",
    "describe",
    "evidence_files",
    "gone_ranks",
    "join",
    "left_loop",
    "rank_state",
    "summarize",
    "verdict",
]

#: ``rank{R}/hang-<n>.json``: one rank's evidence (names shared with the core's watchdog).
HANG_FILE = re.compile(r"^hang-(\d+)\.json$")
#: ``rank{R}/STACKS``: ``fastprof trigger --stacks``'s request (the core's watchdog reads it).
HANG_REQUEST_FILE = "STACKS"
#: ``rank{R}/.hang-watch.json``: the rank's process (pid, host) and training thread.
WATCH_FILE = ".hang-watch.json"
#: ``rank{R}/.hang-closed.json``: written when the rank's loop ends (its Profiler
#: closes): its last step and collective wavefront, for the ranks still waiting.
CLOSED_FILE = ".hang-closed.json"

#: The evidence of a hang: a stall past the timeout, or a SIGTERM to a rank that
#: had made no progress for a while (a job ended while hung, before its timeout);
#: a ``--stacks`` request's answer is not one.
HUNG_REASONS = ("stalled", "sigterm")

#: torch.distributed's collectives (those the anatomy times) and the point-to-point
#: and object calls a rank can wait in, as their functions are named.
COLLECTIVE_OPS = frozenset(COLLECTIVES) | frozenset(
    {
        "gather_object",
        "monitored_barrier",
        "recv",
        "scatter_object_list",
        "send",
        "wait",
    }
)

_SEP = os.sep
_TORCH = f"{_SEP}torch{_SEP}"
_FASTPROF = f"{_SEP}fastprof{_SEP}"
_STDLIB = tuple(
    p + _SEP for p in {sysconfig.get_paths().get("stdlib", ""), sysconfig.get_paths().get("platstdlib", "")} if p
)


def _is_user(file: str) -> bool:
    """A frame of the job's own code: not torch, fastprof or the standard library."""
    return not (_TORCH in file or _FASTPROF in file or file.startswith(_STDLIB) or file.startswith("<"))


def _phase_of(frames: list[dict[str, Any]]) -> str:
    """The step's phase a stack is in: the outermost frame that names one (a
    collective inside backward is backward's, as the anatomy counts it)."""
    for f in reversed(frames):
        file, fn = str(f.get("file", "")), str(f.get("function", ""))
        if f"{_SEP}torch{_SEP}utils{_SEP}data{_SEP}" in file:
            return "dataloader"
        if f"{_SEP}torch{_SEP}autograd{_SEP}" in file or (file.endswith(f"torch{_SEP}_tensor.py") and fn == "backward"):
            return "backward"
        if f"{_SEP}torch{_SEP}optim{_SEP}" in file:
            return "optimizer"
        if f"{_SEP}torch{_SEP}nn{_SEP}modules{_SEP}module.py" in file:
            return "forward"
        if f"{_SEP}torch{_SEP}distributed{_SEP}" in file:
            return "communication"
    return "other"


def summarize(evidence: dict[str, Any], training: int | None) -> dict[str, Any]:
    """Where a rank's training thread is: ``where`` (its innermost frame of
    the job's own code), ``top`` (its innermost frame), ``phase``, and
    ``collective`` (``op`` and the ``site`` it was called from) or None.
    ``training``: the training thread's id (None: the first thread listed
    that has frames)."""
    threads = [t for t in evidence.get("threads") or [] if isinstance(t, dict)]
    thread = None
    for t in threads:
        if training is not None and _ident(t) == training:
            thread = t
            break
    if thread is None:
        thread = next((t for t in threads if t.get("training")), None)
    if thread is None:
        thread = next((t for t in threads if t.get("frames")), None)
    frames = [f for f in (thread or {}).get("frames") or [] if isinstance(f, dict)]
    where = next((f for f in frames if _is_user(str(f.get("file", "")))), frames[0] if frames else None)
    collective = None
    for i, f in enumerate(frames):
        if f"{_SEP}torch{_SEP}distributed{_SEP}" in str(f.get("file", "")) and f.get("function") in COLLECTIVE_OPS:
            site = next((g for g in frames[i + 1 :] if _is_user(str(g.get("file", "")))), None)
            collective = {"op": f["function"], "site": _frame(site), "seq": _seq(evidence, f["function"])}
            break
    phase = _phase_of(frames)
    if collective is None and phase == "backward":
        # A collective torch runs in C++ inside backward (DDP's gradient
        # all-reduce, FSDP's reduce-scatter) is not in the Python stack: it
        # is in torch's Flight Recorder, when the job turned it on.
        pending = _fr_pending(evidence)
        if pending is not None:
            collective = {"op": pending[0], "site": _frame(where), "seq": pending[1], "source": "flight_recorder"}
    return {
        "where": _frame(where),
        "top": _frame(frames[0] if frames else None),
        "phase": phase,
        "collective": collective,
        "worker": _busy_worker(evidence.get("workers")),
    }


def _fr_pending(evidence: dict[str, Any]) -> tuple[str, int] | None:
    """The collective a rank's torch Flight Recorder has last scheduled and
    not retired (``op``, its number there), or None (none, or done)."""
    fr = evidence.get("flight_recorder")
    entries = fr.get("entries") if isinstance(fr, dict) else None
    for e in reversed(entries or []):
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        if e.get("retired") or not isinstance(e.get("collective_seq_id"), int):
            return None
        return str(e.get("profiling_name", "")).split(":")[-1], int(e["collective_seq_id"])
    return None


def worker_where(threads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where a DataLoader worker is, from its threads (``faulthandler``'s,
    parsed): its main thread's (the one in torch's worker loop) innermost
    frame of the job's code; None when it is only in torch and the standard
    library (idle, waiting for an index)."""
    ts = [t for t in threads if isinstance(t, dict) and t.get("frames")]
    loop = f"{_SEP}torch{_SEP}utils{_SEP}data{_SEP}_utils{_SEP}worker.py"
    main = next((t for t in ts if any(loop in str(f.get("file", "")) for f in t["frames"])), None)
    for t in [main] if main is not None else ts:
        f = next((f for f in t["frames"] if _is_user(str(f.get("file", "")))), None)
        if f is not None:
            return _frame(f)
    return None


def _busy_worker(workers: Any) -> dict[str, Any] | None:
    """The first DataLoader worker of a rank that is in the job's code
    (``pid``, ``worker_id``, ``loader``, ``where``), or None."""
    for w in workers if isinstance(workers, list) else ():
        if isinstance(w, dict) and w.get("dataloader") and isinstance(w.get("where"), dict):
            return {k: w.get(k) for k in ("pid", "worker_id", "loader", "where")}
    return None


def _seq(evidence: dict[str, Any], op: str) -> int | None:
    """The sequence number of the collective a rank is in: from its
    wavefront (the last entered, not completed, of that op) when recorded,
    else from torch's Flight Recorder (its last entry not retired, of that op)."""
    wave = evidence.get("collectives")
    if isinstance(wave, dict):
        for g in wave.values():
            e = g.get("entered") if isinstance(g, dict) else None
            if isinstance(e, dict) and e.get("op") == op and e.get("seq") != (g.get("completed") or {}).get("seq"):
                return int(e["seq"])
    fr = evidence.get("flight_recorder")
    entries = fr.get("entries") if isinstance(fr, dict) else None
    for e in reversed(entries or []):
        if not isinstance(e, dict) or e.get("retired") or e.get("is_p2p"):
            continue
        if str(e.get("profiling_name", "")).split(":")[-1] == op and isinstance(e.get("collective_seq_id"), int):
            return int(e["collective_seq_id"])
        break
    return None


def last_completed(evidence: dict[str, Any] | None) -> int | None:
    """The last collective a rank completed on the default group, from
    torch's Flight Recorder (None: not recorded)."""
    fr = (evidence or {}).get("flight_recorder")
    entries = fr.get("entries") if isinstance(fr, dict) else None
    done = [
        int(e["collective_seq_id"])
        for e in entries or []
        if isinstance(e, dict) and e.get("retired") and not e.get("is_p2p")
        if isinstance(e.get("collective_seq_id"), int)
    ]
    return max(done, default=None)


def _ident(thread: dict[str, Any]) -> int | None:
    v = thread.get("ident", thread.get("id"))
    if isinstance(v, int):
        return v
    with contextlib.suppress(TypeError, ValueError):
        return int(str(v), 16)
    return None


def _frame(f: dict[str, Any] | None) -> dict[str, Any] | None:
    if not f:
        return None
    return {"file": f.get("file"), "line": f.get("line"), "function": f.get("function")}


def rank_state(evidence: dict[str, Any] | None, watch: dict[str, Any] | None, live: bool = True) -> dict[str, Any]:
    """One rank's state (see the module documentation) with its summary.
    ``live``: the job still runs, so a process that is not there is gone
    (after the job, a rank without evidence is only silent)."""
    if evidence is None:
        alive = _alive(watch) if live else None
        return {"state": "gone" if alive is False else "silent", "alive": alive, "known": watch is not None}
    s = summarize(evidence, (watch or {}).get("training_thread", evidence.get("training_thread")))
    if evidence.get("answered_by") == "watchdog":
        state = "gil"
    elif s["collective"] is not None:
        state = "collective"
    else:
        state = "elsewhere"
    return {
        **s,
        "state": state,
        "step": evidence.get("step"),
        "stalled_s": evidence.get("stalled_s"),
        "last_completed": last_completed(evidence),
        "entered": _entered(evidence),
        "steps": _steps(evidence),
    }


def closed_state(closed: dict[str, Any]) -> dict[str, Any]:
    """The state of a rank that left its training loop (its Profiler closed)
    and wrote no evidence: its last step and wavefront, from ``closed``."""
    return {
        "state": "closed",
        "where": None,
        "top": None,
        "phase": None,
        "collective": None,
        "step": closed.get("step"),
        "stalled_s": None,
        "last_completed": None,
        "entered": _entered(closed),
        "steps": _steps(closed),
    }


def _entered(evidence: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each process group's last entered collective (``op``, ``seq``) in the
    rank's wavefront."""
    out: dict[str, dict[str, Any]] = {}
    wave = evidence.get("collectives")
    for g, w in wave.items() if isinstance(wave, dict) else ():
        e = w.get("entered") if isinstance(w, dict) else None
        if isinstance(e, dict) and isinstance(e.get("seq"), int):
            out[str(g)] = {"op": e.get("op"), "seq": int(e["seq"])}
    return out


def _steps(evidence: dict[str, Any]) -> dict[str, list[list[int]]]:
    """Each process group's steps (``[step, collectives before its first]``)
    in the rank's wavefront (:func:`fastprof.profiler.collectives.snapshot`)."""
    out: dict[str, list[list[int]]] = {}
    wave = evidence.get("collectives")
    for g, w in wave.items() if isinstance(wave, dict) else ():
        st = w.get("steps") if isinstance(w, dict) else None
        if isinstance(st, list):
            out[str(g)] = [[int(a), int(b)] for a, b in (x for x in st if isinstance(x, list) and len(x) == 2)]
    return out


def step_counts(steps: list[list[int]], entered: int | None) -> tuple[dict[int, int], int, int] | None:
    """A group's collectives per step, from its ``steps`` and its last
    entered number: ``(count by step, first step, last step)``; a step
    within the range that is not in the dict had none. None when empty."""
    if not steps:
        return None
    out: dict[int, int] = {}
    for (step, before), (_, after) in itertools.pairwise(steps):
        out[step] = after - before
    last, before = steps[-1]
    out[last] = (entered if entered is not None else before + 1) - before
    return out, steps[0][0], last


def first_diff(mine: dict[str, Any], theirs: dict[str, Any], group: str) -> dict[str, int] | None:
    """The first step (within both ranks' recorded steps) in which two
    ranks entered a different number of ``group``'s collectives:
    ``{"step", "mine", "theirs"}``, or None (no record, or no difference)."""
    a = step_counts(
        (mine.get("steps") or {}).get(group) or [], ((mine.get("entered") or {}).get(group) or {}).get("seq")
    )
    b = step_counts(
        (theirs.get("steps") or {}).get(group) or [], ((theirs.get("entered") or {}).get(group) or {}).get("seq")
    )
    if a is None or b is None:
        return None
    lo, hi = max(a[1], b[1]), min(a[2], b[2])
    for step in sorted(k for k in a[0].keys() | b[0].keys() if lo <= k <= hi):
        m, t = a[0].get(step, 0), b[0].get(step, 0)
        if m != t:
            return {"step": step, "mine": m, "theirs": t}
    return None


def _skipped(s: dict[str, Any], op: str, seq: Any, waiting: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A rank outside the collective the others wait in that has already
    ended the step they wait in, having entered fewer collectives of that
    group than they did: it skipped one (or more): the ranks' code paths
    diverged. ``{"group", "seq", "op", "step"}``: its last entered, or None.

    The waiting ranks' group is the one whose last entered collective is
    ``op`` #``seq``; their step is the one after the last they ended."""
    steps = [int(w["step"]) for w in waiting if w.get("step") is not None]
    if not isinstance(seq, int) or s.get("step") is None or not steps or len(steps) < len(waiting):
        return None
    if int(s["step"]) < max(steps) + 1:
        return None  # it has not ended that step: it is late, not off the path
    group = next(
        (g for g, e in (waiting[0].get("entered") or {}).items() if e.get("op") == op and e.get("seq") == seq), None
    )
    mine = (s.get("entered") or {}).get(group) if group is not None else None
    if group is None or mine is None or mine["seq"] >= seq:
        return None
    out = {"group": group, "seq": mine["seq"], "op": mine["op"], "step": int(s["step"])}
    first = first_diff(s, waiting[0], group)
    if first is not None:
        out["first"] = first
    return out


def _alive(watch: dict[str, Any] | None) -> bool | None:
    """Whether a rank's process is there: None when unknown (another host, no record)."""
    if not watch or watch.get("host") != socket.gethostname():
        return None
    try:
        pid = int(watch["pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, ValueError, KeyError, TypeError):
        return True
    # A process killed outside its launcher stays a zombie until the launcher
    # reaps it: it is gone all the same (Linux's /proc; elsewhere: alive).
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2 :].split()[0] in ("Z", "X"):
            return False
    return True


def gone_ranks(run_dir: Path, exclude: int | None = None) -> list[tuple[int, int]]:
    """``(rank, pid)`` of each rank of the run whose process, on this host,
    is gone (its watch file names it), ``exclude`` aside. A rank that left
    its training loop first (:func:`closed_ranks`) is not one: its process
    ended after its loop, not outside the launcher."""
    out = []
    closed = closed_ranks(run_dir, exclude)
    for r, d in sorted(_rank_dirs(run_dir).items()):
        watch = _read(d / WATCH_FILE) if r != exclude and r not in closed else None
        if watch is not None and _alive(watch) is False:
            out.append((r, int(watch["pid"])))
    return out


def _closed_of(d: Path, watch: dict[str, Any] | None) -> dict[str, Any] | None:
    """A rank's closed file, taken only from the Profiler that watches it
    (the same token as its watch file)."""
    closed = _read(d / CLOSED_FILE)
    if closed is not None and watch is not None and closed.get("token") != watch.get("token"):
        return None  # another Profiler's: the one watching now started after it closed
    return closed


def closed_ranks(run_dir: Path, exclude: int | None = None) -> dict[int, dict[str, Any]]:
    """Each rank of the run (``exclude`` aside) that has left its training
    loop: its ``.hang-closed.json``."""
    out = {}
    for r, d in sorted(_rank_dirs(run_dir).items()):
        closed = _closed_of(d, _read(d / WATCH_FILE)) if r != exclude else None
        if closed is not None:
            out[r] = closed
    return out


def left_loop(rank: int, step: int | None, wave: Any, closed: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Why a collective of ``rank`` failed (a peer's sockets closed) when
    the ranks of ``closed`` had left their training loop: one entry per such
    rank, ``rank``, ``step``, ``skipped`` and ``text``. ``step``: the last
    step ``rank`` ended; ``wave``: its collective wavefront. A rank that
    ended the step ``rank`` is in with fewer collectives of the group than
    ``rank`` entered skipped one (as :func:`verdict` says of a hang)."""
    entered = _entered({"collectives": wave})
    me = {"step": step, "entered": entered, "steps": _steps({"collectives": wave})}
    # The collective that failed: one entered and not completed, else (the
    # anatomy marks a collective completed when it raises too) the default
    # group's last entered.
    pending = None
    for g, w in wave.items() if isinstance(wave, dict) else ():
        c = w.get("completed") if isinstance(w, dict) else None
        if g in entered and entered[g]["seq"] != (c or {}).get("seq"):
            pending = (str(entered[g]["op"]), entered[g]["seq"])
            break
    last = entered.get("default") or next(iter(entered.values()), None)
    if pending is None and last is not None:
        pending = (str(last["op"]), last["seq"])
    out = []
    for r, doc in sorted(closed.items()):
        s = closed_state(doc)
        now = f"has left its training loop (its Profiler closed after step {s['step']})"
        skip = _skipped(s, pending[0], pending[1], [me]) if pending is not None else None
        if skip is not None and pending is not None:
            text = _skip_text(r, skip, [rank], f"{pending[0]} #{pending[1]}", now)
        elif pending is not None:
            text = f"rank {r} never entered {pending[0]} #{pending[1]}; it {now}"
        else:
            text = f"rank {r} {now}"
        out.append({"rank": r, "step": s["step"], "skipped": skip is not None, "text": text})
    return out


def _skip_text(r: int, skip: dict[str, Any], waiting: list[int], cname: str | None, now: str) -> str:
    """Rank ``r`` skipped a collective (:func:`_skipped`), with what it is doing ``now``."""
    group = "the default group" if skip["group"] == "default" else f"group {skip['group']}"
    return (
        f"rank {r} skipped a collective: it ended step {skip['step']} after {skip['seq']} collectives of "
        f"{group} (the last {skip['op']} #{skip['seq']}) where rank{'s' if len(waiting) > 1 else ''} "
        f"{rank_ranges(waiting)} entered {cname} in that step: the ranks took different code paths (a collective "
        f"called on some ranks only){_first_text(r, skip, waiting, group)}; rank {r} "
        f"{now.replace('is in', 'is now in', 1)}"
    )


def _first_text(r: int, skip: dict[str, Any], waiting: list[int], group: str) -> str:
    """``, first in step S: rank R entered N collectives of the group there
    where rank(s) W entered M``, when the ranks' steps were recorded."""
    f = skip.get("first")
    if not isinstance(f, dict):
        return ""
    many = len(waiting) > 1
    return (
        f", first in step {f['step']}: rank {r} entered {f['mine']} collective{'' if f['mine'] == 1 else 's'} of "
        f"{group} there where rank{'s' if many else ''} {rank_ranges(waiting)} entered {f['theirs']}"
    )


def rank_ranges(states: Iterable[int]) -> str:
    """Ranks as runs: ``0-2, 4`` for [0, 1, 2, 4] (the reports' too)."""
    rs = sorted(states)
    out: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def _at(f: dict[str, Any] | None) -> str:
    if not f:
        return "an unknown place"
    name = os.path.basename(str(f.get("file")))
    return f"{name}:{f.get('line')} in {f.get('function')}"


def verdict(states: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One verdict across ranks (``states``: :func:`rank_state` by rank):
    the entry of report.json's ``hangs[]``, with ``kind`` and ``text``."""
    states = {r: dict(s) for r, s in states.items()}  # a rank found to skip a collective is marked
    waiting = {r: s for r, s in states.items() if s["state"] == "collective"}
    others = {r: s for r, s in states.items() if s["state"] != "collective"}
    answered = [s for s in states.values() if s.get("step") is not None]
    step = min((int(s["step"]) for s in answered), default=None)
    seconds = max((float(s.get("stalled_s") or 0.0) for s in answered), default=0.0)
    collective: dict[str, Any] | None = None
    suspects: list[int]
    if waiting:
        ops: dict[tuple[str, Any], list[int]] = {}
        for r, s in waiting.items():
            ops.setdefault((s["collective"]["op"], s["collective"]["seq"]), []).append(r)
        (op, seq), main = max(ops.items(), key=lambda kv: (len(kv[1]), -min(kv[1])))
        collective = {"op": op, "seq": seq}
        if not others and len(ops) == 1:
            kind, suspects = "backend", []
        elif not others:
            kind = "mismatch"
            suspects = sorted(r for r, _ in waiting.items() if r not in main)
        else:
            kind, suspects = _kind_of(others), sorted(others)
            for r in suspects:
                skip = _skipped(others[r], op, seq, [waiting[w] for w in main])
                if skip is not None:
                    others[r]["skipped"] = skip
                    kind = "mismatch"
        waiting_ranks = sorted(main)
    else:
        kind, suspects, waiting_ranks = _kind_of(others), sorted(others), []
    where = [
        {
            "rank": r,
            "file": (states[r].get("where") or {}).get("file"),
            "line": (states[r].get("where") or {}).get("line"),
            "function": (states[r].get("where") or {}).get("function"),
            "phase": states[r].get("phase"),
            "state": states[r]["state"],
        }
        for r in suspects
    ]
    out = {
        "step": None if step is None else step + 1,
        "seconds": round(seconds, 1),
        "kind": kind,
        "suspect_ranks": suspects,
        "where": where,
        "collective": collective,
        "waiting_ranks": waiting_ranks,
    }
    out["text"] = describe(out, states)
    return out


def _kind_of(others: dict[int, dict[str, Any]]) -> str:
    kinds = {s["state"] for s in others.values()}
    for k in ("gil", "gone", "silent"):
        if k in kinds:
            return k
    return "elsewhere"  # in its own code, the data, compute, or out of its loop (closed)


def describe(v: dict[str, Any], states: dict[int, dict[str, Any]]) -> str:
    """The verdict in one sentence (without the ``fastprof:`` prefix)."""
    head = f"hang at step {v['step']}" if v["step"] is not None else "hang"
    head += f" ({v['seconds']:.0f} s)"
    c = v["collective"]
    cname = None
    if c is not None:
        cname = c["op"] + (f" #{c['seq']}" if c.get("seq") is not None else "")
    parts: list[str] = []
    if v["kind"] == "backend":
        site = _at(states[v["waiting_ranks"][0]]["collective"]["site"]) if v["waiting_ranks"] else ""
        return (
            f"{head}: every rank waits in {cname} ({site}): none is missing, so the network or the "
            "collective backend is stuck"
        )
    for r in v["suspect_ranks"]:
        s = states[r]
        st = s["state"]
        # "rank R never entered op #N; it is in ..." or, with no collective, "rank R is in ...".
        never = f"never entered {cname}; " if cname is not None and st != "collective" else ""
        it = f"rank {r} {never}it" if never else f"rank {r}"
        skip = s.get("skipped")
        if st == "closed":
            now = f"has left its training loop (its Profiler closed after step {s['step']})"
        else:
            phase = s.get("phase")
            now = f"is in {'the dataloader' if phase == 'dataloader' else phase}: {_at(s.get('where'))}"
            w = s.get("worker") if phase == "dataloader" else None
            if isinstance(w, dict):
                now += (
                    f", where its DataLoader worker {w.get('worker_id')} (pid {w.get('pid')}) is in {_at(w['where'])}"
                )
        if skip is not None and v["waiting_ranks"]:
            parts.append(_skip_text(r, skip, v["waiting_ranks"], cname, now))
        elif st == "closed":
            parts.append(f"{it} {now}")
        elif st == "collective":
            sc = s["collective"]
            parts.append(
                f"rank {r} is in {sc['op']} ({_at(sc['site'])}, {s['phase']}) where the others are in "
                f"{cname}: the ranks took different code paths"
            )
        elif st == "gil":
            parts.append(
                f"{it} spins with the GIL held at {_at(s['where'])} ({s['phase']}); innermost: {_at(s['top'])}"
            )
        elif st == "gone":
            parts.append(f"rank {r} {never}its process is gone" if never else f"rank {r}'s process is gone")
        elif st == "silent" and s.get("known") is False:
            # No record of the rank here: its node writes another run directory (no shared
            # filesystem) or it never started its Profiler.
            parts.append(f"rank {r}: no evidence of it in this run directory (another node's?)")
        elif st == "silent":
            parts.append(f"{it} cannot answer (no evidence from it)")
        else:
            parts.append(f"{it} {now}")
    text = f"{head}: " + "; ".join(parts) + "."
    if v["waiting_ranks"] and cname is not None:
        w = v["waiting_ranks"]
        wc = states[w[0]]["collective"]
        site = _at(wc["site"])
        if wc.get("source") == "flight_recorder":
            site = f"DDP's or FSDP's, in backward: {site}"
        many = len(w) > 1
        text += f" Rank{'s' if many else ''} {rank_ranges(w)} wait{'' if many else 's'} in {cname} ({site})."
    return text


def evidence_files(rank_dir: Path) -> list[tuple[int, Path]]:
    """A rank's ``hang-<n>.json`` files, by n."""
    out = []
    with contextlib.suppress(OSError):
        for p in rank_dir.iterdir():
            m = HANG_FILE.match(p.name)
            if m:
                out.append((int(m.group(1)), p))
    return sorted(out)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _rank_dirs(run_dir: Path) -> dict[int, Path]:
    out = {}
    with contextlib.suppress(OSError):
        for d in run_dir.iterdir():
            m = re.match(r"^rank(\d+)$", d.name)
            if m and d.is_dir():
                out[int(m.group(1))] = d
    return out


def join(
    run_dir: Path,
    near: float,
    window: float,
    request: str | None = None,
    world_size: int | None = None,
    live: bool = True,
) -> dict[int, dict[str, Any]]:
    """Each rank's state for the hang seen at wall time ``near``: its
    newest evidence within ``window`` seconds of it (or answering
    ``request``), else gone or silent."""
    dirs = _rank_dirs(run_dir)
    ranks = set(dirs) | (set(range(world_size)) if world_size else set())
    states: dict[int, dict[str, Any]] = {}
    for r in sorted(ranks):
        d = dirs.get(r)
        watch = _read(d / WATCH_FILE) if d is not None else None
        found = None
        # A SIGTERM's evidence only when the rank has no stall's near: taken
        # while the job is torn down, it can show a rank already leaving its wait.
        late = None
        for _n, p in reversed(evidence_files(d) if d is not None else []):
            doc = _read(p)
            if doc is None:
                continue
            if request is not None:
                if doc.get("request") == request:
                    found = doc
                    break
            elif doc.get("reason") in HUNG_REASONS and abs(float(doc.get("time", 0.0)) - near) <= window:
                if doc.get("reason") == "stalled":
                    found = doc
                    break
                late = late or doc
        found = found or late
        closed = _closed_of(d, watch) if d is not None and found is None else None
        if closed is not None and float(closed.get("time", near + 1.0)) <= near:
            states[r] = closed_state(closed)  # it left its loop before the stall was seen
        else:
            states[r] = rank_state(found, watch, live)
    return states


def collect(run_dir: Path) -> list[dict[str, Any]]:
    """report.json's ``hangs[]``: one verdict per stall the ranks reported
    (their ``hang-<n>.json`` of reason ``stalled`` or ``sigterm``, grouped by time)."""
    dirs = _rank_dirs(run_dir)
    times: list[tuple[float, float]] = []
    for d in dirs.values():
        for _n, p in evidence_files(d):
            doc = _read(p)
            if doc is not None and doc.get("reason") in HUNG_REASONS:
                times.append((float(doc.get("time", 0.0)), float(doc.get("timeout_s") or 60.0)))
    times.sort()
    hangs: list[dict[str, Any]] = []
    last: float | None = None
    for t, timeout in times:
        window = max(30.0, timeout)
        if last is not None and t - last <= window:
            continue
        last = t
        v = verdict(join(run_dir, t, window, live=False))
        v["time"] = t
        hangs.append(v)
    return hangs
