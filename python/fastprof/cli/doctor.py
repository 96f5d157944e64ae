"""``fastprof doctor``: what fastprof can see and use on this machine, one
line per item: ok or unavailable, why, and what to do. For a run whose GPU
counters came out empty, before filing a bug.

Items: Python, fastprof, the package (whether ``import fastprof`` loads this
fastprof, and any other distribution that claims the name: ``fastprof`` on
the package index is an unrelated project), torch, CUDA, the NVIDIA driver, each CUDA device,
NVML (the sampler's own probe: library, driver, fields per device), whether
torch.profiler records CUDA kernels (``cuda-kernels``: a one-kernel probe in
a subprocess, so a CUPTI hang or crash cannot take doctor down; without it
torch windows still record CPU operators), torch.distributed backends,
fastprof's clocks, the FASTPROF_* environment, and the default out_dir.

Exit status: 0; 1 when a --require'd capability is missing (named on
stderr); 2 on a bad argument.

Examples:
  fastprof doctor
  fastprof doctor --json | jq '.items[] | select(.status != "ok")'
  fastprof doctor --require gpu,nvml      # a CI job that needs a GPU
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastprof import __version__, _core
from fastprof._package import DISTRIBUTION
from fastprof.cli.args import seconds
from fastprof.cli.errors import CommandError, describe
from fastprof.cli.workloads import import_torch
from fastprof.recording.options import BY_NAME, ENV_VARS, resolve

OK = "ok"
UNAVAILABLE = "unavailable"

#: Seconds the torch.profiler CUDA probe may take (importing torch and
#: starting CUDA take a few seconds; a CUPTI hang takes forever).
PROBE_TIMEOUT_S = 90.0
#: Its upper bound: a thread join takes no more (1e308 s overflowed it, after the other checks).
MAX_PROBE_TIMEOUT_S = 3600.0

#: The backends ``torch.distributed`` reports on, each with its ``is_*_available``.
BACKENDS = ("gloo", "nccl", "mpi", "ucc")


@dataclass
class Item:
    """One line of the report."""

    name: str
    status: str
    detail: str
    hint: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


def _ok(name: str, detail: str) -> Item:
    return Item(name, OK, detail)


def _off(name: str, why: str, hint: str) -> Item:
    return Item(name, UNAVAILABLE, why, hint)


# ------------------------------------------------------------ capabilities

#: ``--require`` names: capability -> the item that shows it ("gpu": any
#: CUDA device item, gpu0, gpu1...).
CAPABILITIES: dict[str, str] = {
    "torch": "torch",
    "cuda": "cuda",
    "gpu": "gpu",
    "nvml": "nvml",
    "cuda-kernels": "cuda-kernels",
    **{b: f"dist.{b}" for b in BACKENDS},
    "out-dir": "out_dir",
}

#: Earlier names still taken by ``--require``: "torch-windows" read as
#: "torch windows do not work" on a CPU machine, where they do (CPU operators).
ALIASES = {"torch-windows": "cuda-kernels"}


def _items_of(items: list[Item], capability: str) -> list[Item]:
    name = CAPABILITIES[capability]
    if name == "gpu":
        return [i for i in items if i.name == "gpu" or (i.name[3:].isdigit() and i.name.startswith("gpu"))]
    return [i for i in items if i.name == name]


def missing(items: list[Item], required: list[str]) -> dict[str, str]:
    """The required capabilities the items do not show, each with why."""
    out = {}
    for c in dict.fromkeys(required):
        shown = _items_of(items, c)
        if not any(i.ok for i in shown):
            out[c] = "; ".join(i.detail for i in shown) or "not checked"
    return out


def _capabilities(text: str) -> list[str]:
    """``--require`` value: one or more capability names, comma-separated."""
    names = [ALIASES.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CAPABILITIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown capability {', '.join(map(repr, bad)) or repr(text)} (known: {', '.join(CAPABILITIES)})"
        )
    return names


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "doctor",
        help="what fastprof can see and use here (GPU, NVML, CUPTI, clocks, out_dir)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (items: name, status, detail, hint)")
    p.add_argument(
        "--require",
        action="append",
        nargs="+",
        type=_capabilities,
        default=[],
        metavar="CAP",
        help=f"exit 1 unless these are available: {', '.join(CAPABILITIES)} (repeat or comma-separate)",
    )
    p.add_argument(
        "--probe-timeout",
        type=seconds(0.0, MAX_PROBE_TIMEOUT_S, above=True),
        default=PROBE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"time the torch.profiler CUDA probe may take (default {PROBE_TIMEOUT_S:g})",
    )
    p.set_defaults(run=run)


# ----------------------------------------------------------------- probing


def _python() -> list[Item]:
    impl = platform.python_implementation()
    return [
        _ok("python", f"{platform.python_version()} ({impl}, {sys.executable})"),
        _ok("fastprof", f"{__version__} (core {_core.__version__}, {Path(__file__).parents[1]})"),
    ]


def _norm(name: str) -> str:
    """A distribution name as the index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _claims_fastprof(dist: importlib.metadata.Distribution) -> bool:
    """Whether ``dist`` is named ``fastprof`` or installs a top-level
    ``fastprof`` package (its top_level.txt, else the files its RECORD lists)."""
    if _norm(dist.metadata["Name"] or "") == "fastprof":
        return True
    top = dist.read_text("top_level.txt")
    if top is not None and "fastprof" in top.split():
        return True
    return any(f.parts[:1] == ("fastprof",) for f in dist.files or ())


