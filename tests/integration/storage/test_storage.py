"""Run directories on object storage, the writing side (issue #26): the store
(:mod:`fastprof.storage.store`), the spool's uploader (:mod:`fastprof.storage.uploader`)
and ``fastprof upload``, against a real S3 server: moto's, started as a
process on a free port, reached through the standard AWS environment only."""

from __future__ import annotations

import gzip
import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from fastprof import ConfigError
from fastprof.cli.main import main
from fastprof.storage.store import Store, StoreConflictError, open_store
from fastprof.storage.uploader import Uploader, closed_files
from fastprof.storage.urls import is_url
from moto_s3 import MotoServer, _free_port, new_bucket, point_at, wait_until


def _point_at(monkeypatch: pytest.MonkeyPatch, server: MotoServer) -> None:
    point_at(monkeypatch, server)


def _bucket(name: str | None = None) -> str:
    return new_bucket(name)


def _write(path: Path, data: bytes) -> Path:
    """Write as fastprof's writers do: a temporary name, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def _segment(rank: int, n: int, events: int = 50) -> bytes:
    body = ",".join(f'{{"ph":"i","name":"e{i}","ts":{i}.000,"pid":{rank},"tid":1}}' for i in range(events))
    return gzip.compress(f'{{"traceEvents":[{body}],"otherData":{{"segment":{n}}}}}'.encode(), mtime=0)


# ------------------------------------------------------------------ store


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("s3://bucket/runs", True),
        ("gs://b/x", True),
        ("az://container/x", True),
        ("abfs://c@acct.dfs.core.windows.net/x", True),
        ("file:///tmp/runs", True),
        ("simplecache::s3://b/x", True),
        ("memory://x", True),
        ("fastprof_runs", False),
        ("/tmp/runs", False),
        ("./s3:/bucket/runs", False),
        ("s3:/bucket/runs", False),  # what a Path() makes of s3://bucket/runs
        ("C:\\runs", False),
        ("C://runs", False),
        ("", False),
    ],
)
def test_is_url(text: str, url: bool) -> None:
    assert is_url(text) is url


def test_missing_extra_is_one_line_naming_it() -> None:
    for url, extra, package in (("gs://b/runs", "gcs", "gcsfs"), ("az://c/runs", "azure", "adlfs")):
        if importlib.util.find_spec(package) is not None:
            continue  # installed here: nothing missing to report
        with pytest.raises(ConfigError) as e:
            open_store(url)
        assert str(e.value) == (
            f"out_dir {url} needs the {extra} extra: pip install 'fastprof-torch[{extra}]' ({package} is not installed)"
        )
    with pytest.raises(ConfigError, match="no filesystem serves nosuch://"):
        open_store("nosuch://b/runs")


def test_store_put_list_open_and_refuse(s3_url: str, tmp_path: Path) -> None:
    store = open_store(s3_url)
    a = _write(tmp_path / "a.json.gz", _segment(0, 0))
    assert store.put(a, "r/rank0/fastprof.0.json.gz").action == "uploaded"
    assert store.put(a, "r/rank0/fastprof.0.json.gz").action == "same"  # a repeated upload is harmless
    assert store.exists("r/rank0/fastprof.0.json.gz") and not store.exists("r/rank0/fastprof.1.json.gz")
    assert store.list("r") == ["r/rank0/fastprof.0.json.gz"]
    with store.open("r/rank0/fastprof.0.json.gz") as f:
        f.seek(2)
        assert f.read(4) == a.read_bytes()[2:6]  # a ranged read
    assert store.cat_ranges(["r/rank0/fastprof.0.json.gz"], [0], [3]) == [a.read_bytes()[:3]]

    b = _write(tmp_path / "b.json.gz", _segment(1, 0))  # another node's file under the same name
    with pytest.raises(StoreConflictError, match="already exists with other content"):
        store.put(b, "r/rank0/fastprof.0.json.gz")
    same_size = _write(tmp_path / "c.json.gz", bytes(len(a.read_bytes())))
    with pytest.raises(StoreConflictError):
        store.put(same_size, "r/rank0/fastprof.0.json.gz")
    assert store.fs.cat_file(store.path("r/rank0/fastprof.0.json.gz")) == a.read_bytes()
    # A file fastprof rewrites replaces its object.
    p = _write(tmp_path / "profiler.json", b'{"v": 1}')
    store.put(p, "r/rank0/profiler.json", rewritable=True)
    _write(p, b'{"v": 2, "more": true}')
    store.put(p, "r/rank0/profiler.json", rewritable=True)
    assert store.fs.cat_file(store.path("r/rank0/profiler.json")) == b'{"v": 2, "more": true}'


def test_file_url_store(tmp_path: Path) -> None:
    store = open_store((tmp_path / "bucket").as_uri())
    f = _write(tmp_path / "x.json.gz", _segment(0, 0))
    store.put(f, "run/rank0/fastprof.0.json.gz")
    assert (tmp_path / "bucket/run/rank0/fastprof.0.json.gz").read_bytes() == f.read_bytes()
    g = _write(tmp_path / "y.json.gz", _segment(3, 0))
    with pytest.raises(StoreConflictError):
        store.put(g, "run/rank0/fastprof.0.json.gz")


# --------------------------------------------------------------- uploader


class FakeRecorder:
    """Writes a rank's files as the recorder does: closed segments, and the
    newest one appended to (a sync flush every few ms) until it is closed."""

    def __init__(self, rank_dir: Path) -> None:
        self.dir = rank_dir
        self.stop = threading.Event()
        self.appended = 0
        self.thread = threading.Thread(target=self._append, daemon=True)

    def _append(self) -> None:
        with open(self.dir / "fastprof.1.json.gz", "ab") as f:
            while not self.stop.is_set():
                f.write(b"x" * 100)
                f.flush()
                self.appended += 1
                time.sleep(0.01)


def test_uploader_sends_closed_files_and_keeps_the_open_segment(s3_url: str, tmp_path: Path) -> None:
    store = open_store(s3_url)
    rank = tmp_path / "spool" / "run-1" / "rank0"
    seg0 = _segment(0, 0)
    _write(rank / "fastprof.0.json.gz", seg0)
    window = _write(rank / "torch" / "ep0-ba4.pt.trace.json.gz", b"torch window")
    _write(rank / "profiler.json", b'{"state": "running"}')
    (rank / ".fastprof.lock").write_bytes(b"")
    (rank / ".profiler.json.tmp-123").write_bytes(b"half")
    (rank / "memory").mkdir()
    (rank / "memory" / "x.pickle.part").write_bytes(b"half")
    rec = FakeRecorder(rank)
    rec.thread.start()
    up = Uploader(rank, store, "run-1/rank0", interval_s=0.05).start()
    try:
        wait_until(lambda: store.exists("run-1/rank0/torch/ep0-ba4.pt.trace.json.gz"), what="the torch window")
        wait_until(lambda: store.exists("run-1/rank0/profiler.json"), what="profiler.json")
        wait_until(lambda: not (rank / "fastprof.0.json.gz").exists(), what="segment 0 to leave the spool")
        assert store.fs.cat_file(store.path("run-1/rank0/fastprof.0.json.gz")) == seg0
        assert not window.exists()
        time.sleep(0.3)  # several passes while the newest segment grows
        assert rec.appended > 10
        assert not store.exists("run-1/rank0/fastprof.1.json.gz")
        assert (rank / "profiler.json").exists()  # rewritten by fastprof: kept

        # Rewritten: uploaded again.
        _write(rank / "profiler.json", b'{"state": "done", "steps": 100}')
        wait_until(
            lambda: store.fs.cat_file(store.path("run-1/rank0/profiler.json")) == b'{"state": "done", "steps": 100}',
            what="profiler.json's new version",
        )
        assert up.stats()["failures"] == 0
    finally:
        rec.stop.set()
        rec.thread.join()
    summary = up.close(timeout_s=10)
    assert store.list("run-1") == [
        "run-1/rank0/fastprof.0.json.gz",
        "run-1/rank0/fastprof.1.json.gz",
        "run-1/rank0/profiler.json",
        "run-1/rank0/torch/ep0-ba4.pt.trace.json.gz",
    ]
    assert len(store.fs.cat_file(store.path("run-1/rank0/fastprof.1.json.gz"))) == 100 * rec.appended
    assert not (rank / "fastprof.1.json.gz").exists()
    assert summary["timed_out"] is False and summary["failures"] == 0
    assert summary["left_in_spool"]["files"] == 0
    assert summary["uploaded_files"] == 5  # profiler.json twice
    left = sorted(p.relative_to(rank).as_posix() for p in rank.rglob("*") if p.is_file())
    assert left == [".fastprof.lock", ".profiler.json.tmp-123", "memory/x.pickle.part", "profiler.json"]


def test_closed_files_rules(tmp_path: Path) -> None:
    for n in ("fastprof.0.json.gz", "fastprof.1.json.gz", "fastprof.2.json.gz.part", "TRIGGER", "a.tmp"):
        (tmp_path / n).write_bytes(b"x")
    (tmp_path / "w").mkdir()
    for n in ("fastprof.3.json.gz", "fastprof.10.json.gz"):
        (tmp_path / "w" / n).write_bytes(b"x")
    going = [rel for rel, _ in closed_files(tmp_path, final=False)]
    # While recording: the open .part is newest, so 0 and 1 are closed; in w/
    # the newest (10, by number, not by name) is held.
    assert going == ["fastprof.0.json.gz", "fastprof.1.json.gz", "w/fastprof.3.json.gz"]
    last = [rel for rel, _ in closed_files(tmp_path, final=True)]
    assert last == [
        "fastprof.0.json.gz",
        "fastprof.1.json.gz",
        "fastprof.2.json.gz.part",
        "w/fastprof.3.json.gz",
        "w/fastprof.10.json.gz",
    ]


def test_two_nodes_never_overwrite_each_other(s3_url: str, tmp_path: Path) -> None:
    """Two nodes, no shared disk, the same run: each rank's objects are its
    own; a node wrongly given the same rank is refused, not written over."""
    store = open_store(s3_url)
    nodes = {r: tmp_path / f"node{r}" / "run" / f"rank{r}" for r in (0, 1)}
    for r, d in nodes.items():
        for n in range(3):
            _write(d / f"fastprof.{n}.json.gz", _segment(r, n))
        _write(d / "profiler.json", f'{{"rank": {r}}}'.encode())
    ups = [Uploader(d, store, f"run/rank{r}", interval_s=0.05).start() for r, d in nodes.items()]
    results = [u.close(timeout_s=10) for u in ups]
    assert all(s["uploaded_files"] == 4 and s["failures"] == 0 and s["conflicts"] == 0 for s in results)
    for r in (0, 1):
        for n in range(3):
            assert store.fs.cat_file(store.path(f"run/rank{r}/fastprof.{n}.json.gz")) == _segment(r, n)
        assert store.fs.cat_file(store.path(f"run/rank{r}/profiler.json")) == f'{{"rank": {r}}}'.encode()

    clash = tmp_path / "node2" / "run" / "rank0"  # a third node that also believes it is rank 0
    _write(clash / "fastprof.0.json.gz", _segment(2, 0, events=80))
    summary = Uploader(clash, store, "run/rank0", interval_s=0.05).close(timeout_s=10)
    assert summary["conflicts"] == 1 and summary["uploaded_files"] == 0
    assert "already exists with other content" in summary["last_error"]
    assert store.fs.cat_file(store.path("run/rank0/fastprof.0.json.gz")) == _segment(0, 0)
    assert (clash / "fastprof.0.json.gz").exists()  # kept for a person to look at
    assert summary["left_in_spool"]["files"] == 1


def test_outage_is_retried_counted_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The store goes away mid-run: uploads fail, are retried with backoff
    and counted, nothing raises, the files wait in the spool; the store back,
    ``fastprof upload`` sends them."""
    server = MotoServer()
    server.start()
    try:
        _point_at(monkeypatch, server)
        url = _bucket()
        store = open_store(url)
        rank = tmp_path / "spool" / "run" / "rank3"
        _write(rank / "fastprof.0.json.gz", _segment(3, 0))
        _write(rank / "fastprof.1.json.gz.part", b"open")
        up = Uploader(rank, store, "run/rank3", interval_s=0.05, backoff_s=0.05, backoff_cap_s=0.4).start()
        wait_until(lambda: not (rank / "fastprof.0.json.gz").exists(), what="segment 0 uploaded")

        server.stop()
        os.replace(rank / "fastprof.1.json.gz.part", rank / "fastprof.1.json.gz")
        _write(rank / "fastprof.1.json.gz", _segment(3, 1))
        _write(rank / "fastprof.2.json.gz.part", b"open")
        _write(rank / "flight" / "flight-001-trigger-ba7.json.gz", _segment(3, 99))
        wait_until(lambda: up.stats()["failures"] >= 3, what="retries")
        stats = up.stats()
        assert stats["uploaded_files"] == 1
        assert "EndpointConnectionError" in stats["last_error"] or "connect" in stats["last_error"].lower()
        # Backoff: a few tries, not one per pass (the passes run every 50 ms).
        time.sleep(1.0)
        tries = up.stats()["failures"] - stats["failures"]
        assert 1 <= tries <= 6, tries

        _write(rank / "fastprof.2.json.gz", _segment(3, 2))
        (rank / "fastprof.2.json.gz.part").unlink()
        t0 = time.monotonic()
        summary = up.close(timeout_s=2)
        assert time.monotonic() - t0 < 4
        assert summary["left_in_spool"]["files"] == 3
        assert summary["failures"] > stats["failures"]
        assert summary["spool"] == str(rank)
        for n in (1, 2):
            assert (rank / f"fastprof.{n}.json.gz").exists()

        server.start()  # same port, an empty store: the bucket is made again
        _bucket(url.split("/")[2])
        r = subprocess.run(
            [sys.executable, "-m", "fastprof", "upload", str(tmp_path / "spool" / "run"), url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0].startswith("fastprof upload: run/rank3: 3 file(s) uploaded")
        assert store.list("run") == [
            "run/rank3/fastprof.1.json.gz",
            "run/rank3/fastprof.2.json.gz",
            "run/rank3/flight/flight-001-trigger-ba7.json.gz",
        ]
    finally:
        server.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_an_outage_is_said_while_the_job_runs_reminded_and_its_end_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job of days must not learn at its end that nothing went up: a
    bucket that is not there (a typo, or not made yet) is said once its
    tries have failed WARN_AFTER_FAILURES times in a row, reminded at most
    every remind_s with what waits in the spool, and its end is said when
    the bucket is there; the final pass says nothing (the end's own line
    does)."""
    from fastprof.storage.uploader import WARN_AFTER_FAILURES

    server = MotoServer()
    server.start()
    try:
        _point_at(monkeypatch, server)
        name = f"later-{os.getpid()}-{time.monotonic_ns()}"
        store = open_store(f"s3://{name}/runs")
        rank = tmp_path / "spool" / "run" / "rank0"
        _write(rank / "fastprof.0.json.gz", _segment(0, 0))
        _write(rank / "fastprof.1.json.gz.part", b"open")
        said: list[str] = []
        t0 = time.monotonic()
        up = Uploader(
            rank, store, "run/rank0", interval_s=0.05, backoff_s=0.05, backoff_cap_s=0.1, warn=said.append, remind_s=0.5
        ).start()
        wait_until(lambda: said, what="the outage said")
        failures = up.stats()["failures"]
        assert failures >= WARN_AFTER_FAILURES, failures
        first = said[0]
        assert first.startswith(f"uploads to s3://{name}/runs/run/rank0 are failing (")
        assert "NoSuchBucket" in first or "does not exist" in first, first
        assert f"the files wait in the spool {rank}" in first, first
        # Reminded, never once per try: the tries come every ~0.1 s.
        wait_until(lambda: len(said) >= 2, what="a reminder")
        time.sleep(0.6)
        elapsed = time.monotonic() - t0
        reminders = [m for m in said[1:] if "still failing after" in m]
        # What `fastprof upload` would send: the closed segment and the open one.
        assert reminders and all("2 file(s), 0.0 MB wait in the spool" in m for m in reminders), said
        assert len(reminders) == len(said) - 1 <= elapsed / 0.5 + 1, (elapsed, said)
        assert up.stats()["failures"] >= WARN_AFTER_FAILURES - 1 + len(said)

        _bucket(name)  # the bucket is there now: the next try goes through
        wait_until(lambda: not (rank / "fastprof.0.json.gz").exists(), what="segment 0 uploaded")
        wait_until(lambda: "resumed after" in said[-1], what="the end of the outage said")
        assert said[-1].startswith(f"uploads to s3://{name}/runs/run/rank0 resumed after ")
        n = len(said)
        server.stop()  # the final pass fails: its caller says what is left, not the uploader
        summary = up.close(timeout_s=2)
        assert len(said) == n, said[n:]
        assert summary["left_in_spool"]["files"] == 1  # the open segment
    finally:
        server.stop()


# ------------------------------------------------------------ the command


def _spool_with_two_ranks(root: Path) -> Path:
    run = root / "run-7"
    for r in (0, 1):
        _write(run / f"rank{r}" / "fastprof.0.json.gz", _segment(r, 0))
        _write(run / f"rank{r}" / "fastprof.1.json.gz.part", _segment(r, 1)[:40])  # a killed writer's open segment
        _write(run / f"rank{r}" / "profiler.json", b"{}")
    _write(run / "trace.json.gz", _segment(0, 9))
    return run


def test_upload_command_subprocess_is_idempotent(s3_url: str, tmp_path: Path) -> None:
    run = _spool_with_two_ranks(tmp_path / "spool")
    cmd = [sys.executable, "-m", "fastprof", "upload", str(tmp_path / "spool"), s3_url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [x.split(":")[1].strip() for x in lines] == ["run-7/rank0", "run-7/rank1", "run-7/run", "total"]
    assert "3 file(s) uploaded" in lines[0] and "0 already there" in lines[0]
    assert lines[-1].startswith("fastprof upload: total: 7 file(s) uploaded")
    assert lines[-1].endswith(f"-> {s3_url}/run-7")
    store = open_store(s3_url)
    assert len(store.list("run-7")) == 7
    assert store.fs.cat_file(store.path("run-7/rank1/fastprof.0.json.gz")) == _segment(1, 0)

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "total: 0 file(s) uploaded (0.0 B), 7 already there" in r.stdout
    assert run.is_dir()


def test_upload_command_errors(
    s3_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _spool_with_two_ranks(tmp_path / "spool")
    with pytest.raises(SystemExit) as ended:  # refused as the command line is parsed
        main(["upload", str(run), "not-a-url"])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "not-a-url: not a storage URL (expected s3://BUCKET/prefix" in err and "\n" not in err
    assert main(["upload", str(tmp_path / "nope"), s3_url]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["upload", str(tmp_path / "empty"), s3_url]) == 2
    assert "no run directory here" in capsys.readouterr().err
    if importlib.util.find_spec("gcsfs") is None:
        assert main(["upload", str(run), "gs://b/runs"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            "fastprof upload: error: URL gs://b/runs needs the gcs extra: pip install 'fastprof-torch[gcs]' "
            "(gcsfs is not installed)"
        )

    # Another run's object under the same name: refused, exit 2, the file kept.
    store: Store = open_store(s3_url)
    other = _write(tmp_path / "other.json.gz", _segment(5, 5))
    store.put(other, "run-7/rank0/fastprof.0.json.gz")
    assert main(["upload", str(run), s3_url, "--delete"]) == 2
    out, err = capsys.readouterr()
    assert "run-7/rank0: 2 file(s) uploaded" in out and "1 refused" in out
    assert err.count("\n") == 1 and "already exists with other content" in err and str(tmp_path) in err
    assert (run / "rank0" / "fastprof.0.json.gz").exists()
    assert not (run / "rank1" / "fastprof.0.json.gz").exists()  # --delete: sent, so removed

    # The store unreachable: one line, exit 1, nothing deleted.
    left = sorted(run.rglob("*"))
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    s3fs.S3FileSystem.clear_instance_cache()
    _write(run / "rank1" / "fastprof.2.json.gz", _segment(1, 2))
    assert main(["upload", str(run), s3_url, "--delete"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "upload failed" in err and "run this command again" in err
    assert sorted(run.rglob("*")) == sorted([*left, run / "rank1" / "fastprof.2.json.gz"])
