"""``fastprof merge`` on multi-rank torch.profiler traces, side by side with
the gzip floor and a Composer-style Python merger, in one run.

Inputs are synthetic Kineto traces in the torch >= 2.4 layout (relative µs
``ts`` against ``baseTimeNanoseconds``, which Kineto writes after
``traceEvents``; ``distributedInfo`` with the rank): cpu_op (~60% of events,
with record_shapes args), python_function, cuda_runtime launches, kernels on
the GPU stream, ac2g and fwdbwd flows, ProfilerStep#N spans and process/thread
metadata, gzip level 1, one file per rank.

1. Throughput on the same files (default 4 ranks x 250 MB = 1 GB of JSON),
   interleaved rounds, best wall time: ``fastprof.merge`` gzip -> gzip against
   the floor ``gzip -dc inputs | gzip -1 > /dev/null`` (two processes, so two
   cores, like the merge). MB/s are of uncompressed input JSON.
2. A Composer-style Python merge of the same inputs: ``json.load`` each file
   (gzip), shift ``ts`` from its ``baseTimeNanoseconds`` onto rank 0's, remap
   pids per rank, ``json.dumps`` into gzip level 1, one file in memory at a
   time (its best case). Always run on a 2 ranks x 50 MB subset (with fastprof
   on the same subset); also on the full inputs when its subset figures say it
   finishes there in under 5 minutes and in under 40% of RAM.
3. Peak RSS of ``fastprof merge -q`` (a subprocess; its own ``ru_maxrss``
   from ``wait4`` in a fresh parent, see ``SPAWN``) on >= 2 GB of JSON (default 8 ranks x 275 MB), and of the
   Python merge on the subset for contrast.
4. Correctness: the output is a single gzip member whose CRC and length
   check; event count == events_out + metadata added + 1 (the merge's own
   metadata event); events_out == events_in - metadata_replaced; every merged
   pid is (rank + 1) * 100000 + n. On the subset the output is ``json.load``-ed
   and each rank's events are compared one by one with its input: same
   fields, one pid map per rank, one ts shift per rank equal to the base
   difference, one flow-id shift per input.

Targets (issue #3): merge time <= the gzip floor (ratio <= 1.0); >= 10x
faster than the Python merger; peak RSS <= 100 MB while merging >= 2 GB.

Run: python benches/bench_merge.py [--ranks 4] [--mb 250] [--big-gb 2.2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import fastprof
from _util import best, interleaved, machine, median, verdict

HERE = Path(__file__).resolve().parent
FASTPROF_CLI = str(Path(sys.executable).with_name("fastprof"))
BASE_NS = 1_727_000_000_000_000_000
CPU_PID = 3_141_592 % 4_194_304  # the same OS pid on every rank: separate hosts
SUBSET_RANKS, SUBSET_MB = 2, 50
BIG_RANKS = 8

# ---------------------------------------------------------------- synthetic Kineto traces

DEVICE_PROPERTIES = """[
    {
      "id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045379072,
      "computeMajor": 9, "computeMinor": 0,
      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
      "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
      "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472,
      "numSms": 132, "sharedMemPerBlockOptin": 232448
    }
  ]"""

LINEAR_INPUTS = (
    '"Concrete Inputs": ["", "", ""], "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"], '
    '"Input Strides": [[16777216, 4096, 1], [4096, 1], [1]], "Input Dims": [[4, 4096, 4096], [4096, 4096], [4096]]'
)
ADDMM_INPUTS = (
    '"Concrete Inputs": ["", "", "", "1", "1"], "Input type": ["c10::BFloat16", "c10::BFloat16", '
    '"c10::BFloat16", "Scalar", "Scalar"], "Input Strides": [[1], [4096, 1], [1, 4096], [], []], '
    '"Input Dims": [[4096], [16384, 4096], [4096, 4096], [], []]'
)
VIEW_INPUTS = (
    '"Concrete Inputs": ["", "[16384, 4096]"], "Input type": ["c10::BFloat16", "ScalarList"], '
    '"Input Strides": [[16777216, 4096, 1], []], "Input Dims": [[4, 4096, 4096], []]'
)
T_INPUTS = (
    '"Concrete Inputs": [""], "Input type": ["c10::BFloat16"], "Input Strides": [[4096, 1]], '
    '"Input Dims": [[4096, 4096]]'
)
TRANSPOSE_INPUTS = (
    '"Concrete Inputs": ["", "0", "1"], "Input type": ["c10::BFloat16", "Scalar", "Scalar"], '
    '"Input Strides": [[4096, 1], [], []], "Input Dims": [[4096, 4096], [], []]'
)
STRIDED_INPUTS = (
    '"Concrete Inputs": ["", "[4096, 4096]", "[1, 4096]", ""], "Input type": ["c10::BFloat16", "ScalarList", '
    '"ScalarList", ""], "Input Strides": [[4096, 1], [], [], []], "Input Dims": [[4096, 4096], [], [], []]'
)
NORM_INPUTS = (
    '"Concrete Inputs": ["", "[4096]", "", "", "1e-05", "True"], "Input type": ["c10::BFloat16", "ScalarList", '
    '"c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"], "Input Strides": [[16777216, 4096, 1], [], [1], [1], '
    '[], []], "Input Dims": [[4, 4096, 4096], [], [4096], [4096], [], []]'
)
GELU_INPUTS = (
    '"Concrete Inputs": ["", "tanh"], "Input type": ["c10::BFloat16", "std::string_view"], '
    '"Input Strides": [[67108864, 16384, 1], []], "Input Dims": [[4, 4096, 16384], []]'
)
MM_INPUTS = (
    '"Concrete Inputs": ["", ""], "Input type": ["c10::BFloat16", "c10::BFloat16"], '
    '"Input Strides": [[4096, 1], [1, 16384]], "Input Dims": [[16384, 4096], [4096, 16384]]'
)
EMPTY_INPUTS = (
    '"Concrete Inputs": ["[16384, 4096]", "15", "0", "", "", ""], "Input type": ["ScalarList", "Scalar", '
    '"Scalar", "Device", "Scalar", ""], "Input Strides": [[], [], [], [], [], []], '
    '"Input Dims": [[], [], [], [], [], []]'
)

GEMM = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1"
    "_execute_segment_k_off_kernel__5x_cublas"
)
LAYERS: dict[str, list[tuple[Any, ...]]] = {
    "Linear": [
        ("py", "nn.Module: Linear_{i}"),
        ("op", "aten::linear", LINEAR_INPUTS, True),
        ("op", "aten::t", T_INPUTS, True),
        ("op", "aten::transpose", TRANSPOSE_INPUTS, False),
        ("op", "aten::as_strided", STRIDED_INPUTS, False),
        ("op", "aten::view", VIEW_INPUTS, True),
        ("op", "aten::addmm", ADDMM_INPUTS, True),
        ("op", "aten::empty", EMPTY_INPUTS, False),
        ("op", "aten::_unsafe_view", VIEW_INPUTS, True),
        ("launch", GEMM, "[128, 32, 1]", "[384, 1, 1]", 168, 213504),
    ],
    "LayerNorm": [
        ("py", "nn.Module: LayerNorm_{i}"),
        ("op", "aten::layer_norm", NORM_INPUTS, True),
        ("op", "aten::native_layer_norm", NORM_INPUTS, True),
        ("op", "aten::empty", EMPTY_INPUTS, False),
        ("op", "aten::empty", EMPTY_INPUTS, False),
        ("op", "aten::view", VIEW_INPUTS, True),
        ("op", "aten::as_strided", STRIDED_INPUTS, False),
        ("op", "aten::view", VIEW_INPUTS, True),
        ("op", "aten::empty", EMPTY_INPUTS, False),
        (
            "launch",
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
            "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
            "c10::BFloat16*)",
            "[16384, 1, 1]",
            "[128, 1, 1]",
            40,
            0,
        ),
    ],
    "GELU": [
        ("py", "nn.Module: GELU_{i}"),
        ("op", "aten::gelu", GELU_INPUTS, True),
        ("op", "aten::empty_like", GELU_INPUTS, False),
        ("op", "aten::empty", EMPTY_INPUTS, False),
        ("op", "aten::view", VIEW_INPUTS, True),
        ("op", "aten::as_strided", STRIDED_INPUTS, False),
        ("op", "aten::view", VIEW_INPUTS, True),
        ("op", "aten::empty", EMPTY_INPUTS, False),
        ("op", "aten::_unsafe_view", VIEW_INPUTS, True),
        (
            "launch",
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::"
            "TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() "
            "const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::"
            "TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() "
            "const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)",
            "[65536, 1, 1]",
            "[128, 1, 1]",
            28,
            0,
        ),
    ],
    "AddmmBackward0": [
        ("py", "torch/autograd/graph.py(768): _engine_run_backward"),
        ("op", "autograd::engine::evaluate_function: AddmmBackward0", '"Concrete Inputs": []', False),
        ("op", "AddmmBackward0", '"Concrete Inputs": []', True),
        ("op", "aten::t", T_INPUTS, True),
        ("op", "aten::transpose", TRANSPOSE_INPUTS, False),
        ("op", "aten::mm", MM_INPUTS, True),
        ("op", "aten::empty", EMPTY_INPUTS, False),
        ("op", "aten::as_strided", STRIDED_INPUTS, False),
        ("op", "aten::sum", VIEW_INPUTS, True),
        ("launch", GEMM, "[128, 32, 1]", "[384, 1, 1]", 168, 213504),
        ("fwdbwd",),
    ],
}
LAYER_ORDER = ["LayerNorm", "Linear", "GELU", "Linear", "AddmmBackward0", "AddmmBackward0"]


def _x(cat: str, name: str, pid: Any, tid: Any, args: str) -> str:
    """An X event as Kineto's ChromeTraceLogger writes it; ts, dur and the
    leading ids are %-placeholders."""
    return (
        "\n  {\n"
        f'    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
        '    "ts": %.3f, "dur": %.3f,\n'
        f'    "args": {{\n      {args}\n    }}\n  }},'
    )


def _layer_template(kind: str, index: int, pid: int, tid: int) -> tuple[str, list[tuple[Any, ...]]]:
    """One layer's events as a %-template, and its specs (which values each event takes)."""
    parts: list[str] = []
    specs: list[tuple[Any, ...]] = []
    for spec in LAYERS[kind]:
        if spec[0] == "py":
            name = spec[1].format(i=index)
            args = '"Python parent id": %d, "Python id": %d, "Python module id": %d, "Python thread": 0'
            parts.append(_x("python_function", name, pid, tid, args))
            specs.append(("py",))
        elif spec[0] == "op":
            _, name, inputs, seq = spec
            inputs = inputs.replace("%", "%%")
            ids = '"External id": %d,"Sequence number": %d, "Fwd thread id": 0, ' if seq else '"External id": %d,'
            parts.append(_x("cpu_op", name, pid, tid, ids + f'"Record function id": 0, {inputs}, "Ev Idx": %d'))
            specs.append(("op", seq))
        elif spec[0] == "launch":
            _, kernel, grid, block, regs, smem = spec
            parts.append(
                _x(
                    "cuda_runtime",
                    "cudaLaunchKernel",
                    pid,
                    tid,
                    '"External id": %d,\n      "cbid": 211, "correlation": %d',
                )
            )
            parts.append(
                f'\n  {{\n    "ph": "s", "id": %d, "pid": {pid}, "tid": {tid}, "ts": %.3f,\n'
                '    "cat": "ac2g", "name": "ac2g"\n  },'
            )
            kargs = (
                '"External id": %d,\n      "queued": 0, "device": 0, "context": 1,\n'
                '      "stream": 7, "correlation": %d,\n'
                f'      "registers per thread": {regs},\n      "shared memory": {smem},\n'
                '      "blocks per SM": 0.969697,\n      "warps per SM": 11.636364,\n'
                f'      "grid": {grid},\n      "block": {block},\n      "est. achieved occupancy %%": 18'
            )
            parts.append(_x("kernel", kernel, 0, 7, kargs))
            parts.append(
                '\n  {\n    "ph": "f", "id": %d, "pid": 0, "tid": 7, "ts": %.3f,\n'
                '    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  },'
            )
            specs.append(("launch",))
        elif spec[0] == "fwdbwd":
            parts.append(
                f'\n  {{\n    "ph": "s", "id": %d, "pid": {pid}, "tid": {tid}, "ts": %.3f,\n'
                '    "cat": "fwdbwd", "name": "fwdbwd"\n  },'
                f'\n  {{\n    "ph": "f", "id": %d, "pid": {pid}, "tid": {tid + 1}, "ts": %.3f,\n'
                '    "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"\n  },'
            )
            specs.append(("fwdbwd",))
    return "".join(parts), specs


