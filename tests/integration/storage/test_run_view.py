"""One view of a run wherever it lives (issue #35, item 2): ``open_run`` of a
run directory on this machine and of the same run in a store answer what the
verbs and reports ask alike: the files under it, one file read whole, where
a file named after it goes, the run as the reports read it (what the core
reads, the side documents, the segments, where a recorded file is now) and
where a report's files go. A store's copy of the side documents is gone when
the view is closed, or collected.

The run is a real Profiler run on CPU; the stores are moto's S3 server,
``memory://`` and ``file://``."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import fastprof
from fastprof.cli.main import main
from fastprof.storage.run_view import RunView, newest_ns, open_run
from fastprof.storage.store import open_store


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run-view")
    with fastprof.Profiler(out_dir=root, run_name="run", torch=False, sample_hz=0) as prof:
        for _ in range(4):
            with fastprof.span("work"):
                pass
            prof.step()
    run = root / "run"
    assert (run / "rank0" / "profiler.json").is_file() and (run / "trace.json.gz").is_file()
    assert list((run / "rank0").glob("fastprof.*.json.gz"))
    return run


def _upload(run: Path, url: str) -> None:
    store = open_store(url)
    for f in sorted(run.rglob("*")):
        if f.is_file():
            store.put(f, f.relative_to(run).as_posix())


def _s3(s3_url: str) -> str:
    return f"{s3_url}/run"


def _memory(_: str) -> str:
    return f"memory://fastprof-{uuid.uuid4().hex[:8]}/run"


STORES: dict[str, Callable[[str], str]] = {"s3": _s3, "memory": _memory}


@pytest.fixture(params=["s3", "memory", "file"])
def stored(request: pytest.FixtureRequest, run_dir: Path, tmp_path: Path) -> str:
    """The run's URL in a store: a copy of it (s3, memory), or itself (file)."""
    if request.param == "file":
        return f"file://{run_dir}"
    s3_url = request.getfixturevalue("s3_url") if request.param == "s3" else ""
    url = STORES[request.param](s3_url)
    _upload(run_dir, url)
    return url


def test_the_location_answers_alike_here_and_in_a_store(run_dir: Path, stored: str) -> None:
    here, there = open_run(run_dir), open_run(stored + "/")
    assert there.name == stored and here.name == str(run_dir)
    assert here.local_path == run_dir and there.local_path is None
    assert here.names_folder() and there.names_folder()
    assert here.inside("trace.json.gz") == run_dir / "trace.json.gz"
    assert there.inside("trace.json.gz") == f"{stored}/trace.json.gz"
    assert not here.is_file() and not there.is_file()
    assert here.read_small(1 << 30) is None and there.read_small(1 << 30) is None
    assert here.keys() == there.keys() and "rank0/profiler.json" in here.keys()
    assert here.get("rank0/profiler.json") == there.get("rank0/profiler.json") is not None
    assert here.get("rank0/nothing.json") is None and there.get("rank0/nothing.json") is None
    assert there.show("rank0/profiler.json") == f"{stored}/rank0/profiler.json"

    doc = (run_dir / "rank0" / "profiler.json").read_bytes()
    one_here, one_there = open_run(run_dir / "rank0" / "profiler.json"), open_run(f"{stored}/rank0/profiler.json")
    for one in (one_here, one_there):
        assert one.basename == "profiler.json" and not one.names_folder()
        assert one.is_file() and one.read_small(len(doc)) == doc and one.read_small(len(doc) - 1) is None
        assert one.modified_ns() is not None
        with one.open() as f:
            assert f.read() == doc
    assert one_here.beside("x.json") == run_dir / "rank0" / "x.json"
    assert one_there.beside("x.json") == f"{stored}/rank0/x.json"
    assert one_there.same_file(f"{stored}/rank0/profiler.json/") and not one_there.same_file(str(run_dir))
    assert one_here.same_file(str(run_dir / "rank0" / ".." / "rank0" / "profiler.json"))
    assert open_run(f"{stored}/nothing").modified_ns() is None
    assert open_run(run_dir / "nothing").modified_ns() is None


def _read(view: RunView) -> tuple[str, list[tuple[str, bytes]], dict[str, bytes]]:
    """What a report reads of the view: its target's name, its rank0
    segments (their file names and bytes) and its side documents."""
    folder = view.folder
    assert folder is not None
    segments = []
    for _, name, seg in view.segments(folder / "rank0"):
        with view.open_file(seg) as f:
            segments.append((name, f.read()))
    side = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    return str(view.target).rsplit("/", 1)[-1], sorted(segments), side


