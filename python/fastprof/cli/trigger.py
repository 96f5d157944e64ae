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
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastprof.cli.args import integer, location, seconds
from fastprof.cli.errors import CommandError, describe
from fastprof.memory._files import write_atomic
from fastprof.profiler.drivers.hang import verdict as hangs
from fastprof.profiler.drivers.hang.store import POLL_S as STACKS_POLL_S
from fastprof.profiler.drivers.hang.store import WATCH_KEY, StoreRun
from fastprof.profiler.drivers.hang.verdict import HANG_REQUEST_FILE
from fastprof.profiler.drivers.triggers import LIVE_FILE, REMOTE_POLL_S, STATE_FILE, TRIGGER_FILE, new_request_id
from fastprof.recording.names import PROFILER_JSON, RANK_DIR
from fastprof.storage.run_view import RunView, open_run
from fastprof.storage.store import open_store

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
    p.add_argument(
        "run_dir", metavar="RUN_DIR", type=location, help="the run directory (<out>/<run_name>), or its URL (s3://...)"
    )
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
        "--stacks",
        action="store_true",
        help="ask each rank for its hang evidence (every thread's stack, step, collectives) and print a verdict",
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


def _no_such_rank(rank: int, run: str, ranks: list[int]) -> None:
    """``--rank`` names a rank the run does not have: bad input (exit 2),
    not a rank that stopped (exit 1)."""
    if rank not in ranks:
        raise CommandError(f"--rank {rank}: {run} has no rank {rank} (its ranks: {', '.join(map(str, ranks))})", 2)


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
    view = open_run(args.run_dir, what="run")
    run_dir = view.local_path
    if getattr(args, "stacks", False):
        return _stacks(args, run_dir, view.name)
    if run_dir is None:
        # Not a folder of this machine: the ranks are reached only through the store.
        return _run_in_store(args, view)
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
        done = [d for d in ranks_dirs if (d / PROFILER_JSON).is_file()]
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
            ranks = sorted(int(m.group(1)) for d in ranks_dirs if (m := RANK_DIR.match(d.name)))
            _no_such_rank(r, str(run_dir), ranks)
            raise CommandError(
                f"rank {r} is not running in {run_dir} (live ranks: {', '.join(map(str, sorted(live)))})"
            )
        targets = [r]
        where = live[r]["dir"] / TRIGGER_FILE
    rid, req = _request(args)
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
    def read(r: int) -> Any:
        try:
            return json.loads((live[r]["dir"] / STATE_FILE).read_text())
        except (OSError, ValueError, RecursionError):
            return None  # being rewritten (or not ours): read again at the next poll

    return _answers(
        targets,
        rid,
        flight,
        limit,
        read,
        show=lambda path, r: path,
        gone=lambda pending: not any(_alive(live[r]) is not False for r in pending),
        pause=0.2,
        where=str(run_dir),
    )


def _answers(
    targets: list[int],
    rid: str,
    flight: bool,
    limit: float,
    read: Callable[[int], Any],
    show: Callable[[str, int], str],
    gone: Callable[[set[int]], bool],
    pause: float,
    where: str,
) -> int:
    """Wait (``limit`` s at most) for each target rank's ``triggers.json``
    (``read(rank)``: its parsed content, None while unreadable) to answer
    request ``rid``; print what each answered, its files through ``show``.
    Exit status: 0 answered, 1 a rank answered with problems, 3 no answer."""
    deadline = time.monotonic() + limit
    pending = set(targets)
    failed = False
    while pending and time.monotonic() < deadline:
        for r in sorted(pending):
            state = read(r)
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
                print(f"  rank {r}: {show(path, r)}")
        if pending:
            if gone(pending):
                break
            time.sleep(pause)
    if pending:
        print(
            f"fastprof trigger: no answer from rank(s) {', '.join(map(str, sorted(pending)))} within {limit:g} s "
            f"(a job between steps, or stopped); see {where}/rank*/{STATE_FILE} later",
            file=sys.stderr,
        )
        return 3
    return 1 if failed else 0