def _metadata(pid: int, tid: int, ts: float) -> str:
    def m(name: str, p: Any, t: Any, args: str) -> str:
        return (
            f'\n  {{\n    "name": "{name}", "ph": "M", "ts": {ts:.3f}, "pid": {p}, "tid": {t},\n'
            f'    "args": {{\n      {args}\n    }}\n  }},'
        )

    return "".join(
        [
            m("process_name", pid, 0, '"name": "python3"'),
            m("process_labels", pid, 0, '"labels": "CPU"'),
            m("process_sort_index", pid, 0, f'"sort_index": {pid}'),
            m("process_name", 0, 0, '"name": "python3"'),
            m("process_labels", 0, 0, '"labels": "GPU 0"'),
            m("process_sort_index", 0, 0, '"sort_index": 16777216'),
            m("thread_name", 0, 7, '"name": "stream 7 "'),
            m("thread_sort_index", 0, 7, '"sort_index": 7'),
            m("thread_name", pid, tid, f'"name": "thread {tid} (python3)"'),
            m("thread_sort_index", pid, tid, f'"sort_index": {tid}'),
            m("thread_name", pid, tid + 1, f'"name": "thread {tid + 1} (pt_autograd_0)"'),
            m("process_name", '"Spans"', 0, '"name": "Spans"'),
            m("process_sort_index", '"Spans"', 0, '"sort_index": 536870912'),
        ]
    )


