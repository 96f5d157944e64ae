"""Run directories on object storage, the reading side (issue #26): the core's
one input walker and one opener take fsspec URLs, so ``fastprof merge``,
``read_columns``, the step analysis and the reports read a run on S3 as they
read it on disk, streaming each object by ranged reads.

Against a real S3 server (moto's: tests/moto_s3.py), ``memory://`` and
``file://``; the run is a real Profiler run on CPU torch, uploaded with the
store fastprof's own uploader uses."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import fastprof
from fastprof import _core
from fastprof.storage.backend import READ_BLOCK, FsspecRemote
from fastprof.storage.store import open_store


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Profiler run on CPU torch: a fastprof segment, two saved torch
    windows, profiler.json and the run's own merged trace.json.gz."""
    root = tmp_path_factory.mktemp("remote-read")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(4, 16), torch.randint(0, 4, (4,))) for _ in range(10)]
    with fastprof.Profiler(
        out_dir=root,
        run_name="run",
        schedule=fastprof.schedule.steps([(2, 4), (6, 8)], warmup=1),
        torch=fastprof.TorchWindows(),
    ) as prof:
        for x, y in prof.loader(batches):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    run = root / "run"
    assert len(list((run / "rank0" / "torch").glob("*.pt.trace.json.gz"))) == 2
    assert (run / "rank0" / "profiler.json").is_file() and (run / "trace.json.gz").is_file()
    # What a run directory also holds: a report's folder, a hidden file.
    (run / "reports").mkdir(exist_ok=True)
    (run / "reports" / "report.json").write_text('{"speed": {}}')
    (run / "rank0" / ".half.pt.trace.json.tmp-1.json").write_text('{"traceEv')
    return run


def _upload(run: Path, url: str) -> None:
    store = open_store(url)
    for f in sorted(run.rglob("*")):
        if f.is_file():
            store.put(f, f.relative_to(run).as_posix())


def _as_url(paths: list[str], run: Path, url: str) -> list[str]:
    return [p.replace(str(run), url, 1) for p in paths]


