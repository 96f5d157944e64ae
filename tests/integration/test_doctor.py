"""``fastprof doctor``: the real command in a subprocess, on this machine.

Its items are checked against what Python, torch and a real recording say
on their own (not against doctor's own code), and the exit codes of
``--require`` against what this machine has. Without a GPU (CI) the GPU
items must say so cleanly; on a GPU machine they must be ok.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fastprof
from fastprof import _core

#: Every item doctor prints whatever the machine ("gpu" or gpu0, gpu1...
#: depending on CUDA devices; nvml.gpuN only with NVML devices).
ITEMS = (
    "python",
    "fastprof",
    "torch",
    "cuda",
    "driver",
    "nvml",
    "cuda-kernels",
    "dist.gloo",
    "dist.nccl",
    "dist.mpi",
    "dist.ucc",
    "clock",
    "config",
    "out_dir",
)

HAS_GPU = torch.cuda.is_available()


#: A launcher's variables: they narrow the devices the sampler would read.
LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without FASTPROF_* and launcher variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_") and k not in LAUNCHER}
    return {**env, **(extra or {})}


def _doctor(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastprof", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=cwd,
        env=_env(env),
    )


def _lines(stdout: str) -> dict[str, str]:
    """Item name -> its line, from the text output ("STATUS NAME DETAIL")."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0] in ("ok", "unavailable"):
            out[parts[1]] = line
    return out


def _items(stdout: str) -> dict[str, dict[str, str]]:
    return {i["name"]: i for i in json.loads(stdout)["items"]}