def generate(path: str, rank: int, world: int, mb: float, corr_start: int = 0) -> tuple[int, int]:
    """Write one rank's trace (gzip level 1) of ~``mb`` MB of JSON; (JSON bytes, events).
    Correlation ids start after ``corr_start`` (a long-running process's are large)."""
    rng = random.Random(1000 + rank)
    pid, tid = CPU_PID, CPU_PID
    layers = [_layer_template(kind, i, pid, tid) for i, kind in enumerate(LAYER_ORDER * 4)]
    per_step = 1 + sum(
        len(sp) + 3 * sum(s[0] == "launch" for s in sp) + sum(s[0] == "fwdbwd" for s in sp) for _, sp in layers
    )
    gaps = [rng.randint(300, 4000) for _ in range(4099)]  # ns between events
    durs = [rng.randint(1500, 60000) for _ in range(4093)]
    target = int(mb * 1e6)
    base = BASE_NS + rank * 1_234_567_891  # ranks start their profilers at different times
    head = (
        f'{{\n  "schemaVersion": 1,\n  "deviceProperties": {DEVICE_PROPERTIES},\n'
        f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}, "pg_count": 1, '
        f'"pg_config": [{{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", '
        f'"pg_size": {world}, "ranks": {list(range(world))}}}], "nccl_version": "2.21.5"}},\n'
        '  "record_shapes": 1,\n  "profile_memory": 0,\n  "with_stack": 0,\n  "with_flops": 0,\n'
        '  "with_modules": 1,\n  "trace_id": "0F4B9A1E52C34D7A8E6B1C2D3E4F5A6B",\n  "traceEvents": ['
    )
    t = 2_000_000 + rank * 777  # ns from base
    ext = seq = evidx = pyid = 0
    corr = corr_start
    g = d = 0
    size = len(head)
    events = 0
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(head.encode())
        step = 0
        while size < target:
            step_start = t
            t += 1000
            body: list[str] = []
            for template, specs in layers:
                vals: list[float | int] = []
                for spec in specs:
                    kind = spec[0]
                    g = (g + 1) % len(gaps)
                    t += gaps[g]
                    d = (d + 1) % len(durs)
                    if kind == "op":
                        ext += 1
                        evidx += 1
                        if spec[1]:
                            seq += 1
                            vals += (t / 1000, durs[d] / 1000, ext, seq, evidx)
                        else:
                            vals += (t / 1000, durs[d] / 1000, ext, evidx)
                    elif kind == "py":
                        pyid += 1
                        vals += (t / 1000, durs[d] * 4 / 1000, pyid - 1, pyid, pyid % 97)
                    elif kind == "launch":
                        corr += 1
                        k = t + 4000 + gaps[g]
                        vals += (t / 1000, 4.231, ext, corr, corr, t / 1000)
                        vals += (k / 1000, durs[d] * 3 / 1000, ext, corr, corr, k / 1000)
                    else:  # fwdbwd
                        vals += (seq, t / 1000, seq, t / 1000 + 0.5)
                body.append(template % tuple(vals))
            ext += 1
            step_ev = _x(
                "user_annotation",
                f"ProfilerStep#{step}",
                pid,
                tid,
                '"External id": %d,"Record function id": 0, "Ev Idx": %d',
            ) % (step_start / 1000, (t - step_start) / 1000, ext, evidx)
            chunk = step_ev + "".join(body)
            size += len(chunk)
            events += per_step
            f.write(chunk.encode())
            step += 1
            t += 20_000
        tail = (
            _metadata(pid, tid, 2000.0)
            + f'\n  {{\n    "ph": "X", "cat": "Trace", "ts": 2000.000, "dur": {(t - 2_000_000) / 1000:.3f},\n'
            '    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
            '    "args": {\n      "Op count": 0\n    }\n  },'
            '\n  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
            f'    "pid": "", "tid": "", "ts": {t / 1000:.3f}\n  }}'
            f'\n  ],\n  "traceName": "{path[:-3]}",\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {base}\n}}'
        )
        events += 13 + 2
        size += len(tail)
        f.write(tail.encode())
    return size, events


