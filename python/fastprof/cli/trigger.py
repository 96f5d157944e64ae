"""``fastprof trigger RUN_DIR``: ask a running job for a torch.profiler capture
and a flight-recorder dump from another shell (issue #17).

It writes the trigger file the job's triggers watch (``<run>/TRIGGER`` for
every rank, ``<run>/rank{R}/TRIGGER`` for one), or with ``--signal`` also
signals the pids the run's ``rank{R}/live.json`` lists on this host; prints
where the files will land; then waits (bounded by ``--wait``) until each
asked rank's ``triggers.json`` shows the request done and its files on disk.
A request the job coalesced into a capture armed and coming (or a flight
dump just taken) is answered with that one's files.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from fastprof.always_on.triggers import LIVE_FILE, STATE_FILE, TRIGGER_FILE, new_request_id
from fastprof.cli.args import integer, seconds
from fastprof.cli.errors import CommandError
from fastprof.memory._files import write_atomic

__all__ = ["add_parser", "run"]


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "trigger",
        help="ask a running job for a torch.profiler capture and a flight dump",
        description=(
            "Ask a running fastprof job (Profiler with triggers on, the default) for a torch.profiler "
            "capture of --steps steps from its next step boundary, and a flight-recorder dump of its "
            "last seconds; every rank captures the same steps. Prints where the files land and waits "
            "for them."
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (<out>/<run_name>)")
    p.add_argument(
        "--steps",
        type=integer(1, 10_000, "a number of steps"),
        default=None,
        help="steps to capture (default: the job's, 5)",
    )
    p.add_argument("--rank", type=_rank, default="all", help="a rank number, or all (default)")
    p.add_argument("--flight", action="store_true", help="only dump the flight recorder (no torch capture)")
    p.add_argument(
        "--signal", action="store_true", help="also send the job's trigger signal to the pids live.json lists"
    )
    p.add_argument(
        "--wait",
        type=seconds(0.0, 86_400.0, what="seconds"),
        default=120.0,
        help="seconds to wait for the files (0: don't wait)",
    )
    p.set_defaults(run=run)


def _rank(text: str) -> str | int:
    if text.strip() == "all":
        return "all"
    return integer(0, (1 << 20) - 1, "a rank number (or all)")(text)


def _live(run_dir: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for d in sorted(run_dir.glob("rank*")):
        f = d / LIVE_FILE
        if not f.is_file():
            continue
        try:
            info = json.loads(f.read_text())
            out[int(info["rank"])] = {**info, "dir": d}
        except OSError as e:
            raise CommandError(f"{f}: unreadable ({e}); is the job still running?") from None
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            # Written atomically by the job: what is there is not a live.json.
            why = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
            raise CommandError(f"{f}: not a fastprof live.json ({why})", exit_code=2) from None
    return out


def _alive(info: dict[str, Any]) -> bool | None:
    """True/False for a pid on this host, None when it is on another."""
    if info.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        what = "not a directory" if run_dir.exists() else "no such run directory"
        raise CommandError(f"{run_dir}: {what} (expected a run directory, <out>/<run_name>)", 2)
    ranks_dirs = [d for d in run_dir.glob("rank*") if d.is_dir()]
    if not ranks_dirs:
        raise CommandError(f"{run_dir}: not a fastprof run directory (no rank*/ folders)", 2)
    live = _live(run_dir)
    for r, info in list(live.items()):
        if _alive(info) is False:
            del live[r]  # a job killed without cleaning up (SIGKILL)
    if not live:
        done = [d for d in ranks_dirs if (d / "profiler.json").is_file()]
        if done:
            raise CommandError(
                f"{run_dir}: the run has finished (profiler.json written); nothing to trigger. "
                f"See its report: fastprof report {run_dir}"
            )
        raise CommandError(
            f"{run_dir}: no live fastprof job with triggers (no rank*/{LIVE_FILE}); "
            "is it running with fastprof.Profiler (triggers on) or fastprof run?"
        )
    if args.rank == "all":
        targets = sorted(live)
        where = run_dir / TRIGGER_FILE
    else:
        r = args.rank
        if r not in live:
            raise CommandError(
                f"rank {r} is not running in {run_dir} (live ranks: {', '.join(map(str, sorted(live)))})"
            )
        targets = [r]
        where = live[r]["dir"] / TRIGGER_FILE
    rid = new_request_id()
    req: dict[str, Any] = {"id": rid, "time": time.time(), "from": f"{socket.gethostname()}:{os.getpid()}"}
    if args.steps is not None:
        req["steps"] = args.steps
    if args.flight:
        req["capture"] = False
        req["flight"] = True
    try:
        write_atomic(where, json.dumps(req))
    except OSError as e:
        raise CommandError(f"{where}: cannot write the trigger file ({e.strerror or e})") from None
    if args.signal:
        for r in targets:
            info = live[r]
            if info.get("signal") and _alive(info):
                try:
                    os.kill(int(info["pid"]), getattr(signal, str(info["signal"])))
                except (OSError, AttributeError) as e:
                    print(f"fastprof trigger: rank {r}: could not signal pid {info['pid']}: {e}", file=sys.stderr)
    what = "a flight dump" if args.flight else "a capture and a flight dump"
    print(f"fastprof trigger: asked rank(s) {', '.join(map(str, targets))} of {run_dir} for {what} (request {rid})")
    for r in targets:
        d = live[r]["dir"]
        print(f"  rank {r}: files land in {d / 'torch'} and {d / 'flight'}; record: {d / STATE_FILE}")
    if args.wait <= 0:
        return 0
    return _wait(run_dir, live, targets, rid, args.wait, args.flight)


def _files_for(state: dict[str, Any], rid: str, flight_only: bool) -> tuple[bool, list[str], list[str], list[str]]:
    """(done, files, problems, notes) of request ``rid`` in a rank's
    triggers.json. A request coalesced into another that answers it (a
    capture armed and coming, a flight dump just taken: its
    ``answered_by``) is answered with that one's files."""
    reqs = [q for q in state.get("requests", []) if q.get("id") == rid]
    if not reqs:
        return False, [], [], []
    notes: list[str] = []
    problems: list[str] = []
    answered_by: set[int] = set()
    for q in reqs:
        action = str(q.get("action", ""))
        if isinstance(q.get("answered_by"), int):
            answered_by.add(q["answered_by"])
            notes.append(f"{action}: answered with it")
        elif action.startswith(("coalesced", "ignored")):
            problems.append(action)
    if problems:
        return True, [], problems, notes

    def answers(rec: dict[str, Any]) -> bool:
        return rec.get("request_id") == rid or rec.get("seq") in answered_by

    files: list[str] = []
    ok = True
    for dmp in state.get("flight_dumps", []):
        if answers(dmp):
            if dmp.get("error"):
                problems.append(f"flight dump: {dmp['error']}")
            elif "dump_s" not in dmp:
                ok = False
            elif dmp.get("deleted"):
                problems.append(f"flight dump {dmp['path']}: {dmp['deleted']}")
            else:
                files.append(str(dmp["path"]))
    if not flight_only:
        caps = [c for c in state.get("captures", []) if answers(c)]
        if not caps:
            ok = False
        for c in caps:
            w = c.get("window") or {}
            if c.get("status") != "done" and not str(c.get("status", "")).startswith(("folded", "not started")):
                ok = False
            elif w.get("error"):
                problems.append(f"capture: {w['error']}")
            elif w.get("deleted"):
                problems.append(f"capture {w.get('path')}: deleted since (by the disk cap or num_traces_to_keep)")
            elif c.get("status") == "done" and not w.get("path"):
                ok = False  # exporting
            elif w.get("path"):
                files.append(str(w["path"]))
            else:
                problems.append(f"capture {c.get('status')}")
    return ok, files, problems, notes


