"""Runs recorded to object storage (issue #26), end to end: real training
scripts (fastprof.Profiler, CPU torch) with ``out_dir="s3://..."`` as
subprocesses against moto's real S3 server (:mod:`moto_s3`), a store outage
(the server stopped mid-run), SIGTERM, a missing extra, a resumed run on a
"new node" (an empty spool), a second run under the same name, a two-rank
torchrun job whose ranks share no directory, and reports and merges read
from the bucket compared with the same run on local disk."""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import s3fs

import fastprof
from conftest import torchrun
from moto_s3 import MotoServer, child_env, new_bucket, wait_until

#: A training loop; argv: out_dir, run name, steps, seconds per step, then
#: key=value Profiler options (ints, floats and booleans parsed). With
#: torch=False the steps are plain Python (no torch import).
JOB = """
import os, sys, time
import fastprof
out, name, steps, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
kw = {}
for a in sys.argv[5:]:
    k, v = a.split("=", 1)
    kw[k] = {"True": True, "False": False}.get(v, float(v) if "." in v else int(v) if v.isdigit() else v)
if kw.get("torch", True) is False:
    # No torch window: a loop of plain Python steps (no torch import, seconds faster).
    def train(i):
        sum(range(20_000))
else:
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(16, 32) for _ in range(8)]
    def train(i):
        model(data[i % 8]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
# JOB_STOP: a file whose existence ends the loop early (a test's cue).
stop = os.environ.get("JOB_STOP")
prof = fastprof.Profiler(out, name, **kw)
with prof:
    for i in range(steps):
        train(i)
        time.sleep(pause)
        prof.step()
        if i == 0:
            print("STEPPING", flush=True)
        if stop and os.path.exists(stop):
            break
print("TRACE_URL", prof.trace_url, flush=True)
print("TRACE_PATH", prof.trace_path, flush=True)
"""


def _fs() -> s3fs.S3FileSystem:
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return fs


def _objects(url: str) -> dict[str, int]:
    """Every object under ``url``: key relative to it -> size."""
    fs = _fs()
    root = url.removeprefix("s3://").rstrip("/")
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    return {k[len(root) + 1 :]: int(v["size"]) for k, v in found.items()}


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def _job(tmp_path: Path, server: MotoServer, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=child_env(server, **(env or {})),
    )


