"""fastprof's NVML path, run for real against a fake ``libnvidia-ml.so.1``.

This machine may have no NVIDIA driver, so NVML itself cannot exist here: the
one place a stand-in is allowed. The stand-in is a real shared library
(tests/fake_nvml/fake_nvml.c) built with gcc and found through
LD_LIBRARY_PATH by the same dlopen() calls that load the real one, so the
Rust sampler (nvml-wrapper) and the Python inventory (pynvml) run unchanged.
Device 0 supports everything; device 1 lacks the energy counter and PCIe
throughput. Readings follow a "load" the test writes to a file while the
profiled process runs; see the C file for the physics.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if shutil.which("gcc") is None:
    pytest.skip("gcc is needed to build the fake NVML library", allow_module_level=True)

FAKE_SRC = Path(__file__).resolve().parents[2] / "fake_nvml" / "fake_nvml.c"
UUID0 = "GPU-fake-0000-0000-0000-000000000000"
UUID1 = "GPU-fake-0001-0000-0000-000000000000"
MIB = 1 << 20
BUSY = 90.0


def power_w(load: float) -> float:
    return 60.0 + 2.4 * load


def pcie_rx(load: float) -> float:
    return (100 + 1000 * load) * 1024.0


def pcie_tx(load: float) -> float:
    return (50 + 500 * load) * 1024.0


# Runs in the child: idle phase at load 0, busy phase at load 90, with
# margins around each measured window so the fake has seen the new load
# (and a tick stamped inside a window read it before the load changed).
SCRIPT = """
import json, os, sys, time
import fastprof

out, gpus, load_file, result, mode = sys.argv[1:6]
gpus = json.loads(gpus)

def set_load(v):
    with open(load_file + ".tmp", "w") as f:
        f.write(str(v))
    os.replace(load_file + ".tmp", load_file)

marks = {}
set_load(0 if mode == "full" else 50)
rec = fastprof.start(out, "fake", sample_hz=50, sample_gpus=gpus)
if mode == "full":
    time.sleep(0.3)
    marks["idle0"] = time.monotonic_ns()
    time.sleep(0.8)
    marks["idle1"] = time.monotonic_ns()
    # A tick stamps its time before it reads NVML: one preempted between
    # the two can carry a time inside the idle window and a busy reading.
    time.sleep(0.3)
    set_load(90)
    time.sleep(0.3)
    marks["busy0"] = time.monotonic_ns()
    time.sleep(1.0)
    marks["busy1"] = time.monotonic_ns()
    time.sleep(0.3)
else:
    time.sleep(0.6)
rec.stop()
energy = {}
if mode == "full":
    for gpu in (0, 1):
        energy[f"gpu{gpu}_idle"] = rec.energy_j(marks["idle0"], marks["idle1"], gpu=gpu)
        energy[f"gpu{gpu}_busy"] = rec.energy_j(marks["busy0"], marks["busy1"], gpu=gpu)
with open("/proc/self/maps") as f:
    libs = sorted({line.split()[-1] for line in f if "libnvidia-ml" in line})
series = {k: [ts.tolist(), v.tolist()] for k, (ts, v) in rec.counters().items() if k.startswith("gpu")}
with open(result, "w") as f:
    json.dump({
        "info": rec.sampler_info(),
        "series": series,
        "energy": energy,
        "marks": marks,
        "trace_dir": str(rec.trace_dir),
        "nvml_libs": libs,
    }, f)
"""


def build(out_dir: Path, *defines: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", *defines]
    cmd += ["-o", str(out_dir / "libnvidia-ml.so.1"), str(FAKE_SRC), "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return out_dir


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("fake_nvml"))


def run_with_fake(work: Path, lib_dir: Path, gpus: Any, mode: str = "short") -> dict[str, Any]:
    """Profile a child process that sees the fake NVML; return what it reported."""
    work.mkdir(parents=True, exist_ok=True)
    script = work / "child.py"
    script.write_text(SCRIPT)
    result = work / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib_dir), os.environ.get("LD_LIBRARY_PATH")]))
    env["FAKE_NVML_LOAD_FILE"] = str(work / "load")
    env["PYTHONWARNINGS"] = "error"
    args = [str(work / "out"), json.dumps(gpus), str(work / "load"), str(result), mode]
    try:
        r = subprocess.run(
            [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60, env=env, cwd=work
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"child did not finish within 60 s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stderr == "", r.stderr
    return json.loads(result.read_text())


@pytest.fixture(scope="module")
def full_run(fake_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ~3 s profiled run with both devices, shared by the tests below."""
    return run_with_fake(tmp_path_factory.mktemp("full"), fake_lib, "all", mode="full")


def window(res: dict[str, Any], metric: str, start: str, end: str) -> np.ndarray:
    ts, vals = (np.asarray(x) for x in res["series"][metric])
    return vals[(ts >= res["marks"][start]) & (ts <= res["marks"][end])]


def seconds(res: dict[str, Any], start: str, end: str) -> float:
    return (res["marks"][end] - res["marks"][start]) / 1e9


# ------------------------------------------------------------------ all GPUs