def _wait(
    run_dir: Path, live: dict[int, dict[str, Any]], targets: list[int], rid: str, limit: float, flight: bool
) -> int:
    deadline = time.monotonic() + limit
    pending = set(targets)
    failed = False
    while pending and time.monotonic() < deadline:
        for r in sorted(pending):
            f = live[r]["dir"] / STATE_FILE
            try:
                state = json.loads(f.read_text())
            except (OSError, ValueError, RecursionError):
                continue  # being rewritten (or not ours): read again at the next poll
            if not isinstance(state, dict):
                continue
            done, files, problems, notes = _files_for(state, rid, flight)
            if not done:
                continue
            pending.discard(r)
            for n in notes:
                print(f"  rank {r}: {n}")
            for p in problems:
                failed = True
                print(f"  rank {r}: {p}")
            for path in files:
                print(f"  rank {r}: {path}")
        if pending:
            if not any(_alive(live[r]) is not False for r in pending):
                break
            time.sleep(0.2)
    if pending:
        print(
            f"fastprof trigger: no answer from rank(s) {', '.join(map(str, sorted(pending)))} within {limit:g} s "
            f"(a job between steps, or stopped); see {run_dir}/rank*/{STATE_FILE} later",
            file=sys.stderr,
        )
        return 3
    return 1 if failed else 0
