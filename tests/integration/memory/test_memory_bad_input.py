"""Bad input to the memory parts (issue #16): an unwritable memory folder,
a history option out of range, a snapshot dump that fails on a full disk.
Each is one clear warning (or, for an option, one error before training);
training goes on and the rest of the run is intact. The allocator is a
stand-in (no CUDA allocator can exist here; benches/gpu_check.py runs the
real one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

import fastprof
from fastprof import ConfigError, FastprofWarning

torch = pytest.importorskip("torch")
UNIT = Path(__file__).resolve().parents[2] / "unit"


def _allocator(**kw: Any) -> Any:
    sys.path.insert(0, str(UNIT))
    try:
        from test_memory_history import Allocator
    finally:
        sys.path.pop(0)
    return Allocator(**kw)


def _steps(run_dir: Path) -> int:
    cols = fastprof.read_columns(run_dir / "rank0", kinds=["spans"], names=["step"])
    return len(cols.spans["ts"])


def test_an_unwritable_memory_folder_is_one_warning_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fastprof.profiler.drivers.memory as loop  # where the Profiler's memory driver makes its history
    from fastprof.memory import collect, collector
    from fastprof.memory.history import HistoryDriver

    alloc = _allocator()
    monkeypatch.setattr(loop, "history_driver", lambda cfg: HistoryDriver(cfg, alloc))
    monkeypatch.setattr(collector, "_allocator", lambda: alloc)
    rank_dir = tmp_path / "run" / "rank0"
    rank_dir.mkdir(parents=True)
    (rank_dir / "memory").write_text("a file where the memory folder goes")

    @collect("training_step", iterations=(1,), snapshots=True)
    def training_step(x: Any) -> Any:
        return net(x).sum()

    net = torch.nn.Linear(4, 2)
    prof = fastprof.Profiler(
        out_dir=tmp_path,
        run_name="run",
        torch=False,
        sample_hz=0,
        model=net,
        memory_history=fastprof.MemoryHistory(state_every=2),
        schedule=fastprof.schedule.epoch(skip_first=2, wait=1, warmup=1, active=2),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with prof:
            for x in prof.loader([torch.ones(4)] * 12):
                training_step(x).backward()
                prof.step()
    ours = [w for w in caught if issubclass(w.category, FastprofWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    msg = str(ours[0].message)
    assert f"cannot write the memory folder {rank_dir / 'memory'}" in msg and "training goes on" in msg
    # Nothing was asked of the allocator; the rest of the run is whole.
    assert alloc.calls == []
    doc = json.loads((rank_dir / "profiler.json").read_text())
    assert doc["steps"] == 12 and doc["exit"] == "stop"
    hist = doc["memory"]["history"]
    assert hist["available"] is False and hist["reason"].startswith("the memory folder cannot be written")
    assert hist["windows"] == [] and hist["state"]["count"] == 0
    assert doc["memory"]["collect"]["entries"] == ["0.training_step.1.start", "0.training_step.1.end"]
    assert "memory folder cannot be written" in doc["memory"]["collect"]["snapshot_reason"]
    assert (rank_dir / "memory").read_text() == "a file where the memory folder goes"
    assert _steps(tmp_path / "run") == 12 and (tmp_path / "run" / "trace.json.gz").is_file()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FASTPROF_MEMORY_HISTORY_MAX_ENTRIES", "-5"),
        ("FASTPROF_MEMORY_HISTORY_STATE_EVERY", "-1"),
        ("FASTPROF_MEMORY_HISTORY_STATE_EVERY", "often"),
        ("FASTPROF_MEMORY_HISTORY_STACKS", "cpp"),
    ],
)
def test_a_history_option_out_of_range_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("FASTPROF_MEMORY_HISTORY", "1")
    monkeypatch.setenv(variable, value)
    name = variable.removeprefix("FASTPROF_MEMORY_HISTORY_").lower()
    with pytest.raises(ConfigError, match=name) as e:
        fastprof.Profiler(out_dir=tmp_path, run_name="run", torch=False, sample_hz=0)
    assert "\n" not in str(e.value) and value in str(e.value)
    assert not (tmp_path / "run").exists()  # nothing written


DISK_FULL = textwrap.dedent(
    """
    import json, resource, signal, sys, warnings
    sys.path.insert(0, sys.argv[2])
    import fastprof, fastprof.profiler.drivers.memory as loop
    from fastprof.memory.history import HistoryDriver
    from test_memory_history import Allocator

    class Big(Allocator):
        def snapshot(self):
            snap = super().snapshot()
            snap["pad"] = b"x" * (4 << 20)  # 4 MiB: over the file-size limit below
            return snap

    alloc = Big()
    loop.history_driver = lambda cfg: HistoryDriver(cfg, alloc)
    # A full disk: every write past 1 MiB fails (EFBIG) as ENOSPC would.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="run", torch=False, sample_hz=0,
                             memory_history=fastprof.MemoryHistory(state_every=2),
                             schedule=fastprof.schedule.epoch(skip_first=2, wait=1, warmup=1, active=2))
    done = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with prof:
            for _ in prof.loader(range(12)):
                alloc.step()
                done += 1
                prof.step()
    print(json.dumps({"done": done, "warnings": [str(w.message) for w in caught
                                                  if issubclass(w.category, fastprof.FastprofWarning)]}))
    """
)


def test_a_snapshot_dump_that_fails_on_a_full_disk_is_one_warning(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(DISK_FULL)
    p = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(UNIT)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["done"] == 12  # training went on
    (warning,) = out["warnings"]
    assert warning.startswith("fastprof: allocator history: ") and "File too large" in warning
    assert "more: see profiler.json" in warning and warning.endswith("training went on")
    rank_dir = tmp_path / "run" / "rank0"
    hist = json.loads((rank_dir / "profiler.json").read_text())["memory"]["history"]
    assert len(hist["windows"]) == 2 and all(w["error"].startswith("dump failed: OSError") for w in hist["windows"])
    # Due at steps 1 and 11 (outside the windows); one still being written
    # (a slow, loaded machine) when the next is due is skipped and counted.
    steps = [s["step"] for s in hist["state"]["snapshots"]]
    assert steps[:1] == [1] and set(steps) <= {1, 11}, steps
    assert len(steps) + hist["state"]["busy"] == 2, hist["state"]
    assert all(s["error"].startswith("write failed") for s in hist["state"]["snapshots"])
    # No half-written dump is left (the atomic writes' temporaries are gone); the run itself is whole.
    assert list((rank_dir / "memory").iterdir()) == []
    assert _steps(tmp_path / "run") == 12 and (tmp_path / "run" / "trace.json.gz").is_file()
