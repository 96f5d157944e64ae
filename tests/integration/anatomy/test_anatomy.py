"""Always-on step anatomy (issue #25, host part): every step split into
dataloader, forward, backward, optimizer, communication and other from the
phase spans the Profiler records on the training thread, with no
torch.profiler window. Real torch on CPU, real subprocesses; report.json is
read with Python's json and checked against its JSON Schema."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from fastprof.recording.names import BACKWARD_GRADS_SPAN

torch = pytest.importorskip("torch")

PHASES = ["dataloader", "forward", "backward", "optimizer", "communication", "other"]

# An unmodified CPU MLP: its loss is a module (so the forward hook sees it).
MLP = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
loss_fn = torch.nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(1536, 64), torch.randint(0, 10, (1536,)))
loader = torch.utils.data.DataLoader(data, batch_size=64)
for epoch in range(2):
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
print("finished", flush=True)
"""


def _report(run_dir: Path, tmp: Path) -> dict[str, Any]:
    jsonschema = pytest.importorskip("jsonschema")
    fastprof.report(run_dir, out_dir=tmp / "rep", formats=("json",))
    doc = json.loads((tmp / "rep" / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(fastprof.reports.SCHEMA_PATH.read_text())).validate(doc)
    return doc


def _spans(trace: Path) -> dict[str, list[dict[str, Any]]]:
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    out: dict[str, list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            out.setdefault(e["name"], []).append(e)
    return out


def _check_shares(anatomy: dict[str, Any]) -> dict[str, float]:
    (r,) = anatomy["per_rank"]
    assert list(r["phases"]) == PHASES
    shares = {p: r["phases"][p]["share"] for p in PHASES}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
    # The phases' times add up to the steps' time within 1%.
    total = sum(r["phases"][p]["total_ns"] for p in PHASES)
    assert total == pytest.approx(r["step_total_ns"], rel=0.01)
    return shares


def test_an_unmodified_mlp_under_fastprof_run_is_mostly_its_four_phases(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(MLP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-m", "fastprof", "run", "-o", str(tmp_path), "--run-name", "mlp", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "mlp"
    status = json.loads((run / "rank0" / "profiler.json").read_text())["anatomy"]
    assert "on: forward" in status
    if not torch.cuda.is_available():
        # No GPU here: the GPU part says so rather than being silently absent.
        assert "GPU phase times: unavailable: no CUDA device" in status, status
    doc = _report(run, tmp_path)
    shares = _check_shares(doc["anatomy"])
    named = shares["dataloader"] + shares["forward"] + shares["backward"] + shares["optimizer"]
    assert named >= 0.8, shares
    assert min(shares["forward"], shares["backward"], shares["optimizer"]) > 0, shares
    assert shares["communication"] == 0
    assert doc["anatomy_reason"] is None


JOB = """
import sys, torch, fastprof
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.randn(256, 32), batch_size=16)
prof = fastprof.Profiler(sys.argv[1], "run", torch=False, sample_hz=0, **eval(sys.argv[2]))
with prof:
    for i, x in enumerate(prof.loader(loader)):
        if sys.argv[3] == "user":
            with fastprof.span("forward"):
                loss = model(x).sum()
            with fastprof.span("backward"):
                loss.backward()
            with fastprof.span("optimizer"):
                opt.step(); opt.zero_grad()
        else:
            loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
        prof.step()
"""


def _job(tmp: Path, options: str, mode: str = "plain", env: dict[str, str] | None = None) -> Path:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp), options, mode],
        capture_output=True,
        text=True,
        timeout=180,
        env={**e, **(env or {})},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp / "run"


def test_each_step_has_one_forward_backward_and_optimizer_span_inside_it(tmp_path: Path) -> None:
    run = _job(tmp_path, "{}")
    spans = _spans(run / "trace.json.gz")
    steps = sorted(spans["step"], key=lambda e: e["ts"])
    assert len(steps) == 16
    for phase in ("phase.forward", "phase.backward"):
        assert len(spans[phase]) == 16, phase
    # opt.step() and opt.zero_grad(): two optimizer spans a step.
    assert len(spans["phase.optimizer"]) == 32
    # One rank: no gradients-ready mark (it serves the straggler analysis only).
    assert not spans.get(BACKWARD_GRADS_SPAN), spans.get(BACKWARD_GRADS_SPAN)
    tid = steps[0]["tid"]
    starts = np.array([s["ts"] for s in steps])
    for name in ("phase.forward", "phase.backward", "phase.optimizer"):
        for e in spans[name]:
            assert e["tid"] == tid  # the training thread's timeline
            k = int(np.searchsorted(starts, e["ts"], side="right")) - 1
            assert k >= 0 and e["ts"] + e["dur"] <= steps[k]["ts"] + steps[k]["dur"] + 1, (name, e)
    _check_shares(_report(run, tmp_path)["anatomy"])


def test_off_by_option_and_environment_and_said(tmp_path: Path) -> None:
    for sub, run in (
        ("a", _job(tmp_path / "a", "{'anatomy': False}")),
        ("b", _job(tmp_path / "b", "{}", env={"FASTPROF_ANATOMY": "0"})),
    ):
        assert not any(n.startswith("phase.") for n in _spans(run / "trace.json.gz")), sub
        assert json.loads((run / "rank0" / "profiler.json").read_text())["anatomy"] == "off (anatomy=False)"
        doc = _report(run, tmp_path / sub)
        assert doc["anatomy"] is None and "anatomy=False" in doc["anatomy_reason"]


def test_the_users_own_phase_spans_count_where_fastprof_recorded_none(tmp_path: Path) -> None:
    run = _job(tmp_path, "{'anatomy': False}", mode="user")
    shares = _check_shares(_report(run, tmp_path)["anatomy"])
    assert min(shares["forward"], shares["backward"], shares["optimizer"]) > 0, shares


def test_hooks_go_at_stop_and_an_exception_in_forward_still_closes_its_span(tmp_path: Path) -> None:
    from torch.nn.modules import module as m

    before = (torch.Tensor.backward, torch.autograd.backward, torch.optim.Optimizer.zero_grad)
    hooks = (len(m._global_forward_pre_hooks), len(m._global_forward_hooks))

    class Boom(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Boom())
    prof = fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0)
    with pytest.raises(ValueError, match="boom"), prof:
        for _ in prof.loader(range(3)):
            model(torch.ones(2, 4))
    assert (torch.Tensor.backward, torch.autograd.backward, torch.optim.Optimizer.zero_grad) == before
    assert (len(m._global_forward_pre_hooks), len(m._global_forward_hooks)) == hooks
    assert not any(len(x._forward_pre_hooks) or len(x._forward_hooks) for x in model.modules())
    cols = fastprof.read_columns(prof.trace_path, kinds=["spans"], names=["phase.forward"])
    assert len(cols.spans["ts"]) == 1  # the failed call, closed by the always-called hook


COMM = """
import os, sys, torch, torch.distributed as dist, fastprof
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
prof = fastprof.Profiler(sys.argv[1], "run", torch=False, sample_hz=0, sync_clocks=False)
with prof:
    for x in prof.loader([torch.ones(256)] * 4):
        dist.all_reduce(x)
        dist.barrier()
        work = dist.all_reduce(x, async_op=True)  # returns at once: the host waits in wait()
        work.wait()
        prof.step()
dist.destroy_process_group()
"""


def test_after_the_first_optimizer_step_only_the_outermost_modules_keep_hooks_and_copies_work(tmp_path: Path) -> None:
    """Global module hooks cost every module call; once the first optimizer
    step settled which modules are called at depth 0 (the model and the loss
    module), only those keep hooks, and the model can still be deep-copied
    and saved whole while they are on (the copy's hooks are inert)."""
    import copy

    from torch.nn.modules import module as m

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    globals_before = len(m._global_forward_pre_hooks)
    prof = fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0)
    with prof:
        for i in prof.loader(range(4)):
            loss_fn(model(torch.ones(2, 4)), torch.zeros(2, 2)).backward()
            opt.step()
            opt.zero_grad()
            if i == 2:
                assert len(m._global_forward_pre_hooks) == globals_before
                # Each is timed by its class's __call__, with no hook (torch's fast call path).
                assert "__call__" in vars(type(model)) and "__call__" in vars(type(loss_fn))
                assert not (model._forward_pre_hooks or loss_fn._forward_pre_hooks)
                assert not any(len(x._forward_pre_hooks) for x in model[:])
                twin = copy.deepcopy(model)
                torch.save(model, tmp_path / "model.pt")
                assert torch.equal(twin(torch.ones(1, 4)), model(torch.ones(1, 4)))
            prof.step()
    assert "__call__" not in vars(type(model)) and "__call__" not in vars(type(loss_fn))  # undone at stop
    spans = _spans(prof.trace_path)
    # One forward span per model call and per loss call at depth 0 (the
    # twin's and the check's calls at step 2 included: they are depth-0 calls).
    assert len(spans["phase.forward"]) >= 8
    assert torch.load(tmp_path / "model.pt", weights_only=False)(torch.ones(1, 4)).shape == (1, 2)