def _described(dist: importlib.metadata.Distribution) -> str:
    """``fastprof 0.4.1 ("Summary", in /site-packages)``."""
    summary = (dist.metadata["Summary"] or "").strip()
    if len(summary) > 60:
        summary = summary[:57] + "..."
    what = f'"{summary}", ' if summary else ""
    return f"{dist.metadata['Name']} {dist.version} ({what}in {dist.locate_file('')})"


def _reinstall(ours: importlib.metadata.Distribution | None) -> str:
    """The command that puts this fastprof back after the other one is
    uninstalled (which removes its files, ours among them where they were
    mixed, and the ``fastprof`` command where it wrote one)."""
    raw = ours.read_text("direct_url.json") if ours is not None else None
    try:
        direct = json.loads(raw) if raw else {}
    except ValueError:
        direct = {}
    url = str(direct.get("url") or "") if isinstance(direct, dict) else ""
    editable = isinstance(direct, dict) and bool((direct.get("dir_info") or {}).get("editable"))
    if editable and url.startswith("file://"):
        return f"pip install --no-deps -e {urllib.parse.unquote(url[len('file://') :])}"
    return f"pip install --force-reinstall --no-deps {DISTRIBUTION}"


def package_item(path: Sequence[str] | None = None) -> Item:
    """Whether ``import fastprof`` over ``path`` (default ``sys.path``) loads
    this fastprof, and whether another distribution claims the name: the
    unrelated ``fastprof`` of the package index (what asking pip for
    ``fastprof`` with an extra installs, into the same folder as ours or
    ahead of it), or this project installed under that former name.
    Uninstalling it is the fix; then ours is installed again, since the
    uninstall takes the files they share. Also whether ours is a stale
    build (its metadata's version is not its extension's).

    Where the other one comes first on ``sys.path`` no verb of ours starts
    (``fastprof.cli`` is not in its package); doctor sees it when ours is
    found first or their files share one folder."""
    search = list(sys.path if path is None else path)
    here = Path(__file__).resolve().parents[1]
    spec = importlib.machinery.PathFinder.find_spec("fastprof", search)
    loaded = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    seen: set[str] = set()
    ours: importlib.metadata.Distribution | None = None
    others: list[importlib.metadata.Distribution] = []
    for dist in importlib.metadata.distributions(path=search):
        key = str(getattr(dist, "_path", "")) or f"{dist.metadata['Name']}=={dist.version}"
        if key in seen:
            continue
        seen.add(key)
        if _norm(dist.metadata["Name"] or "") == DISTRIBUTION:
            ours = ours or dist
        elif _claims_fastprof(dist):
            others.append(dist)
    name = "package"
    fix = (
        f"pip uninstall -y {' '.join(dict.fromkeys(str(d.metadata['Name']) for d in others)) or 'fastprof'}, "
        f"then {_reinstall(ours)}"
    )
    if loaded != here:
        shadow = next((d for d in others if Path(str(d.locate_file("fastprof"))).resolve() == loaded), None)
        by = f" of {_described(shadow)}" if shadow is not None else ""
        return _off(name, f"import fastprof loads {loaded or 'nothing'}{by}, not this fastprof ({here})", fix)
    if others:
        named = "; ".join(_described(d) for d in others)
        return _off(name, f"another distribution claims the fastprof package: {named}", fix)
    if ours is None:
        return _ok(name, f"not installed as {DISTRIBUTION} (imported from {here}); no distribution claims fastprof")
    if ours.version != _core.__version__:
        return _off(
            name,
            f"{DISTRIBUTION} {ours.version} is installed, but its extension is {_core.__version__}: a stale build",
            _reinstall(ours),
        )
    return _ok(name, f"{DISTRIBUTION} {ours.version} ({here}); no other distribution claims fastprof")