def test_nvml_metadata_names_the_fake_devices(full_run, fake_lib):
    nvml = full_run["info"]["nvml"]
    assert nvml["available"] is True and nvml["reason"] is None
    assert nvml["driver"] == "999.99"
    assert nvml["errors"] == []
    assert [d["label"] for d in nvml["devices"]] == ["gpu0", "gpu1"]
    assert [d["uuid"] for d in nvml["devices"]] == [UUID0, UUID1]
    assert all(d["name"] == "Fake GPU" and d["power_limit_w"] == 300.0 for d in nvml["devices"])
    assert [d["memory_total_bytes"] for d in nvml["devices"]] == [16 << 30, 8 << 30]
    # The library dlopen()ed in the child is the fake one, not some real driver.
    assert full_run["nvml_libs"] == [str((fake_lib / "libnvidia-ml.so.1").resolve())]
    assert full_run["info"]["self_cost"]["nvml_ns_per_tick_mean"] > 0


def test_gpu0_readings_follow_the_load(full_run):
    names = {k for k in full_run["series"] if k.startswith("gpu0.")}
    assert names == {
        "gpu0.util [%]",
        "gpu0.mem_util [%]",
        "gpu0.mem_used [B]",
        "gpu0.mem_total [B]",
        "gpu0.power [W]",
        "gpu0.energy [J]",
        "gpu0.sm_clock [MHz]",
        "gpu0.mem_clock [MHz]",
        "gpu0.temperature [C]",
        "gpu0.throttle_reasons",
        "gpu0.pcie_rx [B/s]",
        "gpu0.pcie_tx [B/s]",
    }
    expect = {
        "gpu0.util [%]": (0, BUSY),
        "gpu0.mem_util [%]": (0, BUSY / 2),
        "gpu0.mem_used [B]": (512 * MIB, 512 * MIB + BUSY * 64 * MIB),
        "gpu0.mem_total [B]": (16 << 30, 16 << 30),
        "gpu0.power [W]": (power_w(0), power_w(BUSY)),
        "gpu0.sm_clock [MHz]": (210, 210 + 15 * BUSY),
        "gpu0.mem_clock [MHz]": (1593, 1593),
        "gpu0.temperature [C]": (30, 30 + BUSY / 2),
        "gpu0.throttle_reasons": (0x1, 0x4),  # GPU_IDLE, then SW_POWER_CAP
    }
    for metric, (idle, busy) in expect.items():
        in_idle = window(full_run, metric, "idle0", "idle1")
        in_busy = window(full_run, metric, "busy0", "busy1")
        # Some samples in each phase (how many is the scheduler's business).
        assert in_idle.size >= 3 and in_busy.size >= 3, (metric, in_idle.size, in_busy.size)
        assert np.all(in_idle == idle), (metric, set(in_idle.tolist()))
        assert np.all(in_busy == busy), (metric, set(in_busy.tolist()))
    power = np.asarray(full_run["series"]["gpu0.power [W]"][1])
    assert power.min() >= power_w(0) and power.max() <= power_w(100)


def test_pcie_is_read_about_once_a_second_in_bytes(full_run):
    # Counted against the sampler's own ticks and clock, never wall time: at
    # most one reading per 0.8 s of the span the ticks cover, at least two.
    util_ts = np.asarray(full_run["series"]["gpu0.util [%]"][0])
    span_s = (util_ts[-1] - util_ts[0]) / 1e9
    for metric, f in (("gpu0.pcie_rx [B/s]", pcie_rx), ("gpu0.pcie_tx [B/s]", pcie_tx)):
        ts, vals = full_run["series"][metric]
        assert 2 <= len(vals) <= span_s / 0.8 + 1, (metric, len(vals), span_s)
        assert len(vals) < len(util_ts)
        assert vals[0] == f(0)  # read on the first tick, at load 0
        assert set(vals) <= {f(0), f(BUSY)}, vals  # KB/s from NVML, B/s here
        assert np.all(np.diff(ts) >= 0.8e9), np.diff(ts)


def test_gpu0_energy_counter_matches_the_power_physics(full_run):
    ts, energy = (np.asarray(x) for x in full_run["series"]["gpu0.energy [J]"])
    assert np.all(np.diff(energy) >= 0)
    # The fake's counter starts at 5,000,000 mJ: fastprof reports joules.
    assert 5000 <= energy[0] < 5100, energy[0]
    for phase, load in (("idle", 0), ("busy", BUSY)):
        joules, source = full_run["energy"][f"gpu0_{phase}"]
        expected = power_w(load) * seconds(full_run, f"{phase}0", f"{phase}1")
        assert source == "energy_counter"
        assert abs(joules - expected) < 0.1 * expected, (phase, joules, expected)
    # The counter and the power readings agree over the whole run.
    pts, power = (np.asarray(x) for x in full_run["series"]["gpu0.power [W]"])
    integral = float(np.sum(np.diff(pts) / 1e9 * (power[1:] + power[:-1]) / 2))
    counted = float(np.interp(pts[-1], ts, energy) - np.interp(pts[0], ts, energy))
    assert abs(counted - integral) < 0.1 * integral, (counted, integral)


