"""Leak and growth detection (issue #16): a loop that keeps a tensor every
step fires, a steady one stays quiet, and where the growth began is found;
the slope against a plain all-pairs Theil-Sen."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from fastprof.memory.leaks import growth, theil_sen

pytest.importorskip("torch")
MIB = 1 << 20

TRAIN = """
import sys, time, torch, fastprof
out, steps, leak_from = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kept = []
prof = fastprof.Profiler(out_dir=out, run_name="run", torch=False, sample_hz=0)
with prof:
    for i in prof.loader(range(steps)):
        t = torch.ones(2 * 256 * 1024)  # 2 MiB, written
        if 0 <= leak_from <= i:
            kept.append(t)  # the classic leak: a tensor kept across steps
        del t  # freed before the next step's (glibc then reuses it: RSS steady)
        time.sleep(0.002)  # a training step's length: each step gets its own RSS reading (the core's budget)
        prof.step()
"""


def _run(tmp: Path, steps: int, leak_from: int) -> dict[str, Any]:
    subprocess.run(
        [sys.executable, "-c", TRAIN, str(tmp), str(steps), str(leak_from)],
        check=True,
        capture_output=True,
        timeout=120,
        env=dict(os.environ),
    )
    rep = fastprof.report(tmp / "run", out_dir=tmp / "reports", formats=("json",))
    doc = json.loads((tmp / "reports" / "report.json").read_text())
    assert doc == json.loads(rep.to_json())
    return doc


def _memory_check(doc: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in doc["recommendations"]["checks"] if c["rule"] == "memory_growth")


def test_a_loop_that_keeps_a_tensor_every_step_fires(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = _run(tmp_path, 40, leak_from=0)
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    (r,) = doc["memory"]["per_rank"]
    assert r["series"] == "mem.rss [B]" and r["leak"] is True
    assert r["growth_b_per_step"] == pytest.approx(2 * MIB, rel=0.05)
    lo, hi = r["growth_ci_b_per_step"]
    assert 0 < lo <= r["growth_b_per_step"] <= hi
    assert r["began_at_step"] <= r["warmup_steps_excluded"] + 2
    check = _memory_check(doc)
    assert check["status"] == "fired" and check in doc["recommendations"]["items"]
    assert "mem.rss [B] grows 2.00 MiB per step on rank 0" in check["message"]
    # The page draws the series and says where the growth began.
    fastprof.report(tmp_path / "run", out_dir=tmp_path / "page", formats=("html",))
    html = (tmp_path / "page" / "report.html").read_text()
    section = html.split('<section id="memory">', 1)[1].split("</section>", 1)[0]
    assert "Memory at each step" in section and "2.0 MiB per step" in section
    assert f"from step {r['began_at_step']} (dashed line)" in section


def test_a_steady_loop_stays_quiet(tmp_path: Path) -> None:
    doc = _run(tmp_path, 40, leak_from=-1)
    (r,) = doc["memory"]["per_rank"]
    assert r["leak"] is False and r["began_at_step"] is None
    assert abs(r["growth_b_per_step"]) < 64 * 1024
    assert _memory_check(doc)["status"] == "ok"
    assert not any(i["rule"] == "memory_growth" for i in doc["recommendations"]["items"])


def test_where_the_growth_began_is_found(tmp_path: Path) -> None:
    doc = _run(tmp_path, 60, leak_from=30)
    (r,) = doc["memory"]["per_rank"]
    assert r["leak"] is True and 28 <= r["began_at_step"] <= 32, r


def test_a_report_without_per_step_statistics_says_why(tmp_path: Path) -> None:
    rec = fastprof.start(tmp_path, "plain", sample_hz=0)
    with fastprof.span("step"):
        pass
    rec.stop()
    doc = fastprof.report(rec.run_dir, formats=()).data
    assert doc["memory"] is None and "memory_stats" in doc["memory_reason"]
    assert _memory_check(doc)["status"] == "not_evaluated"


def test_theil_sen_against_all_pairs_and_its_interval() -> None:
    rng = np.random.default_rng(7)
    x = np.arange(60, dtype=np.float64)
    y = 3.0 * x + rng.normal(0, 5, 60)
    y[[10, 40]] += 500  # outliers a least-squares fit would follow
    slope, lo, hi = theil_sen(x, y)
    pairs = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(60) for j in range(i + 1, 60)]
    assert slope == pytest.approx(statistics.median(pairs))
    assert lo < slope < hi and abs(slope - 3.0) < 0.5
    # Flat with noise: the interval holds zero, no leak.
    flat = growth(1e9 + rng.normal(0, 1e5, 200))
    assert flat["leak"] is False and flat["growth_ci_b_per_step"][0] <= 0 <= flat["growth_ci_b_per_step"][1]
    # Too short to judge.
    assert growth([1.0] * 5)["verdict"].startswith("too few steps")


def test_diff_compares_the_cuda_allocator_peak_when_both_reports_have_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fastprof diff --max-memory-growth` compares the steadiest figure both
    reports have and names it: the CUDA allocator's peak (per-step
    statistics), else the GPU memory in use, else the process's RSS."""
    from fastprof.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")  # one line per row in the table
    doc = _run(tmp_path, 12, leak_from=-1)
    assert doc["memory"]["per_rank"][0]["cuda_allocated_peak_b"] is None  # no CUDA here
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(doc))
    new.write_text(json.dumps(doc))
    assert main(["diff", str(base), str(new), "--max-memory-growth", "25%"]) == 0
    out = capsys.readouterr().out
    assert "process RSS, peak (B)" in out and "CUDA allocated" not in out
    # Both with the allocator's peak (as a CUDA run writes it): that one, 1 GiB -> 1.5 GiB.
    for path, peak in ((base, 2**30), (new, 1.5 * 2**30)):
        d = json.loads(path.read_text())
        d["memory"]["per_rank"][0]["cuda_allocated_peak_b"] = peak
        path.write_text(json.dumps(d))
    assert main(["diff", str(base), str(new), "--max-memory-growth", "25%"]) == 1
    out = capsys.readouterr().out
    assert "CUDA allocated, peak (B)" in out and "process RSS, peak" not in out
    # Only one of them has it: the figure both have.
    d = json.loads(base.read_text())
    d["memory"]["per_rank"][0]["cuda_allocated_peak_b"] = None
    base.write_text(json.dumps(d))
    assert main(["diff", str(base), str(new), "--max-memory-growth", "25%"]) == 0
    assert "process RSS, peak (B)" in capsys.readouterr().out