def test_collectives_are_communication_with_op_bytes_and_a_sequence(tmp_path: Path) -> None:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", COMM, str(tmp_path), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=180,
        env=e,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    comm = sorted(_spans(tmp_path / "run" / "trace.json.gz")["phase.communication"], key=lambda e: e["ts"])
    # A sync collective's own wait is inside its span, not a span of its own.
    assert [c["args"]["op"] for c in comm] == ["all_reduce", "barrier", "all_reduce", "wait"] * 4
    calls = [c for c in comm if c["args"]["op"] != "wait"]
    assert [c["args"]["seq"] for c in calls] == list(range(1, 13))
    assert {c["args"]["bytes"] for c in calls if c["args"]["op"] == "all_reduce"} == {256 * 4}
    assert {c["args"]["group_size"] for c in calls} == {1}
    assert all(set(c["args"]) == {"op"} for c in comm if c["args"]["op"] == "wait")


def test_diff_holds_each_phase_to_its_own_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-slowdown backward:10%``: the per-step time of a phase is held
    to its limit (a real run's report.json, and the same with its backward
    made 50% slower)."""
    from fastprof.cli.main import main

    run = _job(tmp_path, "{}")
    base = _report(run, tmp_path)
    new = json.loads(json.dumps(base))
    for r in new["anatomy"]["per_rank"]:
        r["phases"]["backward"]["total_ns"] = int(r["phases"]["backward"]["total_ns"] * 1.5)
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "new.json").write_text(json.dumps(new))
    args = [str(tmp_path / "base.json"), str(tmp_path / "new.json")]
    capsys.readouterr()
    assert main(["diff", *args, "--max-slowdown", "10%,backward:10%"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "threshold crossed: anatomy backward (ms/step)" in out and "+50.0%" in out
    assert main(["diff", *args, "--max-slowdown", "backward:60%"]) == 0
    assert main(["diff", *args, "--max-slowdown", "forward:5%"]) == 0
    assert main(["diff", *args, "--max-slowdown", "backwards:5%"]) == 2
    assert "unknown phase 'backwards'" in capsys.readouterr().err


def test_an_optimizer_closure_splits_the_optimizer_span_so_phases_never_overlap(tmp_path: Path) -> None:
    """LBFGS (and Lightning's automatic optimization) run forward and
    backward inside ``optimizer.step(closure)``: the optimizer's span is cut
    around them, and the phases of a step tile it without overlap."""
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    x, y = torch.randn(16, 8), torch.randn(16, 1)

    def closure() -> Any:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    prof = fastprof.Profiler(tmp_path, "run", torch=False, sample_hz=0)
    with prof:
        for _ in prof.loader(range(4)):
            opt.step(closure)
            prof.step()
    spans = _spans(prof.trace_path)
    phases = sorted(
        (e["ts"], e["ts"] + e["dur"], n)
        for n in ("phase.forward", "phase.backward", "phase.optimizer")
        for e in spans[n]
    )
    assert len(spans["phase.forward"]) >= 4 and len(spans["phase.optimizer"]) > 4
    for (_, end, a), (start, _, b) in itertools.pairwise(phases):
        assert start >= end - 1, (a, b)  # µs rounding of the trace
    _check_shares(_report(tmp_path / "run", tmp_path)["anatomy"])


def test_the_page_draws_every_steps_phases_and_the_windows_breakdown_too(tmp_path: Path) -> None:
    """report.html's "Where the step went": a bar per step from the anatomy
    (not only a torch window's steps), then the window's finer breakdown."""
    from fastprof.reports.data import load
    from fastprof.reports.html import anatomy_figures

    e = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    job = JOB.replace("torch=False, sample_hz=0, **eval(sys.argv[2])", "sample_hz=0")
    p = subprocess.run([sys.executable, "-c", job, str(tmp_path), "{}", "plain"], capture_output=True, text=True,
                       timeout=240, env=e)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "run"
    doc = _report(run, tmp_path)
    assert doc["breakdown"] is not None  # the default schedule's torch window
    figs, note = anatomy_figures(doc, load(run))
    (fig,) = figs
    bars = {t.name: t for t in fig.data}
    assert {"dataloader", "forward", "backward", "optimizer"} <= set(bars)
    assert all(len(t.x) == 16 for t in fig.data)  # every step, not only the window's
    assert "every step" in note
    fastprof.report(run, out_dir=tmp_path / "page", formats=("html",))
    html = (tmp_path / "page" / "report.html").read_text()
    assert "(step anatomy, every step)" in html and "(step-time breakdown)" in html


ANOMALY = """
import sys, time, torch, fastprof
torch.manual_seed(0)
model = torch.nn.Linear(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
class Slow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x
    @staticmethod
    def backward(ctx, g):
        # 20 ms a step: a preemption of the step before the slow one (a
        # burst counts once, under its first step) needs 10x that.
        time.sleep(1.0 if SLOW_NOW else 0.02)
        return g
prof = fastprof.Profiler(sys.argv[1], "run", torch=fastprof.TorchWindows(), sample_hz=0, sync_clocks=False,
                         schedule=fastprof.schedule.epoch(wait=100, warmup=0, active=1, repeat=0),
                         triggers=fastprof.Triggers(anomaly_window=16, anomaly_factor=10, poll_s=0.05))
with prof:
    for i, x in enumerate(prof.loader([torch.randn(8, 32)] * 40)):
        SLOW_NOW = i == 30
        Slow.apply(model(x)).sum().backward()
        opt.step(); opt.zero_grad()
        prof.step()
"""


def test_a_slow_step_is_named_with_the_phase_that_made_it_slow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step 30's backward sleeps: the anomaly trigger says backward, and so
    do the report's slow steps and `fastprof summary`."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run([sys.executable, "-c", ANOMALY, str(tmp_path)], capture_output=True, text=True, timeout=240,
                       env=e)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    state = json.loads((tmp_path / "run" / "rank0" / "triggers.json").read_text())
    a = next(a for a in state["anomalies"] if a["step"] == 30)
    assert a["phase"].startswith("backward ") and a["phase"].endswith("x its median"), a
    doc = _report(tmp_path / "run", tmp_path)
    (r,) = doc["triggers"]["per_rank"]
    assert next(x for x in r["anomalies"] if x["step"] == 30)["phase"] == a["phase"]
    (an,) = doc["anatomy"]["per_rank"]
    top = an["slow_steps"][0]
    assert top["step"] == 30 and top["phase"] == "backward", an["slow_steps"]
    assert top["phase_factor"] > 3 and top["dur_ns"] > 2 * top["median_step_ns"]
    from fastprof.cli.main import main

    capsys.readouterr()
    assert main(["summary", str(tmp_path / "run")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Step anatomy, every step" in out
    assert "Slow step on rank 0: step 30 took" in out and ": backward " in out


class _HostClockEvent:
    """Stands in for torch.cuda.Event where there is no GPU: it "completes"
    at once and its time is the host's at record(), so the GPU phase times
    it gives equal the host's (a GPU run is gpu_check's anatomy item)."""

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _HostClockEvent) -> float:
        return (end.t - self.t) * 1e3


def test_gpu_phase_times_are_recorded_per_timed_step_and_reported_beside_the_hosts(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from fastprof.profiler.anatomy import GPU_COUNTER, GPU_STEP_COUNTER, _GpuPhases
    from fastprof.profiler.drivers.anatomy import AnatomyDriver

    cuda = SimpleNamespace(Event=_HostClockEvent, is_initialized=lambda: True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = fastprof.Profiler(tmp_path, "gpu", torch=False, sample_hz=0)
    with prof:
        driver = prof._driver(AnatomyDriver)
        assert driver is not None and driver.anatomy.active
        driver.anatomy._gpu = gpu = _GpuPhases(SimpleNamespace(cuda=cuda), driver.anatomy)
        for _ in prof.loader(range(40)):
            loss = model(torch.randn(64, 32)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)
            prof.step()
    # Steps of 20 ms are far longer than 100 timed steps' cost of this
    # stand-in (~20 µs here, x4 at most for a preempted one): every step is
    # timed and recorded, none dropped.
    assert gpu.timed_steps == gpu.recorded == 40 and gpu.dropped == 0 and gpu.failed is None, (
        gpu.timed_steps,
        gpu.recorded,
        gpu.dropped,
        gpu.cost_ns,
        gpu.failed,
    )
    status = json.loads((prof.rank_dir / "profiler.json").read_text())["anatomy"]
    assert "GPU phase times: CUDA events, within a 1% budget: 40 steps recorded" in status, status
    # In the trace: one counter event per timed step, just after one with its
    # step's number, read with Python's json.
    with gzip.open(prof.trace_path, "rt") as f:
        counters = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "C"]
    events = [e for e in counters if e.get("name") == GPU_COUNTER]
    assert sorted(int(e["args"]["value"]) for e in counters if e.get("name") == GPU_STEP_COUNTER) == list(range(40))
    assert len(events) == 40
    for e in events:
        a = e["args"]
        assert a["forward"] > 0 and a["backward"] > 0 and a["optimizer"] > 0 and a["communication"] == 0
        assert a["span"] >= a["forward"] + a["backward"] + a["optimizer"] - 1e-6
    doc = _report(prof.run_dir, tmp_path)
    (r,) = doc["anatomy"]["per_rank"]
    g = r["gpu"]
    assert g["timed_steps"] == 40
    # The stand-in's GPU time is the host's: the ratio is about 1, host-bound.
    for p in ("forward", "backward", "optimizer"):
        assert g["phases"][p]["p50_ns"] == pytest.approx(g["phases"][p]["host_p50_ns"], rel=0.5), (p, g)
    assert g["verdict"].startswith("host-bound") or g["verdict"].startswith("balanced"), g
    import io

    from fastprof.reports.terminal import render

    buf = io.StringIO()
    render(doc, file=buf)
    out = " ".join(buf.getvalue().split())
    assert "On the GPU, rank 0 (40 timed steps, p50): forward" in out, out


WINDOWED = """
import sys, torch, fastprof
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 10))
loss_fn = torch.nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
# Batches of 1024: a step of ~60 ms of work, so that a preemption between our
# hook and torch's first op (a time slice, ours alone) is a small share of it.
data = [(torch.randn(1024, 256), torch.randint(0, 10, (1024,))) for _ in range(4)]
prof = fastprof.Profiler(sys.argv[1], "run", sample_hz=0,
                         schedule=fastprof.schedule.cyclic(wait=3, warmup=1, active=6, repeat=1))