def test_gpu1_unsupported_fields_are_disabled_and_energy_is_integrated(full_run):
    names = {k for k in full_run["series"] if k.startswith("gpu1.")}
    assert "gpu1.energy [J]" not in names
    assert not any("pcie" in n for n in names)
    assert {"gpu1.util [%]", "gpu1.power [W]", "gpu1.mem_used [B]", "gpu1.throttle_reasons"} <= names
    assert np.all(window(full_run, "gpu1.util [%]", "busy0", "busy1") == BUSY)
    assert np.all(window(full_run, "gpu1.mem_total [B]", "idle0", "busy1") == 8 << 30)
    disabled = full_run["info"]["nvml"]["disabled_fields"]
    assert set(disabled) == {"gpu1"}, disabled  # gpu0 lost nothing
    assert set(disabled["gpu1"]) == {"energy [J]", "pcie_rx [B/s]", "pcie_tx [B/s]"}
    for reason in disabled["gpu1"].values():
        assert "not available" in reason or "not supported" in reason.lower(), reason
    for phase, load in (("idle", 0), ("busy", BUSY)):
        joules, source = full_run["energy"][f"gpu1_{phase}"]
        expected = power_w(load) * seconds(full_run, f"{phase}0", f"{phase}1")
        assert source == "integrated_power"
        assert abs(joules - expected) < 0.1 * expected, (phase, joules, expected)


def test_trace_has_gpu_counters_and_inventories(full_run, traces):
    run = traces.read(full_run["trace_dir"])
    counters = [e for e in run.events if e.get("ph") == "C"]
    names = {e["name"] for e in counters}
    assert {"gpu0.util [%]", "gpu0.energy [J]", "gpu0.pcie_rx [B/s]", "gpu1.power [W]"} <= names
    assert not {"gpu1.energy [J]", "gpu1.pcie_rx [B/s]", "gpu1.pcie_tx [B/s]"} & names
    util = [e["args"]["value"] for e in counters if e["name"] == "gpu0.util [%]"]
    assert util == full_run["series"]["gpu0.util [%]"][1]  # every sample, in order
    nvml = run.final["sampler"]["nvml"]
    assert len(nvml["devices"]) == 2 and nvml["driver"] == "999.99"
    assert set(nvml["disabled_fields"]["gpu1"]) == {"energy [J]", "pcie_rx [B/s]", "pcie_tx [B/s]"}
    # The Python inventory went through pynvml and the same fake library.
    inv = run.final["config"]["gpu_inventory"]
    assert inv["available"] is True and inv["driver"] == "999.99"
    assert [(d["index"], d["name"], d["uuid"]) for d in inv["devices"]] == [
        (0, "Fake GPU", UUID0),
        (1, "Fake GPU", UUID1),
    ]
    assert [d["memory_total_bytes"] for d in inv["devices"]] == [16 << 30, 8 << 30]
    assert all(d["power_limit_w"] == 300.0 and "errors" not in d for d in inv["devices"])


# ------------------------------------------------------------- selections


@pytest.mark.parametrize("gpus", [["1"], [UUID1]], ids=["index", "uuid"])
def test_selected_device_only(gpus, fake_lib, tmp_path):
    res = run_with_fake(tmp_path, fake_lib, gpus)
    nvml = res["info"]["nvml"]
    assert nvml["available"] is True
    assert [d["label"] for d in nvml["devices"]] == ["gpu1"]
    assert nvml["devices"][0]["uuid"] == UUID1
    assert res["series"] and all(k.startswith("gpu1.") for k in res["series"])
    assert set(res["series"]["gpu1.util [%]"][1]) == {50.0}
    assert set(nvml["disabled_fields"]) == {"gpu1"}


def test_unknown_device_is_reported(fake_lib, tmp_path):
    res = run_with_fake(tmp_path, fake_lib, ["7", "GPU-nope"])
    nvml = res["info"]["nvml"]
    assert nvml["available"] is False
    assert nvml["reason"] == "no device selected or visible"
    assert len(nvml["errors"]) == 2
    assert nvml["errors"][0].startswith("device 7:") and nvml["errors"][1].startswith("device GPU-nope:")
    assert res["series"] == {}


def test_none_loads_no_nvml(fake_lib, tmp_path, traces):
    res = run_with_fake(tmp_path, fake_lib, "none")
    nvml = res["info"]["nvml"]
    assert nvml["available"] is False and "disabled" in nvml["reason"]
    assert res["series"] == {}
    assert res["nvml_libs"] == []  # neither Rust nor pynvml opened the library
    assert "gpu_inventory" not in traces.read(res["trace_dir"]).final["config"]


# ------------------------------------------------------------- old drivers


def test_missing_symbol_disables_the_field(tmp_path):
    """An older driver without a function: the field is switched off and listed, once."""
    lib = build(tmp_path / "lib", "-DFAKE_NVML_OMIT_ENERGY")
    res = run_with_fake(tmp_path / "run", lib, ["0"])
    assert "gpu0.energy [J]" not in res["series"]
    assert "gpu0.util [%]" in res["series"]
    assert "energy [J]" in res["info"]["nvml"]["disabled_fields"].get("gpu0", {})