def test_the_profilers_own_windows_are_not_judged_as_a_leak() -> None:
    """A torch.profiler window's steps (and the step after, its export)
    are cut out and the rest stitched: jumps there neither fire on a flat
    series nor hide a real leak, and the growth's start maps back to the
    run's step numbers."""
    rng = np.random.default_rng(3)
    steps = 60
    windows = {s for first in (5, 20, 35) for s in range(first, first + 4)}
    jumps = np.zeros(steps)
    for first in (5, 20, 35):
        jumps[first + 1] = 100 * MIB  # the window's buffers, kept
    flat = 800 * MIB + np.cumsum(jumps) + rng.normal(0, 64 * 1024, steps)
    whole = growth(flat)  # judged whole, the windows look like growth (that ended at the last window)
    assert whole["leak"] is True or whole["ended_at_step"] is not None, whole
    quiet = growth(flat, 0, windows)
    assert quiet["leak"] is False and quiet["ended_at_step"] is None, quiet
    assert quiet["steps"] == steps and quiet["steps_judged"] == steps - len(windows)
    r = growth(flat + 2 * MIB * np.arange(steps), 0, windows)
    assert r["leak"] is True and r["growth_b_per_step"] == pytest.approx(2 * MIB, rel=0.05)
    late = growth(flat + 2 * MIB * np.maximum(0, np.arange(steps) - 26), 0, windows)
    assert late["leak"] is True and 24 <= late["began_at_step"] <= 28, late
    # Mostly windows: too few steps left to judge, and said so.
    short = growth(flat[:10], 0, windows)
    assert short["leak"] is False and short["verdict"].startswith("too few steps outside the profiler's windows")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU demo, 32 steps: four torch.profiler windows, 15 steps judged."""
    tmp = tmp_path_factory.mktemp("demo")
    subprocess.run(
        [sys.executable, "-m", "fastprof", "demo", "-o", str(tmp), "--run-name", "d", "--steps", "32", "-q"],
        check=True,
        capture_output=True,
        timeout=280,
    )
    return tmp / "d"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_with_torch_windows_does_not_fire(demo: Path, tmp_path: Path) -> None:
    """The CPU demo: torch.profiler windows grow RSS by hundreds of MB,
    which is the profiler's, not the job's."""
    doc = fastprof.report(demo, out_dir=tmp_path / "reports", formats=("json",)).data
    (r,) = doc["memory"]["per_rank"]
    assert r["series"] == "mem.rss [B]" and r["window_steps_excluded"] > 0
    # The raw series does grow across the windows (what fired before)...
    from fastprof.reports.data import load

    _, values = load(demo).counter("mem.rss [B]", 0)
    skip = r["warmup_steps_excluded"]
    whole = growth(values[skip:], skip)
    assert whole["leak"] is True or whole["ended_at_step"] is not None, whole
    # ... and the judgement leaves the windows out.
    assert r["leak"] is False and r["ended_at_step"] is None, r
    assert r["steps_judged"] >= 8, r  # judged, not "too few steps"
    check = _memory_check(doc)
    assert check["status"] == "ok" and "rank 0" in check["message"], check
    assert not any(i["rule"] == "memory_growth" for i in doc["recommendations"]["items"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_segment_gets_the_verdict_of_its_run_directory(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fastprof summary <run>/rank0/fastprof.0.json.gz` (the form its --help
    shows) judges as the run directory does: it reads its recording's
    profiler.json beside it for the steps the torch windows took. Moved
    away alone, it says that it cannot judge, and why."""
    from fastprof.cli.main import main

    seg = demo / "rank0" / "fastprof.0.json.gz"
    whole = fastprof.report(demo, formats=()).data
    alone = fastprof.report(seg, formats=()).data
    keys = ("series", "warmup_steps_excluded", "window_steps_excluded", "steps_judged", "leak", "verdict")
    (w,), (a,) = whole["memory"]["per_rank"], alone["memory"]["per_rank"]
    assert {k: a[k] for k in keys} == {k: w[k] for k in keys}, (a, w)
    assert a["growth_b_per_step"] == pytest.approx(w["growth_b_per_step"])
    assert _memory_check(alone) == _memory_check(whole)
    said = {}
    for path in (demo, seg):
        assert main(["summary", str(path)]) == 0
        out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
        said[path] = out[out.index("Memory, rank 0") :].split(" Recommendations", 1)[0]
    assert said[seg] == said[demo], said
    # Alone, without its recording's profiler.json: not judged, and said so.
    lone = tmp_path / "lone" / seg.name
    lone.parent.mkdir()
    shutil.copyfile(seg, lone)
    doc = fastprof.report(lone, formats=()).data
    (r,) = doc["memory"]["per_rank"]
    assert r["leak"] is False and r["growth_b_per_step"] is None, r
    assert r["verdict"].startswith("not judged: a segment alone does not say which steps"), r
    check = _memory_check(doc)
    assert check["status"] == "not_evaluated" and "profiler.json" in check["message"], check
    assert main(["summary", str(lone)]) == 0
    assert "not judged: a segment alone" in " ".join(capsys.readouterr().out.split())


