"""Hangs in a run whose ranks share no directory (issue #37): a 2-rank
``torchrun`` job (gloo, CPU) recording to S3 (moto's real server, reached
over HTTP), each rank through its own local spool, as two nodes would. Rank
1 sleeps in ``Dataset.__getitem__`` while rank 0 waits in ``all_reduce``.
Rank 0's verdict joins rank 1's evidence through the bucket, and ``fastprof
trigger s3://.../run --stacks`` asks both ranks through it and prints where
each is. Every object is read back with Python's json."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import s3fs

from hung_job import job_env, kill, line_of, start, torchrun_cmd, workers
from moto_s3 import MotoServer, child_env

pytestmark = pytest.mark.slow

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import fastprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mode = sys.argv[3] if len(sys.argv) > 3 else "data"

    class Data(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            if mode == "data" and rank == 1 and i == 6:
                time.sleep(3600)  # STUCK
            return torch.ones(4)

    # No directory shared between the ranks: each has its own spool, as two nodes would.
    spool = os.path.join(sys.argv[2], f"node{rank}")
    with fastprof.Profiler(sys.argv[1], "job", spool_dir=spool, schedule="never", merge_timeout=30) as prof:
        for i, x in enumerate(prof.loader(DataLoader(Data(), batch_size=1))):
            t = x.sum()
            if not (mode == "skip" and rank == 1 and i == 6):  # SKIP: rank 1 leaves out one all_reduce
                dist.all_reduce(t)  # WAIT
            prof.step()
    dist.destroy_process_group()
    """
)
TIMEOUT_S = 4.0


_line = partial(line_of, WORKER)


def _objects(fs: s3fs.S3FileSystem, url: str) -> list[str]:
    base = url.removeprefix("s3://")
    fs.invalidate_cache()
    return sorted(p[len(base) + 1 :] for p in fs.find(base))


