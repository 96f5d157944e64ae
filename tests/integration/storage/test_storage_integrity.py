"""Nothing mixed, nothing lost in object storage (issue #34, items 2 and 3),
against moto's S3 server run as a process:

- two jobs started together under one run name on one URL take two names
  (the name is claimed in the store with a conditional create);
- a job that could not claim its name at start (the store was down) and
  finds it another job's sends nothing there, and ``fastprof upload`` of
  its spool is refused whole (exit 2), rewritten files included;
- a spool file is freed only when its object has its content, never
  because an object of the same size is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import s3fs

from fastprof.storage.spool import claim_in_store
from fastprof.storage.store import Store, StoreConflictError, open_store
from fastprof.storage.uploader import Uploader
from moto_s3 import MotoServer, child_env

#: A job that waits for a barrier file before it starts recording (so two
#: start as together as two processes can), then takes a few steps.
JOB = """
import os, sys, time
import fastprof
out, name, gate = sys.argv[1], sys.argv[2], sys.argv[3]
while not os.path.exists(gate):
    time.sleep(0.001)
prof = fastprof.Profiler(out, name, torch=False, sample_hz=0)
with prof:
    for i in range(3):
        sum(range(20_000))
        prof.step()
print("RUN", prof.run_dir.name, flush=True)
"""


def _fs() -> s3fs.S3FileSystem:
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return fs


def _start(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )


def _done(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=180)
    return p.returncode, out, err


def test_two_jobs_started_together_under_one_name_take_two_names(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    # Two nodes: each job has its own spool, and sees the other only in the store.
    jobs = [
        _start(
            tmp_path, child_env(moto_server, FASTPROF_SPOOL_DIR=str(tmp_path / f"spool{i}")), s3_url, "tw", str(gate)
        )
        for i in range(2)
    ]
    gate.touch()
    results = [_done(p) for p in jobs]
    for code, _out, err in results:
        assert code == 0, err
        assert "could not be sent" not in err and "refused" not in err, err
    names = sorted(next(ln.split()[1] for ln in out.splitlines() if ln.startswith("RUN ")) for _c, out, _e in results)
    assert names == ["tw", "tw-2"], results
    fs = _fs()
    root = s3_url.removeprefix("s3://")
    for name in names:
        summary = json.loads(fs.cat_file(f"{root}/{name}/rank0/profiler.json"))
        assert summary["upload"]["url"] == f"{s3_url}/{name}/rank0"
        assert summary["upload"]["conflicts"] == 0
    # Each name claimed by one job, a different one each.
    assert len({json.loads(fs.cat_file(f"{root}/{n}/.fastprof-run"))["job"] for n in names}) == 2


def test_a_job_that_could_not_claim_its_name_never_writes_into_another_jobs_run(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    gate.touch()
    # Job A records into "tw" with the store up.
    code, _out, err = _done(
        _start(tmp_path, child_env(moto_server, FASTPROF_SPOOL_DIR=str(tmp_path / "spoolA")), s3_url, "tw", str(gate))
    )
    assert code == 0, err
    fs = _fs()
    root = s3_url.removeprefix("s3://")
    before = {k: fs.cat_file(k) for k in fs.find(f"{root}/tw")}
    # Job B on another node starts while its store is unreachable: it cannot
    # ask whether "tw" is taken, records into its spool and keeps it there.
    down = child_env(moto_server, FASTPROF_SPOOL_DIR=str(tmp_path / "spoolB"), AWS_ENDPOINT_URL="http://127.0.0.1:9")
    code, _out, err = _done(_start(tmp_path, down, s3_url, "tw", str(gate)))
    assert code == 0, err
    command = next(ln for ln in err.splitlines() if "fastprof upload " in ln).split("send them with: ", 1)[1]
    spool_run = tmp_path / "spoolB" / "tw"
    assert (spool_run / "rank0" / "profiler.json").is_file()
    # The command it printed, with the store back: refused whole, one line, exit 2.
    p = _fastprof(moto_server, *command.split()[1:])
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and "another job took the name" in p.stderr, p.stderr
    fs.invalidate_cache()
    after = {k: fs.cat_file(k) for k in fs.find(f"{root}/tw")}
    assert after == before  # not one object replaced, profiler.json included
    assert (spool_run / "rank0" / "profiler.json").is_file()


def test_an_uploader_that_finds_its_name_claimed_by_another_job_sends_nothing(s3_url: str, tmp_path: Path) -> None:
    store = open_store(s3_url)
    assert claim_in_store(store, "tw/.fastprof-run", "job-A") is None
    assert claim_in_store(store, "tw/.fastprof-run", "job-A") is None  # the same job again: still its own
    rank = tmp_path / "rank0"
    rank.mkdir()
    (rank / "profiler.json").write_text('{"from": "B"}')
    (rank / "fastprof.0.json.gz").write_bytes(b"B" * 100)
    (rank / "fastprof.1.json.gz").write_bytes(b"B" * 10)
    said: list[str] = []
    up = Uploader(
        rank,
        store,
        "tw/rank0",
        interval_s=0.05,
        warn=said.append,
        claim=lambda: claim_in_store(store, "tw/.fastprof-run", "job-B"),
    ).start()
    out = up.close(20)
    assert store.list("tw") == ["tw/.fastprof-run"]
    assert out["uploaded_files"] == 0 and out["conflicts"] == 1 and out["left_in_spool"]["files"] == 3
    assert len(said) == 1 and "job job-A's run" in said[0], said


def _fastprof(server: MotoServer, *argv: str) -> subprocess.CompletedProcess[str]:
    """The ``fastprof`` command in a subprocess, pointed at ``server``."""
    return subprocess.run(
        [sys.executable, "-m", "fastprof", *argv], capture_output=True, text=True, timeout=120, env=child_env(server)
    )


def _same_size_other_content(store: Store, tmp_path: Path, size: int) -> Path:
    """An object ``run/rank0/fastprof.0.json.gz`` of ``size`` bytes, and a
    local file of the same name and size with other bytes (the last one)."""
    theirs = tmp_path / "theirs"
    theirs.write_bytes(os.urandom(size))
    store.put(theirs, "run/rank0/fastprof.0.json.gz")
    rank = tmp_path / "spool" / "run" / "rank0"
    rank.mkdir(parents=True)
    mine = bytearray(theirs.read_bytes())
    mine[-1] ^= 0xFF
    (rank / "fastprof.0.json.gz").write_bytes(bytes(mine))
    return rank / "fastprof.0.json.gz"


@pytest.mark.parametrize("size", [1000, (4 << 20) + 17], ids=["small", "over-4MiB"])
def test_a_spool_file_is_never_freed_because_an_object_of_its_size_is_there(
    s3_url: str, moto_server: MotoServer, tmp_path: Path, size: int
) -> None:
    store = open_store(s3_url)
    mine = _same_size_other_content(store, tmp_path, size)
    kept = mine.read_bytes()
    # The uploader (a resumed run's segment numbered as an earlier one): refused, kept.
    up = Uploader(mine.parent, store, "run/rank0", interval_s=0.05).start()
    out = up.close(30)
    assert mine.read_bytes() == kept
    assert out["conflicts"] == 1 and out["deleted_local"] == 0
    with pytest.raises(StoreConflictError):
        store.put(mine, "run/rank0/fastprof.0.json.gz")
    # fastprof upload --delete: not "already there", not deleted.
    p = _fastprof(moto_server, "upload", str(tmp_path / "spool" / "run"), s3_url, "--delete")
    assert p.returncode == 2 and "already exists with other content" in p.stderr, (p.stdout, p.stderr)
    assert mine.read_bytes() == kept
    # The same content is recognised as such, and then freed.
    fs = _fs()
    fs.pipe_file(f"{s3_url.removeprefix('s3://')}/run/rank0/fastprof.0.json.gz", kept)
    assert store.same_content(mine, "run/rank0/fastprof.0.json.gz")
    p = _fastprof(moto_server, "upload", str(tmp_path / "spool" / "run"), s3_url, "--delete")
    assert p.returncode == 0 and "1 already there" in p.stdout, (p.stdout, p.stderr)
    assert not mine.exists()


def test_a_multipart_object_is_recognised_by_its_etag(s3_url: str, tmp_path: Path) -> None:
    """A file put in parts (its ETag the MD5 of the parts' MD5s) is the same
    content when compared again, without reading it back."""
    store = open_store(s3_url)
    big = tmp_path / "big"
    big.write_bytes(os.urandom((8 << 20) * 2 + 5))
    store.put(big, "run/big")
    info = store.info("run/big")
    assert info is not None and str(info.get("ETag", "")).strip('"').endswith("-3")
    reads = []
    real_open = store.fs.open

    def counting_open(*a: object, **k: object) -> object:
        reads.append(a)
        return real_open(*a, **k)

    store.fs.open = counting_open  # type: ignore[method-assign]
    try:
        assert store.same_content(big, "run/big")
    finally:
        del store.fs.open
    assert reads == []


def test_two_claims_racing_have_one_winner(s3_url: str) -> None:
    store = open_store(s3_url)
    results: list[str | None] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def claim(i: int) -> None:
        start.wait()
        held = claim_in_store(store, "race/.fastprof-run", f"job-{i}")
        with lock:
            results.append(held)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(None) == 1, results


def test_merge_of_a_bucket_run_that_merged_itself_is_up_to_date(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    """Item 4: as on local disk, ``fastprof merge URL`` after a run that
    merged itself says "up to date" and exits 0; with a filter or --force it
    merges again."""
    gate = tmp_path / "go"
    gate.touch()
    code, _out, err = _done(
        _start(tmp_path, child_env(moto_server, FASTPROF_SPOOL_DIR=str(tmp_path / "spool")), s3_url, "m", str(gate))
    )
    assert code == 0, err
    run_url = f"{s3_url}/m"

    def merge(*extra: str) -> subprocess.CompletedProcess[str]:
        return _fastprof(moto_server, "merge", run_url, *extra)

    p = merge()
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert f"{run_url}/trace.json.gz is up to date" in p.stdout
    p = merge("-q")
    assert p.returncode == 0 and p.stdout.strip() == f"{run_url}/trace.json.gz", p.stdout
    # A filtered merge is not the whole one: it must not be taken as done.
    p = merge("--ranks", "0")
    assert p.returncode == 1 and "use --force" in p.stderr, p.stderr
    p = merge("--force")
    assert p.returncode == 0 and "merged" in p.stdout, p.stderr


LOOP = """
import sys, time
import fastprof
prof = fastprof.Profiler(sys.argv[1], "job", torch=False, sample_hz=0, upload_timeout=2.0)
with prof:
    for i in range(100000):
        time.sleep(0.01)
        prof.step()
        if i == 0:
            print("STEPPING", flush=True)
"""


def test_after_sigterm_with_the_store_down_stderr_says_only_where_the_data_is(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    """Item 7: with the store unreachable, SIGTERM's lines say the files
    wait in the spool, and never that the rank's data is saved in the store;
    the merge command they print works."""
    import shlex
    import signal

    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    spool = tmp_path / "spool"
    env = child_env(moto_server, FASTPROF_SPOOL_DIR=str(spool), AWS_ENDPOINT_URL="http://127.0.0.1:9")
    p = subprocess.Popen(
        [sys.executable, str(script), "s3://bucket/runs"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "STEPPING"
    p.send_signal(signal.SIGTERM)
    _out, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGTERM, err
    assert "data is saved in s3://" not in err, err
    line = next(ln for ln in err.splitlines() if "SIGTERM:" in ln)
    assert f"data is saved in {spool / 'job' / 'rank0'}" in line, line
    assert "could not be sent" in err and "fastprof upload" in err
    merge = shlex.split(line.split("build the unified trace with: ", 1)[1])
    m = subprocess.run([sys.executable, "-m", "fastprof", *merge[1:]], capture_output=True, text=True, timeout=120)
    assert m.returncode == 0, m.stderr


def test_a_run_still_being_written_is_read_whatever_moved_since_the_listing(s3_url: str, tmp_path: Path) -> None:
    """Item 6: between the store's listing and the read of an object, a
    live run renames its open segment (``.part`` closed) or frees an object.
    The readers (columns, the report that ``summary`` prints) follow the
    rename, and skip what is gone with a note, instead of FileNotFoundError."""
    import fastprof
    from fastprof import _core
    from fastprof.storage.backend import FsspecRemote, register

    out = tmp_path / "runs"
    with fastprof.Recorder(out_dir=out, run_name="live", sample_hz=0, segment_seconds=0.2, flush_interval=0.05) as rec:
        for i in range(60):
            with fastprof.span("step", step=i):
                sum(range(50_000))
            if i % 10 == 9:
                time.sleep(0.35)
    rank = rec.trace_dir
    segments = sorted((p.name for p in rank.glob("fastprof.*.json.gz")), key=lambda n: int(n.split(".")[1]))
    assert len(segments) >= 3, segments
    store = open_store(s3_url)
    for p in rank.iterdir():
        store.put(p, f"live/rank0/{p.name}")
    whole = fastprof.read_columns(f"{s3_url}/live")
    # The listing a reader gets was taken while the run went on: the last
    # segment was still open (.part, renamed since), one object since freed.
    last, freed = segments[-1], segments[0]
    fs = _fs()
    root = f"{s3_url.removeprefix('s3://')}/live/rank0"
    fs.rm_file(f"{root}/{freed}")

    class Stale(FsspecRemote):
        def list(self, url: str) -> list[tuple[str, int]]:
            listed = super().list(url)
            out_ = [(u + ".part", n) if u.endswith("/" + last) and u != url else (u, n) for u, n in listed]
            ghost = f"{s3_url}/live/rank0/{freed}"
            return sorted([*out_, (ghost, 100)]) if ghost.startswith(url.rstrip("/") + "/") else out_

    _core._set_remote(Stale())
    try:
        cols = fastprof.read_columns(f"{s3_url}/live")
        rep = fastprof.report(f"{s3_url}/live", out_dir=tmp_path / "rep", formats=())
    finally:
        import fastprof.storage.backend as remote_mod

        remote_mod._registered = False
        register()
    freed_spans = len(whole.spans["ts"]) - len(cols.spans["ts"])
    assert 0 < freed_spans < len(whole.spans["ts"])  # the freed segment's spans only, the renamed one's read
    gone = f"{s3_url}/live/rank0/{freed}: skipped, gone since it was listed"
    assert any(w.startswith(gone) for w in cols.warnings), cols.warnings
    assert any(gone in w for w in rep.data["source"]["warnings"]), rep.data["source"]["warnings"]