# Per-step RSS of a real process: a Profiler loop that keeps (or drops) 1 MiB
# bytearrays, written so that they are resident. Each step lasts at least a
# millisecond, as a training step does: an empty step (microseconds) would
# share its reading with the steps around it.
KEEPER = """
import random, sys, time, fastprof
out, name, steps, keep_from, keep_to = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
MIB = 1 << 20
kept = []
rng = random.Random(7)
prof = fastprof.Profiler(out_dir=out, run_name=name, torch=False, sample_hz=0)
with prof:
    for i in prof.loader(range(steps)):
        if keep_from <= i < keep_to:
            kept.append(bytearray(b"\\x01") * MIB)
        if name == "noise":  # 0.25 to 4 MiB made and dropped each step
            tmp = bytearray(b"\\x02") * rng.randrange(MIB // 4, 4 * MIB)
            del tmp
        time.sleep(0.001)
        prof.step()
"""
STEPS = 200
#: run name -> the steps that keep 1 MiB each ([from, to)).
KEEPERS = {
    "fill25": (0, 50),
    "fill50": (0, 100),
    "fill75": (0, 150),
    "leak": (0, STEPS),
    "late_leak": (150, STEPS),
    "noise": (0, 0),
}


@pytest.fixture(scope="module")
def keepers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each class's report.json, the six jobs run side by side."""
    tmp = tmp_path_factory.mktemp("keepers")
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", KEEPER, str(tmp), name, str(STEPS), str(a), str(b)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name, (a, b) in KEEPERS.items()
    ]
    for job in jobs:
        _, err = job.communicate(timeout=180)
        assert job.returncode == 0, err.decode(errors="replace")
    docs = {}
    for name in KEEPERS:
        fastprof.report(tmp / name, out_dir=tmp / name / "reports", formats=("json",))
        docs[name] = json.loads((tmp / name / "reports" / "report.json").read_text())
    return docs


