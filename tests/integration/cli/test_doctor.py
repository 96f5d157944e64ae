"""``fastprof doctor``: the real command in a subprocess, on this machine.

Its items are checked against what Python, torch and a real recording say
on their own (not against doctor's own code), and the exit codes of
``--require`` against what this machine has. Without a GPU (CI) the GPU
items must say so cleanly; on a GPU machine they must be ok.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fastprof
from fastprof import _core
from fastprof._package import DISTRIBUTION
from fastprof.cli import doctor

#: Every item doctor prints whatever the machine ("gpu" or gpu0, gpu1...
#: depending on CUDA devices; nvml.gpuN only with NVML devices).
ITEMS = (
    "python",
    "fastprof",
    "package",
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
    # This environment holds fastprof once, under its own name.
    assert lines["package"].startswith("ok"), lines["package"]
    assert f"{DISTRIBUTION} {fastprof.__version__}" in lines["package"]
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


FAKE_NVML = Path(__file__).resolve().parents[2] / "fake_nvml" / "fake_nvml.c"


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


# ---------------------------------------------- another fastprof beside ours

#: The unrelated ``fastprof`` of the package index (0.4.1: likelihood-based
#: statistics), reduced to what matters here: a top-level ``fastprof``
#: package of its own and a second one, ``fastprof_utils``.
UNRELATED = {
    "fastprof/__init__.py": "from .core import Model\n",
    "fastprof/core.py": "class Model:\n    pass\n",
    "fastprof_utils/__init__.py": "",
    "fastprof-0.4.1.dist-info/METADATA": (
        "Metadata-Version: 2.1\nName: fastprof\nVersion: 0.4.1\n"
        "Summary: 'A fast profiling tool for likelihood-based statistical analyses'\n"
    ),
    "fastprof-0.4.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    "fastprof-0.4.1.dist-info/top_level.txt": "fastprof\nfastprof_utils\n",
}


def _install_unrelated(tmp_path: Path) -> Path:
    """That project installed by pip from a wheel into a folder of its own
    (``--target``): a real dist-info as pip writes it (RECORD, INSTALLER).
    Returns the folder, a site directory to put on a path."""
    record = []
    whl = tmp_path / "fastprof-0.4.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for name, text in UNRELATED.items():
            data = text.encode()
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append("fastprof-0.4.1.dist-info/RECORD,,")
        z.writestr("fastprof-0.4.1.dist-info/RECORD", "\n".join(record) + "\n")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(whl)],
        check=True,
        capture_output=True,
        timeout=110,
    )
    assert (site / "fastprof-0.4.1.dist-info" / "RECORD").is_file()
    return site


def _fix_of(item: doctor.Item) -> None:
    """The hint: uninstall the other one, then put ours back as it was installed."""
    ours = importlib.metadata.distribution(DISTRIBUTION)
    editable = json.loads(ours.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable")
    again = "pip install --no-deps -e " if editable else f"pip install --force-reinstall --no-deps {DISTRIBUTION}"
    assert item.hint.startswith("pip uninstall -y fastprof, then ") and again in item.hint, item.hint


def test_another_fastprof_ahead_on_the_path_is_named_with_the_fix(tmp_path: Path) -> None:
    site = _install_unrelated(tmp_path)
    item = doctor.package_item([str(site), *sys.path])
    assert item.status == "unavailable", item
    assert f"import fastprof loads {site / 'fastprof'} of fastprof 0.4.1" in item.detail, item.detail
    assert "likelihood-based" in item.detail and f"not this fastprof ({Path(fastprof.__file__).parent})" in item.detail
    _fix_of(item)


def test_another_fastprof_behind_ours_is_named_too(tmp_path: Path) -> None:
    site = _install_unrelated(tmp_path)
    item = doctor.package_item([*sys.path, str(site)])
    assert item.status == "unavailable", item
    assert "import fastprof loads" not in item.detail
    assert item.detail.startswith("another distribution claims the fastprof package: fastprof 0.4.1 (")
    assert f"in {site})" in item.detail, item.detail
    _fix_of(item)
    # Without it, this environment is clean.
    clean = doctor.package_item()
    assert clean.ok and clean.detail.startswith(f"{DISTRIBUTION} {fastprof.__version__} ("), clean


def test_the_doctor_command_says_it_in_one_line(tmp_path: Path) -> None:
    """The real verb, in a process whose path holds the other project after
    ours (as a second site directory does): one line, the fix after it."""
    site = _install_unrelated(tmp_path)
    code = (
        "import sys\n"
        f"sys.path.append({str(site)!r})\n"
        "from fastprof.cli.main import main\n"
        "sys.exit(main(['doctor', '--probe-timeout', '60']))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=110, cwd=tmp_path, env=_env()
    )
    assert r.returncode == 0, r.stderr
    line = _lines(r.stdout)["package"]
    assert line.startswith("unavailable package") and "fastprof 0.4.1" in line, line
    assert " -> pip uninstall -y fastprof, then pip install " in line, line


def test_a_stale_build_of_ours_is_named(tmp_path: Path) -> None:
    """Metadata of another version than the extension's: the package was
    not rebuilt since the version changed (Cargo.toml)."""
    info = tmp_path / "site" / f"{DISTRIBUTION.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 0.0.1\n")
    item = doctor.package_item([*sys.path[:1], str(tmp_path / "site"), *sys.path[1:]])
    assert item.status == "unavailable", item
    assert item.detail == f"{DISTRIBUTION} 0.0.1 is installed, but its extension is {_core.__version__}: a stale build"
    assert item.hint.startswith("pip install "), item
