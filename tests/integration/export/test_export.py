"""The step table (issue #38, item 5): ``fastprof export RUN -o steps.parquet``
and ``fastprof.load(RUN)``, one row per rank and step.

Runs are real: a CPU MLP under the real Profiler in a subprocess, its
segments kept small so that the table is read across several of them, and a
``torchrun`` gloo job of two ranks. The table is read back with pyarrow,
pandas, polars and DuckDB, and its values are checked against the step spans
of the trace's segments as Python's ``json`` reads them."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from conftest import torchrun
from fastprof.cli.main import main
from fastprof.readers.steps import COLUMNS
from fastprof.storage.store import open_store

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")
pytest.importorskip("torch")

PHASES = ["dataloader", "forward", "backward", "optimizer", "communication", "other"]
STEPS = 3000

JOB = """
import sys, torch, fastprof
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(torch.randn(int(sys.argv[2]) * 2, 8), batch_size=4)
prof = fastprof.Profiler(sys.argv[1], "run", torch=False, sample_hz=0, segment_size=65536)
with prof:
    for epoch in range(2):
        prof.begin_epoch(epoch)
        for x in prof.loader(loader):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
"""


def _job(out: Path, steps: int = STEPS) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", JOB, str(out), str(steps)], capture_output=True, text=True, timeout=240, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return out / "run"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = _job(tmp_path_factory.mktemp("export"))
    # Rotated: the table is read across segments, steps and readings carried between them.
    assert len(list((run / "rank0").glob("fastprof.*.json.gz"))) >= 3
    return run


def _ns(us: Any) -> int:
    """µs as written (three decimals) to integer ns, as the core parses them."""
    return round(float(us) * 1000)


def _expected(rank_dir: Path) -> list[dict[str, Any]]:
    """Each step of a rank from its segments read with Python's json: the
    step span, the phase spans that start inside it (each up to the step's
    end; this job's phases never overlap), and the last RSS reading
    taken at or after its end and before the next step's end."""
    steps: list[dict[str, Any]] = []
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    rss: list[tuple[int, float]] = []
    segs = sorted(rank_dir.glob("fastprof.*.json.gz"), key=lambda p: int(p.name.split(".")[1]))
    for seg in segs:
        with gzip.open(seg, "rt") as f:
            doc = json.load(f)
        base = int(doc["baseTimeNanoseconds"]) + int(doc["otherData"].get("clock", {}).get("offset_ns", 0))
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and e["name"] == "step":
                a = e["args"]
                steps.append(
                    {
                        "step": a["batch"],
                        "epoch": a["epoch"],
                        "start_ns": base + _ns(e["ts"]),
                        "duration_ns": _ns(e["dur"]),
                    }
                )
            elif e.get("ph") == "X":
                spans[e["name"]].append((base + _ns(e["ts"]), _ns(e["dur"])))
            elif e.get("ph") == "C" and e["name"] == "mem.rss [B]":
                rss.append((base + _ns(e["ts"]), e["args"]["value"]))
    steps.sort(key=lambda s: s["start_ns"])
    names = {
        "dataloader": "loader.train.next",
        "forward": "phase.forward",
        "backward": "phase.backward",
        "optimizer": "phase.optimizer",
        "communication": "phase.communication",
    }
    for s in steps:
        a, b = s["start_ns"], s["start_ns"] + s["duration_ns"]
        covered = 0
        for phase, name in names.items():
            s[f"{phase}_ns"] = sum(min(t + d, b) - t for t, d in spans[name] if a <= t < b)
            covered += s[f"{phase}_ns"]
        s["other_ns"] = max(s["duration_ns"] - covered, 0)
        s["rss_bytes"] = None
    ends = [s["start_ns"] + s["duration_ns"] for s in steps]
    for t, v in sorted(rss):
        at = max(int(np.searchsorted(ends, t, side="right")) - 1, 0)
        steps[at]["rss_bytes"] = int(v)
    return steps


def test_the_table_read_back_is_the_traces_steps(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "steps.parquet"
    assert main(["export", str(run), "-o", str(out)]) == 0
    assert f"{STEPS} steps" in capsys.readouterr().out
    table = pq.read_table(out)
    assert table.schema.names == [c for c, _, _ in COLUMNS]
    assert str(table.schema.field("rank").type) == "int32"
    assert all(str(table.schema.field(c).type) == "int64" for c, _, _ in COLUMNS[1:])
    got = table.to_pylist()
    want = _expected(run / "rank0")
    assert len(got) == len(want) == STEPS
    for g, w in zip(got, want, strict=True):
        assert g["rank"] == 0
        for key, value in w.items():
            assert g[key] == value, (key, g, w)
    # Both epochs, as the Profiler numbered them, in step order.
    assert (
        sorted({g["epoch"] for g in got}) == sorted({w["epoch"] for w in want}) and len({g["epoch"] for g in got}) == 2
    )
    assert [g["step"] for g in got] == list(range(STEPS))
    # Phases are there and add up to the step; no GPU or CUDA figures on this machine.
    assert all(g["forward_ns"] > 0 and g["backward_ns"] > 0 and g["optimizer_ns"] > 0 for g in got)
    assert sum(g["rss_bytes"] is not None for g in got) > 0
    assert all(g["cuda_allocated_bytes"] is None and g["gpu_span_ns"] is None for g in got)
    # Written a row group at a time.
    assert pq.ParquetFile(out).metadata.num_row_groups >= 1


def test_read_a_segment_at_a_time_or_the_merged_trace_whole_the_table_is_the_same(run: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    merged = tmp_path / "merged.json.gz"
    fastprof.merge(run, merged)
    assert main(["export", str(run), "-o", str(a), "-q"]) == 0
    assert main(["export", str(merged), "-o", str(b), "-q"]) == 0
    assert pq.read_table(a).equals(pq.read_table(b))


# The GPU figures as the Profiler records them on a GPU, written by the loop
# itself here (no GPU on this machine): every third step's phase times a step
# late (``phase.gpu.step`` with its number, then ``phase.gpu [ms]``), and the
# allocator's bytes at each step's end.
GPU_JOB = """
import sys, fastprof
from fastprof.recording.names import CUDA_ALLOCATED, GPU_PHASE_COUNTER, GPU_PHASE_STEP_COUNTER
prof = fastprof.Profiler(sys.argv[1], "run", torch=False, sample_hz=0, segment_size=65536)
with prof:
    for i in prof.loader(range(int(sys.argv[2]))):
        with fastprof.span("forward"):
            if i % 3 == 1:
                fastprof.counter(GPU_PHASE_STEP_COUNTER, float(i - 1))
                fastprof.counter(GPU_PHASE_COUNTER, {"forward": 1.5 + i, "backward": 2.25, "optimizer": 0.5,
                                                     "communication": 0.0, "span": 4.75 + i})
        prof.step()
        fastprof.counter(CUDA_ALLOCATED, float(1000 * i))
"""


def test_gpu_times_join_their_step_by_number_and_allocator_bytes_their_step_by_time(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    n = 3000
    p = subprocess.run(
        [sys.executable, "-c", GPU_JOB, str(tmp_path), str(n)], capture_output=True, text=True, timeout=240, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "run"
    assert len(list((run / "rank0").glob("fastprof.*.json.gz"))) >= 2
    df = fastprof.load(run)
    assert df["step"].tolist() == list(range(n))
    # Read with Python's json: each GPU event's step is the phase.gpu.step value
    # before it; each allocator reading the last step that ended at or before it.
    events: list[tuple[int, str, dict[str, float]]] = []
    ends: list[int] = []
    for seg in sorted((run / "rank0").glob("fastprof.*.json.gz"), key=lambda q: int(q.name.split(".")[1])):
        with gzip.open(seg, "rt") as f:
            doc = json.load(f)
        base = int(doc["baseTimeNanoseconds"])
        for e in doc["traceEvents"]:
            if e.get("ph") == "C" and e["name"] in ("phase.gpu.step", "phase.gpu [ms]", "mem.cuda.allocated [B]"):
                events.append((base + _ns(e["ts"]), e["name"], e["args"]))
            elif e.get("ph") == "X" and e["name"] == "step":
                ends.append(base + _ns(e["ts"]) + _ns(e["dur"]))
    ends.sort()
    gpu: dict[int, dict[str, float]] = {}
    cuda: dict[int, float] = {}
    current = -1
    for t, name, a in sorted(events, key=lambda x: x[0]):
        if name == "phase.gpu.step":
            current = int(a["value"])
        elif name == "phase.gpu [ms]":
            gpu[current] = a
        else:
            cuda[max(int(np.searchsorted(ends, t, side="right")) - 1, 0)] = a["value"]
    assert len(gpu) == n // 3 and len(cuda) > n // 2
    for row in df.itertuples(index=False):
        g = gpu.get(row.step)
        for phase in ("forward", "backward", "optimizer", "communication", "span"):
            value = getattr(row, f"gpu_{phase}_ns")
            if g is None:
                assert np.isnan(value), row
            else:
                assert value == round(g[phase] * 1e6), (row, g)
        if row.step in cuda:
            assert row.cuda_allocated_bytes == cuda[row.step], row
        else:
            assert np.isnan(row.cuda_allocated_bytes), row
    assert df["rss_bytes"].notna().any()


def test_rows_closed_in_small_batches_make_the_same_table_in_more_row_groups(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    assert main(["export", str(run), "-o", str(a), "-q"]) == 0
    monkeypatch.setattr("fastprof.readers.steps.ROW_GROUP", 97)
    assert main(["export", str(run), "-o", str(b), "-q"]) == 0
    assert pq.read_table(a).equals(pq.read_table(b))
    assert pq.ParquetFile(b).metadata.num_row_groups > pq.ParquetFile(a).metadata.num_row_groups


def test_load_is_the_exported_file_as_pandas_and_polars_read_it(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "steps.parquet"
    assert main(["export", str(run), "-o", str(out), "-q"]) == 0
    df = fastprof.load(run)
    assert isinstance(df, pd.DataFrame)
    pd.testing.assert_frame_equal(df, pd.read_parquet(out))
    pl = pytest.importorskip("polars")
    frame = fastprof.load(str(run), engine="polars")
    assert isinstance(frame, pl.DataFrame)
    assert frame.equals(pl.read_parquet(out))


def test_duckdb_finds_the_ten_slowest_steps_per_rank(run: Path, tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "steps.parquet"
    assert main(["export", str(run), "-o", str(out), "-q"]) == 0
    # The query of docs/export.md.
    rows = duckdb.sql(
        f"""
        SELECT rank, step, duration_ns FROM (
          SELECT rank, step, duration_ns,
                 row_number() OVER (PARTITION BY rank ORDER BY duration_ns DESC, step) AS k
          FROM '{out}')
        WHERE k <= 10 ORDER BY rank, duration_ns DESC, step
        """
    ).fetchall()
    df = pd.read_parquet(out).sort_values(["rank", "duration_ns", "step"], ascending=[True, False, True])
    want = df.groupby("rank").head(10)[["rank", "step", "duration_ns"]]
    assert rows == [tuple(int(x) for x in r) for r in want.itertuples(index=False)]
    assert len(rows) == 10


def test_an_existing_output_is_kept_without_force(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "steps.parquet"
    out.write_bytes(b"mine")
    assert main(["export", str(run), "-o", str(out)]) == 1
    assert "already exists (use -f to overwrite)" in capsys.readouterr().err
    assert out.read_bytes() == b"mine"
    assert main(["export", str(run), "-o", str(out), "-f", "-q"]) == 0
    assert pq.read_table(out).num_rows == STEPS


def test_without_o_the_table_goes_into_the_run(tmp_path: Path) -> None:
    run = _job(tmp_path, steps=40)
    assert main(["export", str(run), "-q"]) == 0
    assert pq.read_table(run / "steps.parquet").num_rows == 40
    # A report of the run still reads its traces only.
    assert not [w for w in fastprof.read_columns(run).warnings if "parquet" in w]


def test_bad_input_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("this is not a trace")
    out = tmp_path / "o.parquet"
    assert main(["export", str(bad), "-o", str(out)]) != 0
    err = capsys.readouterr().err
    assert str(bad) in err and "byte 0" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".fastprof-export-*"))
    missing = tmp_path / "nowhere"
    assert main(["export", str(missing), "-o", str(out)]) != 0
    assert str(missing) in capsys.readouterr().err
    assert not missing.exists()
    # A trace without a Profiler's steps.
    rec = tmp_path / "rec"
    with fastprof.Recorder(out_dir=rec, run_name="r", sample_hz=0):
        with fastprof.span("work"):
            pass
    assert main(["export", str(rec / "r"), "-o", str(out)]) != 0
    assert "no fastprof step spans" in capsys.readouterr().err
    with pytest.raises(fastprof.TraceError, match=r"bad\.json"):
        fastprof.load(bad)


def test_a_cut_segment_is_read_up_to_its_last_event_and_said(tmp_path: Path) -> None:
    run = _job(tmp_path, steps=200)
    seg = run / "rank0" / "fastprof.0.json.gz"
    text = gzip.decompress(seg.read_bytes())
    cut = run / "rank0" / "fastprof.0.json.gz"
    cut.write_bytes(gzip.compress(text[: len(text) * 2 // 3]))
    with pytest.warns(fastprof.FastprofWarning, match=r"fastprof\.0\.json\.gz"):
        df = fastprof.load(run / "rank0" / "fastprof.0.json.gz")
    assert 0 < len(df) < 200


def test_without_pyarrow_the_error_says_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from fastprof.cli.main import main\n"
        f"sys.exit(main(['export', {str(tmp_path)!r}]))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "pip install 'fastprof-torch[parquet]'" in p.stderr and "Traceback" not in p.stderr


def test_a_run_in_a_store_exports_to_and_from_a_url(run: Path, s3_url: str, tmp_path: Path) -> None:
    store = open_store(f"{s3_url}/run")
    for f in sorted(run.rglob("*")):
        if f.is_file() and f.name != "steps.parquet":
            store.put(f, f.relative_to(run).as_posix())
    assert main(["export", f"{s3_url}/run", "-o", f"{s3_url}/tables/steps.parquet", "-q"]) == 0
    local = tmp_path / "local.parquet"
    assert main(["export", str(run), "-o", str(local), "-q"]) == 0
    with open_store(f"{s3_url}/tables").open("steps.parquet") as obj:
        stored = pq.read_table(pa.BufferReader(obj.read()))
    assert stored.equals(pq.read_table(local))
    pd.testing.assert_frame_equal(fastprof.load(f"{s3_url}/run"), pd.read_parquet(local))


WORKER = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    import fastprof

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(120, 8), batch_size=4)
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="job", schedule="never", merge_timeout=60)
    with prof:
        for x in prof.loader(loader):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            dist.all_reduce(torch.ones(1))
            prof.step()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_ranks_of_a_torchrun_job_are_each_their_steps(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    torchrun(tmp_path / "worker.py", str(tmp_path / "out"), cwd=tmp_path, timeout=150)
    run = tmp_path / "out" / "job"
    out = tmp_path / "steps.parquet"
    assert main(["export", str(run), "-o", str(out), "-q"]) == 0
    df = pd.read_parquet(out)
    assert sorted(df["rank"].unique().tolist()) == [0, 1]
    for rank in (0, 1):
        got = df[df["rank"] == rank]
        want = _expected(run / f"rank{rank}")
        assert got["step"].tolist() == [w["step"] for w in want] == list(range(30))
        assert got["start_ns"].tolist() == [w["start_ns"] for w in want]
        assert got["duration_ns"].tolist() == [w["duration_ns"] for w in want]
        # The all_reduce called from Python each step is the communication phase.
        assert (got["communication_ns"] > 0).all()
        assert got["communication_ns"].tolist() == [w["communication_ns"] for w in want]


@pytest.mark.parametrize("asked", [None, "mimalloc"])
def test_the_command_runs_pyarrow_on_the_c_allocators_pool_unless_told(
    run: Path, tmp_path: Path, asked: str | None
) -> None:
    """``fastprof export`` in its own process: pyarrow's buffers from the C
    allocator, which gives a written row group's back (mimalloc kept them),
    unless ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if asked:
        env["ARROW_DEFAULT_MEMORY_POOL"] = asked
    code = (
        "import sys; from fastprof.cli.main import main; rc = main(sys.argv[1:]); "
        "import pyarrow as pa; print(pa.default_memory_pool().backend_name); sys.exit(rc)"
    )
    out = tmp_path / "steps.parquet"
    r = subprocess.run(
        [sys.executable, "-c", code, "export", str(run), "-o", str(out), "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [asked or "system"], r.stdout
    assert pq.read_table(out).num_rows > 0
