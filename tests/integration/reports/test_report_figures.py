"""report.html's plotly figures (issue #34, item 16): every byte axis is in
one binary unit (the one the headline's human_bytes writes), titled with it,
with no SI tick format that rounds 703.3 MiB to "737MB" on every tick; the
headline's peak RSS and the Memory plot's axis say the same unit. Read from
the figure JSON of the page of a real run (Python's json; plotly's typed
arrays decoded with numpy)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastprof
from fastprof.reports.data import BINARY_UNITS

PYTHON = Path(fastprof.__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import sys, torch, fastprof

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with fastprof.Profiler(out_dir=sys.argv[1], run_name="run", torch=None, sample_hz=50) as prof:
        for i in range(30):
            x, y = torch.randn(128, 64), torch.randn(128, 1)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            kept.append(torch.ones(256 * 1024))  # 1 MiB a step: the RSS moves
            prof.step()
    """
)


def figures(page: str) -> list[dict[str, Any]]:
    """Every ``Plotly.newPlot(id, data, layout, ...)`` of the page, as
    {"id", "data", "layout"}."""
    dec = json.JSONDecoder()
    out = []
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        data, end = dec.raw_decode(page, m.end())
        end = page.index(",", end) + 1
        while page[end].isspace():
            end += 1
        layout, _ = dec.raw_decode(page, end)
        out.append({"id": m.group(1), "data": data, "layout": layout})
    return out


def values(v: Any) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A trace's x or y: a list, or plotly's typed array {"dtype", "bdata"}."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).astype(np.float64)
    return np.asarray(v, dtype=np.float64)


def title(axis: dict[str, Any] | None) -> str:
    t = (axis or {}).get("title") or {}
    return str(t.get("text", "")) if isinstance(t, dict) else str(t)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("figures")
    (tmp / "train.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(PYTHON))
    subprocess.run(
        [sys.executable, str(tmp / "train.py"), str(tmp / "out")], check=True, env=env, capture_output=True, timeout=100
    )
    subprocess.run(
        [sys.executable, "-m", "fastprof", "report", str(tmp / "out" / "run"), "-o", str(tmp / "reports")],
        check=True,
        env=env,
        capture_output=True,
        timeout=100,
    )
    doc = json.loads((tmp / "reports" / "report.json").read_text())
    return (tmp / "reports" / "report.html").read_text(encoding="utf-8"), doc


def test_byte_axes_are_in_one_binary_unit_that_fits_and_say_it(page: tuple[str, dict[str, Any]]) -> None:
    text, doc = page
    figs = figures(text)
    assert figs
    by_title = {str(f["layout"]["title"]["text"]): f for f in figs}
    # The byte plots this run has: the sampler's RSS and the memory at each step's end.
    byte_figs = [by_title["Memory"], by_title["Memory at each step's end"]]
    for f in figs:
        y = f["layout"].get("yaxis") or {}
        # No plot of the page formats ticks with SI prefixes, bytes or not ("737MB").
        assert "s" not in str(y.get("tickformat", "")), (f["id"], y)
        assert y.get("ticksuffix") in (None, ""), (f["id"], y)
        if title(y) in BINARY_UNITS:
            assert f in byte_figs, (f["layout"]["title"], y)
    for f in byte_figs:
        y = f["layout"]["yaxis"]
        unit = title(y)
        assert unit in BINARY_UNITS and unit != "B", (f["layout"]["title"], y)
        assert y.get("exponentformat") == "none", y  # no "1k MiB"
        if "tickvals" in y or "ticktext" in y:  # explicit ticks: distinct
            assert len(set(y["ticktext"])) == len(y["ticktext"]), y
        top = max(float(np.nanmax(np.abs(values(t["y"])))) for t in f["data"])
        # The unit is the one that fits the largest value, as human_bytes picks it.
        assert 1 <= top < 1024, (unit, top)

    # The headline's peak RSS and the Memory plot agree, in unit and in value.
    card = re.search(r'data-key="rss_peak"><div class="v">([^<]+)</div>', text)
    assert card is not None
    number, card_unit = card.group(1).split()
    mem = by_title["Memory"]
    assert card_unit == title(mem["layout"]["yaxis"])
    rss = next(t for t in mem["data"] if t["name"] == "proc.rss [B]")
    peak = float(values(rss["y"]).max())
    assert f"{peak:.1f}" == number
    scale = 1024.0 ** BINARY_UNITS.index(card_unit)
    assert peak * scale == pytest.approx(doc["system"]["host"][0]["rss_peak_b"])
    # The step plot's series is the report's, in the same unit scale.
    steps = by_title["Memory at each step's end"]
    assert str(doc["memory"]["per_rank"][0]["series"]) in steps["data"][0]["name"]