with prof:
    for i in prof.loader(range(14)):
        x, y = data[i % 4]
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        prof.step()
"""


def test_the_anatomy_agrees_with_a_torch_window_over_the_same_steps(tmp_path: Path) -> None:
    """Issue #25's proof: over the steps a torch.profiler window covers, each
    phase's share of those steps from the anatomy's spans is within 5 points of
    the share torch's own CPU ops give it: the top-level ops of the step's
    thread under ``Optimizer.*`` annotations (optimizer), autograd's
    ``evaluate_function`` ops (backward), and the rest (forward: the model
    and the loss), each from its first op's start to its last op's end; and
    step by step, each phase's median difference is within 10 points. Read
    from the unified trace with Python's json."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    p = subprocess.run(
        [sys.executable, "-c", WINDOWED, str(tmp_path)], capture_output=True, text=True, timeout=180, env=e
    )
    assert p.returncode == 0, p.stderr[-3000:]
    with gzip.open(tmp_path / "run" / "trace.json.gz", "rt") as f:
        events = [x for x in json.load(f)["traceEvents"] if x.get("ph") == "X"]
    steps = [x for x in events if x["name"].startswith("ProfilerStep#") and x.get("cat") == "user_annotation"]
    assert len(steps) == 6, [s["name"] for s in steps]

    def within(x: dict[str, Any], s: dict[str, Any]) -> bool:
        return bool(s["ts"] <= x["ts"] and x["ts"] + x.get("dur", 0) <= s["ts"] + s["dur"])

    ops = [x for x in events if x.get("cat") in ("cpu_op", "user_annotation") and not x["name"].startswith("Profiler")]
    total_ours: dict[str, float] = {}
    total_torch: dict[str, float] = {}
    diffs: dict[str, list[float]] = {}
    seen: list[Any] = []
    for s in steps:
        mine = sorted((x for x in ops if within(x, s)), key=lambda x: (x["tid"], x["ts"], -x["dur"]))
        top, end = [], {}
        for x in mine:  # the step's top-level ops, per thread
            if x["ts"] + x["dur"] <= end.get(x["tid"], -1):
                continue
            top.append(x)
            end[x["tid"]] = x["ts"] + x["dur"]
        # Each phase's extent by torch's ops: the first op's start to the last
        # one's end (the optimizer's annotations are spans already), so that
        # time between ops (Python, a preemption under load) counts on both sides.
        kinds: dict[str, list[dict[str, Any]]] = {"forward": [], "backward": [], "optimizer": []}
        for x in top:
            if x["name"].startswith("Optimizer."):
                kinds["optimizer"].append(x)
            elif x["name"].startswith("autograd::engine::evaluate_function"):
                kinds["backward"].append(x)
            elif x["tid"] == s["tid"]:
                kinds["forward"].append(x)
        torch_share = {"optimizer": sum(x["dur"] for x in kinds["optimizer"]) / s["dur"]}
        for phase in ("forward", "backward"):
            xs = kinds[phase]
            torch_share[phase] = (max(x["ts"] + x["dur"] for x in xs) - min(x["ts"] for x in xs)) / s["dur"]
        ours = {
            p: sum(x["dur"] for x in events if x["name"] == f"phase.{p}" and within(x, s)) / s["dur"]
            for p in torch_share
        }
        seen.append((s["name"], ours, torch_share))
        for phase in torch_share:
            diffs.setdefault(phase, []).append(abs(ours[phase] - torch_share[phase]))
            total_ours[phase] = total_ours.get(phase, 0.0) + ours[phase] * s["dur"]
            total_torch[phase] = total_torch.get(phase, 0.0) + torch_share[phase] * s["dur"]
        assert min(torch_share.values()) > 0, torch_share  # every phase is there
    # A loaded machine preempts for a time slice (~10 ms) between our hook
    # and torch's own annotation: such a preemption is ours alone and lands in
    # a few steps. With steps of ~5 ms of work, CI saw zero_grad's span 10.4
    # points over torch's in one step of six; beside a CPU hog, five phase
    # shares of 18 were off by more than 10 points, and one 8 ms preemption in
    # backward put the window's total 5.3 points over. Steps are now ~60 ms
    # of work (batches of 1024). A wrong attribution lands in every step, so
    # in the median, and in the window's total, which is the claim.
    for phase, d in diffs.items():
        assert sorted(d)[len(d) // 2] <= 0.10, (phase, d, seen)
    span = sum(s["dur"] for s in steps)
    for phase, t in total_torch.items():
        assert abs(total_ours[phase] - t) / span <= 0.05, (phase, total_ours[phase] / span, t / span)
