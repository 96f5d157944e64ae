"""Reports (issue #11) on real CPU training runs through fastprof.Profiler:
numbers checked against the unified trace read with Python's gzip + json,
the JSON against its schema, the CSVs with Python's csv, and the CLI verbs
(report, summary, diff) in subprocesses."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import fastprof
from fastprof.cli.main import main
from fastprof.reports import SCHEMA_PATH

PYTHON = Path(fastprof.__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import sys, time, torch, fastprof
    from torch.utils.data import DataLoader, Dataset

    out, sample_sleep, step_sleep = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    steps, with_torch = int(sys.argv[4]), sys.argv[5] == "1"

    class Sleepy(Dataset):
        def __len__(self):
            return steps * 4
        def __getitem__(self, i):
            time.sleep(sample_sleep)
            return torch.randn(8), torch.randn(1)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = fastprof.Profiler(out_dir=out, run_name="run", sample_hz=50, torch=None if not with_torch else True,
                             schedule=fastprof.schedule.epoch(skip_first=2, wait=0, warmup=1, active=1))
    with prof:
        for x, y in prof.loader(DataLoader(Sleepy(), batch_size=4, num_workers=0)):
            with fastprof.span("forward"):
                loss = ((model(x) - y) ** 2).mean()
            with fastprof.span("backward"):
                loss.backward()
            with fastprof.span("optimizer_step"):
                opt.step()
                opt.zero_grad()
            if step_sleep:
                time.sleep(step_sleep)
            prof.step()
        with torch.no_grad():
            for x, _y in prof.loader(DataLoader(Sleepy(), batch_size=4), name="val"):
                with fastprof.span("validation_step"):
                    model(x)
    """
)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(PYTHON)
    return e


def train(tmp: Path, sample_sleep: float, step_sleep: float, steps: int = 10, with_torch: bool = False) -> Path:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    args = [str(tmp / "out"), str(sample_sleep), str(step_sleep), str(steps), "1" if with_torch else "0"]
    subprocess.run([sys.executable, str(script), *args], check=True, env=env(), capture_output=True, timeout=100)
    run = tmp / "out" / "run"
    assert (run / "trace.json.gz").is_file()
    return run


@pytest.fixture(scope="module")
def loader_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset that sleeps 3 ms per sample, num_workers=0, torch windows on."""
    return train(tmp_path_factory.mktemp("loader"), 0.003, 0.0, steps=10, with_torch=True)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(tmp_path_factory.mktemp("base"), 0.0, 0.0, steps=12)


@pytest.fixture(scope="module")
def slowed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base run with a 40 ms sleep in every step."""
    return train(tmp_path_factory.mktemp("slowed"), 0.0, 0.04, steps=12)


def trace_events(run: Path) -> list[dict[str, Any]]:
    with gzip.open(run / "trace.json.gz", "rt") as f:
        doc = json.load(f)
    return list(doc["traceEvents"])