def generate_set(tmp: Path, name: str, ranks: int, mb: float) -> tuple[list[str], int, int, float]:
    """Generate ``ranks`` files in parallel; (paths, JSON bytes, events, seconds)."""
    d = tmp / name
    d.mkdir()
    paths = [str(d / f"node{r:02d}_{CPU_PID}.1727000000{r:03d}.pt.trace.json.gz") for r in range(ranks)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(ranks, os.cpu_count() or 1)) as ex:
        results = list(ex.map(generate, paths, range(ranks), [ranks] * ranks, [mb] * ranks))
    return paths, sum(r[0] for r in results), sum(r[1] for r in results), time.perf_counter() - t0


# ---------------------------------------------------------------- the Python peer


def python_merge(output: str, inputs: list[str]) -> None:
    """Composer-style: load each trace whole, shift onto rank 0's base, remap pids, dump."""
    base_out: int | None = None
    first = True
    with gzip.open(output, "wb", compresslevel=1) as out:
        out.write(b'{"traceEvents": [')
        for path in inputs:
            with gzip.open(path, "rb") as f:
                trace = json.load(f)
            rank = trace["distributedInfo"]["rank"]
            base = trace["baseTimeNanoseconds"]
            if base_out is None:
                base_out = base
            shift = (base - base_out) / 1000
            pids: dict[Any, int] = {}
            for e in trace["traceEvents"]:
                if "ts" in e:
                    e["ts"] += shift
                if "pid" in e:
                    e["pid"] = pids.setdefault(e["pid"], (rank + 1) * 100_000 + len(pids))
            text = json.dumps(trace["traceEvents"])[1:-1]
            if text:
                out.write((text if first else ", " + text).encode())
                first = False
            del trace, text
        out.write(b'], "baseTimeNanoseconds": %d}' % (base_out or 0))


