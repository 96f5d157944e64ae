"""report.html (issue #11) opened in headless Chromium, driven through the
DevTools protocol: no console error or exception, no network request but the
file itself, every plot drawn (traces in the SVG, coloured pixels inside each
plot area of a screenshot decoded with Pillow), and the embedded JSON parsed
by the browser's JSON.parse matching the report.

Chromium is Debian's ``chromium`` package (``make dev`` installs it when run
as root); without it this test fails and says how to install it."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websocket
from PIL import Image

import fastprof
from fastprof.reports import data as report_data
from fastprof.reports.breakdown import step_breakdown
from fastprof.reports.data import BINARY_UNITS
from fastprof.reports.html import MAX_POINTS, downsample, step_part_figures
from fastprof.reports.triggers import CONTENTION

PYTHON = Path(fastprof.__file__).resolve().parents[1]
SCREENSHOT = os.environ.get("FASTPROF_TEST_SCREENSHOT")  # optional: where to keep the PNG

SCRIPT = textwrap.dedent(
    """
    import sys, time, torch, fastprof
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 48
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.randn(32), torch.randn(1)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = fastprof.Profiler(out_dir=sys.argv[1], run_name="run", sample_hz=100, torch=True,
                             schedule=fastprof.schedule.epoch(skip_first=2, wait=0, warmup=1, active=1))
    with prof:
        for x, y in prof.loader(DataLoader(Slow(), batch_size=4, num_workers=0)):
            with fastprof.span("forward"):
                loss = ((model(x) - y) ** 2).mean()
            with fastprof.span("backward"):
                loss.backward()
            with fastprof.span("optimizer_step"):
                opt.step()
                opt.zero_grad()
            prof.step()
    """
)


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "headless Chromium is needed to check report.html: install Debian's package "
        "(`sudo apt-get update && sudo apt-get install -y chromium`, or `make dev` as root)"
    )


class Browser:
    """Chromium with a DevTools websocket to its one page; events are kept."""

    def __init__(self, tmp: Path) -> None:
        profile = tmp / "chromium-profile"
        profile.mkdir()
        args = [
            chromium(),
            "--headless=new",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1400,1000",
            "about:blank",
        ]
        # Chromium puts its singleton socket folder in TMPDIR: one of its own,
        # removed at close (a short path: a socket's path has at most 107
        # bytes, and pytest's tmp_path under xdist is longer).
        self.tmpdir = tempfile.mkdtemp(prefix="fastprof-chromium-")
        env = {**os.environ, "TMPDIR": self.tmpdir}
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                self.close()
                pytest.fail(f"chromium did not start its DevTools endpoint: {err[-2000:]}")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=20, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, (method, msg["error"])
                return dict(msg["result"])
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not any(e["method"] == method for e in self.events):
            assert time.monotonic() < deadline, f"no {method} in {timeout} s"
            self.ws.settimeout(max(deadline - time.monotonic(), 0.1))
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
        self.ws.settimeout(20)

    def js(self, expr: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in res, res["exceptionDetails"]
        return res["result"].get("value")

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    (tmp / "train.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(PYTHON))
    subprocess.run(
        [sys.executable, str(tmp / "train.py"), str(tmp / "out")], check=True, env=env, capture_output=True, timeout=100
    )
    return tmp / "out" / "run"


# Per plotly div: its traces, the SVG nodes drawn for them, and the plot area in page coordinates.
PLOTS_JS = """
Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const area = gd.querySelector('.nsewdrag') || gd;
  const r = area.getBoundingClientRect();
  const drawn = Array.from(gd.querySelectorAll('.cartesianlayer .trace path'))
    .filter(p => (p.getAttribute('d') || '').length > 4).length;
  return {id: gd.id, traces: gd.data.length, svgs: gd.querySelectorAll('svg.main-svg').length,
          traceNodes: gd.querySelectorAll('.cartesianlayer .trace').length, drawn: drawn,
          rect: [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height]};
})
"""


# Per plotly div: its y axis's title and the tick labels the browser drew.
TICKS_JS = """
Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
  id: gd.id,
  title: ((gd.layout.yaxis || {}).title || {}).text || '',
  ticks: Array.from(gd.querySelectorAll('.ytick text')).map(t => t.textContent),
}))
"""


def coloured_pixels(img: Image.Image, rect: list[float]) -> int:
    """Pixels inside rect far from grey (plotly draws data in colour, its
    background, grid and axes in white and greys)."""
    x, y, w, h = (round(v) for v in rect)
    a = np.asarray(img.convert("RGB").crop((x, y, x + w, y + h)), dtype=np.int16)
    return int(((a.max(axis=2) - a.min(axis=2)) > 60).sum())


def _page_errors(events: list[dict[str, Any]]) -> list[Any]:
    """What the page reported as an error: exceptions, console errors and
    assertions, error log entries."""
    return [
        e["params"]
        for e in events
        if e["method"] == "Runtime.exceptionThrown"
        or (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]


@pytest.mark.slow
def test_report_html_in_headless_chromium(run: Path, tmp_path: Path) -> None:
    rep = fastprof.report(run, out_dir=tmp_path / "reports")
    page = tmp_path / "reports" / "report.html"
    assert page in rep.files and (tmp_path / "reports" / "report.json") in rep.files
    text = page.read_text(encoding="utf-8")
    assert "cdn.plot.ly" not in text.split("<body>", 1)[1]  # plotly.js inlined, not fetched
    url = page.resolve().as_uri()

    b = Browser(tmp_path)
    try:
        for domain in ("Runtime", "Log", "Network", "Page"):
            b.call(f"{domain}.enable")
        b.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        b.call("Page.navigate", url=url)
        b.wait_event("Page.loadEventFired")
        n_divs = text.count('class="plotly-graph-div"')
        deadline = time.monotonic() + 15
        while True:
            plots = b.js(PLOTS_JS)
            if len(plots) == n_divs and all(p["traceNodes"] == p["traces"] > 0 for p in plots):
                break
            assert time.monotonic() < deadline, f"plots not rendered: {plots} (expected {n_divs} plots)"
            time.sleep(0.2)
        ticks = b.js(TICKS_JS)
        embedded = b.js("JSON.parse(document.getElementById('fastprof-report').textContent)")
        cards = b.js(
            "Object.fromEntries(Array.from(document.querySelectorAll('.card'))"
            ".map(c => [c.dataset.key, c.querySelector('.v').textContent]))"
        )
        height = b.js("document.documentElement.scrollHeight")
        shot = b.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1},
        )
        b.call("Runtime.evaluate", expression="0")  # drain events sent before the screenshot
    finally:
        b.close()

    # No console error, no exception, no log error.
    errors = _page_errors(b.events)
    assert not errors, errors
    # No request but the page itself.
    urls = [e["params"]["request"]["url"] for e in b.events if e["method"] == "Network.requestWillBeSent"]
    assert urls == [url], urls

    # Every plot drawn: step time, where the step went, counters (CPU, memory).
    assert n_divs >= 4, n_divs
    for p in plots:
        assert p["svgs"] >= 1 and p["drawn"] >= p["traces"], p

    # Byte axes (issue #34): a binary unit in the title, and tick labels the
    # reader can tell apart (plotly's SI format wrote "737MB" on all four).
    byte_axes = [t for t in ticks if t["title"] in BINARY_UNITS]
    assert byte_axes, ticks
    for t in byte_axes:
        assert len(t["ticks"]) >= 2 and len(set(t["ticks"])) == len(t["ticks"]), t
        assert not any(c.isalpha() for c in "".join(t["ticks"])), t  # numbers only: the unit is the title's

    # The embedded JSON is the report.
    doc = json.loads((tmp_path / "reports" / "report.json").read_text())
    assert embedded["schema_version"] == doc["schema_version"] == fastprof.reports.SCHEMA_VERSION
    assert embedded["wall"]["duration_s"] == doc["wall"]["duration_s"]
    assert embedded["speed"]["train"] == doc["speed"]["train"]
    assert embedded["speed"]["step_time"] == doc["speed"]["step_time"]
    assert embedded["system"]["host"] == doc["system"]["host"]
    assert embedded["recommendations"] == doc["recommendations"]
    assert cards["wall"] == f"{doc['wall']['duration_s']:.3f} s"
    assert cards["steps"] == str(sum(r["steps"] for r in doc["speed"]["train"]["per_rank"]))
    assert cards["iterations_per_s"] == f"{doc['speed']['train']['iterations_per_s']:.2f}"
    assert cards["samples_per_s"] == f"{doc['speed']['train']['samples_per_s']:.1f}"
    assert "energy" not in cards  # no GPU on this machine: no energy card
    # The DataLoader sleeps 8 ms a batch: its rule fires and the page quotes the number.
    fired = [r for r in doc["recommendations"]["items"] if r["rule"] == "dataloader"]
    assert fired and f"{fired[0]['measured']:.1f}%" in text
    assert "aten::addmm" in text and "no GPU activity in the torch windows" in text

    # Screenshot: every plot area holds coloured (data) pixels.
    png = base64.b64decode(shot["data"])
    img = Image.open(io.BytesIO(png))
    assert img.size[0] == 1400 and img.size[1] >= height - 1
    if SCREENSHOT:
        Path(SCREENSHOT).write_bytes(png)
    for p in plots:
        assert p["rect"][2] > 100 and p["rect"][3] > 50, p
        assert coloured_pixels(img, p["rect"]) > 200, p


def test_step_parts_follow_the_breakdown_when_present(run: Path) -> None:
    """Without a breakdown the bars come from fastprof spans (loader wait,
    the user's top-level spans, the rest: summing to the step); with one,
    its roles, in the schema's order, zero roles left out."""
    data = report_data.load(run)
    doc = fastprof.report(run, formats=()).data
    figs, note = step_part_figures({**doc, "breakdown": None}, data)
    assert "fastprof spans" in note and len(figs) == 1
    names = [t.name for t in figs[0].data]
    assert names[-1] == "rest of step"
    assert {"loader.train.next", "forward", "backward", "optimizer_step"} <= set(names)
    steps = data.spans("step", 0)
    total = np.sum([np.asarray(t.y, dtype=np.float64) for t in figs[0].data], axis=0)
    assert np.allclose(total, steps.dur / 1e6)

    # Steps 3 then 4 (in time): the breakdown of a real Kineto trace.
    trace = _steps_trace(run.parent / "two_steps.pt.trace.json", [3, 4], loader_us=[5000, 6000], cpu_us=[3000, 3000])
    data.breakdown = step_breakdown(trace, keep_rows=False)
    bd = {"source": "torch windows", "gpu_activity": False}
    figs, note = step_part_figures({**doc, "breakdown": bd}, data)
    assert "breakdown" in note and len(figs) == 1 and "drawn as" not in note
    assert [t.name for t in figs[0].data] == ["dataloader", "cpu exec"]
    assert list(figs[0].data[0].x) == [3, 4] and list(figs[0].data[0].y) == [5.0, 6.0]


def _steps_trace(path: Path, steps: list[int], loader_us: list[int], cpu_us: list[int]) -> Path:
    """A Kineto trace of ``ProfilerStep#N`` spans, each a DataLoader
    ``__next__`` of ``loader_us`` then a ``cpu_op`` of ``cpu_us``."""
    events: list[dict[str, Any]] = []
    t = 1000
    for n, lo, cpu in zip(steps, loader_us, cpu_us, strict=True):
        common = {"ph": "X", "pid": 1, "tid": 1}
        events.append({**common, "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": t, "dur": lo + cpu})
        loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
        events.append({**common, "cat": "user_annotation", "name": loader, "ts": t, "dur": lo})
        events.append({**common, "cat": "cpu_op", "name": "aten::mm", "ts": t + lo, "dur": cpu})
        t += lo + cpu
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def test_a_long_run_s_step_parts_are_merged_into_bars_and_the_page_says_so(run: Path) -> None:
    from fastprof.reports.html import MAX_BARS

    data = report_data.load(run)
    doc = fastprof.report(run, formats=()).data
    n = 2 * MAX_BARS + 500
    loader = np.arange(1, n + 1, dtype=np.int64) * 10
    trace = _steps_trace(run.parent / "long.pt.trace.json", list(range(n)), loader.tolist(), [7] * n)
    data.breakdown = step_breakdown(trace, keep_rows=False)
    figs, note = step_part_figures({**doc, "breakdown": {"source": "torch windows", "gpu_activity": False}}, data)
    (fig,) = figs
    bars = fig.data[0]
    assert len(bars.x) <= MAX_BARS and len(bars.x) == -(-n // 3)
    assert list(bars.x[:3]) == [0, 3, 6]
    assert f"{n} steps are drawn as {len(bars.x)} bars, each the mean of 3 consecutive steps" in note
    # Each bar is its steps' mean: the bars, weighted by their steps, hold all the time.
    weights = np.diff(np.append(np.arange(0, n, 3), n))
    assert np.sum(np.asarray(bars.y) * weights) * 1e6 == pytest.approx(loader.sum() * 1000)


def test_downsample_keeps_peaks_within_the_point_budget() -> None:
    x = np.arange(100_003, dtype=np.float64)
    y = np.sin(x / 500.0)
    y[77_777], y[12_345] = 9.0, -9.0
    dx, dy = downsample(x, y)
    assert len(dx) <= MAX_POINTS and np.all(np.diff(dx) > 0)
    assert dy.max() == 9.0 and dy.min() == -9.0
    assert 77_777.0 in dx and 12_345.0 in dx
    short = np.arange(10, dtype=np.float64)
    assert downsample(short, short)[0] is short


TRIGGERED = textwrap.dedent(
    """
    import sys, time, torch, fastprof

    torch.manual_seed(0)
    m = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    trig = fastprof.Triggers(poll_s=0.1, min_interval_s=0, steps=3)
    prof = fastprof.Profiler(sys.argv[1], "run", schedule="never", sync_clocks=False, triggers=trig, sample_hz=20)
    with prof:
        for i in range(200):
            loss = m(x).pow(2).mean()
            loss.backward()
            time.sleep(0.08 if i == 120 else 0.004)  # step 120: ~20x the others
            opt.step()  # ends step i
            opt.zero_grad()
    """
)


@pytest.fixture(scope="module")
def triggered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose anomaly trigger flagged a slow step, captured the steps
    after it with torch.profiler and dumped the flight recorder."""
    tmp = tmp_path_factory.mktemp("triggered")
    (tmp / "train.py").write_text(TRIGGERED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPROF_")}
    env["PYTHONPATH"] = str(PYTHON)
    subprocess.run(
        [sys.executable, str(tmp / "train.py"), str(tmp / "out")], check=True, env=env, capture_output=True, timeout=100
    )
    return tmp / "out" / "run"


TRIGGERS_JS = """
(() => {
  const sec = document.getElementById('triggers');
  const rows = cls => Array.from(sec.querySelectorAll('table.' + cls + ' tbody tr'))
    .map(tr => Array.from(tr.cells).map(td => td.textContent));
  const links = cls => Array.from(sec.querySelectorAll('table.' + cls + ' a'))
    .map(a => ({attr: a.getAttribute('href'), url: a.href, text: a.textContent}));
  const gd = document.querySelector('#steps .js-plotly-plot');
  return {
    heading: sec.querySelector('h2').textContent,
    captures: rows('captures'), dumps: rows('flight-dumps'), slow: rows('slow-steps'),
    captureLinks: links('captures'), dumpLinks: links('flight-dumps'),
    plot: {
      title: gd.layout.title.text,
      shapes: (gd.layout.shapes || []).map(s => ({type: s.type, x0: s.x0, x1: s.x1, fill: s.fillcolor || null,
                                                  dash: (s.line || {}).dash || null})),
      traces: gd.data.map(t => ({name: t.name, x: Array.from(t.x || [])})),
      drawnMarkers: gd.querySelectorAll('.scatterlayer .trace .points path').length,
    },
  };
})()
"""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["reports", "elsewhere/out"])
def test_the_page_lists_the_triggers_links_each_capture_and_marks_the_plot(
    triggered: Path, tmp_path: Path, where: str
) -> None:
    """report.html's Triggers section, in headless Chromium: every capture,
    flight dump and slow step report.json lists, each capture's trace linked
    by a relative link that reaches the file (from the run's reports/ and
    from a folder elsewhere), and each capture shaded, each slow step marked
    and each flight dump drawn on the step-time plot."""
    from fastprof.reports.html_triggers import CAPTURE_COLOUR

    out = triggered / "reports" if where == "reports" else tmp_path / where
    fastprof.report(triggered, out_dir=out, formats=("json", "html"))
    doc = json.loads((out / "report.json").read_text())
    (t,) = doc["triggers"]["per_rank"]
    assert t["captures"] and t["flight_dumps"] and any(a["step"] == 120 for a in t["anomalies"]), t
    page = out / "report.html"
    b = Browser(tmp_path)
    try:
        for domain in ("Runtime", "Log", "Page"):
            b.call(f"{domain}.enable")
        b.call("Page.navigate", url=page.resolve().as_uri())
        b.wait_event("Page.loadEventFired")
        deadline = time.monotonic() + 15
        while not b.js(
            "(() => { const g = document.querySelector('#steps .js-plotly-plot'); "
            "return !!(g && g.data && g.querySelector('.scatterlayer .trace')); })()"
        ):
            assert time.monotonic() < deadline, "the step-time plot was not drawn"
            time.sleep(0.2)
        got = b.js(TRIGGERS_JS)
        b.call("Runtime.evaluate", expression="0")
    finally:
        b.close()
    errors = _page_errors(b.events)
    assert not errors, errors
    assert got["heading"] == "Triggers"

    # Listed: one row per capture, flight dump and slow step of report.json.
    assert [r[2] for r in got["captures"]] == [
        f"{c['first_step']}..{c['first_step'] + c['steps'] - 1}" for c in t["captures"]
    ]
    assert [r[2] for r in got["dumps"]] == [str(d["step"]) for d in t["flight_dumps"]]
    assert [r[1] for r in got["slow"]] == [str(a["step"]) for a in t["anomalies"]]

    # Each capture's trace and each dump linked relatively, reaching the file.
    for links, items in ((got["captureLinks"], t["captures"]), (got["dumpLinks"], t["flight_dumps"])):
        assert len(links) == len(items), (links, items)
        for link, item in zip(links, items, strict=True):
            assert not link["attr"].startswith(("/", "file:")) and "://" not in link["attr"], link
            target = (page.parent / link["attr"]).resolve()
            assert target.is_file() and target == Path(item["file"]).resolve(), (link, item)
            assert link["url"] == target.as_uri()
    with gzip.open(page.parent / got["captureLinks"][0]["attr"], "rt") as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    first = t["captures"][0]["first_step"]
    assert f"ProfilerStep#{first}" in names  # the capture's own torch.profiler trace

    # On the step-time plot: each capture shaded over its steps, each slow
    # step a marker at its step, each flight dump a dotted line.
    plot = got["plot"]
    assert plot["title"] == "Step time per step"
    shaded = {(s["x0"], s["x1"]) for s in plot["shapes"] if s["type"] == "rect" and s["fill"] == CAPTURE_COLOUR}
    assert shaded == {(c["first_step"] - 0.5, c["first_step"] + c["steps"] - 0.5) for c in t["captures"]}, plot
    dotted = {s["x0"] for s in plot["shapes"] if s["type"] == "line" and s["dash"] == "dot"}
    assert dotted == {d["step"] for d in t["flight_dumps"]}, plot
    _check_marks(plot, t["anomalies"])


def _check_marks(plot: dict[str, Any], anomalies: list[dict[str, Any]]) -> None:
    """Every slow step of report.json is marked on the step-time plot: the
    job's (and those whose wait was not read) as an "x", those the host
    caused (waiting for a CPU: a loaded machine's, recorded only) as an open
    circle in a trace of their own."""
    marks = {tr["name"]: tr["x"] for tr in plot["traces"] if tr["name"].startswith("slow step")}
    host = [a["step"] for a in anomalies if a.get("cause") == CONTENTION]
    job = [a["step"] for a in anomalies if a.get("cause") != CONTENTION]
    assert marks.get("slow step (anomaly trigger)", []) == job, (marks, anomalies)
    assert marks.get("slow step (host contention)", []) == host, (marks, anomalies)
    assert plot["drawnMarkers"] >= len(anomalies)


@pytest.mark.slow
def test_a_slow_step_the_host_caused_is_marked_beside_the_job_s(triggered: Path, tmp_path: Path) -> None:
    """On a loaded machine the job's trigger also records a slow step the
    host caused (it waited for a CPU; recorded only, not captured), as it
    did at step 169 of the run above once under load: report.json lists it
    and the plot marks it as an open circle, not an "x" (the test above
    read the "x" trace alone and failed). The run copied, such a step
    planted in its record as the trigger writes it; both are marked."""
    run = tmp_path / "run"
    shutil.copytree(triggered, run, ignore=shutil.ignore_patterns("reports"))
    planted = {
        "step": 169,
        "duration_ms": 41.0,
        "median_ms": 4.5,
        "mad_ms": 0.1,
        "factor": 9.11,
        "phase": None,
        "cause": CONTENTION,
        "waited_ms": 39.5,
        "said": "step 169: 41.0 ms, of which 39.5 ms waiting for a CPU: host contention",
        "time": time.time(),
        "action": "recorded only (host contention)",
    }
    for name in ("profiler.json", "triggers.json"):
        f = run / "rank0" / name
        d = json.loads(f.read_text())
        t = d["triggers"] if name == "profiler.json" else d
        t["anomalies"] = [a for a in t["anomalies"] if a["step"] != 169] + [planted]
        f.write_text(json.dumps(d))
    # From the segments and the records: the rank's summary holds its triggers as they were.
    fastprof.report(run, formats=("json", "html"), from_segments=True)
    doc = json.loads((run / "reports" / "report.json").read_text())
    (t,) = doc["triggers"]["per_rank"]
    causes = {a["step"]: a["cause"] for a in t["anomalies"]}
    assert causes[169] == CONTENTION and any(c != CONTENTION for c in causes.values()), causes
    b = Browser(tmp_path)
    try:
        for domain in ("Runtime", "Log", "Page"):
            b.call(f"{domain}.enable")
        b.call("Page.navigate", url=(run / "reports" / "report.html").resolve().as_uri())
        b.wait_event("Page.loadEventFired")
        deadline = time.monotonic() + 15
        while not b.js(
            "(() => { const g = document.querySelector('#steps .js-plotly-plot'); "
            "return !!(g && g.data && g.querySelector('.scatterlayer .trace')); })()"
        ):
            assert time.monotonic() < deadline, "the step-time plot was not drawn"
            time.sleep(0.2)
        got = b.js(TRIGGERS_JS)
        b.call("Runtime.evaluate", expression="0")
    finally:
        b.close()
    assert not _page_errors(b.events)
    assert [r[1] for r in got["slow"]] == [str(a["step"]) for a in t["anomalies"]]
    _check_marks(got["plot"], t["anomalies"])


class _Links(HTMLParser):
    """The ``href`` of every ``<a>`` inside ``<section id="triggers">``."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.depth:
            self.depth += tag == "section"
            if tag == "a":
                self.hrefs.append(dict(attrs)["href"] or "")
        elif tag == "section" and dict(attrs).get("id") == "triggers":
            self.depth = 1

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag == "section":
            self.depth -= 1


def test_a_moved_run_links_its_own_files_and_a_file_gone_is_named_not_linked(triggered: Path, tmp_path: Path) -> None:
    """profiler.json records absolute paths: a run copied elsewhere links
    the copy's files (not the original's); a capture whose trace is gone
    (rotated away, deleted) is named and said to be missing, never linked."""
    moved = tmp_path / "moved" / "run"
    shutil.copytree(triggered, moved, ignore=shutil.ignore_patterns("reports"))
    fastprof.report(moved, formats=("json", "html"))
    page = moved / "reports" / "report.html"
    links = _Links()
    links.feed(page.read_text(encoding="utf-8"))
    doc = json.loads((moved / "reports" / "report.json").read_text())
    (t,) = doc["triggers"]["per_rank"]
    assert len(links.hrefs) == len(t["captures"]) + len(t["flight_dumps"]), links.hrefs
    for href in links.hrefs:
        target = (page.parent / href).resolve()
        assert target.is_file() and moved.resolve() in target.parents, href
    # The capture's trace gone: named, not linked; the dump still linked.
    gone = Path(t["captures"][0]["file"])
    (moved / gone.relative_to(triggered)).unlink()
    fastprof.report(moved, formats=("html",))
    text = page.read_text(encoding="utf-8")
    links = _Links()
    links.feed(text)
    assert not any(h.endswith(gone.name) for h in links.hrefs), links.hrefs
    assert len(links.hrefs) == len(t["captures"]) - 1 + len(t["flight_dumps"])
    assert f"{gone.relative_to(triggered)} (not there now)" in text