def test_the_run_reads_alike_here_and_in_a_store(run_dir: Path, stored: str) -> None:
    with open_run(run_dir) as here, open_run(stored) as there:
        assert here.folder == run_dir and here.target == run_dir / "trace.json.gz"
        assert there.target == f"{stored}/trace.json.gz" and there.run_dir_name == stored
        assert here.run_dir_name == str(run_dir)
        assert here.local_file is None and there.local_file is None
        name, segments, side = _read(here)
        assert segments and "rank0/profiler.json" in side
        name2, segments2, side2 = _read(there)
        assert (name2, segments2) == (name, segments)
        # The side documents a report reads, as they are, and no trace.
        assert "rank0/profiler.json" in side2 and all(side2[k] == side[k] for k in side2)
        assert not [k for k in side2 if k.endswith(".gz")]
        seg = str(run_dir / "rank0" / segments[0][0])
        assert here.where_now(seg) == seg
        assert there.where_now(seg) == f"{stored}/rank0/{segments[0][0]}"
        assert there.file_size(there.where_now(seg)) == here.file_size(seg) == len(segments[0][1])
        with there.local_copy(there.where_now(seg)) as local:
            assert Path(local).read_bytes() == segments[0][1]
        copied = there.folder
        assert copied is not None and copied.is_dir() and copied != run_dir
    assert not copied.exists()

    # Read without a block, the copy lives as long as the view.
    view = open_run(stored).read()
    copied = view.folder
    assert copied is not None and copied.is_dir()
    del view
    gc.collect()
    assert not copied.exists()


def test_a_missing_place_is_said_where_it_is_read(run_dir: Path, stored: str) -> None:
    with pytest.raises(fastprof.FastprofFileNotFoundError, match="expected a run") as e:
        open_run(run_dir / "nothing").must_exist("a run")
    assert e.value.filename == str(run_dir / "nothing")
    open_run(f"{stored}/nothing").must_exist("a run")  # a store is looked up when read
    with pytest.raises(fastprof.FastprofFileNotFoundError, match="nothing stored under this URL"):
        open_run(f"{stored}/nothing").read()


def test_a_reports_files_go_into_the_run_or_the_output_named(run_dir: Path, stored: str, tmp_path: Path) -> None:
    with open_run(run_dir) as here, here.output(None) as out:
        assert out.folder == run_dir / "reports"
        assert out.deliver([out.folder / "report.json"]) == []
    said: list[str] = []
    with open_run(stored) as there, there.output(None) as out:
        staged = out.folder
        staged.mkdir()
        (staged / "a.json").write_text("{}")
        urls = out.deliver([staged / "a.json"], said.append)
        assert urls == [f"{stored}/reports/a.json"] and said == ["putting 1 files in the store"]
        assert open_run(f"{stored}/reports/a.json").read_small(10) == b"{}"
    assert not staged.exists()
    with open_run(run_dir) as here, here.output(tmp_path / "out") as out:
        assert out.folder == tmp_path / "out"
    with open_run(run_dir) as here, here.output(f"{stored}/elsewhere") as out:
        out.folder.mkdir()
        (out.folder / "b.json").write_text("[]")
        assert out.deliver([out.folder / "b.json"]) == [f"{stored}/elsewhere/b.json"]


def test_the_newest_input_is_timed_where_it_lives(run_dir: Path, stored: str) -> None:
    files = sorted(str(p) for p in run_dir.rglob("fastprof.*.json.gz"))
    assert newest_ns([str(run_dir)], files) == max(Path(f).stat().st_mtime_ns for f in files)
    objects = [f"{stored}/{Path(f).relative_to(run_dir).as_posix()}" for f in files]
    assert isinstance(newest_ns([stored], objects), int)
    # A file its input's listing does not time: unknown, so the caller merges again.
    assert newest_ns([stored], [*objects, f"{stored}/rank0/gone.json.gz"]) is None
    assert newest_ns([str(run_dir)], [*files, str(run_dir / "gone.json.gz")]) is None


def test_a_report_of_a_missing_place_makes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run is opened before anything is written: a report of a path that
    is not there raises and leaves no folder where its reports would go."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fastprof.FastprofFileNotFoundError) as e:
        fastprof.report(Path("nothing") / "run")
    assert e.value.filename == str(Path("nothing") / "run")
    assert list(tmp_path.iterdir()) == []


def test_diff_reads_a_json_object_as_it_reads_the_file(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``.json`` nested deeper than any report is read as a trace, in a
    store as on disk (it was a traceback from a store): one line, exit 2."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    url = f"memory://fastprof-{uuid.uuid4().hex[:8]}/x/deep.json"
    open_store(url).put(deep, "")
    lines = []
    for where in (str(deep), url):
        assert main(["diff", where, str(run_dir)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        lines.append(err.replace(where, "DEEP"))
    assert lines[0] == lines[1] and "not a trace" in lines[0], lines