@pytest.fixture(scope="module")
def store_hang(moto_server: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job, hung: rank 0's verdict awaited (its object in the bucket),
    then ``fastprof trigger URL --stacks``, then SIGTERM to torchrun once
    rank 1 has stalled more than 10 s (its evidence is written again, as a
    number of its own: the earlier ones left the spool once uploaded), then
    the job killed."""
    root = tmp_path_factory.mktemp("hang-store")
    env = child_env(moto_server)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": moto_server.url}, key="testing", secret="testing")
    bucket = f"hang-{os.getpid()}-{int(time.time())}"
    fs.mkdir(bucket)
    url = f"s3://{bucket}/runs"
    (root / "worker.py").write_text(WORKER)
    base = job_env({"FASTPROF_HANG_TIMEOUT": str(TIMEOUT_S), "FASTPROF_HANG_GRACE": "2"}, source=env)
    cmd = torchrun_cmd(str(root / "worker.py"), url, str(root / "spools"))
    t0 = time.monotonic()
    p = start(cmd, root, base)
    run = f"{url}/job"
    stacks = None
    said = False
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and p.poll() is None:
            if any(k.startswith(".hang-verdict-") for k in _objects(fs, run)):
                said = True
                break
            time.sleep(0.5)
        took = time.monotonic() - t0
        if said:
            time.sleep(1.0)  # the verdict's line reaches stderr
            stacks = subprocess.run(
                [sys.executable, "-m", "fastprof", "trigger", run, "--stacks", "--wait", "60"],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            # The verdict came at least the 4 s timeout into the stall: 12 s at least by now.
            time.sleep(max(0.0, 8.0 - (time.monotonic() - t0 - took)))
            os.kill(p.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=60)
    finally:
        out, err = kill(p, workers(p))  # the ranks' watch files are in the bucket
    assert said, f"no verdict in the bucket within 90 s\nstdout:\n{out}\nstderr:\n{err}"
    objects = _objects(fs, run)
    docs = {
        k: json.loads(fs.cat_file(f"{run.removeprefix('s3://')}/{k}"))
        for k in objects
        if re.fullmatch(r"rank\d/hang-\d+\.json", k) or k.endswith("hang-watch.json") or "hang-verdict" in k
    }
    # The report of the run, killed while hung, read from the bucket once each
    # node's spool (the open segments of a killed rank) is sent, as the upload
    # command fastprof prints says.
    for node in (0, 1):
        if not (root / "spools" / f"node{node}" / "job").is_dir():
            continue  # everything sent at the SIGTERM's close: the spool was freed
        up = subprocess.run(
            [sys.executable, "-m", "fastprof", "upload", str(root / "spools" / f"node{node}" / "job"), url],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert up.returncode == 0, up.stdout + up.stderr
    report = subprocess.run(
        [sys.executable, "-m", "fastprof", "report", run, "-o", str(root / "rep")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert report.returncode == 0, report.stderr
    return {
        "root": root,
        "run": run,
        "stderr": err,
        "stacks": stacks,
        "objects": objects,
        "docs": docs,
        "took": took,
        "report": json.loads((root / "rep" / "report.json").read_text()),
    }


def test_the_ranks_share_no_directory(store_hang: dict[str, Any]) -> None:
    spools = store_hang["root"] / "spools"
    assert not (spools / "node0" / "job" / "rank1").exists() and not (spools / "node1" / "job" / "rank0").exists()


def test_each_rank_puts_its_evidence_and_watch_file_in_the_bucket(store_hang: dict[str, Any]) -> None:
    docs = store_hang["docs"]
    for rank in (0, 1):
        stalled = [d for k, d in docs.items() if k.startswith(f"rank{rank}/hang-") and d.get("reason") == "stalled"]
        assert len(stalled) == 1 and stalled[0]["rank"] == rank and stalled[0]["step"] == 5, docs.keys()
        watch = docs[f"rank{rank}/hang-watch.json"]
        assert watch["rank"] == rank and isinstance(watch["pid"], int), watch
    (r1,) = [d for k, d in docs.items() if k.startswith("rank1/hang-") and d.get("reason") == "stalled"]
    assert (r1["summary"]["where"]["line"], r1["summary"]["phase"]) == (_line("STUCK"), "dataloader")


def test_rank0_says_one_verdict_with_rank1s_line_from_the_bucket(store_hang: dict[str, Any]) -> None:
    lines = [ln for ln in store_hang["stderr"].splitlines() if "fastprof: hang at step" in ln]
    assert len(lines) == 1, store_hang["stderr"][-3000:]
    (v,) = lines
    assert (
        f"rank 1 never entered all_reduce #7; it is in the dataloader: worker.py:{_line('STUCK')} in __getitem__. "
        f"Rank 0 waits in all_reduce #7 (worker.py:{_line('WAIT')} in <module>)." in v
    ), v
    (lock,) = [d for k, d in store_hang["docs"].items() if k.startswith(".hang-verdict-")]
    assert lock["rank"] == 0 and lock["step"] == 6, lock


def test_trigger_stacks_asks_a_bucket_run_and_prints_where_each_rank_is(store_hang: dict[str, Any]) -> None:
    r, run = store_hang["stacks"], store_hang["run"]
    assert r is not None and r.returncode == 0, (r.stdout, r.stderr) if r else None
    asked = {}
    for rank in (0, 1):
        (doc,) = [d for k, d in store_hang["docs"].items() if k.startswith(f"rank{rank}/hang-") and d.get("request")]
        assert doc["reason"] == "request" and doc["rank"] == rank, doc
        asked[rank] = doc
        assert re.search(rf"^  rank {rank}: {re.escape(run)}/rank{rank}/hang-\d+\.json$", r.stdout, re.M), r.stdout
    assert asked[0]["request"] == asked[1]["request"] and asked[0]["request"] in r.stdout
    assert re.search(rf"rank 1: \S*worker.py:{_line('STUCK')} in __getitem__ \(dataloader\)", r.stdout), r.stdout
    assert re.search(rf"rank 0: \S*worker.py:{_line('WAIT')} in <module> \([a-z]+, in all_reduce\)", r.stdout)
    v = next(ln for ln in r.stdout.splitlines() if ln.startswith("fastprof trigger: hang"))
    assert f"rank 1 never entered all_reduce #7; it is in the dataloader: worker.py:{_line('STUCK')} in " in v, v
    # The request objects were taken by the ranks.
    assert not [k for k in store_hang["objects"] if k.endswith("/STACKS")], store_hang["objects"]


def test_the_report_of_the_bucket_run_killed_while_hung_has_the_hang(store_hang: dict[str, Any]) -> None:
    hangs = store_hang["report"]["hangs"]
    assert len(hangs) == 1, hangs
    (h,) = hangs
    assert h["step"] == 6 and h["suspect_ranks"] == [1] and h["waiting_ranks"] == [0], h
    (w,) = h["where"]
    assert (w["rank"], w["line"], w["function"], w["phase"]) == (1, _line("STUCK"), "__getitem__", "dataloader"), w


def test_sigterm_evidence_after_uploaded_evidence_gets_a_number_of_its_own(store_hang: dict[str, Any]) -> None:
    """Rank 1's stall and request evidence left its spool once uploaded; its
    SIGTERM evidence is numbered after them, so the object is new, not a
    conflict with hang-1.json kept in the spool."""
    docs = {k: d for k, d in store_hang["docs"].items() if k.startswith("rank1/hang-") and "watch" not in k}
    assert sorted(d["reason"] for d in docs.values()) == ["request", "sigterm", "stalled"], docs.keys()
    for k, d in docs.items():
        assert k == f"rank1/hang-{d['n']}.json", (k, d["n"])
    (sig,) = [d for d in docs.values() if d["reason"] == "sigterm"]
    assert sig["stalled_s"] >= 10.0 and sig["summary"]["where"]["line"] == _line("STUCK"), sig
    assert not list((store_hang["root"] / "spools" / "node1").rglob("hang-*.json"))


def test_a_skipped_all_reduce_is_named_through_the_bucket(moto_server: MotoServer, tmp_path_factory: Any) -> None:
    """Rank 1 leaves out step 6's all_reduce; gloo pairs collectives by
    number, so the ranks run on one apart until rank 1 has ended every step
    and leaves its loop while rank 0 waits in its last all_reduce. Rank 1's
    closed file (its last step and wavefront) reaches rank 0 only through the
    bucket, and rank 0's verdict (8 s) names rank 1 as having skipped a
    collective."""
    root = tmp_path_factory.mktemp("hang-store-skip")
    env = child_env(moto_server)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": moto_server.url}, key="testing", secret="testing")
    bucket = f"skip-{os.getpid()}-{int(time.time())}"
    fs.mkdir(bucket)
    (root / "worker.py").write_text(WORKER)
    base = job_env({"FASTPROF_HANG_TIMEOUT": "8", "FASTPROF_HANG_GRACE": "2"}, source=env)
    p = start(torchrun_cmd(str(root / "worker.py"), f"s3://{bucket}/runs", str(root / "spools"), "skip"), root, base)
    run = f"s3://{bucket}/runs/job"
    said = False
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and p.poll() is None and not said:
            said = any(k.startswith(".hang-verdict-") for k in _objects(fs, run))
            time.sleep(0.5)
        time.sleep(1.0)  # the verdict's line reaches stderr
    finally:
        _out, err = kill(p, workers(p))  # the ranks' watch files are in the bucket
    assert said, err[-3000:]
    assert "rank1/hang-closed.json" in _objects(fs, run)
    assert not (root / "spools" / "node0" / "job" / "rank1").exists()
    lines = [ln for ln in err.splitlines() if "fastprof: hang at step" in ln]
    assert len(lines) == 1, err[-3000:]
    named = [
        m
        for ln in lines
        if (
            m := re.search(
                r"rank 1 skipped a collective: it ended step 39 after (\d+) collectives of the default group "
                r"\(the last all_reduce #(\d+)\) where rank 0 entered all_reduce #(\d+) in that step",
                ln,
            )
        )
    ]
    assert named, lines
    for m in named:
        assert int(m.group(1)) == int(m.group(2)) == int(m.group(3)) - 1, m.group(0)
    assert "rank 1 has left its training loop (its Profiler closed after step 39)" in lines[0], lines