@pytest.mark.parametrize("name", ["fill25", "fill50", "fill75"])
def test_a_fill_that_ended_is_not_a_leak(keepers: dict[str, dict[str, Any]], name: str) -> None:
    """A cache filled by the first 25/50/75% of the steps, then kept: it grew
    until the step it was full, and is flat since; no recommendation."""
    doc = keepers[name]
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    (r,) = doc["memory"]["per_rank"]
    full = KEEPERS[name][1] - 1  # the step whose end holds the last MiB
    assert r["series"] == "mem.rss [B]" and r["leak"] is False, r
    assert full - 3 <= r["ended_at_step"] <= full + 3, r
    assert r["verdict"].startswith(f"grew until step {r['ended_at_step']}, flat since"), r
    check = _memory_check(doc)
    assert check["status"] == "ok" and "flat since" in check["message"], check
    assert not any(i["rule"] == "memory_growth" for i in doc["recommendations"]["items"])


def test_a_steady_leak_and_a_late_one_fire(keepers: dict[str, dict[str, Any]]) -> None:
    """1 MiB kept every step fires from the start; kept from 75% of the run on
    (most pairs of steps then differ by nothing), it fires from there."""
    for name, began in (("leak", (0, 3)), ("late_leak", (147, 153))):
        doc = keepers[name]
        (r,) = doc["memory"]["per_rank"]
        assert r["leak"] is True and r["ended_at_step"] is None, (name, r)
        assert began[0] <= r["began_at_step"] <= began[1], (name, r)
        check = _memory_check(doc)
        assert check["status"] == "fired" and check in doc["recommendations"]["items"], (name, check)
        assert f"from step {r['began_at_step']}" in check["message"]
    (r,) = keepers["leak"]["memory"]["per_rank"]
    assert r["growth_b_per_step"] == pytest.approx(MIB, rel=0.05)


def test_noise_alone_is_steady(keepers: dict[str, dict[str, Any]]) -> None:
    doc = keepers["noise"]
    (r,) = doc["memory"]["per_rank"]
    assert r["leak"] is False and r["ended_at_step"] is None and r["began_at_step"] is None, r
    assert _memory_check(doc)["status"] == "ok"


def test_the_growth_classes_by_hand() -> None:
    """The same classes as numbers (0.52 MiB a step, the issue's cache), and
    what is neither: a one-time saw of the working set, a fill in the middle."""
    rng = np.random.default_rng(11)
    i = np.arange(STEPS)
    base = 400 * MIB + rng.normal(0, 100 * 1024, STEPS)
    for end in (50, 100, 150):
        g = growth(base + 0.52 * MIB * np.minimum(i, end))
        assert g["leak"] is False and abs(g["ended_at_step"] - end) <= 3, g
        assert g["verdict"].startswith(f"grew until step {g['ended_at_step']}, flat since")
    mid = growth(base + MIB * np.clip(i - 60, 0, 60), 1)  # steps 61..120 grow
    assert mid["leak"] is False and 118 <= mid["ended_at_step"] <= 124 and 58 <= mid["began_at_step"] <= 64, mid
    late = growth(base + MIB * np.maximum(0, i - 170), 1)
    assert late["leak"] is True and 168 <= late["began_at_step"] <= 174, late
    saw = growth(base + 2 * MIB * (i % 30))
    assert saw["leak"] is False and saw["ended_at_step"] is None, saw
    # Ended too near the end to tell from a pause: still judged on the whole run.
    assert growth(base + MIB * np.minimum(i, 195))["leak"] is True


def test_readings_shared_by_short_steps_are_judged_per_step() -> None:
    """Short steps share a resident-memory reading (the core reads it within
    a budget), so a reading's step number is given: the slope stays per
    step and the steps named are the run's, windows left out as before."""
    rng = np.random.default_rng(5)
    i = np.arange(STEPS)
    every = 7
    at = i[::every]
    base = 400 * MIB + rng.normal(0, 100 * 1024, STEPS)
    leak = base + 2 * MIB * np.maximum(0, i - 100)
    full, sparse = growth(leak), growth(leak[at], steps=at)
    assert sparse["leak"] is True and sparse["steps"] == len(at)
    assert sparse["growth_b_per_step"] == pytest.approx(full["growth_b_per_step"], rel=0.1)
    assert abs(sparse["began_at_step"] - 100) <= every and sparse["began_at_step"] % every == 0
    fill = base + 0.52 * MIB * np.minimum(i, 120)
    g = growth(fill[at], steps=at)
    assert g["leak"] is False and abs(g["ended_at_step"] - 120) <= every, g
    # Windows: the excluded steps do not count in the per-step slope.
    windows = {s for first in (30, 60) for s in range(first, first + 10)}
    steady = base + MIB * np.arange(STEPS)
    w = growth(steady[at], excluded=windows, steps=at)
    assert w["growth_b_per_step"] == pytest.approx(MIB, rel=0.1), w
    with pytest.raises(ValueError, match="readings"):
        growth(leak[:3], steps=at)