def _run_in_store(args: argparse.Namespace, view: RunView) -> int:
    """``fastprof trigger s3://.../run``: a run whose ranks upload to object
    storage (issue #26). The trigger is an object the ranks look for every
    ``REMOTE_POLL_S``; their ``triggers.json`` objects (uploaded as they
    are rewritten) say when the files are there."""
    url = view.name
    try:
        keys = view.keys()
    except Exception as e:  # noqa: BLE001 - a store's error is one line
        raise CommandError(f"{url}: {describe(e)}") from None
    ranks = sorted({int(m.group(1)) for k in keys if "/" in k and (m := RANK_DIR.match(k.split("/", 1)[0]))})
    if not ranks:
        raise CommandError(f"{url}: not a fastprof run (no rank*/ objects under it)", 2)
    live = [r for r in ranks if f"rank{r}/{LIVE_FILE}" in keys and f"rank{r}/{PROFILER_JSON}" not in keys]
    if not live:
        if any(f"rank{r}/{PROFILER_JSON}" in keys for r in ranks):
            raise CommandError(
                f"{url}: the run has finished (profiler.json written); nothing to trigger. "
                f"See its report: fastprof report {url}"
            )
        raise CommandError(f"{url}: no live fastprof job with triggers (no rank*/{LIVE_FILE} object)")
    if args.rank == "all":
        targets, key = live, TRIGGER_FILE
    else:
        if args.rank not in live:
            _no_such_rank(args.rank, url, ranks)
            raise CommandError(f"rank {args.rank} is not running in {url} (live ranks: {', '.join(map(str, live))})")
        targets, key = [args.rank], f"rank{args.rank}/{TRIGGER_FILE}"
    if args.signal:
        print(
            "fastprof trigger: --signal is ignored for a run in object storage (its pids are on other hosts)",
            file=sys.stderr,
        )
    rid, req = _request(args)
    with tempfile.TemporaryDirectory(prefix="fastprof-trigger-") as tmp:
        local = Path(tmp) / TRIGGER_FILE
        local.write_text(json.dumps(req))
        try:
            view.put(local, key)
        except Exception as e:  # noqa: BLE001
            raise CommandError(f"{view.show(key)}: cannot put the trigger object ({describe(e)})") from None
    what = "a flight dump" if args.flight else "a capture and a flight dump"
    print(
        f"fastprof trigger: asked rank(s) {', '.join(map(str, targets))} of {url} for {what} (request {rid}); "
        f"the ranks look for it every {REMOTE_POLL_S:g} s"
    )
    for r in targets:
        print(
            f"  rank {r}: files land in {url}/rank{r}/torch and {url}/rank{r}/flight; record: "
            f"{url}/rank{r}/{STATE_FILE}"
        )
    if args.wait <= 0:
        return 0

    def read(r: int) -> Any:
        try:
            raw = view.get(f"rank{r}/{STATE_FILE}")
            return None if raw is None else json.loads(raw)
        except Exception:  # noqa: BLE001 - not there yet, or being replaced: next look
            return None

    return _answers(
        targets,
        rid,
        args.flight,
        args.wait,
        read,
        show=lambda path, _r: view.where_now(path),
        gone=lambda pending: False,  # pids on other hosts: only the time limit ends the wait
        pause=2.0,
        where=url,
    )


def _stacks(args: argparse.Namespace, run_dir: Path | None, name: str) -> int:
    """``--stacks``: write each live rank's request file (``rank{R}/STACKS``,
    read by its hang watchdog thread, which answers even while a thread of
    the job holds the GIL), wait for each rank's ``hang-<n>.json`` answering
    it, and print where each rank is and one verdict (issue #37)."""
    if run_dir is None:
        return _stacks_in_store(args, name)
    if not run_dir.is_dir():
        raise CommandError(f"{run_dir}: no such run directory (expected <out>/<run_name>)", 2)
    watches: dict[int, dict[str, Any]] = {}
    for d in sorted(run_dir.glob("rank*")):
        m = RANK_DIR.match(d.name)
        f = d / hangs.WATCH_FILE
        if not m or not f.is_file():
            continue
        try:
            watches[int(m.group(1))] = {**json.loads(f.read_text()), "dir": d}
        except (OSError, ValueError, RecursionError):
            continue
    live = _live_ranks(watches, args.rank, str(run_dir), f"no rank*/{hangs.WATCH_FILE} of a running process")
    rid = new_request_id()
    for w in live.values():
        where = w["dir"] / HANG_REQUEST_FILE
        try:
            write_atomic(where, rid)
        except OSError as e:
            raise CommandError(f"{where}: cannot write the request ({e.strerror or e})") from None
    asked = ", ".join(map(str, sorted(live)))
    print(f"fastprof trigger: asked rank(s) {asked} of {run_dir} for stacks (request {rid})")
    deadline = time.monotonic() + args.wait
    pending = set(live)
    while pending and time.monotonic() < deadline:
        for r in sorted(pending):
            p = _answer(live[r]["dir"], rid)
            if p is not None:
                pending.discard(r)
                print(f"  rank {r}: {p}")
        if pending:
            time.sleep(0.2)
    return _say_stacks(hangs.join(run_dir, time.time(), 0.0, request=rid), live, pending)


def _answer(rank_dir: Path, rid: str) -> Path | None:
    """The rank's evidence file that answers request ``rid``, if written."""
    for _n, p in hangs.evidence_files(rank_dir):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(doc, dict) and doc.get("request") == rid:
            return p
    return None