# ---------------------------------------------------------------- measuring


# Linux charges a child's ru_maxrss with the RSS high-water mark of the memory
# it was forked (or vforked) from, so a child of this process, which holds
# parsed traces, would report this process's peak. The command therefore runs
# under a fresh small interpreter and the figure is that grandchild's.
SPAWN = """
import os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{time.perf_counter() - t0} {usage.ru_maxrss * 1024} {os.waitstatus_to_exitcode(status)}")
"""


def run_measured(cmd: list[str], log: Path) -> tuple[float, int]:
    """Run ``cmd``; (wall seconds, its own peak RSS in bytes)."""
    result = log.with_suffix(".rusage")
    with open(log, "wb") as out:
        subprocess.run(
            [sys.executable, "-c", SPAWN, str(result), *cmd], stdout=out, stderr=subprocess.STDOUT, check=True
        )
    wall, rss, code = result.read_text().split()
    if int(code) != 0:
        sys.stdout.write(log.read_text(errors="replace")[-4000:])
        raise SystemExit(f"{cmd[:3]}... failed with exit code {code}")
    return float(wall), int(rss)


def fastprof_merge(inputs: list[str], output: str) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = fastprof.merge(inputs, output, force=True)
    for w in caught:
        print(f"  warning from fastprof.merge: {w.message}")
    return s


PID_RE = re.compile(rb'"pid": ?(-?\d+|"[^"]*")')


def scan_output(path: str) -> dict[str, Any]:
    """Stream-decompress a merge output: gzip members, JSON bytes, events
    (``"ph"`` keys), pids. zlib checks each member's CRC32 and length."""
    members, size, events = 0, 0, 0
    pids: set[bytes] = set()
    carry = b""
    d = None
    with open(path, "rb") as f:
        pending = f.read(1 << 20)
        while pending:
            if d is None:
                d, members = zlib.decompressobj(31), members + 1
            data = d.decompress(pending)
            pending = d.unused_data if d.eof else b""
            if d.eof:
                d = None
            if not pending:
                pending = f.read(1 << 20)
            size += len(data)
            buf = carry + data
            cut = buf.rfind(b"\n") + 1
            events += buf.count(b'"ph"', 0, cut)
            pids.update(PID_RE.findall(buf, 0, cut))
            carry = buf[cut:]
    events += carry.count(b'"ph"')
    pids.update(PID_RE.findall(carry))
    return {"members": members, "complete": d is None, "bytes": size, "events": events, "pids": pids}


