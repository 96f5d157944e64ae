"""``fastprof upload SPOOL URL``: send to object storage what a job left in
its spool (issue #26): files its uploader could not send (the store was down,
the job was killed before its last pass).

Examples:
  fastprof upload /tmp/fastprof-spool/run-1 s3://bucket/runs    # one run: s3://bucket/runs/run-1/...
  fastprof upload /tmp/fastprof-spool s3://bucket/runs          # every run of the spool

The URL is the job's ``out_dir``: a run directory ``<spool>/<run>`` goes to
``<URL>/<run>/``. Run it again as often as needed: an object already there
with the same content is skipped. An object there with other content is
never replaced, except the files fastprof rewrites (``profiler.json``, ...)
of the job's own run: a run name that another job claimed in the store is
refused whole (exit 2), nothing sent.
Credentials and endpoints come from the storage library's own environment
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastprof.cli.args import location, url
from fastprof.cli.errors import CommandError
from fastprof.recording.names import RANK_DIR
from fastprof.reports.data import human_bytes
from fastprof.storage.spool import claim_in_store, read_store_claim
from fastprof.storage.store import REWRITTEN, Store, StoreConflictError, open_store
from fastprof.storage.uploader import closed_files

__all__ = ["add_parser", "run"]


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "upload",
        help="upload what a job left in its spool to object storage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "spool", metavar="SPOOL", type=location, help="a run directory of the spool (<spool>/<run>), or the spool"
    )
    p.add_argument(
        "url", metavar="URL", type=url, help="the job's out_dir: s3://bucket/runs, gs://..., az://..., file://..."
    )
    p.add_argument("--delete", action="store_true", help="delete each local file once its object is in the store")
    p.set_defaults(run=run)


@dataclass
class _Tally:
    uploaded: int = 0
    uploaded_bytes: int = 0
    skipped: int = 0
    conflicts: int = 0

    def line(self) -> str:
        text = f"{self.uploaded} file(s) uploaded ({human_bytes(self.uploaded_bytes)}), {self.skipped} already there"
        return text + (f", {self.conflicts} refused (other content there)" if self.conflicts else "")


def _runs(spool: Path) -> list[Path]:
    """The run directories of ``spool``: itself when it holds rank folders,
    else its sub-folders that do."""

    def is_run(d: Path) -> bool:
        return any(c.is_dir() and RANK_DIR.match(c.name) for c in d.iterdir())

    if is_run(spool):
        return [spool]
    return sorted(d for d in spool.iterdir() if d.is_dir() and not d.name.startswith(".") and is_run(d))


def run(args: argparse.Namespace) -> int:
    spool = Path(args.spool)
    if not spool.is_dir():
        what = "not a directory" if spool.exists() else "no such directory"
        raise CommandError(f"{spool}: {what} (expected a spool or one of its run directories)", 2)
    runs = _runs(spool)
    if not runs:
        raise CommandError(f"{spool}: no run directory here (no rank*/ folders in it or its sub-folders)", 2)
    store = open_store(args.url, what="URL")
    owned = {run_dir: _claimed(store, run_dir, spool) for run_dir in runs}
    total = _Tally()
    conflicts: list[str] = []
    for run_dir in runs:
        groups: dict[str, list[tuple[str, int]]] = {}
        for rel, st in closed_files(run_dir, final=True):
            top = rel.split("/", 1)[0]
            groups.setdefault(top if RANK_DIR.match(top) else "run", []).append((rel, st.st_size))
        for group in sorted(groups, key=_group_order):
            tally = _Tally()
            for rel, size in groups[group]:
                _send(store, run_dir, rel, size, tally, conflicts, delete=args.delete, owned=owned[run_dir])
            print(f"fastprof upload: {run_dir.name}/{group}: {tally.line()}")
            total.uploaded += tally.uploaded
            total.uploaded_bytes += tally.uploaded_bytes
            total.skipped += tally.skipped
            total.conflicts += tally.conflicts
    where = store.url_of(runs[0].name) if len(runs) == 1 else store.url
    print(f"fastprof upload: total: {total.line()} -> {where}")
    if conflicts:
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise CommandError(f"{conflicts[0]}{more}; the local files stay in {spool}", 2)
    return 0


def _claimed(store: Store, run_dir: Path, spool: Path) -> bool:
    """Whether the run's name in the store is this spool's job's (its
    claim, made now if the job never could): then the files fastprof
    rewrites replace their objects. A name another job claimed: refused
    whole, before anything is sent. A spool that names no claim (an older
    fastprof's): nothing is replaced, rewritten files included."""
    claims = {c for d in run_dir.iterdir() if d.is_dir() and RANK_DIR.match(d.name) and (c := read_store_claim(d))}
    for key, job in sorted(claims):
        try:
            holder = claim_in_store(store, key, job)
        except Exception as e:  # noqa: BLE001 - botocore, aiohttp, OSError: all "the store failed"
            raise CommandError(
                f"{store.url_of(key)}: could not be read ({type(e).__name__}: {' '.join(str(e).split())}); "
                f"nothing uploaded: run this command again when the store is reachable"
            ) from None
        if holder is not None:
            raise CommandError(
                f"{store.url_of(run_dir.name)} is {holder}'s run, not the one recorded in {run_dir}; nothing "
                f"uploaded (another job took the name; the local files stay in {spool})",
                2,
            )
    return bool(claims)


def _group_order(group: str) -> tuple[int, int]:
    return (1, 0) if group == "run" else (0, int(group[4:]))


def _send(
    store: Store,
    run_dir: Path,
    rel: str,
    size: int,
    tally: _Tally,
    conflicts: list[str],
    *,
    delete: bool,
    owned: bool,
) -> None:
    key = f"{run_dir.name}/{rel}"
    local = run_dir / rel
    rewritable = owned and rel.rsplit("/", 1)[-1] in REWRITTEN
    try:
        if store.same_content(local, key):
            tally.skipped += 1
        else:
            store.put(local, key, rewritable=rewritable)
            tally.uploaded += 1
            tally.uploaded_bytes += size
    except StoreConflictError as e:
        tally.conflicts += 1
        conflicts.append(str(e))
        return
    except Exception as e:  # noqa: BLE001 - botocore, aiohttp, OSError: all "the store failed"
        if isinstance(e, FileNotFoundError) and not local.exists():
            return  # gone since it was listed (a job still running beside us)
        raise CommandError(
            f"{store.url_of(key)}: upload failed ({type(e).__name__}: {' '.join(str(e).split())}); "
            f"what is not uploaded stays in {run_dir}: run this command again when the store is reachable"
        ) from None
    if delete:
        local.unlink(missing_ok=True)