def quantile(xs: list[int], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def test_time_report_matches_the_trace(loader_run: Path) -> None:
    rep = fastprof.report(loader_run, formats=())
    durs: dict[str, list[int]] = defaultdict(list)
    for e in trace_events(loader_run):
        if e.get("ph") == "X" and e.get("cat") == "user":
            durs[e["name"]].append(round(float(e["dur"]) * 1000))
    rows = {r["name"]: r for r in rep["time"]["rows"]}
    for name in ("step", "forward", "backward", "optimizer_step", "loader.train.next", "validation_step"):
        got, want = rows[name], durs[name]
        assert got["count"] == len(want), name
        assert abs(got["total_s"] * 1e9 - sum(want)) <= len(want), name
        assert abs(got["max_s"] * 1e9 - max(want)) <= 1, name
        assert abs(got["p50_s"] * 1e9 - quantile(want, 0.5)) <= 1, name
        assert abs(got["p95_s"] * 1e9 - quantile(want, 0.95)) <= 1, name
    # Concise leaves torch ops out; verbose keeps them.
    assert not any(n.startswith("aten::") for n in rows)
    verbose = fastprof.report(loader_run, formats=(), verbose=True)
    assert any(r["name"].startswith("aten::") for r in verbose["time"]["rows"])


def test_speed_excludes_warmup(loader_run: Path) -> None:
    rep = fastprof.report(loader_run, formats=())
    steps = sorted(
        (float(e["ts"]), round(float(e["dur"]) * 1000))
        for e in trace_events(loader_run)
        if e.get("ph") == "X" and e.get("name") == "step"
    )
    speed = rep["speed"]
    assert speed["warmup"]["steps_excluded"] == 2
    assert "skip_first" in speed["warmup"]["source"]
    kept = [d for _ts, d in steps[2:]]
    r0 = speed["train"]["per_rank"][0]
    assert r0["steps"] == len(steps) and r0["steps_measured"] == len(kept)
    assert r0["iterations_per_s"] == pytest.approx(len(kept) / (sum(kept) / 1e9), rel=1e-9)
    assert speed["step_time"]["max_s"] * 1e9 == pytest.approx(max(kept), abs=1)
    # The Profiler records the DataLoader's batch size; samples/s follow from it.
    assert speed["batch_size"]["value"] == 4 and "loader.train.batch_size" in speed["batch_size"]["source"]
    assert speed["train"]["samples_per_s"] == pytest.approx(4 * speed["train"]["iterations_per_s"])
    with_bs = fastprof.report(loader_run, formats=(), batch_size=4, warmup_steps=0)
    assert with_bs["speed"]["warmup"]["steps_excluded"] == 0
    assert with_bs["speed"]["train"]["samples_per_s"] == pytest.approx(
        4 * with_bs["speed"]["train"]["iterations_per_s"]
    )
    assert [v["batches"] for v in speed["validation"]] == [10]


def test_dataloader_recommendation_quotes_the_share(loader_run: Path, tmp_path: Path) -> None:
    rep = fastprof.report(loader_run, out_dir=tmp_path, formats=("csv",))
    share = rep["speed"]["train"]["per_rank"][0]["loader_share_pct"]
    assert share > 50.0  # 12 ms of sleep per batch against a tiny linear model
    # The rule takes the every-step anatomy's DataLoader share (issue #36,
    # item 3: one story), not the torch windows' breakdown of a few steps:
    # computed here again from the trace's step and loader spans.
    events = trace_events(loader_run)
    skip = rep["speed"]["warmup"]["steps_excluded"]
    steps = sorted((e for e in events if e.get("ph") == "X" and e["name"] == "step"), key=lambda e: e["ts"])[skip:]
    waits = [e for e in events if e.get("ph") == "X" and e["name"] == "loader.train.next"]
    inside = [
        min(w["ts"] + w["dur"], s["ts"] + s["dur"]) - w["ts"]
        for w in waits
        for s in steps
        if s["ts"] <= w["ts"] < s["ts"] + s["dur"]
    ]
    expected = 100 * sum(inside) / sum(s["dur"] for s in steps)
    assert expected > 50.0
    fired = [r for r in rep.recommendations if r["rule"] == "dataloader"]
    assert fired and fired[0]["measured"] == pytest.approx(expected, abs=0.1)
    assert f"{fired[0]['measured']:.1f}%" in fired[0]["message"] and "workers" in fired[0]["message"]
    assert f"step anatomy, every step: {len(steps)} steps" in fired[0]["message"]
    gpu = rep["system"]["gpu"]
    assert gpu["available"] is False and gpu["reason"].startswith("no GPU")


def test_json_validates_and_csv_parses(loader_run: Path, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    rep = fastprof.report(loader_run, out_dir=tmp_path)
    doc = json.loads((tmp_path / "report.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc == json.loads(rep.to_json())
    csvs = sorted(p for p in rep.files if p.suffix == ".csv")
    assert {p.name for p in csvs} >= {"time.csv", "speed.csv", "loaders.csv", "host.csv", "recommendations.csv"}
    for p in csvs:
        with open(p, newline="") as f:
            rows = list(csv.DictReader(f))
        if p.name == "time.csv":
            assert {r["name"] for r in rows} >= {"step", "forward"}
            assert all(float(r["total_s"]) >= 0 for r in rows)


def test_default_out_dir_and_single_trace(base_run: Path) -> None:
    rep = fastprof.report(base_run)
    assert (base_run / "reports" / "report.json") in rep.files
    seg = next((base_run / "rank0").glob("fastprof.*.json.gz"))
    alone = fastprof.report(seg, formats=())
    assert alone["speed"]["train"]["per_rank"][0]["steps"] == rep["speed"]["train"]["per_rank"][0]["steps"]
    assert alone["system"]["overhead"][0]["drops"] == 0


def test_run_dir_without_unified_trace(loader_run: Path, tmp_path: Path) -> None:
    """A run whose merge never ran (segments, torch windows and profiler.json
    per rank): profiler.json is fastprof's own file, skipped by the core's
    input walker without a warning (nothing is wrong), not fed to the breakdown."""
    run = tmp_path / "run"
    shutil.copytree(loader_run / "rank0", run / "rank0")
    rep = fastprof.report(run, formats=())
    unified = fastprof.report(loader_run, formats=())
    assert not any("profiler.json" in w for w in rep["source"]["warnings"]), rep["source"]["warnings"]
    assert all(Path(f["path"]).name != "profiler.json" for f in rep["source"]["inputs"]), rep["source"]["inputs"]
    assert rep["speed"]["train"]["per_rank"][0]["steps"] == unified["speed"]["train"]["per_rank"][0]["steps"]
    assert rep["breakdown"] is not None and rep["breakdown"]["step_count"] == unified["breakdown"]["step_count"]


def test_summary_prints_in_a_subprocess(base_run: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "fastprof", "summary", str(base_run)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "Time (seconds)" in p.stdout and "train iterations/s" in p.stdout and "step" in p.stdout


def test_diff_exit_codes(base_run: Path, slowed_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(base_run), str(base_run)]) == 0
    assert main(["diff", str(base_run), str(slowed_run), "--max-slowdown", "10%"]) == 1
    assert "threshold crossed" in capsys.readouterr().out
    assert main(["diff", str(slowed_run), str(base_run), "--max-slowdown", "10%"]) == 0
    fastprof.report(base_run)
    p = subprocess.run(
        [sys.executable, "-m", "fastprof", "diff", str(base_run / "reports" / "report.json"), str(slowed_run)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1, p.stderr


def test_bad_input_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["report", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0] and "no such file" in err[0]
    junk = tmp_path / "junk.json"
    junk.write_text("this is not a trace")
    assert main(["summary", str(junk)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(junk) in err[0]
    assert main(["diff", str(junk), str(missing)]) == 2
    assert main(["diff", str(missing), str(missing), "--max-slowdown", "ten"]) == 2
    with pytest.raises(fastprof.ConfigError, match="formats"):
        fastprof.report(tmp_path, formats=("html5",))


def test_the_cli_names_only_the_tables_it_did_not_write(
    loader_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # breakdown.csv comes from the breakdown's columns (report v2), not from
    # the document: it was written and must not be listed as "not written".
    out = tmp_path / "rep"
    assert main(["report", str(loader_run), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    with open(out / "breakdown.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) > 0
    not_written = [line for line in printed.splitlines() if line.startswith("no rows, so not written")]
    for csv_file in out.glob("*.csv"):
        assert all(csv_file.name not in line for line in not_written), (csv_file.name, not_written)


def test_torch_window_ops_are_read_as_totals_and_the_report_is_the_same(loader_run: Path) -> None:
    """A report reads a torch window's ops and kernels as totals per (rank,
    name, category) and every ProfilerStep#N under one name (a million-step
    run's rows and names were most of its memory): the totals are the
    trace's, and the report is the one every row gives."""
    from fastprof.reports import data as report_data
    from fastprof.reports.html import top_events
    from fastprof.reports.report import build_from

    folded = report_data.load(loader_run)
    every = report_data.load(loader_run, fold=False)
    assert len(folded.cols.spans["ts"]) < len(every.cols.spans["ts"])
    names = folded.cols.names
    assert "ProfilerStep#*" in names and not any(n.startswith("ProfilerStep#") and n[-1].isdigit() for n in names)
    # The folded totals against the trace, read with Python's json.
    want: dict[tuple[str, str], list[int]] = defaultdict(list)
    for e in trace_events(loader_run):
        if e.get("ph") == "X" and e.get("cat") in report_data.KINETO_CATEGORIES:
            if not e["name"].startswith("ProfilerStep#"):
                want[(e["cat"], e["name"])].append(round(float(e["dur"]) * 1000))
    f = folded.cols.folded
    got: dict[tuple[str, str], tuple[int, int, int]] = {}
    for i in range(len(f["name"])):
        key = (folded.cols.categories[int(f["cat"][i])], names[int(f["name"][i])])
        got[key] = (int(f["count"][i]), int(f["total_ns"][i]), int(f["max_ns"][i]))
    assert any(k[0] == "cpu_op" for k in want) and set(got) == set(want)
    for key, durs in want.items():
        count, total, mx = got[key]
        assert count == len(durs) and abs(total - sum(durs)) <= len(durs) and abs(mx - max(durs)) <= 1, key
    a, b = build_from(folded), build_from(every)
    for section in ("time", "speed", "system", "ranks", "wall", "breakdown", "recommendations"):
        assert a[section] == b[section], section
    for cats in ({"cpu_op"}, {"kernel", "gpu_memcpy", "gpu_memset"}):
        assert top_events(folded, cats) == top_events(every, cats)
    assert top_events(folded, {"cpu_op"})


def test_breakdown_csv_is_written_as_the_rows_are_computed(loader_run: Path, tmp_path: Path) -> None:
    """breakdown.csv holds a row per step, equal to the breakdown's rows,
    while the report keeps only per-rank summaries; a report without CSV
    writes none, and report.json's breakdown section is the same either way."""
    from fastprof.reports.breakdown import ROLES, step_breakdown

    rep = fastprof.report(loader_run, out_dir=tmp_path / "all")
    with open(tmp_path / "all" / "breakdown.csv", newline="") as f:
        got = list(csv.DictReader(f))
    rows = step_breakdown(loader_run / "trace.json.gz").rows()
    assert len(got) == len(rows) == rep["breakdown"]["step_count"] > 0
    for g, r in zip(got, rows, strict=True):
        assert (int(g["step"]), int(g["rank"]), g["source"]) == (r["step"], r["rank"], r["source"])
        assert int(g["duration_ns"]) == r["duration_ns"] == sum(int(g[k]) for k in ROLES)
    only_json = fastprof.report(loader_run, out_dir=tmp_path / "json", formats=("json",))
    # JSON only: report.json and the JSON beside it (the operator tables: the last window's, and each window's).
    per_window = [f for w in only_json["memory"]["operators"]["windows"] for f in w["files"] if f.endswith(".json")]
    assert per_window
    assert sorted(p.name for p in (tmp_path / "json").iterdir()) == sorted(
        ["operators.json", "report.json", *per_window]
    )
    assert only_json["breakdown"] == rep["breakdown"]
    assert not list(tmp_path.glob(".*tmp-*")), "a staging folder was left behind"


def test_the_report_carries_the_last_window_s_operator_table(loader_run: Path, tmp_path: Path) -> None:
    """The memory section reads the last saved torch window with
    fastprof.memory.operator_table (its trace, not torch's printed table),
    says the window lacked profile_memory, and writes operators.json/.csv."""
    jsonschema = pytest.importorskip("jsonschema")
    rep = fastprof.report(loader_run, out_dir=tmp_path)
    ops = rep["memory"]["operators"]
    windows = json.loads((loader_run / "rank0" / "profiler.json").read_text())["torch"]["windows"]
    assert ops["window"] == [w for w in windows if w["saved"]][-1]["path"]
    assert ops["memory_recorded"] is False and "profile_memory=True" in ops["note"]
    assert ops["top_self_cpu_memory"] and all(r["count"] >= 1 for r in ops["top_self_cpu_memory"])
    assert json.loads((tmp_path / "operators.json").read_text())["memory_recorded"] is False
    with open(tmp_path / "operators.csv", newline="") as f:
        assert list(csv.DictReader(f))
    # One table per window (every saved one), each as operator_table reads that window.
    from fastprof.memory import operator_table

    saved = [w for w in windows if w["saved"]]
    assert [w["window"] for w in ops["windows"]] == [w["path"] for w in saved] and len(saved) >= 2
    for w, win in zip(ops["windows"], saved, strict=True):
        assert (w["rank"], w["first_step"], w["last_step"]) == (0, win["first_step"], win["last_step"])
        stem = "operators.rank0." + Path(win["path"]).name.removesuffix(".pt.trace.json.gz")
        assert w["files"] == [f"{stem}.json", f"{stem}.csv"] and w["reason"] is None
        assert json.loads((tmp_path / f"{stem}.json").read_text()) == operator_table(win["path"], top=10).to_dict()
        with open(tmp_path / f"{stem}.csv", newline="") as f:
            assert list(csv.DictReader(f))
    # The last window's table is also operators.json, and report.json stays small: its top rows only.
    assert json.loads((tmp_path / "operators.json").read_text()) == json.loads(
        (tmp_path / f"{ops['windows'][-1]['files'][0]}").read_text()
    )
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads((tmp_path / "report.json").read_text()))
    # Reported again into the same folder: a table of a window this report
    # has none for (here a made-up one) is stale and goes; the user's other
    # files, and this report's tables, stay.
    (tmp_path / "operators.rank0.ep9-ba999.json").write_text("{}")
    (tmp_path / "operators.rank1.ep0-ba1.csv").write_text("x\n")
    (tmp_path / "notes.txt").write_text("mine")
    fastprof.report(loader_run, out_dir=tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("operators."))
    assert left == sorted(["operators.json", "operators.csv", *(f for w in ops["windows"] for f in w["files"])])
    assert (tmp_path / "notes.txt").read_text() == "mine"