def check_summary_and_scan(s: dict[str, Any], scan: dict[str, Any], ranks: int) -> list[str]:
    """Problems found in a merge's summary and its streamed output (empty: none)."""
    bad: list[str] = []
    if scan["members"] != 1 or not scan["complete"]:
        bad.append(f"{scan['members']} gzip members (complete: {scan['complete']}), expected one")
    if scan["bytes"] != s["bytes_uncompressed"]:
        bad.append(f"{scan['bytes']} JSON bytes in the file, summary says {s['bytes_uncompressed']}")
    if s["events_out"] != s["events_in"] - s["metadata_replaced"]:
        bad.append(f"events_out {s['events_out']} != events_in {s['events_in']} - replaced {s['metadata_replaced']}")
    if scan["events"] != s["events_out"] + s["metadata_added"] + 1:
        bad.append(f"{scan['events']} events in the file, expected events_out + metadata_added + 1")
    by_rank: dict[int, int] = {}
    for raw in scan["pids"]:
        try:
            pid = int(raw)
        except ValueError:
            bad.append(f"pid {raw!r} left unmapped")
            continue
        if pid == 0:
            continue
        by_rank[pid // 100_000 - 1] = by_rank.get(pid // 100_000 - 1, 0) + 1
    if sorted(by_rank) != list(range(ranks)):
        bad.append(f"merged pids belong to ranks {sorted(by_rank)}, expected 0..{ranks - 1}")
    if len(set(by_rank.values())) > 1:
        bad.append(f"pids per rank differ: {by_rank}")
    return bad


def check_events(output: str, inputs: list[str], s: dict[str, Any]) -> tuple[list[str], int]:
    """``json.load`` the output and compare each rank's events with its input; (problems, events)."""
    with gzip.open(output, "rb") as f:
        out = json.load(f)
    bad: list[str] = []
    evs = out["traceEvents"]
    if len(evs) != s["events_out"] + s["metadata_added"] + 1:
        bad.append(f"json.load: {len(evs)} events, expected {s['events_out'] + s['metadata_added'] + 1}")
    if out.get("otherData", {}).get("merged") is not True:
        bad.append("otherData.merged is not true")
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for e in evs:
        pid = e.get("pid")
        if not isinstance(pid, int):
            bad.append(f"non-integer pid in {e}")
            continue
        if pid == 0 or "ts" not in e:  # the merge's own metadata carries no ts
            continue
        per_rank.setdefault(pid // 100_000 - 1, []).append(e)
    base_out = out["baseTimeNanoseconds"]
    for path in inputs:
        with gzip.open(path, "rb") as f:
            trace = json.load(f)
        rank = trace["distributedInfo"]["rank"]
        want = [e for e in trace["traceEvents"] if not (e["ph"] == "M" and e["name"] == "process_sort_index")]
        got = per_rank.pop(rank, [])
        if len(got) != len(want):
            bad.append(f"rank {rank}: {len(got)} events out, {len(want)} in")
            continue
        shift = (trace["baseTimeNanoseconds"] - base_out) / 1000
        pid_map: dict[Any, int] = {}
        id_shift: set[int] = set()
        for a, b in zip(want, got, strict=True):
            if pid_map.setdefault(a["pid"], b["pid"]) != b["pid"]:
                bad.append(f"rank {rank}: pid {a['pid']} mapped to two pids")
                break
            if abs(b["ts"] - a["ts"] - shift) > 0.0015:
                bad.append(f"rank {rank}: ts {a['ts']} -> {b['ts']}, expected shift {shift}")
                break
            if "id" in a:
                id_shift.add(b["id"] - a["id"])
            if a["ph"] == "M" and a["name"] == "process_name":
                a["args"] = {"name": f"rank {rank}: {a['args']['name']}"}
            rest_a = {k: v for k, v in a.items() if k not in ("pid", "ts", "id")}
            rest_b = {k: v for k, v in b.items() if k not in ("pid", "ts", "id")}
            if rest_a != rest_b:
                bad.append(f"rank {rank}: event changed: {rest_a} -> {rest_b}")
                break
        if len(id_shift) > 1:
            bad.append(f"rank {rank}: flow ids shifted by {len(id_shift)} different amounts")
        if len(set(pid_map.values())) != len(pid_map):
            bad.append(f"rank {rank}: two input pids share an output pid")
        del trace, want, got
    if per_rank:
        bad.append(f"events with pids of ranks {sorted(per_rank)} that no input has")
    return bad, len(evs)


# ---------------------------------------------------------------- the run


def mb_s(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4, help="ranks in the throughput run (default 4)")
    ap.add_argument("--mb", type=float, default=250, help="MB of JSON per rank in the throughput run (default 250)")
    ap.add_argument("--big-gb", type=float, default=2.2, help="GB of JSON for the peak-RSS run (default 2.2)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds for the throughput pair (default 3)")
    ap.add_argument("--python-merge", nargs="+", help=argparse.SUPPRESS)  # OUT IN...: the peer, in a subprocess
    args = ap.parse_args()
    if args.python_merge:
        python_merge(args.python_merge[0], args.python_merge[1:])
        return

    print(f"machine: {machine()}")
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(f"RAM {ram / 2**30:.1f} GiB; fastprof merge threads: every core ({os.cpu_count()})\n")
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="fastprof-bench-merge-", dir="/tmp"))
    try:
        run(args, tmp, ram, load0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path, ram: int, load0: float) -> None:
    # ---- 1. throughput against the gzip floor
    paths, json_bytes, n_events, gen_s = generate_set(tmp, "main", args.ranks, args.mb)
    gz_bytes = sum(os.path.getsize(p) for p in paths)
    print(
        f"inputs: {args.ranks} ranks x {args.mb:g} MB = {json_bytes / 1e6:.0f} MB of Kineto JSON, {n_events} events, "
        f"{gz_bytes / 1e6:.0f} MB gzip -1 on disk ({json_bytes / gz_bytes:.1f}x); generated in {gen_s:.1f} s\n"
    )
    out = str(tmp / "merged.json.gz")
    summaries: list[dict[str, Any]] = []
    floor = "set -o pipefail; gzip -dc " + " ".join(paths) + " | gzip -1 > /dev/null"
    times = interleaved(
        {
            "fastprof": lambda: summaries.append(fastprof_merge(paths, out)),
            "gzip": lambda: subprocess.run(["bash", "-c", floor], check=True),
        },
        args.rounds,
    )
    s = summaries[-1]
    fp_t, gz_t = best(times["fastprof"]), best(times["gzip"])
    ratio = fp_t / gz_t
    print(f"1. throughput, gzip -> gzip, same files, best of {args.rounds} interleaved rounds (median in brackets):")
    print(f"  {'':34} {'wall s':>8} {'MB/s of input JSON':>20}")
    print(f"  {'fastprof.merge':34} {fp_t:8.2f} {mb_s(json_bytes, fp_t):20.0f}   ({median(times['fastprof']):.2f} s)")
    print(
        f"  {'gzip -dc | gzip -1 > /dev/null':34} {gz_t:8.2f} {mb_s(json_bytes, gz_t):20.0f}   "
        f"({median(times['gzip']):.2f} s)"
    )
    med_ratio = median(times["fastprof"]) / median(times["gzip"])
    print(f"  ratio fastprof / gzip floor        {ratio:8.2f}     target <= 1.0: {verdict(ratio <= 1.0)}")
    print(f"  ratio of the medians               {med_ratio:8.2f}")
    print(
        "  every round: fastprof "
        + " ".join(f"{t:.2f}" for t in times["fastprof"])
        + " s; gzip "
        + " ".join(f"{t:.2f}" for t in times["gzip"])
        + f" s; load average before the run {load0:.2f} (other work on the machine widens the spread)"
    )
    print(
        f"  output: {s['bytes_uncompressed'] / 1e6:.0f} MB JSON -> {s['bytes_written'] / 1e6:.0f} MB gzip; "
        f"events in {s['events_in']}, out {s['events_out']}, metadata replaced {s['metadata_replaced']}, "
        f"added {s['metadata_added']}\n"
    )
    t0 = time.perf_counter()
    scan = scan_output(out)
    bad_full = check_summary_and_scan(s, scan, args.ranks)
    scan_s = time.perf_counter() - t0
    os.remove(out)

    # ---- 2. the Python peer: subset always, full when it fits
    sub_paths, sub_bytes, _, _ = generate_set(tmp, "subset", SUBSET_RANKS, SUBSET_MB)
    sub_out = str(tmp / "subset.json.gz")
    sub_fp = interleaved({"fastprof": lambda: summaries.append(fastprof_merge(sub_paths, sub_out))}, 3)["fastprof"]
    sub_s = summaries[-1]
    py_cmd = [sys.executable, str(HERE / "bench_merge.py"), "--python-merge", str(tmp / "py.json.gz")]
    py_sub_t, py_sub_rss = run_measured(py_cmd + sub_paths, tmp / "py.log")
    os.remove(tmp / "py.json.gz")
    est_t = py_sub_t * json_bytes / sub_bytes
    est_rss = py_sub_rss * (args.mb / SUBSET_MB)  # one file in memory at a time
    full_py: tuple[float, int] | None = None
    if est_t < 300 and est_rss < 0.4 * ram:
        py_t, py_rss = run_measured(py_cmd + paths, tmp / "py.log")
        os.remove(tmp / "py.json.gz")
        full_py = (py_t, py_rss)
    print("2. against a Composer-style Python merge (json.load, shift ts, remap pids, json.dumps -> gzip -1):")
    sub_ratio = py_sub_t / best(sub_fp)
    print(
        f"  subset {SUBSET_RANKS} ranks x {SUBSET_MB} MB ({sub_bytes / 1e6:.0f} MB): Python {py_sub_t:.2f} s "
        f"({mb_s(sub_bytes, py_sub_t):.0f} MB/s), fastprof {best(sub_fp):.2f} s "
        f"({mb_s(sub_bytes, best(sub_fp)):.0f} MB/s) -> {sub_ratio:.1f}x faster   "
        f"target >= 10x: {verdict(sub_ratio >= 10)}"
    )
    if full_py is not None:
        full_ratio = full_py[0] / fp_t
        print(
            f"  full {args.ranks} ranks x {args.mb:g} MB ({json_bytes / 1e6:.0f} MB): Python {full_py[0]:.2f} s "
            f"({mb_s(json_bytes, full_py[0]):.0f} MB/s), fastprof {fp_t:.2f} s -> {full_ratio:.1f}x faster   "
            f"target >= 10x: {verdict(full_ratio >= 10)}"
        )
    else:
        print(
            f"  full inputs skipped for Python: estimated {est_t:.0f} s and {est_rss / 1e9:.1f} GB peak "
            "from the subset (limits: 300 s, 40% of RAM); the ratio above is on the subset"
        )
    print()
    t0 = time.perf_counter()
    sub_scan = scan_output(sub_out)
    bad_sub = check_summary_and_scan(sub_s, sub_scan, SUBSET_RANKS)
    bad_ev, sub_events = check_events(sub_out, sub_paths, sub_s)
    bad_sub += bad_ev
    check_s = time.perf_counter() - t0
    shutil.rmtree(tmp / "main")
    shutil.rmtree(tmp / "subset")
    os.remove(sub_out)

    # ---- 3. peak RSS on >= 2 GB
    per_rank_mb = args.big_gb * 1000 / BIG_RANKS
    big_paths, big_bytes, _, big_gen_s = generate_set(tmp, "big", BIG_RANKS, per_rank_mb)
    big_out = str(tmp / "big.json.gz")
    big_t, big_rss = run_measured([FASTPROF_CLI, "merge", *big_paths, "-o", big_out, "-f", "-q"], tmp / "big.log")
    big_written = os.path.getsize(big_out)
    shutil.rmtree(tmp / "big")
    os.remove(big_out)
    print("3. peak RSS (ru_maxrss of the merging process itself, from wait4 in a fresh parent):")
    print(
        f"  fastprof merge -q, {BIG_RANKS} ranks x {per_rank_mb:.0f} MB = {big_bytes / 1e6:.0f} MB JSON "
        f"(generated in {big_gen_s:.0f} s): {big_rss / 1e6:.0f} MB, {big_t:.1f} s "
        f"({mb_s(big_bytes, big_t):.0f} MB/s), "
        f"{big_written / 1e6:.0f} MB written   target <= 100 MB: {verdict(big_rss <= 100e6)}"
    )
    print(f"  Python merge, subset {SUBSET_RANKS} x {SUBSET_MB} MB: {py_sub_rss / 1e6:.0f} MB")
    if full_py is not None:
        print(f"  Python merge, full {args.ranks} x {args.mb:g} MB: {full_py[1] / 1e6:.0f} MB")
    print()

    # ---- 4. correctness
    print("4. correctness of the fastprof outputs:")
    print(
        f"  full run ({scan_s:.1f} s, streamed): {scan['members']} gzip member(s) read to the end (zlib checks "
        f"CRC32 and length), {scan['bytes']} JSON bytes, "
        f"{scan['events']} events, {len(scan['pids'])} distinct pids"
    )
    for b in bad_full:
        print(f"    PROBLEM: {b}")
    print(
        f"  subset ({check_s:.1f} s, json.load): {sub_scan['members']} gzip member, {sub_events} events, "
        "each rank's events == its input's (pid map, ts shift = base difference, flow-id shift, fields)"
    )
    for b in bad_sub:
        print(f"    PROBLEM: {b}")
    print(f"  all checks: {verdict(not bad_full and not bad_sub)}")


if __name__ == "__main__":
    main()