def _live_ranks(watches: dict[int, dict[str, Any]], rank: Any, where: str, none: str) -> dict[int, dict[str, Any]]:
    """The ranks whose watchdog is alive (``rank``: "all" or one), or a
    one-line error naming ``where`` (``none``: what was not found)."""
    live = {r: w for r, w in watches.items() if _alive(w) is not False}
    if rank != "all":
        if rank not in live:
            raise CommandError(f"rank {rank} has no live hang watchdog in {where}", 2)
        live = {rank: live[rank]}
    if not live:
        raise CommandError(
            f"{where}: no live rank with a hang watchdog ({none}); "
            "is the job running with fastprof.Profiler and FASTPROF_HANG_TIMEOUT not off?"
        )
    return live


def _say_stacks(states: dict[int, dict[str, Any]], live: dict[int, Any], pending: set[int]) -> int:
    """Where each asked rank is, and one verdict; exit status 3 when a rank
    did not answer."""
    for r, s in sorted(states.items()):
        if r not in live:
            continue
        if s["state"] in ("gone", "silent"):
            print(f"  rank {r}: no answer ({s['state']})")
            continue
        w = s.get("where") or {}
        c = s.get("collective")
        inside = f", in {c['op']}" if c else ""
        gil = ", the GIL held (stacks read without it)" if s["state"] == "gil" else ""
        print(f"  rank {r}: {w.get('file')}:{w.get('line')} in {w.get('function')} ({s.get('phase')}{inside}{gil})")
    v = hangs.verdict({r: s for r, s in states.items() if r in live})
    print(f"fastprof trigger: {v['text']}")
    return 3 if pending else 0


def _stacks_in_store(args: argparse.Namespace, url: str) -> int:
    """``--stacks`` on a run in object storage (issue #37): its ranks may
    share no directory. Each live rank (its ``rank{R}/hang-watch.json``
    object, and no ``profiler.json`` yet) is asked by a ``rank{R}/STACKS``
    object, which its hang driver takes every ``POLL_S``; its answer is the
    ``hang-<n>.json`` object it puts, read back here and joined as for a
    local run."""
    try:
        store = open_store(url, what="run")
        run = StoreRun(store)
        watches: dict[int, dict[str, Any]] = {}
        for r in run.ranks():
            raw = run.read(r, WATCH_KEY)
            if raw is None or store.exists(f"rank{r}/{PROFILER_JSON}"):
                continue
            with contextlib.suppress(ValueError, RecursionError):
                doc = json.loads(raw)
                if isinstance(doc, dict):
                    watches[r] = doc
    except CommandError:
        raise
    except Exception as e:  # noqa: BLE001 - a store's error is one line
        raise CommandError(f"{url}: {describe(e)}") from None
    live = _live_ranks(watches, args.rank, url, f"no rank*/{WATCH_KEY} object of a running job")
    rid = new_request_id()
    with tempfile.TemporaryDirectory(prefix="fastprof-trigger-") as tmp:
        ask = Path(tmp) / HANG_REQUEST_FILE
        ask.write_text(rid)
        for r in sorted(live):
            try:
                store.put(ask, f"rank{r}/{HANG_REQUEST_FILE}", rewritable=True)
            except Exception as e:  # noqa: BLE001
                raise CommandError(
                    f"{store.url_of(f'rank{r}/{HANG_REQUEST_FILE}')}: cannot put the request ({describe(e)})"
                ) from None
    print(
        f"fastprof trigger: asked rank(s) {', '.join(map(str, sorted(live)))} of {url} for stacks (request {rid}); "
        f"the ranks look for it every {STACKS_POLL_S:g} s"
    )
    deadline = time.monotonic() + args.wait
    pending = set(live)
    with tempfile.TemporaryDirectory(prefix="fastprof-stacks-") as tmp:
        into = Path(tmp)
        while True:
            try:
                run.fetch(into, sorted(pending))
            except Exception:  # noqa: BLE001 - not there yet, or the store failed once: next look
                pass
            for r in sorted(pending):
                p = _answer(into / f"rank{r}", rid)
                if p is not None:
                    pending.discard(r)
                    print(f"  rank {r}: {store.url_of(f'rank{r}/{p.name}')}")
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        with contextlib.suppress(Exception):
            run.fetch(into, sorted(live))  # the watch files of the ranks asked
        return _say_stacks(hangs.join(into, time.time(), 0.0, request=rid), live, pending)


def _request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """A new request's id and the trigger file's content, as the job parses it."""
    rid = new_request_id()
    req: dict[str, Any] = {"id": rid, "time": time.time(), "from": f"{socket.gethostname()}:{os.getpid()}"}
    if args.steps is not None:
        req["steps"] = args.steps
    if args.flight:
        req["capture"] = False
        req["flight"] = True
    return rid, req