def test_text_output_has_every_item_with_this_machines_facts(tmp_path: Path) -> None:
    r = _doctor(cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = _lines(r.stdout)
    for name in ITEMS:
        assert name in lines, f"no {name} line in:\n{r.stdout}"
    assert platform.python_version() in lines["python"]
    assert fastprof.__version__ in lines["fastprof"]
    assert lines["torch"].startswith("ok") and torch.__version__ in lines["torch"]
    for b in ("gloo", "nccl", "mpi"):
        available = getattr(dist, f"is_{b}_available")()
        assert lines[f"dist.{b}"].startswith("ok" if available else "unavailable"), lines[f"dist.{b}"]
    # Every line that says unavailable also says what to do.
    for line in lines.values():
        if line.startswith("unavailable"):
            assert " -> " in line, line
    if HAS_GPU:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            assert lines[f"gpu{i}"].startswith("ok"), lines[f"gpu{i}"]
            assert p.name in lines[f"gpu{i}"] and f"{p.major}.{p.minor}" in lines[f"gpu{i}"]
    else:
        for name in ("gpu", "cuda", "cuda-kernels"):
            assert lines[name].startswith("unavailable"), lines[name]
        assert "no GPU" in lines["gpu"]
        # What is missing is CUDA kernels in the windows, not the windows.
        assert "torch windows record CPU operators only" in lines["cuda-kernels"], lines["cuda-kernels"]
    # Nothing left behind where the run directory would go.
    assert list(tmp_path.iterdir()) == []


def test_json_items_agree_with_the_sampler_and_the_clocks(tmp_path: Path) -> None:
    r = _doctor("--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    items = _items(r.stdout)
    assert set(ITEMS) <= set(items)
    for i in doc["items"]:
        assert set(i) == {"name", "status", "detail", "hint"}
        assert i["status"] in ("ok", "unavailable"), i
        assert i["detail"], i
        assert bool(i["hint"]) == (i["status"] == "unavailable"), i
    assert doc["fastprof_version"] == fastprof.__version__
    assert doc["missing"] == [] and doc["required"] == []

    # NVML as a real recording's sampler saw it (its metadata in the trace):
    # same availability, same reason.
    with fastprof.Recorder(out_dir=tmp_path / "runs", run_name="r", sample_hz=50):
        pass
    seg = next((tmp_path / "runs" / "r" / "rank0").glob("*.json.gz"))
    other = json.loads(gzip.decompress(seg.read_bytes()))["otherData"]
    nvml = other["sampler"]["nvml"]
    assert doc["nvml"]["available"] == nvml["available"]
    assert doc["nvml"].get("reason") == nvml.get("reason")
    assert (items["nvml"]["status"] == "ok") == nvml["available"]
    if not nvml["available"]:
        assert nvml["reason"] in items["nvml"]["detail"]
    else:
        labels = {d["label"] for d in nvml["devices"]}
        assert {f"nvml.{x}" for x in labels} <= set(items)

    # The clocks: the tick source a recording wrote, the kernel's resolutions.
    clock = other["clock"]
    assert doc["clock"]["ticks"] == clock["ticks"]
    for key, cid in (
        ("monotonic_resolution_ns", time.CLOCK_MONOTONIC),
        ("realtime_resolution_ns", time.CLOCK_REALTIME),
    ):
        assert doc["clock"][key] == round(time.clock_getres(cid) * 1e9)
    assert items["clock"]["status"] == "ok" and clock["ticks"] in items["clock"]["detail"]


@pytest.mark.skipif(HAS_GPU, reason="checks the answer of a machine without a GPU")
def test_require_gpu_exits_1_naming_it_without_a_gpu(tmp_path: Path) -> None:
    r = _doctor("--require", "gpu", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "missing required capability: gpu (no GPU" in err[0], r.stderr
    assert "Traceback" not in r.stderr
    assert "gpu" in _lines(r.stdout)  # the report is still printed
    # Several at once, in --json too: each missing one named, the present one not.
    r = _doctor("--json", "--require", "torch,nvml", "--require", "gpu", cwd=tmp_path)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["required"] == ["torch", "nvml", "gpu"]
    missing = ["gpu"] + (["nvml"] if not doc["nvml"]["available"] else [])
    assert sorted(doc["missing"]) == sorted(missing)
    assert all(f"{m} (" in r.stderr for m in missing) and "torch (" not in r.stderr


def test_require_what_this_machine_has_exits_0(tmp_path: Path) -> None:
    present = ["torch", "out-dir"] + (["gloo"] if dist.is_gloo_available() else [])
    r = _doctor("--require", ",".join(present), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_require_takes_the_earlier_name_of_cuda_kernels(tmp_path: Path) -> None:
    # "torch-windows" read as "torch windows do not work" on a CPU machine,
    # where they do: the item is cuda-kernels, and a CI line written with the
    # old name still means it.
    r = _doctor("--json", "--require", "torch-windows", "--probe-timeout", "0.01", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert doc["required"] == ["cuda-kernels"] and doc["missing"] == ["cuda-kernels"]
    assert r.returncode == 1 and "missing required capability: cuda-kernels (" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--require", "gpus"),
        ("--require", "torch,bogus"),
        ("--require", ","),
        ("--probe-timeout", "0"),
        ("--probe-timeout", "soon"),
    ],
)
def test_bad_argument_exits_2_naming_it(tmp_path: Path, args: tuple[str, ...]) -> None:
    r = _doctor(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert r.stdout == ""
    assert f"argument {args[0]}" in r.stderr and "Traceback" not in r.stderr


def test_unwritable_out_dir_is_reported_unavailable(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: a read-only mode does not stop root from writing")
        r = _doctor("--json", "--require", "out-dir", cwd=tmp_path, env={"FASTPROF_OUT_DIR": str(ro / "runs")})
        out = _items(r.stdout)["out_dir"]
        assert out["status"] == "unavailable", out
        assert "not writable" in out["detail"] and str(ro) in out["detail"]
        assert "FASTPROF_OUT_DIR" in out["hint"]
        assert r.returncode == 1 and "out-dir (" in r.stderr
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_out_dir_under_a_file_is_unavailable_and_a_writable_one_ok(tmp_path: Path) -> None:
    # Holds as root too: nothing can make a directory inside a regular file.
    f = tmp_path / "a-file"
    f.write_text("x")
    r = _doctor("--json", cwd=tmp_path, env={"FASTPROF_OUT_DIR": str(f / "runs")})
    out = _items(r.stdout)["out_dir"]
    assert out["status"] == "unavailable" and "not a directory" in out["detail"], out
    assert r.returncode == 0  # not required: reported, not failed

    d = tmp_path / "runs"
    d.mkdir()
    r = _doctor("--json", cwd=tmp_path, env={"FASTPROF_OUT_DIR": str(d)})
    out = _items(r.stdout)["out_dir"]
    assert out["status"] == "ok" and "writable" in out["detail"] and "GiB free" in out["detail"], out
    assert list(d.iterdir()) == []  # the write probe cleaned up


def test_a_bad_fastprof_variable_and_disabled_gpus_are_named(tmp_path: Path) -> None:
    r = _doctor("--json", cwd=tmp_path, env={"FASTPROF_SAMPLE_GPUS": "none"})
    items = _items(r.stdout)
    assert items["nvml"]["status"] == "unavailable"
    assert "disabled by configuration" in items["nvml"]["detail"]
    assert "FASTPROF_SAMPLE_GPUS" in items["nvml"]["hint"]
    assert items["config"]["status"] == "ok" and "FASTPROF_SAMPLE_GPUS" in items["config"]["detail"]
    # The core's probe says the same for the same selection.
    assert _core.nvml_probe([])["reason"] == "disabled by configuration"

    r = _doctor("--json", cwd=tmp_path, env={"FASTPROF_SAMPLE_HZ": "fast"})
    assert r.returncode == 0, r.stderr
    cfg = _items(r.stdout)["config"]
    assert cfg["status"] == "unavailable" and "FASTPROF_SAMPLE_HZ" in cfg["detail"], cfg


def test_a_profiler_probe_that_hangs_is_cut_off_not_waited_for(tmp_path: Path) -> None:
    # 10 ms: the child cannot even import torch, so it is killed at the limit,
    # the way a CUPTI hang would be.
    r = _doctor("--json", "--probe-timeout", "0.01", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    win = _items(r.stdout)["cuda-kernels"]
    assert win["status"] == "unavailable"
    assert "did not finish in 0.01 s" in win["detail"], win


FAKE_NVML = Path(__file__).resolve().parents[1] / "fake_nvml" / "fake_nvml.c"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the fake NVML library")
def test_nvml_fields_are_what_a_recording_samples_against_the_fake_library(tmp_path: Path) -> None:
    # No driver here, so NVML itself cannot exist: the suite's one stand-in,
    # a real libnvidia-ml.so.1 (tests/fake_nvml) that dlopen() finds through
    # LD_LIBRARY_PATH. Device 0 supports every field; device 1 lacks the
    # energy counter and PCIe throughput.
    lib = tmp_path / "lib"
    lib.mkdir()
    cc = ["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib / "libnvidia-ml.so.1"), str(FAKE_NVML), "-lpthread"]
    built = subprocess.run(cc, capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    ld = os.pathsep.join(filter(None, [str(lib), os.environ.get("LD_LIBRARY_PATH")]))
    env = {"LD_LIBRARY_PATH": ld, "FAKE_NVML_LOAD": "50"}

    r = _doctor("--json", "--require", "nvml", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    items = _items(r.stdout)
    assert doc["nvml"]["library_path"] == str(lib / "libnvidia-ml.so.1")
    assert items["nvml"]["status"] == "ok" and str(lib / "libnvidia-ml.so.1") in items["nvml"]["detail"]
    assert items["driver"]["status"] == "ok" and "999.99" in items["driver"]["detail"]
    fields = {d["label"]: d["fields"] for d in doc["nvml"]["devices"]}
    assert set(fields) == {"gpu0", "gpu1"}
    assert len(fields["gpu0"]["supported"]) == 12 and fields["gpu0"]["unsupported"] == {}
    assert set(fields["gpu1"]["unsupported"]) == {"energy [J]", "pcie_rx [B/s]", "pcie_tx [B/s]"}
    assert "Fake GPU: 12 field(s) read" in items["nvml.gpu0"]["detail"]
    assert "not supported: energy [J]" in items["nvml.gpu1"]["detail"]

    # What a real recording's sampler switched off, under the same library.
    script = (
        "import sys, time, fastprof\n"
        "rec = fastprof.start(sys.argv[1], 'r', sample_hz=50)\n"
        "time.sleep(0.3)\n"
        "rec.stop()\n"
    )
    rec = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=110,
        env=_env(env),
        cwd=tmp_path,
    )
    assert rec.returncode == 0, rec.stderr
    seg = next((tmp_path / "runs" / "r" / "rank0").glob("*.json.gz"))
    sampled = json.loads(gzip.decompress(seg.read_bytes()))["otherData"]["sampler"]["nvml"]
    assert sampled["available"] and sampled["driver"] == doc["nvml"]["driver"]
    disabled = sampled["disabled_fields"]
    for label, f in fields.items():
        assert f["unsupported"] == disabled.get(label, {}), label

    # NVML is not CUDA: torch still sees no device, so a GPU is still missing.
    if not HAS_GPU:
        r = _doctor("--require", "gpu", cwd=tmp_path, env=env)
        assert r.returncode == 1 and "gpu (" in r.stderr
