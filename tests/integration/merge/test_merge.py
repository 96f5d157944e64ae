"""``fastprof merge`` on real traces: a torch.profiler CPU trace beside the
fastprof trace of the same run, a real 2-rank torchrun (gloo) job, filters,
and the corpus of bad inputs. Outputs are checked with Python's own gzip and
json, independently of the Rust reader."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import fastprof
from fastprof.cli.main import main

torch = pytest.importorskip("torch")

CORPUS = Path(__file__).resolve().parents[3] / "rust" / "fastprof-core" / "tests" / "corpus"


def load_single_member(path: Path) -> dict:
    """Parse a merged output, insisting on one gzip member and strict UTF-8 JSON."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        d = zlib.decompressobj(wbits=31)
        text = d.decompress(raw) + d.flush()
        assert d.eof and d.unused_data == b"", "more than one gzip member"
    else:
        text = raw
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))  # the corpus nests args deeper than json's default allows
    try:
        return json.loads(text.decode("utf-8"), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    finally:
        sys.setrecursionlimit(limit)


def rank_of(pid: int) -> int:
    return pid // 100_000 - 1


def train_with_profiler(trace_dir: Path, steps: int = 6) -> None:
    """A tiny training loop under torch.profiler and fastprof spans named 'step'."""
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = trace_dir / "torch"
    out.mkdir(parents=True, exist_ok=True)

    def ready(p):
        p.export_chrome_trace(str(out / "window.pt.trace.json.gz"))

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=ready,
    ) as prof:
        for i in range(steps):
            with fastprof.span("step", step=i):
                loss = model(torch.randn(16, 64)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            prof.step()


def test_profiler_steps_line_up_with_fastprof_steps(tmp_path):
    rec = fastprof.start(tmp_path, "align", sample_hz=0)
    train_with_profiler(rec.trace_dir)
    rec.stop()
    out = tmp_path / "merged.json.gz"
    s = fastprof.merge(rec.run_dir, out)
    doc = load_single_member(out)
    ev = doc["traceEvents"]
    torch_steps = {int(e["name"].split("#")[1]): e for e in ev if e.get("name", "").startswith("ProfilerStep#")}
    fp_steps = {e["args"]["step"]: e for e in ev if e.get("name") == "step" and e.get("ph") == "X"}
    assert len(torch_steps) == 3 and len(fp_steps) == 6
    # Order, not distance: torch's ProfilerStep#n opens at the prof.step() that
    # ends fastprof's step n-1 and closes at the one after fastprof's step n,
    # so on one aligned clock each fastprof step lies inside its ProfilerStep
    # and after the step before it. (1 µs of slack: torch writes whole µs.)
    for n, te in torch_steps.items():
        fe, prev = fp_steps[n], fp_steps[n - 1]
        assert prev["ts"] + prev["dur"] <= te["ts"] + 1, (n, prev, te)
        assert te["ts"] <= fe["ts"] + 1 and fe["ts"] + fe["dur"] <= te["ts"] + te["dur"] + 1, (n, te, fe)
        assert te["pid"] == fe["pid"]  # same process of the same rank, side by side
    assert s["events_out"] == s["events_in"] - s["metadata_replaced"]
    assert doc["otherData"]["merged"] is True and doc["baseTimeNanoseconds"] == s["base_ns"]


TORCHRUN_SCRIPT = r"""
import os, sys, torch, torch.distributed as dist
import fastprof
from torch.profiler import ProfilerActivity, profile, schedule

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
rec = fastprof.start(out, "run", sample_hz=20, sample_gpus="none")
tdir = rec.trace_dir / "torch"
tdir.mkdir(parents=True, exist_ok=True)
model = torch.nn.Linear(32, 32)

def ready(p):
    p.export_chrome_trace(str(tdir / f"rank{rank}.pt.trace.json.gz"))

with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
             on_trace_ready=ready) as prof:
    for i in range(5):
        with fastprof.span("step", step=i):
            loss = model(torch.randn(8, 32)).sum()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
        prof.step()
fastprof.stop()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchrun")
    script = root / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPROF_", "RANK", "WORLD"))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    r = subprocess.run(
        [*cmd, str(script), str(root)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run = root / "run"
    assert (run / "rank0" / "torch").is_dir() and (run / "rank1" / "torch").is_dir()
    return run


@pytest.mark.slow
def test_two_rank_torchrun_merge(two_rank_run, tmp_path):
    out = tmp_path / "all.json.gz"
    s = fastprof.merge(two_rank_run, out)
    assert s["ranks"] == [0, 1] and s["files"] == 4
    doc = load_single_member(out)
    ev = doc["traceEvents"]
    assert len(ev) == s["events_out"] + s["metadata_added"] + 1  # + the merge's own metadata event
    assert s["events_out"] == s["events_in"] - s["metadata_replaced"]
    pids_by_rank: dict[int, set[int]] = {0: set(), 1: set()}
    for e in ev:
        if e["pid"] != 0:
            pids_by_rank[rank_of(e["pid"])].add(e["pid"])
    assert pids_by_rank[0] and pids_by_rank[1] and not (pids_by_rank[0] & pids_by_rank[1])
    names = [e for e in ev if e.get("ph") == "M" and e["name"] == "process_name"]
    assert all(re.fullmatch(rf"rank {rank_of(e['pid'])}( · .+)?", e["args"]["name"]) for e in names)
    sort = {e["pid"]: e["args"]["sort_index"] for e in ev if e.get("ph") == "M" and e["name"] == "process_sort_index"}
    assert sorted(sort, key=sort.get) == sorted(sort, key=lambda p: (rank_of(p), p))
    flows: dict[int, set] = {0: set(), 1: set()}
    for e in ev:
        if e.get("ph") in ("s", "f", "t", "b", "e", "n") and "id" in e:
            flows[rank_of(e["pid"])].add(e["id"])
    assert flows[0] and flows[1] and not (flows[0] & flows[1])
    steps = [e for e in ev if e.get("name", "").startswith("ProfilerStep#")]
    assert {rank_of(e["pid"]) for e in steps} == {0, 1}
    counters = [e for e in ev if e.get("ph") == "C"]
    assert {rank_of(e["pid"]) for e in counters} == {0, 1}
    # Per-rank segments carry Kineto's distributedInfo (backend included); a
    # merge of several ranks names none (HTA reads one rank per file).
    for rank in (0, 1):
        seg = load_single_member(two_rank_run / f"rank{rank}" / "fastprof.0.json.gz")
        assert seg["distributedInfo"] == {"backend": "gloo", "rank": rank, "world_size": 2}
    assert "distributedInfo" not in load_single_member(out)
    one = fastprof.merge(two_rank_run, tmp_path / "one.json", ranks=[1])
    assert one["ranks"] == [1]
    assert load_single_member(tmp_path / "one.json")["distributedInfo"] == {
        "backend": "gloo",
        "rank": 1,
        "world_size": 2,
    }


@pytest.mark.slow
def test_rank_window_and_category_filters(two_rank_run, tmp_path):
    full = fastprof.merge(two_rank_run, tmp_path / "full.json")
    only1 = fastprof.merge(two_rank_run, tmp_path / "r1.json", ranks=[1])
    ev1 = load_single_member(tmp_path / "r1.json")["traceEvents"]
    assert {rank_of(e["pid"]) for e in ev1 if e["pid"]} == {1}
    assert only1["filtered_rank"] > 0

    doc = load_single_member(tmp_path / "full.json")
    span_s = (full["end_ns"] - full["start_ns"]) / 1e9
    w = fastprof.merge(two_rank_run, tmp_path / "w.json", start=span_s * 0.25, end=span_s * 0.5)
    wd = load_single_member(tmp_path / "w.json")
    lo = (w["start_ns"] - wd["baseTimeNanoseconds"]) / 1e3
    hi = (w["end_ns"] - wd["baseTimeNanoseconds"]) / 1e3
    timed = [e for e in wd["traceEvents"] if e.get("ph") not in ("M",) and "ts" in e]
    assert timed and w["filtered_window"] > 0
    assert all(e["ts"] + e.get("dur", 0) >= lo - 0.001 and e["ts"] <= hi + 0.001 for e in timed)
    assert len(wd["traceEvents"]) < len(doc["traceEvents"])

    ex = fastprof.merge(two_rank_run, tmp_path / "ex.json", exclude_categories=["cpu_op"])
    exd = load_single_member(tmp_path / "ex.json")
    assert not any(e.get("cat") == "cpu_op" for e in exd["traceEvents"]) and ex["filtered_category"] > 0
    fastprof.merge(two_rank_run, tmp_path / "inc.json", include_categories=["user"])
    incd = load_single_member(tmp_path / "inc.json")
    assert {e.get("cat") for e in incd["traceEvents"] if e.get("ph") != "M"} == {"user"}

    st = fastprof.merge(two_rank_run, tmp_path / "steps.json", steps=(2, 3))
    sd = load_single_member(tmp_path / "steps.json")
    names = {e["name"] for e in sd["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    assert "ProfilerStep#2" in names and "ProfilerStep#3" in names and "ProfilerStep#1" not in names
    assert st["filtered_window"] > 0


def test_max_bytes_drops_lowest_value_category_first(tmp_path):
    events = [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "p"}}]
    for i in range(2000):
        events.append({"ph": "X", "cat": "python_function", "name": f"f{i}" * 5, "pid": 7, "tid": 1, "ts": i, "dur": 1})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 1, "ts": i, "dur": 0.5})
    src = tmp_path / "rank0.json"
    src.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}))
    size = src.stat().st_size
    s = fastprof.merge(src, tmp_path / "small.json", max_bytes=size // 2)
    doc = load_single_member(tmp_path / "small.json")
    cats = {e.get("cat") for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert cats == {"cpu_op"}
    assert s["dropped_categories"] == ["python_function"] and s["filtered_max_bytes"] == 2000
    assert doc["otherData"]["max_bytes"]["dropped_categories"] == ["python_function"]


def test_old_kineto_absolute_epoch_and_exact_decimal_time(tmp_path):
    # Absolute epoch µs (torch < 2.4) next to a baseTimeNanoseconds trace of the same instant.
    base = 1_700_000_000_123_456_789
    old = {"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": "1700000000123456.789", "dur": 5}]}
    new = {
        "baseTimeNanoseconds": base - 1_000_000,
        "traceEvents": [{"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 1000.000, "dur": 5}],
    }
    (tmp_path / "rank0.json").write_text(json.dumps(old))
    (tmp_path / "rank1.json").write_text(json.dumps(new))
    fastprof.merge([tmp_path / "rank0.json", tmp_path / "rank1.json"], tmp_path / "o.json")
    doc = load_single_member(tmp_path / "o.json")
    a = next(e for e in doc["traceEvents"] if e.get("name") == "a")
    b = next(e for e in doc["traceEvents"] if e.get("name") == "b")
    assert a["ts"] == b["ts"] == 0.0 and doc["baseTimeNanoseconds"] == base
    text = (tmp_path / "o.json").read_text()
    assert len(re.findall(r'"ts":\s*0\.000[,}]', text)) == 2  # three decimals, separators copied as they were


def test_refuses_to_overwrite_and_cli_errors_are_one_line(tmp_path, capsys):
    src = tmp_path / "rank0.json"
    src.write_text(json.dumps({"traceEvents": [{"ph": "i", "name": "x", "pid": 1, "tid": 1, "ts": 1.7e15}]}))
    out = tmp_path / "o.json.gz"
    assert main(["merge", str(src), "-o", str(out), "-q"]) == 0
    before = out.read_bytes()
    # Its inputs unchanged since: nothing to do, and said (exit 0).
    assert main(["merge", str(src), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith("is up to date: the merge of its 1 inputs, newer than each")
    # An input newer than the output: not overwritten without -f (bad usage, exit 2).
    os.utime(src, ns=(out.stat().st_mtime_ns + 10**9,) * 2)
    assert main(["merge", str(src), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "-f" in err[0]
    assert out.read_bytes() == before
    assert main(["merge", str(src), "-o", str(out), "-f", "-q"]) == 0
    assert main(["merge", str(tmp_path / "missing.json"), "-o", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.json" in err[0] and "Traceback" not in err[0]
    assert main(["merge", str(src), "--steps", "3", "-o", str(tmp_path / "s.json")]) == 2


CORPUS_FILES = sorted(p for p in CORPUS.glob("*") if p.suffix not in (".md", ".py"))


def test_corpus_is_big_enough():
    assert len(CORPUS_FILES) >= 15


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_bad_input_corpus(path, tmp_path, capsys):
    src = tmp_path / f"rank0_{path.name}"
    shutil.copy(path, src)
    out = tmp_path / "out.json.gz"
    rc = main(["merge", str(src), "-o", str(out), "-q"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "panicked" not in err
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.json.gz.tmp")]
    assert not leftovers
    if rc == 0:
        load_single_member(out)
    else:
        assert rc == 2 and not out.exists()
        lines = [line for line in err.strip().splitlines() if "error" in line]
        assert len(lines) == 1 and src.name in lines[0], err
    if path.name.startswith("err_"):
        assert rc == 2, "a file the reader rejects must not merge"
    if path.name.startswith("salvage_") and rc == 0:
        warn = [line for line in err.splitlines() if "warning" in line]
        assert warn and all(src.name in line for line in warn), err


@pytest.mark.slow
def test_cli_subprocess_default_output(two_rank_run, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(two_rank_run, run)
    r = subprocess.run(
        [sys.executable, "-m", "fastprof", "merge", str(run)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert (run / "trace.json.gz").is_file()
    assert "merged 4 files, ranks [0, 1]" in r.stdout and "ui.perfetto.dev" in r.stdout
    # merging the run again skips the previous output instead of doubling it
    r2 = subprocess.run(
        [sys.executable, "-m", "fastprof", "merge", str(run), "-o", str(tmp_path / "again.json.gz")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r2.returncode == 0 and "skipped" in r2.stdout


def test_per_rank_clock_offsets_are_applied_to_every_input_of_the_rank(tmp_path):
    base = 1_700_000_000_000_000_000
    fp0 = {
        "baseTimeNanoseconds": base,
        "traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0}],
        "otherData": {
            "producer": "fastprof",
            "rank": 0,
            "clock": {"offset_ns": 5_000_000, "offset_uncertainty_ns": 1234},
        },
    }
    torch0 = {
        "baseTimeNanoseconds": base,
        "distributedInfo": {"rank": 0},
        "traceEvents": [{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0}],
    }
    fp1 = {
        "baseTimeNanoseconds": base,
        "traceEvents": [{"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0}],
        "otherData": {"producer": "fastprof", "rank": 1, "clock": {"offset_ns": 0, "offset_uncertainty_ns": 10}},
    }
    for name, doc in (("fp0.json", fp0), ("torch0.json", torch0), ("fp1.json", fp1)):
        (tmp_path / name).write_text(json.dumps(doc))
    s = fastprof.merge([tmp_path / n for n in ("fp0.json", "torch0.json", "fp1.json")], tmp_path / "o.json")
    doc = load_single_member(tmp_path / "o.json")
    ts = {e["name"]: e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert ts == {"b": 0.0, "a": 5000.0, "k": 5000.0}  # rank 0 shifted by its offset, torch trace too
    assert s["ranks"] == [0, 1] and s["uncertainty_ns"] >= 1234
    offsets = {(i["rank"], i["kind"]): i["offset_ns"] for i in doc["otherData"]["inputs"]}
    assert offsets == {(0, "fastprof"): 5_000_000, (0, "kineto"): 5_000_000, (1, "fastprof"): 0}
    assert doc["otherData"]["alignment"]["uncertainty_ns"] == s["uncertainty_ns"]
