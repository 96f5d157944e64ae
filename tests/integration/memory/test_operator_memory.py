"""fastprof.memory.operator_table against key_averages() of the same real torch.profiler window (CPU)."""

from __future__ import annotations

import csv
import gzip
import json

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from fastprof.memory import NO_MEMORY_NOTE, operator_table

KNOWN = 256 * 1024  # float32 elements: 1 MiB


def train_window(profile_memory: bool = True, record_shapes: bool = True) -> profile:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 3, 16, 16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=profile_memory, record_shapes=record_shapes) as prof:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        with record_function("known_alloc"):
            a = torch.ones(KNOWN)
            del a  # freed by Python inside the span, in no operator of its own
    return prof


@pytest.fixture(scope="module")
def window() -> profile:
    return train_window()


def test_values_equal_key_averages(window: profile) -> None:
    table = operator_table(window, top=5)
    ka = {a.key: a for a in window.key_averages()}
    rows = {r.name: r for r in table.rows}
    assert set(rows) == set(ka) and len(table.rows) == len(ka)
    for name, a in ka.items():
        r = rows[name]
        assert r.count == a.count, name
        assert r.self_cpu_memory == a.self_cpu_memory_usage, name
        assert r.cpu_memory == a.cpu_memory_usage, name
        assert r.self_device_memory == a.self_device_memory_usage == 0, name
        assert r.self_cpu_time_us == a.self_cpu_time_total, name
        assert r.cpu_time_us == a.cpu_time_total, name
    assert table.memory_recorded and table.shapes_recorded and table.note is None
    # The model's ops are there with their memory: the ReLU's output, 4*8*16*16 floats per forward.
    assert rows["aten::clamp_min"].count == 2
    assert rows["aten::clamp_min"].self_cpu_memory == 2 * 4 * 8 * 16 * 16 * 4
    # On a CPU window there is no device ranking.
    assert list(table.top) == ["self_cpu_memory", "self_cpu_time"]


def test_allocated_and_freed_split_self_memory(window: profile) -> None:
    table = operator_table(window)
    assert table.split_available
    for r in table.rows:
        assert r.cpu_allocated is not None and r.cpu_freed is not None
        assert r.cpu_allocated >= 0 and r.cpu_freed >= 0
        assert r.cpu_allocated - r.cpu_freed == r.self_cpu_memory, r.name
    rows = {r.name: r for r in table.rows}
    # The span's own free (del a) is its self memory; the allocation is aten::empty's, a child's.
    known = rows["known_alloc"]
    assert (known.cpu_allocated, known.cpu_freed, known.self_cpu_memory) == (0, KNOWN * 4, -KNOWN * 4)
    assert known.cpu_memory == 0  # allocated and freed inside the span
    assert rows["aten::empty"].cpu_allocated >= KNOWN * 4
    assert table.totals()["cpu_allocated"] == sum(r.cpu_allocated or 0 for r in table.rows)


def test_top_n_order(window: profile) -> None:
    n = 4
    table = operator_table(window, top=n)
    ka = list(window.key_averages())
    mem = [r.self_cpu_memory for r in table.top["self_cpu_memory"]]
    assert len(mem) == n
    assert mem == sorted((a.self_cpu_memory_usage for a in ka), reverse=True)[:n]
    assert table.top["self_cpu_memory"][0].name == max(ka, key=lambda a: a.self_cpu_memory_usage).key
    times = [r.self_cpu_time_us for r in table.top["self_cpu_time"]]
    assert times == sorted((a.self_cpu_time_total for a in ka), reverse=True)[:n]
    # top larger than the operator count lists them all.
    assert len(operator_table(window, top=10_000).top["self_cpu_memory"]) == len(ka)


def test_input_shapes(window: profile) -> None:
    rows = {r.name: r for r in operator_table(window).rows}
    assert rows["aten::clamp_min"].input_shapes == [{"shapes": [[4, 8, 16, 16], []], "count": 2}]
    by_shape = operator_table(window, group_by_input_shape=True)
    assert by_shape.grouped_by_input_shape
    ka = {(a.key, str(a.input_shapes)): a for a in window.key_averages(group_by_input_shape=True)}
    got = {(r.name, str(r.input_shapes or [])): r for r in by_shape.rows}
    assert set(got) == set(ka)
    for k, a in ka.items():
        assert (got[k].count, got[k].self_cpu_memory) == (a.count, a.self_cpu_memory_usage), k
        assert got[k].cpu_allocated - got[k].cpu_freed == a.self_cpu_memory_usage, k


