"""Shared fixtures for the fastprof test suite.

Traces are read back here with Python's own ``gzip``/``zlib`` and ``json``,
never with ``fastprof.read_trace``, so that the files are checked
independently of the Rust reader. Every test runs with the ``FASTPROF_*`` and
torchrun variables cleared, in its own temporary working directory, and with
no recorder left running afterwards.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import warnings
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# torch runs single-threaded in the tests and every job they start (the
# variable is inherited): CI runs 3 test workers on 2 cores, where OpenMP's
# waiting threads spin on the cores the other jobs need. Beside a CPU hog,
# `fastprof demo` took 41 s of CPU with torch's default threads and 22 s with
# one. Set before torch is first imported here; a test may still ask for more.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import fastprof
from moto_s3 import moto_server, s3_url  # noqa: F401  (fixtures: a real S3 server and a fresh bucket)

# Variables that change where or how the recorder runs; cleared for every test.
ENV_VARS = (
    "FASTPROF_OUT_DIR",
    "FASTPROF_RUN_NAME",
    "FASTPROF_BUFFER_SIZE",
    "FASTPROF_BUFFER_GROWTH",
    "FASTPROF_FLUSH_INTERVAL",
    "FASTPROF_SEGMENT_SIZE",
    "FASTPROF_SEGMENT_SECONDS",
    "FASTPROF_MAX_DISK",
    "FASTPROF_KEEP_SEGMENTS",
    "FASTPROF_RANK",
    "FASTPROF_RESUME",
    "FASTPROF_SAMPLE_HZ",
    "FASTPROF_SAMPLE_SYSTEM_HZ",
    "FASTPROF_SAMPLE_PER_CPU",
    "FASTPROF_SAMPLE_GPUS",
    "FASTPROF_SAMPLE_HISTORY",
    "FASTPROF_COMPRESSION_LEVEL",
    "FASTPROF_HOST_SAMPLER",
    "FASTPROF_WINDOW_SECONDS",
    "FASTPROF_WINDOW_BYTES",
    "FASTPROF_SPOOL_DIR",
    "FASTPROF_UPLOAD_TIMEOUT",
    "FASTPROF_CLOCK",
    "FASTPROF_TEST_SAMPLER_PANIC_AFTER",
    "FASTPROF_TEST_CLOCK_SKEW_NS",
    "FASTPROF_TEST_FAULT",
    "FASTPROF_RECORDING_PID",
    "FASTPROF_SCHEDULE",
    "FASTPROF_GATE_SPANS",
    "FASTPROF_MERGE",
    "FASTPROF_MERGE_TIMEOUT",
    "FASTPROF_SYNC_CLOCKS",
    "FASTPROF_TORCH",
    "FASTPROF_MLFLOW",
    "FASTPROF_TEST_EXPORT_DELAY_S",
    *(
        f"FASTPROF_TORCH_{n.upper()}"
        for n in (
            "activities",
            "record_shapes",
            "profile_memory",
            "with_stack",
            "with_flops",
            "with_modules",
            "use_gzip",
            "folder",
            "filename",
            "num_traces_to_keep",
            "overwrite",
            "memory_timeline",
        )
    ),
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
)

SEGMENT_RE = re.compile(r"^fastprof\.(\d+)\.json\.gz$")
# Every "ts"/"dur" value in the raw JSON text, whatever it looks like.
TIME_VALUE_RE = re.compile(r'"(ts|dur)":\s*([^,}\s]*)')
# The only accepted form: µs with exactly three decimals.
THREE_DECIMALS_RE = re.compile(r"^-?\d+\.\d{3}$")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Clean environment and cwd; stop any recorder a test left running."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    # Recorder tests count events exactly: the sampler (on by default) would add
    # its counters. Sampler tests pass sample_hz explicitly, which wins over this.
    monkeypatch.setenv("FASTPROF_SAMPLE_HZ", "0")
    monkeypatch.chdir(tmp_path)
    yield
    with warnings.catch_warnings():
        # A drop warning at teardown belongs to a test that already failed.
        warnings.simplefilter("ignore")
        fastprof.stop()
    assert not fastprof.is_active()


# ------------------------------------------------------------------ reading


@dataclass
class Segment:
    path: Path
    index: int
    text: str
    doc: dict[str, Any]

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.doc["traceEvents"]

    @property
    def other(self) -> dict[str, Any]:
        return self.doc["otherData"]

    @property
    def base_ns(self) -> int:
        return self.doc["baseTimeNanoseconds"]


@dataclass
class RunTrace:
    """All closed segments of one trace directory, in index order."""

    trace_dir: Path
    segments: list[Segment]
    parts: list[Path] = field(default_factory=list)

    @property
    def events(self) -> list[dict[str, Any]]:
        return [e for s in self.segments for e in s.events]

    @property
    def others(self) -> list[dict[str, Any]]:
        return [s.other for s in self.segments]

    @property
    def final(self) -> dict[str, Any]:
        return self.segments[-1].other

    def of(self, ph: str, name: str | None = None, tid: int | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("ph") == ph and (name is None or e.get("name") == name) and (tid is None or e.get("tid") == tid)
        ]

    def data_events(self) -> list[dict[str, Any]]:
        """Everything except metadata (``ph == "M"``)."""
        return [e for e in self.events if e.get("ph") != "M"]

    def thread_names(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for e in self.of("M", "thread_name"):
            out[e["tid"]] = e["args"]["name"]
        return out

    def spans_abs(self) -> list[tuple[int, int, dict[str, Any]]]:
        """X events as (start epoch ns, end epoch ns, event), in file order."""
        out = []
        for s in self.segments:
            for e in s.events:
                if e.get("ph") == "X":
                    t0 = s.base_ns + us_to_ns(e["ts"])
                    out.append((t0, t0 + us_to_ns(e["dur"]), e))
        return out


def us_to_ns(v: float) -> int:
    """Three-decimal µs back to integer ns (exact for such values)."""
    return round(v * 1000)


def load_segment(path: Path) -> Segment:
    """Read one closed segment: a single gzip member holding one JSON object."""
    m = SEGMENT_RE.match(path.name)
    assert m, f"unexpected segment name {path.name}"
    raw = path.read_bytes()
    d = zlib.decompressobj(wbits=31)
    body = d.decompress(raw) + d.flush()
    assert d.eof, f"{path}: gzip stream does not end"
    assert d.unused_data == b"", f"{path}: more than one gzip member"
    # And Python's own gzip module agrees.
    assert gzip.decompress(raw) == body
    text = body.decode("utf-8")
    doc = json.loads(text)
    assert isinstance(doc, dict), f"{path}: not a JSON object"
    for key in ("baseTimeNanoseconds", "traceEvents", "otherData"):
        assert key in doc, f"{path}: no {key}"
    assert isinstance(doc["baseTimeNanoseconds"], int)
    assert isinstance(doc["traceEvents"], list)
    return Segment(path=path, index=int(m.group(1)), text=text, doc=doc)


def read_run(trace_dir: Path | str, *, allow_parts: bool = False) -> RunTrace:
    """Read every closed segment of ``trace_dir`` with gzip + json."""
    trace_dir = Path(trace_dir)
    assert trace_dir.is_dir(), f"{trace_dir} is not a directory"
    parts = sorted(trace_dir.glob("*.part"))
    if not allow_parts:
        assert parts == [], f"open segments left behind: {parts}"
    seg_paths = [p for p in trace_dir.iterdir() if SEGMENT_RE.match(p.name)]
    segments = sorted((load_segment(p) for p in seg_paths), key=lambda s: s.index)
    assert segments, f"no closed segment in {trace_dir}: {sorted(os.listdir(trace_dir))}"
    assert [s.index for s in segments] == list(range(len(segments))), "segment indices not 0..N-1"
    return RunTrace(trace_dir=trace_dir, segments=segments, parts=parts)


def assert_time_format(text: str) -> int:
    """Every ts/dur in the raw text has exactly three decimals; returns how many."""
    n = 0
    for key, value in TIME_VALUE_RE.findall(text):
        assert THREE_DECIMALS_RE.match(value), f'"{key}":{value} is not µs with three decimals'
        n += 1
    return n


def assert_strict_nesting(run: RunTrace) -> dict[int, list[tuple[int, int, int, dict]]]:
    """Check that X events nest strictly per thread.

    Returns, per tid, ``(start_ns, end_ns, depth, event)`` in file order, where
    depth is the number of spans of the same thread that enclose the event.
    """
    per_tid: dict[int, list[tuple[int, int, int, dict]]] = defaultdict(list)
    for idx, (t0, t1, e) in enumerate(run.spans_abs()):
        assert t1 >= t0, f"negative duration: {e}"
        per_tid[e["tid"]].append((t0, t1, idx, e))
    result: dict[int, list[tuple[int, int, int, dict]]] = {}
    for tid, spans in per_tid.items():
        depth_of: dict[int, int] = {}
        stack: list[tuple[int, dict]] = []  # (end, event) of enclosing spans
        for t0, t1, idx, e in sorted(spans, key=lambda s: (s[0], -s[1], s[2])):
            while stack and stack[-1][0] <= t0:
                stack.pop()
            if stack:
                assert t1 <= stack[-1][0], (
                    f"tid {tid}: {e['name']} [{t0}, {t1}] overlaps {stack[-1][1]['name']} "
                    f"ending at {stack[-1][0]} without being inside it"
                )
            depth_of[idx] = len(stack)
            stack.append((t1, e))
        result[tid] = [(t0, t1, depth_of[idx], e) for t0, t1, idx, e in spans]
    return result


class Traces:
    """What tests use to read and check traces (a fixture, so no imports are needed)."""

    read = staticmethod(read_run)
    load_segment = staticmethod(load_segment)
    time_format = staticmethod(assert_time_format)
    nesting = staticmethod(assert_strict_nesting)
    us_to_ns = staticmethod(us_to_ns)


@pytest.fixture
def traces() -> type[Traces]:
    return Traces


# ------------------------------------------------------------- subprocesses


@dataclass
class PyScript:
    """Run Python source as a real subprocess of the interpreter under test."""

    tmp_path: Path

    def write(self, source: str, name: str = "script.py") -> Path:
        path = self.tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    def run(
        self,
        source: str,
        *args: str,
        timeout: float = 90,
        env: dict[str, str] | None = None,
        name: str = "script.py",
    ) -> subprocess.CompletedProcess[str]:
        path = self.write(source, name)
        try:
            return subprocess.run(
                [sys.executable, str(path), *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, **(env or {})},
                cwd=self.tmp_path,
            )
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{name} did not finish within {timeout} s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")


@pytest.fixture
def pyscript(tmp_path: Path) -> PyScript:
    return PyScript(tmp_path)


#: torchrun's own variables: a test's torchrun must not inherit a parent job's.
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def summarised_rank(run: Path, rank: int, profiler_json: str | None = None, **doc: object) -> Path:
    """``run/rank{rank}``: a stand-in segment (100 + rank bytes), its
    profiler.json (``profiler_json``, else naming run ``job`` and the rank)
    and a rank summary current for that segment (``doc`` over its required
    members)."""
    from fastprof.reports import summaries  # the reports only for the tests that ask

    d = run / f"rank{rank}"
    d.mkdir(parents=True)
    (d / "fastprof.0.json.gz").write_bytes(b"x" * (100 + rank))
    own = json.dumps({"run_name": "job", "rank": rank}) if profiler_json is None else profiler_json
    (d / "profiler.json").write_text(own)
    base = {
        "format": summaries.FORMAT,
        "version": summaries.VERSION,
        "fastprof_version": fastprof.__version__,
        "run_name": "job",
        "rank": rank,
        "segments": summaries.segments_of(d),
    }
    summaries.write(d, base | doc)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(
    script: Path, *args: str, cwd: Path, timeout: float, nproc: int = 2, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --nproc-per-node N script args`` on
    this host (gloo on the loopback interface, no FASTPROF_* or torchrun
    variables inherited, no sampler unless ``env`` says), asserted to exit 0."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_") and k not in TORCHRUN_VARS}
    base.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", FASTPROF_SAMPLE_HZ="0", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(free_port()), str(script), *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})}, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish within {timeout} s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    assert r.returncode == 0, f"torchrun failed ({r.returncode})\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


# ------------------------------------------------------------- scheduling

#: The files that take longest (minutes of CPU each, measured on CI's 2
#: cores), run first: pytest-xdist hands files to workers in collection order,
#: and one of these started last kept one worker busy alone at the end (a
#: core idle for minutes). Longest first; the rest keep their order.
LONGEST_FIRST = (
    "test_exit_matrix.py",
    "test_triggers.py",
    "test_run_cmd.py",
    "test_readme.py",
    "test_exits.py",
    "test_run_dir.py",
    "test_doctor.py",
    "test_storage_runs.py",
    "test_anatomy.py",
    "test_cli_exits.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order