def _torch() -> tuple[list[Item], Any]:
    """torch, CUDA and each CUDA device; also the torch module (None: not importable)."""
    try:
        torch = import_torch()
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
        why = f"torch is not importable: {describe(e)}"
        hint = "install PyTorch (pip install torch); the recorder and merge work without it"
        return [_off("torch", why, hint), _off("cuda", "no torch", hint), _off("gpu", "no torch", hint)], None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    items = [_ok("torch", f"{torch.__version__} ({build})")]
    if not torch.version.cuda:
        hint = "install a CUDA build of torch (pytorch.org lists the wheels per CUDA version)"
        items.append(_off("cuda", f"torch {torch.__version__} is built without CUDA", hint))
        items.append(_off("gpu", "no GPU: this torch cannot use one", hint))
        return items, torch
    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except Exception as e:  # noqa: BLE001 - a broken driver raises many things
        available, count = False, 0
        items.append(_off("cuda", f"CUDA {torch.version.cuda}: starting CUDA failed: {describe(e)}", _DRIVER_HINT))
    else:
        if available and count:
            items.append(_ok("cuda", f"CUDA {torch.version.cuda}, {count} device(s)"))
        else:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            why = f"torch is built for CUDA {torch.version.cuda} but sees no device"
            if visible is not None:
                why += f" (CUDA_VISIBLE_DEVICES={visible!r})"
            items.append(_off("cuda", why, _DRIVER_HINT))
    if not count:
        items.append(_off("gpu", "no GPU: torch.cuda sees no device", _DRIVER_HINT))
        return items, torch
    for i in range(count):
        try:
            p = torch.cuda.get_device_properties(i)
            items.append(
                _ok(f"gpu{i}", f"{p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
            )
        except Exception as e:  # noqa: BLE001
            items.append(_off(f"gpu{i}", f"cannot read device {i}: {describe(e)}", _DRIVER_HINT))
    return items, torch


_DRIVER_HINT = (
    "expected on a machine without a GPU; else check that nvidia-smi lists it, that CUDA_VISIBLE_DEVICES "
    "does not hide it, and that the driver is as new as torch's CUDA needs"
)


def _sample_gpus() -> tuple[list[str] | None, Item]:
    """What the sampler would sample (the recorder's resolved ``sample_gpus``)
    and whether the FASTPROF_* environment resolves at all."""
    set_vars = sorted(v for v in ENV_VARS if v.startswith("FASTPROF_") and os.environ.get(v, "").strip())
    try:
        opts = resolve()
    except Exception as e:  # noqa: BLE001 - a ConfigError, or a bad value that breaks formatting
        return None, _off("config", describe(e), "fix or unset that variable: the recorder refuses it too")
    detail = f"FASTPROF_* environment valid ({', '.join(set_vars) or 'none set'})"
    return opts.sample_gpus, _ok("config", detail)


def _nvml(selection: list[str] | None) -> tuple[list[Item], dict[str, Any]]:
    """NVML as the sampler sees it: the core's probe (the sampler's own code
    path) over the devices the recorder would sample."""
    probe = _core.nvml_probe(selection)
    driver_probe = probe if selection != [] else _core.nvml_probe(None)
    items = []
    driver = driver_probe.get("driver")
    if driver:
        items.append(_ok("driver", f"NVIDIA driver {driver} (from NVML)"))
    else:
        why = driver_probe.get("reason") or "NVML reports no driver version"
        items.append(_off("driver", f"no NVIDIA driver found: {why}", _DRIVER_HINT))
    if not probe.get("available"):
        reason = probe.get("reason") or "unknown"
        if selection == []:
            hint = "unset FASTPROF_SAMPLE_GPUS (or set it to auto) so the sampler reads the GPUs"
        elif "not found" in reason:
            hint = (
                f"{probe.get('library')} ships with the NVIDIA driver: install the driver, or add the "
                "directory holding it to LD_LIBRARY_PATH (in a container: run it with the NVIDIA runtime)"
            )
        else:
            hint = "GPU counters will be empty; " + _DRIVER_HINT
        items.append(_off("nvml", f"no GPU counters: {reason}", hint))
        return items, probe
    devices = probe.get("devices") or []
    where = probe.get("library_path") or probe.get("library")
    which = "all visible devices" if selection is None else f"devices {', '.join(selection)} (sample_gpus)"
    items.append(_ok("nvml", f"{where}, driver {driver}, sampling {which}: {len(devices)} device(s)"))
    for err in probe.get("errors") or []:
        items.append(_off("nvml.error", err, "check FASTPROF_SAMPLE_GPUS against nvidia-smi -L"))
    for d in devices:
        fields = d.get("fields") or {}
        supported = fields.get("supported") or []
        unsupported = fields.get("unsupported") or {}
        missing = fields.get("no_reading") or []
        parts = [f"{d.get('name')}: {len(supported)} field(s) read: {', '.join(supported) or 'none'}"]
        if unsupported:
            parts.append("not supported: " + ", ".join(f"{k} ({v})" for k, v in unsupported.items()))
        if missing:
            parts.append("no reading this time (retried each tick): " + ", ".join(missing))
        name = f"nvml.{d.get('label')}"
        if supported:
            items.append(_ok(name, "; ".join(parts)))
        else:
            items.append(_off(name, "; ".join(parts), "the driver refuses every reading: " + _DRIVER_HINT))
    return items, probe


#: Run in a child process: one kernel under torch.profiler, one JSON line out.
_PROBE = """
import json, sys
def out(ok, detail, hint=""):
    print(json.dumps({"ok": ok, "detail": detail, "hint": hint}), flush=True)
    sys.exit(0)
import torch
from torch.profiler import ProfilerActivity, profile
if not torch.cuda.is_available():
    out(False, "no GPU: torch.cuda sees no device; torch windows record CPU operators only",
        "needs a CUDA device; on a machine without a GPU this is expected")
if ProfilerActivity.CUDA not in torch.profiler.supported_activities():
    out(False, "this torch's profiler offers no CUDA activity (Kineto built without CUPTI)",
        "install a CUDA build of torch from pytorch.org")
x = torch.ones(1 << 16, device="cuda")
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    (x * 2.0).sum()
    torch.cuda.synchronize()
kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
if not kernels:
    out(False, "torch.profiler recorded no CUDA kernel (CUPTI missing, busy or denied)",
        "see the CUPTI lines of this probe's stderr")
out(True, f"{len(kernels)} kernel(s) recorded: {', '.join(kernels)[:120]}")
"""


class _Probe:
    """The probe child, started now and read by a thread of its own, which
    notes when it finished: the ``--probe-timeout`` limit runs from the
    start (the other checks run meanwhile), so a probe that finished after
    its limit counts as not finished, however late doctor looks."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a hung child is killed with whatever it started
        )
        self.started = time.monotonic()
        self.finished: float | None = None
        self.out = ("", "")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        self.out = self.proc.communicate()
        self.finished = time.monotonic()

    def wait(self, timeout: float) -> bool:
        """True when the probe finished within ``timeout`` of its start."""
        self.reader.join(max(0.0, self.started + timeout - time.monotonic()))
        return self.finished is not None and self.finished - self.started <= timeout

    def kill(self) -> None:
        if self.proc.poll() is None:
            _kill(self.proc)
        self.reader.join(5)


def _start_window_probe() -> _Probe:
    return _Probe()


def _finish_window_probe(probe: _Probe, timeout: float) -> Item:
    name = "cuda-kernels"
    if not probe.wait(timeout):
        probe.kill()
        return _off(
            name,
            f"the one-kernel torch.profiler probe did not finish in {timeout:g} s (a CUPTI or driver hang)",
            "check for another profiler holding CUPTI (nsys, ncu, DCGM profiling); "
            "a longer --probe-timeout if the machine is just slow",
        )
    proc = probe.proc
    stdout, stderr = probe.out
    cupti = [ln.strip() for ln in stderr.splitlines() if "CUPTI" in ln]
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        last = (cupti or [ln for ln in stderr.splitlines() if ln.strip()] or ["no output"])[-1]
        return _off(name, f"the torch.profiler probe died ({how}): {last[:200]}", _cupti_hint(stderr))
    result = json.loads(lines[-1])
    if result["ok"]:
        return _ok(name, f"torch.profiler records CUDA kernels: {result['detail']}")
    detail = str(result["detail"])
    if cupti:
        detail += f": {cupti[-1][:200]}"
    return _off(name, detail, _cupti_hint(stderr) if cupti else str(result["hint"]))


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill the probe and whatever it started (its own session); its reader
    thread reaps it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _cupti_hint(stderr: str) -> str:
    if "INSUFFICIENT_PRIVILEGES" in stderr:
        return (
            "CUPTI needs profiling permission: load nvidia with NVreg_RestrictProfilingToAdminUsers=0 "
            "(or run as root / with CAP_SYS_ADMIN in the container)"
        )
    if "MULTIPLE_SUBSCRIBERS" in stderr or "CUPTI_ERROR_NOT_INITIALIZED" in stderr:
        return "another profiler holds CUPTI (nsys, ncu, DCGM profiling): stop it, or profile without it"
    if "libcupti" in stderr:
        return "libcupti is not found: install the CUDA toolkit's CUPTI or add its lib directory to LD_LIBRARY_PATH"
    return "run the probe by hand with CUDA_LAUNCH_BLOCKING=1 to see the failure"


def _distributed(torch: Any) -> list[Item]:
    if torch is None:
        return [_off(f"dist.{b}", "no torch", "install PyTorch") for b in BACKENDS]
    dist = torch.distributed  # loaded by `import torch`, built in or not
    if not dist.is_available():
        hint = "install a torch build with distributed support"
        return [_off(f"dist.{b}", "torch.distributed is not built in", hint) for b in BACKENDS]
    items = []
    hints = {
        "gloo": "install a torch build with gloo",
        "nccl": "NCCL comes with torch's CUDA builds on Linux",
        "mpi": "torch's wheels have no MPI: build torch from source against an MPI",
        "ucc": "torch's wheels have no UCC: build torch from source with USE_UCC=1",
    }
    for b in BACKENDS:
        check = getattr(dist, f"is_{b}_available", None)
        if check is None:
            items.append(_off(f"dist.{b}", f"this torch has no is_{b}_available()", hints[b]))
        elif check():
            items.append(_ok(f"dist.{b}", "available"))
        else:
            items.append(_off(f"dist.{b}", "not built into this torch", hints[b]))
    return items


def _clock() -> tuple[Item, dict[str, Any]]:
    c = _core.clock_info()
    detail = (
        f"ticks: {c['ticks_reason']}; kernel clocksource {c.get('clocksource') or 'unknown'}; "
        f"CLOCK_MONOTONIC resolution {c.get('monotonic_resolution_ns')} ns, "
        f"CLOCK_REALTIME {c.get('realtime_resolution_ns')} ns; "
        f"realtime/monotonic anchors within {c.get('anchor_uncertainty_ns')} ns"
    )
    return _ok("clock", detail), c


def _out_dir() -> Item:
    """The default out_dir (FASTPROF_OUT_DIR or ``fastprof_runs``): free
    space, and whether a run directory can be made in it (tried, then removed)."""
    try:
        out = Path(resolve().out_dir)
    except Exception:  # noqa: BLE001 - the config item names the bad variable
        out = Path(os.environ.get("FASTPROF_OUT_DIR", "").strip() or BY_NAME["out_dir"].default)
    shown = f"{out} ({out.resolve()})" if not out.is_absolute() else str(out)
    hint = "set FASTPROF_OUT_DIR (or out_dir=) to a writable directory on a disk with room"
    # The directory need not exist: the recorder makes it. Try where it would be made.
    base = out
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        return _off("out_dir", f"{shown}: {base.resolve()} is not a directory", hint)
    free = shutil.disk_usage(base).free
    try:
        probe = Path(tempfile.mkdtemp(prefix=".fastprof-doctor-", dir=base))
    except OSError as e:
        where = "" if base == out else f" (it would be made in {base.resolve()})"
        return _off("out_dir", f"{shown} is not writable{where}: {e.strerror or e}", hint)
    probe.rmdir()
    state = "writable" if base == out else f"not made yet, {base.resolve()} writable"
    return _ok("out_dir", f"{shown}: {state}, {free / 2**30:.1f} GiB free")


def collect(probe_timeout: float = PROBE_TIMEOUT_S) -> tuple[list[Item], dict[str, Any]]:
    """Every item, and the raw facts behind them (NVML probe, clocks)."""
    window = _start_window_probe()  # runs while the rest is checked
    try:
        items = [*_python(), package_item()]
        torch_items, torch = _torch()
        selection, config = _sample_gpus()
        nvml_items, nvml = _nvml(selection)
        clock, clocks = _clock()
        items += torch_items[:2] + nvml_items[:1] + torch_items[2:] + nvml_items[1:]
        items.append(_finish_window_probe(window, probe_timeout))
        items += _distributed(torch)
        items += [clock, config, _out_dir()]
    finally:
        window.kill()
    return items, {"nvml": nvml, "clock": clocks}


# ------------------------------------------------------------------ output


def run(args: argparse.Namespace) -> int:
    items, facts = collect(args.probe_timeout)
    required = list(dict.fromkeys(c for arg in args.require for group in arg for c in group))
    lacking = missing(items, required)
    if args.json:
        doc = {
            "fastprof_version": __version__,
            "items": [asdict(i) for i in items],
            "required": required,
            "missing": list(lacking),
            **facts,
        }
        print(json.dumps(doc, indent=2))
    else:
        width = max(len(i.name) for i in items)
        for i in items:
            line = f"{i.status:<11} {i.name:<{width}}  {i.detail}"
            print(line + (f"  -> {i.hint}" if i.hint else ""))
        n_ok = sum(i.ok for i in items)
        print(f"{n_ok} ok, {len(items) - n_ok} unavailable")
    if lacking:
        named = "; ".join(f"{c} ({why})" for c, why in lacking.items())
        raise CommandError(f"missing required capability: {named}", exit_code=1)
    return 0
