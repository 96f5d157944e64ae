"""fastprof.model_summary on real torch modules (CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import fastprof
from fastprof.memory import model_summary


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),  # 8*3*3*3 + 8 = 224
        nn.BatchNorm2d(8),  # 16 params, buffers: 8 + 8 floats + 1 int64
        nn.ReLU(),
        nn.Sequential(nn.Conv2d(8, 4, 3), nn.Flatten()),  # 4*8*3*3 + 4 = 292
        nn.Linear(4 * 6 * 6, 10),  # 144*10 + 10 = 1450
    )


def rows_by_name(s: fastprof.memory.ModelSummary) -> dict[str, fastprof.memory.LayerRow]:
    return {r.name: r for r in s.rows}


def test_counts_equal_sum_of_numel() -> None:
    m = conv_net()
    s = fastprof.model_summary(m)
    want = sum(p.numel() for p in m.parameters())
    assert want == 224 + 16 + 292 + 1450
    assert s.totals["params"] == want
    assert s.totals["trainable"] == want and s.totals["non_trainable"] == 0
    assert s.totals["param_bytes"] == sum(p.numel() * p.element_size() for p in m.parameters())
    assert s.totals["buffer_bytes"] == 8 * 4 + 8 * 4 + 8  # running mean, var (f32), num_batches_tracked (i64)
    rows = rows_by_name(s)
    assert rows[""].params == want and rows[""].percent == 100.0
    assert rows["0"].params == 224 and rows["0"].own_params == 224
    assert rows["3"].params == 292 and rows["3"].own_params == 0  # a container: its subtree, nothing of its own
    assert rows["3.0"].params == 292
    assert rows["4"].param_bytes == 1450 * 4
    assert rows["1"].buffer_bytes == 72
    assert rows["4"].percent == pytest.approx(100 * 1450 / want, abs=1e-3)
    # The depth-1 rows partition the model: their params add up to the total.
    assert sum(r.params for r in s.rows if r.depth == 1) == want


def test_trainable_split_after_freezing() -> None:
    m = conv_net()
    for p in m[0].parameters():
        p.requires_grad_(False)
    m[4].bias.requires_grad_(False)
    s = model_summary(m)
    assert s.totals["non_trainable"] == 224 + 10
    assert s.totals["trainable"] == 16 + 292 + 1440
    rows = rows_by_name(s)
    assert rows["0"].trainable == 0 and rows["0"].params == 224
    assert rows["4"].trainable == 1440
    assert rows[""].trainable == s.totals["trainable"]


def test_depth_respected() -> None:
    m = conv_net()
    one = [r.name for r in model_summary(m, depth=1).rows]
    two = [r.name for r in model_summary(m, depth=2).rows]
    assert one == ["", "0", "1", "2", "3", "4"]
    assert two == ["", "0", "1", "2", "3", "3.0", "3.1", "4"]
    assert [r.name for r in model_summary(m, depth=0).rows] == [""]
    with pytest.raises(ValueError, match="depth"):
        model_summary(m, depth=-1)


def test_output_shapes_with_example_input() -> None:
    m = conv_net()
    s = model_summary(m, depth=2, example_input=torch.randn(2, 3, 8, 8))
    shapes = {r.name: r.output_shape for r in s.rows}
    assert shapes == {
        "": [2, 10],
        "0": [2, 8, 8, 8],
        "1": [2, 8, 8, 8],
        "2": [2, 8, 8, 8],
        "3": [2, 144],
        "3.0": [2, 4, 6, 6],
        "3.1": [2, 144],
        "4": [2, 10],
    }
    assert all(r.calls == 1 for r in s.rows)
    assert "[2, 4, 6, 6]" in s.text()
    # Without an example input there are no shapes.
    assert all(r.output_shape is None and r.calls is None for r in model_summary(m).rows)


def test_example_forward_leaves_model_as_it_was() -> None:
    m = conv_net()
    m.train()
    m[1].eval()  # a per-module flag the summary must restore as it was, not to the root's
    bn_mean = m[1].running_mean.clone()
    m[0].register_forward_hook(lambda *_: None)  # the user's own hook stays
    model_summary(m, example_input=torch.randn(2, 3, 8, 8))
    assert m.training and m[0].training and not m[1].training
    assert all(len(mod._forward_hooks) == 0 for name, mod in m.named_modules() if name != "0")
    assert len(m[0]._forward_hooks) == 1
    assert torch.equal(m[1].running_mean, bn_mean)


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a(x)
        raise RuntimeError("boom in forward")


def test_hooks_removed_when_forward_raises() -> None:
    m = Boom()
    m.train()
    with pytest.raises(RuntimeError, match="boom in forward"):
        model_summary(m, example_input=torch.randn(1, 4))
    assert all(len(mod._forward_hooks) == 0 for mod in m.modules())
    assert m.training and m.a.training
    assert torch.is_grad_enabled()


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight  # one Parameter under two names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def test_tied_weights_counted_once() -> None:
    m = Tied()
    s = model_summary(m, example_input=torch.tensor([[1, 2, 3]]))
    assert s.totals["params"] == 50 * 8 == sum(p.numel() for p in m.parameters())
    assert s.totals["param_bytes"] == 50 * 8 * 4
    # Each subtree still shows the weight it uses; the total does not add them twice.
    rows = rows_by_name(s)
    assert rows["embed"].params == rows["head"].params == 400
    assert s.tied == [{"names": ["embed.weight", "head.weight"], "numel": 400}]
    assert rows["head"].output_shape == [1, 3, 50]
    assert "embed.weight = head.weight" in s.text()


def test_json_and_text_files(tmp_path) -> None:
    m = conv_net()
    s = model_summary(m, example_input=torch.randn(2, 3, 8, 8))
    j, t = s.write(tmp_path / "reports")
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["model_summary.json", "model_summary.txt"]
    doc = json.loads(j.read_text())
    assert doc["schema"] == "fastprof.model_summary" and doc["version"] == 1
    assert doc["totals"]["params"] == 1982
    assert [r["name"] for r in doc["rows"]] == [r.name for r in s.rows]
    assert doc["rows"][5]["output_shape"] == [2, 4, 6, 6]
    assert doc == json.loads(json.dumps(s.to_dict()))
    text = t.read_text()
    lines = text.splitlines()
    # Aligned: every table line has the same width as the header rule.
    width = len(lines[1])
    assert set(lines[1]) == {"-"}
    assert all(len(line) <= width for line in lines[:10])
    assert lines[0].index("Params") + len("Params") == lines[2].index("1,982") + len("1,982")
    assert "Total parameters:      1,982" in text