def _merged_events(path: Path) -> list[str]:
    """The events of a merged output, parsed by Python's json, sorted (each
    input is written by one of the merge's parallel workers)."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
    return sorted(json.dumps(e, sort_keys=True) for e in doc["traceEvents"])


def _text(value: Any) -> str:
    """``value`` as JSON text (numpy arrays as lists): NaN compares equal."""
    return json.dumps(value, sort_keys=True, default=lambda a: np.asarray(a).tolist())


def _same_columns(remote: fastprof.Columns, local: fastprof.Columns, run: Path, url: str) -> None:
    for kind in ("spans", "instants", "counters"):
        a, b = getattr(remote, kind), getattr(local, kind)
        assert a.keys() == b.keys()
        for col in a:
            assert np.array_equal(a[col], b[col]), (kind, col)
    assert remote.names == local.names and remote.categories == local.categories
    assert [f["path"] for f in remote.files] == _as_url([str(f["path"]) for f in local.files], run, url)
    assert [(f["kind"], f["rank"], f["events"], f["skipped"]) for f in remote.files] == [
        (f["kind"], f["rank"], f["events"], f["skipped"]) for f in local.files
    ]
    assert remote.warnings == _as_url(local.warnings, run, url)


def _check_same_as_local(run: Path, url: str, out: Path) -> None:
    """Inputs, columns, the step analysis and a merge of ``url`` give what
    the same calls give on the local directory ``run``."""
    local = _core.trace_inputs([str(run)])
    remote = _core.trace_inputs([url])
    assert remote[0] == _as_url(local[0], run, url)
    assert any("/rank0/torch/" in f for f in remote[0]) and any(f.endswith("trace.json.gz") for f in remote[0])
    assert remote[1] == _as_url(local[1], run, url)
    assert f"{url}/reports/report.json" in remote[1] and f"{url}/rank0/profiler.json" in remote[1]
    assert not any(".tmp-" in f for f in remote[0] + remote[1])
    assert remote[2] == [] and remote[3] == local[3] == []

    cols = fastprof.read_columns(url)
    assert len(cols.spans["ts"]) > 100
    _same_columns(cols, fastprof.read_columns(run), run, url)

    a, b = _core.analyze_steps([url]), _core.analyze_steps([str(run)])
    assert a["step_count"] == b["step_count"] > 0
    # As text: the per-rank summaries hold NaN (no GPU), never equal to itself.
    assert _text(a["summaries"]) == _text(b["summaries"])
    assert _text(a["bars"]) == _text(b["bars"])
    for col in b["steps"]:
        assert np.array_equal(a["steps"][col], b["steps"][col], equal_nan=a["steps"][col].dtype.kind == "f"), col
    assert [f["path"] for f in a["files"]] == _as_url([str(f["path"]) for f in b["files"]], run, url)

    out.mkdir()
    mr = fastprof.merge(url, out / "remote.json")
    ml = fastprof.merge(run, out / "local.json")
    assert (mr["files"], mr["events_out"], mr["ranks"]) == (ml["files"], ml["events_out"], ml["ranks"])
    assert mr["own_files"] == _as_url(ml["own_files"], run, url)
    events = _merged_events(out / "remote.json")
    assert len(events) > 100
    assert events == _merged_events(out / "local.json")
    # The core's merge, gzip output, straight from the binding.
    _core.merge([url], str(out / "core.json.gz"))
    assert _merged_events(out / "core.json.gz") == events


def test_an_s3_run_reads_as_the_local_run(run_dir: Path, s3_url: str, tmp_path: Path) -> None:
    url = f"{s3_url}/run"
    _upload(run_dir, url)
    _check_same_as_local(run_dir, url, tmp_path / "out")
    # One object named by its URL is that file, whatever its name.
    one = f"{url}/rank0/fastprof.0.json.gz"
    assert _core.trace_inputs([one])[0] == [one]
    assert fastprof.read_columns(one).files[0]["path"] == one


def test_memory_and_file_urls_without_a_server(run_dir: Path, tmp_path: Path) -> None:
    url = f"memory://fastprof-{uuid.uuid4().hex[:8]}/run"
    _upload(run_dir, url)
    _check_same_as_local(run_dir, url, tmp_path / "memory")
    # A chain keeps its prefix on every object it lists.
    chained = f"simplecache::{url}"
    assert _core.trace_inputs([chained])[0] == [f"simplecache::{f}" for f in _core.trace_inputs([url])[0]]
    _check_same_as_local(run_dir, f"file://{run_dir}", tmp_path / "file")


def _readers(url: str, out: Path) -> list[Callable[[], object]]:
    """Every reader of a URL input."""
    return [
        lambda: _core.trace_inputs([url]),
        lambda: fastprof.read_columns(url),
        lambda: _core.analyze_steps([url]),
        lambda: fastprof.merge(url, out),
    ]


def test_a_missing_url_is_a_file_not_found_error_naming_it(s3_url: str, tmp_path: Path) -> None:
    open_store(s3_url).put(_write(tmp_path / "a.json", b'{"traceEvents": []}'), "other/a.json")
    # Nothing there, a key prefix that is no folder, another protocol.
    for url in (f"{s3_url}/nope", f"{s3_url}/oth", "memory://fastprof-missing/run"):
        for call in _readers(url, tmp_path / "out.json.gz"):
            with pytest.raises(FileNotFoundError, match=url) as e:
                call()
            assert isinstance(e.value, fastprof.FastprofFileNotFoundError)
            assert e.value.filename == url
    with pytest.raises(fastprof.FastprofOSError, match="glob"):
        _core.trace_inputs([f"{s3_url}/*/a.json"])
    assert not (tmp_path / "out.json.gz").exists()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


class _Recorded:
    """A file from FsspecRemote.open that records what it is asked, and the
    ranges fsspec fetches under it."""

    def __init__(self, f: Any, fail_after: int | None) -> None:
        self.f = f
        self.fail_after = fail_after
        self.largest = 0
        self.total = 0
        self.fetches: list[tuple[int, int]] = []
        fetch = f.cache.fetcher

        def recorded_fetch(start: int, end: int) -> bytes:
            self.fetches.append((start, end))
            data: bytes = fetch(start, end)
            return data

        f.cache.fetcher = recorded_fetch

    def read(self, n: int = -1) -> bytes:
        if self.fail_after is not None and self.total >= self.fail_after:
            raise ConnectionResetError("connection reset by peer")
        self.largest = max(self.largest, n)
        data: bytes = self.f.read(n)
        self.total += len(data)
        return data

    def close(self) -> None:
        self.f.close()


class _RecordingRemote(FsspecRemote):
    def __init__(self, fail_after: int | None = None) -> None:
        self.fail_after = fail_after
        self.opened: list[_Recorded] = []

    def open(self, url: str) -> Any:
        f = _Recorded(super().open(url), self.fail_after)
        self.opened.append(f)
        return f


@pytest.fixture
def recording() -> Iterator[type[_RecordingRemote]]:
    """Swap the registered backend for a recording one, then put it back."""
    yield _RecordingRemote
    _core._set_remote(FsspecRemote())


def _big_trace(min_bytes: int) -> tuple[bytes, int]:
    pad = "x" * 200
    events = []
    n = 0
    size = 0
    while size < min_bytes:
        e = (
            f'{{"ph":"X","cat":"user","name":"op{n % 50}","pid":1,"tid":1,'
            f'"ts":{n}.000,"dur":1.000,"args":{{"p":"{pad}"}}}}'
        )
        events.append(e)
        size += len(e) + 1
        n += 1
    return ('{"baseTimeNanoseconds":1700000000000000000,"traceEvents":[' + ",".join(events) + "]}").encode(), n


def test_a_large_object_streams_in_bounded_ranged_reads(
    s3_url: str, tmp_path: Path, recording: type[_RecordingRemote]
) -> None:
    data, n = _big_trace(24 << 20)
    url = f"{s3_url}/big/host_1.pt.trace.json"
    open_store(s3_url).put(_write(tmp_path / "big.json", data), "big/host_1.pt.trace.json")
    remote = recording()
    _core._set_remote(remote)
    cols = fastprof.read_columns(url)
    assert len(cols.spans["ts"]) == n
    [f] = remote.opened
    assert f.total == len(data)
    # The core asks for at most its 1 MiB scanning buffer at a time...
    assert f.largest <= 1 << 20, f.largest
    # ...and fsspec fetches the object by ranges of about READ_BLOCK, never whole.
    assert len(f.fetches) >= 3, f.fetches
    assert max(end - start for start, end in f.fetches) <= READ_BLOCK + (1 << 20), f.fetches
    assert f.fetches[0][0] == 0 and f.fetches[-1][1] == len(data)


def test_a_read_failing_mid_stream_is_an_error_naming_the_url(
    s3_url: str, tmp_path: Path, recording: type[_RecordingRemote]
) -> None:
    data, _ = _big_trace(3 << 20)
    url = f"{s3_url}/run/rank0/fastprof.0.json"
    open_store(s3_url).put(_write(tmp_path / "t.json", data), "run/rank0/fastprof.0.json")
    _core._set_remote(recording(fail_after=1 << 20))
    # Not a salvage of what was read before: the object did not end there.
    for target in (url, f"{s3_url}/run"):
        with pytest.raises(fastprof.FastprofOSError, match="ConnectionResetError: connection reset by peer") as e:
            fastprof.read_columns(target)
        assert e.value.filename == url
        with pytest.raises(fastprof.FastprofOSError, match="ConnectionResetError"):
            fastprof.merge(target, tmp_path / "out.json.gz")
    assert not (tmp_path / "out.json.gz").exists()


def test_a_protocol_without_its_package_is_the_one_line_config_error() -> None:
    import importlib.util

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    for call in (lambda: _core.trace_inputs(["gs://b/runs/run1"]), lambda: fastprof.read_columns("gs://b/x")):
        with pytest.raises(fastprof.ConfigError, match=r"needs the gcs extra: pip install 'fastprof-torch\[gcs\]'"):
            call()