def _finish(p: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the job did not finish within {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    return p.returncode, out, err


def _ungz_json(data: bytes) -> Any:
    return json.loads(gzip.decompress(data))


# ------------------------------------------------------------------ writing


def test_a_profiled_job_writes_its_run_to_the_bucket_and_frees_the_spool(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    p = _job(tmp_path, moto_server, s3_url, "job", "12", "0.01", f"spool_dir={spool}")
    code, out, err = _finish(p)
    assert code == 0, err
    objects = _objects(f"{s3_url}/job")
    # Every file a local run directory would hold, in the store under the same names.
    assert "rank0/fastprof.0.json.gz" in objects, objects
    assert "rank0/profiler.json" in objects and "rank0/triggers.json" in objects, objects
    assert any(k.startswith("rank0/torch/") and k.endswith(".pt.trace.json.gz") for k in objects), objects
    assert "rank0/.fastprof-done" in objects
    # live.json says a rank is running: gone with the run, from the store too.
    assert "rank0/live.json" not in objects
    # Rank 0's unified trace, merged from the bucket and put back; the Profiler says where.
    assert "trace.json.gz" in objects, objects
    assert f"TRACE_URL {s3_url}/job/trace.json.gz" in out
    assert "TRACE_PATH None" in out
    fs = _fs()
    root = s3_url.removeprefix("s3://")
    unified = _ungz_json(fs.cat_file(f"{root}/job/trace.json.gz"))  # Python's json, not ours
    names = {e.get("name") for e in unified["traceEvents"]}
    assert "step" in names and any(str(n).startswith("ProfilerStep#") for n in names)
    summary = json.loads(fs.cat_file(f"{root}/job/rank0/profiler.json"))
    up = summary["upload"]
    assert up["url"] == f"{s3_url}/job/rank0"
    assert up["uploaded_files"] >= 4 and up["failures"] == 0 and up["conflicts"] == 0
    assert up["left_in_spool"] == {"files": 0, "bytes": 0} and up["timed_out"] is False
    # Each file left the spool once in the store; the spool is empty at the end.
    assert _files(spool) == []
    # The spool is named on stderr, once, and no upload command is asked of the user.
    assert err.count("through the local spool") == 1, err
    assert "fastprof upload" not in err


def test_a_missing_extra_is_one_line_and_the_job_trains_on(pyscript: Any, tmp_path: Path) -> None:
    # gcsfs is not installed here: gs:// names its extra, and the run stays in the spool.
    pytest.importorskip("fsspec")
    if __import__("importlib").util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed: the missing-extra path cannot be shown with gs://")
    spool = tmp_path / "spool"
    r = pyscript.run(JOB, "gs://bucket/runs", "job", "4", "0", f"spool_dir={spool}", "torch=False")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "fastprof-torch[gcs]" in ln]
    assert len(lines) == 1, r.stderr
    assert "gcsfs is not installed" in lines[0] and str(spool) in lines[0]
    # The recording is whole, in the spool, with the one command that sends it later.
    assert any(f.startswith("job/rank0/fastprof.") for f in _files(spool)), _files(spool)
    assert f"fastprof upload {spool / 'job'} gs://bucket/runs" in r.stderr


def test_a_store_outage_never_fails_the_job_and_fastprof_upload_sends_the_rest(tmp_path: Path) -> None:
    server = MotoServer()
    server.start()
    try:
        os.environ.update(server.env())
        s3fs.S3FileSystem.clear_instance_cache()
        url = new_bucket()
        bucket = url.removeprefix("s3://").split("/")[0]
        spool, stop = tmp_path / "spool", tmp_path / "stop"
        # The job steps until told (at most 2,400 steps): the outage must
        # begin while it runs, however slowly the store is polled.
        p = _job(
            tmp_path,
            server,
            url,
            "job",
            "2400",
            "0.05",
            f"spool_dir={spool}",
            "segment_seconds=0.5",
            "upload_timeout=3.0",
            "torch=False",
            env={"JOB_STOP": str(stop)},
        )
        # Segments close every 0.5 s and go up: then the store goes away mid-run.
        wait_until(
            lambda: "rank0/fastprof.0.json.gz" in _objects(f"{url}/job"),
            60,
            "the first segment in the store",
            pause=0.2,
        )
        server.stop()
        time.sleep(1.0)  # segments close while the store is gone
        stop.touch()
        code, _out, err = _finish(p)
        # The job's own outcome, whatever the store did.
        assert code == 0, err
        m = re.search(r"could not be sent to (\S+).*?send them with: (fastprof upload \S+ \S+)", err)
        assert m, err
        assert m.group(1) == f"{url}/job/rank0"
        assert m.group(2) == f"fastprof upload {spool / 'job'} {url}"
        left = [f for f in _files(spool / "job") if not any(part.startswith(".") for part in f.split("/"))]
        assert any(f.startswith("rank0/fastprof.") for f in left) and "rank0/profiler.json" in left, left
        # Nothing recorded is lost: the command sends what the spool holds to a store that is back.
        server.start()
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir(bucket)  # moto's store is in memory: a restart starts empty
        argv = m.group(2).split()
        r = subprocess.run(
            [sys.executable, "-m", "fastprof", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(server),
        )
        assert r.returncode == 0, r.stderr
        objects = _objects(f"{url}/job")
        for f in left:
            assert f in objects, (f, sorted(objects))
        summary = json.loads(_fs().cat_file(f"{bucket}/runs/job/rank0/profiler.json"))
        assert summary["upload"]["failures"] >= 1 and summary["upload"]["last_error"]
    finally:
        server.stop()
        for k in server.env():
            os.environ.pop(k, None)
        s3fs.S3FileSystem.clear_instance_cache()


#: Steps until the file argv[2] exists (the test makes it once stderr said the outage).
UNTIL_TOLD = """
import os, sys, time
import fastprof
out, stop = sys.argv[1], sys.argv[2]
with fastprof.Profiler(out, "job", torch=False, segment_seconds=0.5, upload_timeout=1.0) as prof:
    t0 = time.monotonic()
    while not os.path.exists(stop) and time.monotonic() - t0 < 120:
        sum(range(20_000))
        time.sleep(0.02)
        prof.step()
"""


def test_a_bucket_that_is_not_there_is_said_while_the_job_runs(moto_server: MotoServer, tmp_path: Path) -> None:
    """A typo in the bucket's name must not be learnt at the end of a job of
    days: stderr says the uploads are failing while the job trains, once."""
    script, stop, spool = tmp_path / "job.py", tmp_path / "stop", tmp_path / "spool"
    script.write_text(UNTIL_TOLD)
    url = f"s3://no-such-bucket-{os.getpid()}-{time.monotonic_ns()}/runs"
    p = subprocess.Popen(
        [sys.executable, str(script), url, str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=child_env(moto_server, FASTPROF_SPOOL_DIR=str(spool)),
    )
    assert p.stderr is not None
    lines: list[str] = []
    try:
        for line in p.stderr:  # the job runs (up to 120 s) until told
            lines.append(line)
            if "are failing" in line:
                break
        stop.touch()
        code, _out, rest = _finish(p)
    finally:
        if p.poll() is None:
            p.kill()
    err = "".join(lines) + rest
    assert code == 0, err
    failing = [line for line in err.splitlines() if "are failing" in line]
    assert len(failing) == 1, err
    assert failing[0].startswith(f"fastprof: uploads to {url}/job/rank0 are failing (3 tries in a row; "), err
    assert "NoSuchBucket" in failing[0] or "does not exist" in failing[0], err
    assert f"the files wait in the spool {spool / 'job' / 'rank0'}" in failing[0], err
    # Then the end's own account, and the command that sends the rest.
    assert err.index("are failing") < err.index("could not be sent to"), err
    assert f"send them with: fastprof upload {spool / 'job'} {url}" in err, err
    assert "resumed" not in err and "Traceback" not in err, err


def test_sigterm_uploads_what_is_closed_and_dies_as_without_fastprof(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    p = _job(
        tmp_path,
        moto_server,
        s3_url,
        "job",
        "100000",
        "0.02",
        f"spool_dir={spool}",
        "segment_seconds=1.0",
        "upload_timeout=10.0",
        "torch=False",
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "STEPPING"
    time.sleep(1.5)
    p.send_signal(signal.SIGTERM)
    code, _out, err = _finish(p, timeout=60)
    # Without fastprof, SIGTERM kills the interpreter: the same status here.
    assert code == -signal.SIGTERM, err
    objects = _objects(f"{s3_url}/job")
    segments = [k for k in objects if re.fullmatch(r"rank0/fastprof\.\d+\.json\.gz", k)]
    assert segments, objects
    summary = json.loads(_fs().cat_file(f"{s3_url.removeprefix('s3://')}/job/rank0/profiler.json"))
    assert summary["exit"] == "SIGTERM"
    assert summary["upload"]["left_in_spool"]["files"] == 0
    assert f"rank 0's data is saved in {s3_url}/job/rank0" in err
    assert _files(spool) == []


def test_a_second_run_under_the_same_name_takes_a_new_name_in_the_bucket(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    # Two nodes' worth of spools: the second run sees the first only in the bucket.
    for i, expect in enumerate(("job", "job-2")):
        p = _job(tmp_path, moto_server, s3_url, "job", "3", "0", f"spool_dir={tmp_path / f'spool{i}'}", "torch=False")
        code, out, err = _finish(p)
        assert code == 0, err
        assert f"TRACE_URL {s3_url}/{expect}/trace.json.gz" in out, (out, err)
    objects = _objects(s3_url)
    assert "job/rank0/fastprof.0.json.gz" in objects and "job-2/rank0/fastprof.0.json.gz" in objects


def test_a_resumed_run_on_a_new_node_continues_the_segment_numbers(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    for i in range(2):
        extra = ["resume=1"] if i else []
        p = _job(
            tmp_path,
            moto_server,
            s3_url,
            "job",
            "3",
            "0",
            f"spool_dir={tmp_path / f'node{i}'}",
            "torch=False",
            *extra,
        )
        code, _out, err = _finish(p)
        assert code == 0, err
        assert "could not be sent" not in err, err
    objects = _objects(f"{s3_url}/job")
    segments = sorted(int(m.group(1)) for k in objects if (m := re.fullmatch(r"rank0/fastprof\.(\d+)\.json\.gz", k)))
    # Two recordings, numbered one after the other: nothing refused, nothing overwritten.
    assert len(segments) >= 2 and segments == list(range(len(segments))), segments


# ------------------------------------------------------------------ reading


def _local_copy(url: str, dest: Path) -> Path:
    """The bucket run downloaded as it is (what the run directory would be on disk)."""
    fs = _fs()
    root = url.removeprefix("s3://")
    for key in fs.find(root):
        rel = key[len(root) + 1 :]
        if rel.startswith(".") or "/." in rel or rel.startswith("reports/"):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(fs.cat_file(key))
    return dest


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    for k in ("path", "run_dir", "inputs"):
        doc["source"].pop(k, None)
    # A window is named where it is (an object, a file): compared from its rank folder on.
    ops = (doc.get("memory") or {}).get("operators") or {}
    for w in [ops, *(ops.get("windows") or [])]:
        if w.get("window"):
            w["window"] = w["window"][w["window"].rindex("/rank") + 1 :]
    return doc


def test_report_summary_diff_and_merge_read_a_bucket_run_as_they_read_it_on_disk(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    p = _job(
        tmp_path,
        moto_server,
        s3_url,
        "job",
        "12",
        "0.01",
        f"spool_dir={tmp_path / 'spool'}",
    )
    code, _out, err = _finish(p)
    assert code == 0, err
    run_url = f"{s3_url}/job"
    local = _local_copy(run_url, tmp_path / "local" / "job")
    env = child_env(moto_server)

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fastprof", *argv], capture_output=True, text=True, timeout=300, env=env
        )

    r = cli("report", run_url, "-q")
    assert r.returncode == 0, r.stderr
    assert f"{run_url}/reports/report.json" in r.stdout.split()
    # The torch window was recorded in the spool, which the uploader emptied:
    # the report reads its object (and the local copy's report its file there).
    assert "no operator table" not in r.stderr, r.stderr
    r = cli("report", str(local), "-q")
    assert r.returncode == 0, r.stderr
    assert "no operator table" not in r.stderr, r.stderr
    remote_doc = json.loads(_fs().cat_file(f"{run_url.removeprefix('s3://')}/reports/report.json"))
    local_doc = json.loads((local / "reports" / "report.json").read_text())
    assert remote_doc["source"]["path"] == run_url
    windows = remote_doc["memory"]["operators"]["windows"]
    assert windows and all(w["window"].startswith(f"{run_url}/rank0/torch/") and w["files"] for w in windows), windows
    assert _comparable(remote_doc) == _comparable(local_doc)
    # The HTML page is there too, and is what the local one is (but for the paths it names).
    assert "reports/report.html" in _objects(run_url)
    r = cli("summary", run_url)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr
    r = cli("diff", run_url, str(local))
    assert r.returncode == 0, r.stdout + r.stderr
    # A merge from the bucket into the bucket, equal to the local merge's events.
    r = cli("merge", run_url, "-o", f"{run_url}/again.json.gz", "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{run_url}/again.json.gz"
    again = _ungz_json(_fs().cat_file(f"{run_url.removeprefix('s3://')}/again.json.gz"))
    r = cli("merge", str(local / "rank0"), "-o", str(tmp_path / "local.json.gz"), "-q")
    assert r.returncode == 0, r.stderr
    here = _ungz_json((tmp_path / "local.json.gz").read_bytes())
    assert len(again["traceEvents"]) == len(here["traceEvents"])
    # Without --force an object is never replaced.
    r = cli("merge", run_url, "-o", f"{run_url}/again.json.gz")
    assert r.returncode == 1 and "already exists" in r.stderr


def test_a_missing_url_is_one_line_naming_it(s3_url: str, moto_server: MotoServer) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fastprof", "report", f"{s3_url}/nothing-here"],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(moto_server),
    )
    assert r.returncode == 2, r.stderr
    assert f"{s3_url}/nothing-here" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------- distributed

DIST_JOB = """
import os, sys, time
import torch, torch.distributed as dist, fastprof
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
# No directory shared between the ranks: each has its own spool, as two nodes would.
spool = os.path.join(sys.argv[2], f"node{rank}")
with fastprof.Profiler(sys.argv[1], "dist", spool_dir=spool, torch=False) as prof:
    for i in range(6):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
print("TRACE_URL", rank, prof.trace_url, flush=True)
dist.destroy_process_group()
"""


def test_a_torchrun_job_with_no_shared_directory_merges_every_rank_from_the_bucket(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    script = tmp_path / "dist_job.py"
    script.write_text(DIST_JOB)
    r = torchrun(script, s3_url, str(tmp_path / "spools"), cwd=tmp_path, timeout=240, env=moto_server.env())
    assert f"TRACE_URL 0 {s3_url}/dist/trace.json.gz" in r.stdout, r.stdout + r.stderr
    objects = _objects(f"{s3_url}/dist")
    for rank in (0, 1):
        assert f"rank{rank}/fastprof.0.json.gz" in objects and f"rank{rank}/profiler.json" in objects, objects
    unified = _ungz_json(_fs().cat_file(f"{s3_url.removeprefix('s3://')}/dist/trace.json.gz"))
    pids = {e["pid"] for e in unified["traceEvents"] if e.get("name") == "step"}
    assert len(pids) == 2, pids  # both ranks' steps, each on its own track
    assert _files(tmp_path / "spools") == []


def test_read_columns_of_a_bucket_run(s3_url: str, moto_server: MotoServer, tmp_path: Path) -> None:
    with fastprof.Recorder(s3_url, "cols", spool_dir=tmp_path / "spool", flush_interval=0.05) as rec:
        for _ in range(5):
            with fastprof.span("work"):
                pass
    assert rec.stats is not None and rec.stats.upload is not None
    assert rec.stats.upload["left_in_spool"]["files"] == 0
    cols = fastprof.read_columns(f"{s3_url}/cols")
    names = cols.names
    work = names.index("work")
    assert int((cols.spans["name"] == work).sum()) == 5
    shutil.rmtree(tmp_path / "spool", ignore_errors=True)


LIVE_JOB = """
import sys, time
from pathlib import Path
import torch, fastprof
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
triggers = fastprof.Triggers(min_interval_s=0, anomaly=False, poll_s=0.1)
with fastprof.Profiler(sys.argv[1], "live", spool_dir=sys.argv[2], schedule="never", triggers=triggers) as prof:
    while not Path("STOP").exists():
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
        time.sleep(0.02)
"""


def test_fastprof_trigger_asks_a_bucket_run_and_names_the_objects(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    (tmp_path / "live.py").write_text(LIVE_JOB)
    env = child_env(moto_server)
    job = subprocess.Popen(
        [sys.executable, "live.py", s3_url, str(tmp_path / "spool")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: "rank0/live.json" in _objects(f"{s3_url}/live"), 90, "live.json in the store", pause=0.2)
        r = subprocess.run(
            [sys.executable, "-m", "fastprof", "trigger", f"{s3_url}/live", "--steps", "2", "--wait", "120"],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        shown = re.findall(r"rank 0: (s3://\S+)", r.stdout)
        assert any("/rank0/torch/" in u for u in shown) and any("/rank0/flight/" in u for u in shown), r.stdout
        # Each file it names is an object of the run (uploaded once closed).
        keys = [u[len(f"{s3_url}/live/") :] for u in shown]
        wait_until(lambda: all(k in _objects(f"{s3_url}/live") for k in keys), 30, f"{keys} in the store", pause=0.2)
        # The trigger object was taken (deleted) by the rank that answered it.
        assert "TRIGGER" not in _objects(f"{s3_url}/live")
    finally:
        (tmp_path / "STOP").touch()
        code, _out, err = _finish(job)
    assert code == 0, err
    # After the run: a trigger is refused with the report command.
    r = subprocess.run(
        [sys.executable, "-m", "fastprof", "trigger", f"{s3_url}/live"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 1 and f"fastprof report {s3_url}/live" in r.stderr, r.stderr


TRAIN = """
import torch
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x in torch.utils.data.DataLoader(torch.randn(64, 16), batch_size=8):
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_fastprof_run_records_a_plain_script_to_a_bucket(s3_url: str, moto_server: MotoServer, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    env = child_env(moto_server, FASTPROF_SPOOL_DIR=str(tmp_path / "spool"))
    r = subprocess.run(
        [sys.executable, "-m", "fastprof", "run", "-o", s3_url, "--run-name", "plain", "train.py"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    # The command it prints reads the bucket, and works.
    assert f"fastprof run: next: fastprof report {s3_url}/plain" in r.stderr, r.stderr
    objects = _objects(f"{s3_url}/plain")
    assert {"rank0/fastprof.0.json.gz", "rank0/profiler.json", "trace.json.gz"} <= set(objects), objects
    r = subprocess.run(
        [sys.executable, "-m", "fastprof", "summary", f"{s3_url}/plain"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert _files(tmp_path / "spool") == []


def test_the_demo_into_a_bucket_prints_commands_that_work_on_it(
    s3_url: str, moto_server: MotoServer, tmp_path: Path
) -> None:
    """``fastprof demo -o s3://...``: the places it prints are the bucket's,
    and each command it prints runs as printed (a shell's split of the line)."""
    env = child_env(moto_server, FASTPROF_SPOOL_DIR=str(tmp_path / "spool"))
    argv = [sys.executable, "-m", "fastprof", "demo", "-o", s3_url, "--run-name", "d", "--steps", "4"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_url = f"{s3_url}/d"
    assert f"unified trace: {run_url}/trace.json.gz" in r.stdout, r.stdout
    assert "copy it from the store" in r.stdout
    windows = [line for line in r.stdout.splitlines() if line.startswith("torch window steps")]
    assert windows and all(f"{run_url}/rank0/torch/" in line for line in windows), r.stdout
    printed = [
        line.split(":", 1)[1].split("   (")[0]
        for line in r.stdout.splitlines()
        if line.startswith(("redo it:", "report:"))
    ]
    assert len(printed) == 2, r.stdout
    for command in printed:
        words = shlex.split(command)
        assert words[0] == "fastprof", command
        p = subprocess.run(
            [sys.executable, "-m", "fastprof", *words[1:]], capture_output=True, text=True, timeout=300, env=env
        )
        assert p.returncode == 0, f"{command}\n{p.stderr}"
        assert "warning" not in p.stderr, f"{command}\n{p.stderr}"
    assert "reports/report.json" in _objects(run_url)
    assert _files(tmp_path / "spool") == []