def test_no_profile_memory_says_so() -> None:
    prof = train_window(profile_memory=False, record_shapes=False)
    table = operator_table(prof)
    assert not table.memory_recorded and not table.split_available
    assert NO_MEMORY_NOTE in table.notes
    assert NO_MEMORY_NOTE == "memory not recorded: profile with profile_memory=True"
    assert all(r.cpu_allocated is None and r.self_cpu_memory == 0 for r in table.rows)
    assert all(r.input_shapes is None for r in table.rows)
    doc = table.to_dict()
    assert NO_MEMORY_NOTE in doc["note"] and doc["memory_recorded"] is False
    # Counts and times are still there.
    assert {r.name: r.count for r in table.rows} == {a.key: a.count for a in prof.key_averages()}


def test_json_and_csv_parse(window: profile, tmp_path) -> None:
    table = operator_table(window, top=3)
    j, c = table.write(tmp_path / "reports")
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["operators.csv", "operators.json"]
    doc = json.loads(j.read_text())
    assert doc["schema"] == "fastprof.operators" and doc["top"] == 3
    assert [r["name"] for r in doc["rankings"]["self_cpu_memory"]] == [r.name for r in table.top["self_cpu_memory"]]
    assert doc["totals"]["count"] == sum(a.count for a in window.key_averages())
    with open(c, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(len(v) for v in table.top.values()) == 6
    first = rows[0]
    want = table.top["self_cpu_memory"][0]
    assert (first["ranking"], first["rank"], first["name"]) == ("self_cpu_memory", "1", want.name)
    assert int(first["self_cpu_memory"]) == want.self_cpu_memory
    assert int(first["count"]) == want.count
    assert float(first["self_cpu_time_us"]) == want.self_cpu_time_us
    assert json.loads(first["input_shapes"]) == want.input_shapes


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="top"):
        operator_table(train_window(), top=0)
    with pytest.raises(TypeError, match=r"torch\.profiler\.profile"):
        operator_table(object())
    with pytest.raises(ValueError, match="no results"):
        operator_table(profile(activities=[ProfilerActivity.CPU]))


# The trace path: the same window exported as a Kineto trace file.


def test_trace_file_equals_key_averages(window: profile, tmp_path) -> None:
    path = tmp_path / "w.pt.trace.json"
    window.export_chrome_trace(str(path))
    gz = tmp_path / "w.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    from_object = {r.name: r for r in operator_table(window).rows}
    ka = {a.key: a for a in window.key_averages()}
    for source in (path, str(gz)):
        table = operator_table(source, top=4)
        rows = {r.name: r for r in table.rows}
        assert set(rows) == set(ka)
        for name, a in ka.items():
            r = rows[name]
            assert (r.count, r.self_cpu_memory, r.cpu_memory) == (
                a.count,
                a.self_cpu_memory_usage,
                a.cpu_memory_usage,
            ), name
            assert (r.cpu_allocated, r.cpu_freed) == (from_object[name].cpu_allocated, from_object[name].cpu_freed)
            assert r.input_shapes == from_object[name].input_shapes, name
            # The trace holds µs to the ns: times agree to that.
            assert r.cpu_time_us == pytest.approx(a.cpu_time_total, abs=1e-3 * a.count), name
            assert r.self_cpu_time_us == pytest.approx(a.self_cpu_time_total, abs=2e-3 * a.count), name
        assert table.memory_recorded and table.split_available and table.note is None
        mem = [r.self_cpu_memory for r in table.top["self_cpu_memory"]]
        assert mem == sorted((a.self_cpu_memory_usage for a in ka.values()), reverse=True)[:4]
    by_shape = operator_table(path, group_by_input_shape=True)
    ka_s = {(a.key, str(a.input_shapes)): a for a in window.key_averages(group_by_input_shape=True)}
    got = {(r.name, str(r.input_shapes or [])): r for r in by_shape.rows}
    assert set(got) == set(ka_s)
    assert all(got[k].count == a.count and got[k].self_cpu_memory == a.self_cpu_memory_usage for k, a in ka_s.items())


def test_trace_file_without_memory_says_so(tmp_path) -> None:
    prof = train_window(profile_memory=False)
    path = tmp_path / "nomem.pt.trace.json"
    prof.export_chrome_trace(str(path))
    table = operator_table(path)
    assert not table.memory_recorded and NO_MEMORY_NOTE in table.notes
    assert all(r.cpu_allocated is None and r.self_cpu_memory == 0 for r in table.rows)
    assert {r.name: r.count for r in table.rows} == {a.key: a.count for a in prof.key_averages()}


def test_trace_file_bad_input(tmp_path) -> None:
    bad = tmp_path / "cut.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", ')
    with pytest.raises(ValueError, match=r"cut\.pt\.trace\.json: not a JSON trace \(line 1"):
        operator_table(bad)
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"other\.json: not a Chrome/Kineto trace"):
        operator_table(other)
    with pytest.raises(FileNotFoundError):
        operator_table(tmp_path / "missing.pt.trace.json")
