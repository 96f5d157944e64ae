"""fastprof's warnings show as its own lines (#34, item 11): one
``fastprof: ...`` line on stderr each, with no ``path:lineno: FastprofWarning:``
before it and no source line after it, and still a ``FastprofWarning`` for
code that filters or records warnings. Other libraries' warnings show as
Python shows them.

Real jobs in subprocesses: a Profiler whose run directory cannot be made (a
file in the way), a trace cut short and read back (the reader's salvage
note), and warnings of other kinds beside fastprof.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from fastprof import _warning_display

pytest.importorskip("torch")

# A file where the out_dir would go: the Profiler cannot make its run
# directory, says so, and training goes on unprofiled.
BLOCKED = """
import contextlib, warnings, sys
import torch
import fastprof

open("blocker", "w").write("in the way")
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode in ("error", "ignore"):
    warnings.filterwarnings(mode, category=fastprof.FastprofWarning)
with warnings.catch_warnings(record=True) if mode == "record" else contextlib.nullcontext() as caught:
    if mode == "record":
        warnings.simplefilter("always")
    with fastprof.Profiler("blocker/runs", "r", sample_hz=0) as prof:
        model = torch.nn.Linear(4, 1)
        for x in prof.loader([torch.randn(2, 4) for _ in range(3)]):
            model(x).sum().backward()
            prof.step()
if mode == "record":
    print("\\n".join(f"{w.category.__module__}.{w.category.__name__}|{w.message}" for w in caught))
print("trained")
"""

WHY = "fastprof: cannot write the run directory "


def _python(tmp_path: Path, source: str, *args: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, *flags, str(script), *args], capture_output=True, text=True, timeout=90, cwd=tmp_path
    )


def test_one_line_per_warning(tmp_path: Path) -> None:
    proc = _python(tmp_path, BLOCKED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "trained\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(WHY) and "training goes on without profiling" in lines[0], lines
    assert "FastprofWarning" not in proc.stderr and "job.py" not in proc.stderr and ".py:" not in proc.stderr


def test_still_a_warning_for_filters_and_recorders(tmp_path: Path) -> None:
    # A filter of "error": the job stops on it, a FastprofWarning raised where it was.
    err = _python(tmp_path, BLOCKED, "error")
    assert err.returncode == 1, err.stderr
    assert err.stderr.splitlines()[-1].startswith("fastprof.FastprofWarning: " + WHY), err.stderr
    # "ignore": nothing said.
    quiet = _python(tmp_path, BLOCKED, "ignore")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # A recorder gets the warning itself: category and message as issued.
    rec = _python(tmp_path, BLOCKED, "record")
    assert rec.returncode == 0 and rec.stderr == "", rec.stderr
    (seen,) = [ln for ln in rec.stdout.splitlines() if "|" in ln]
    category, message = seen.split("|", 1)
    assert category == "fastprof.FastprofWarning" and message.startswith(WHY), seen


def test_salvage_note_is_one_line(tmp_path: Path) -> None:
    # A trace cut short (a killed writer): read_trace salvages what it can and
    # says so; the reader's note does not start with "fastprof:", the line does.
    import fastprof

    rec = fastprof.start(tmp_path / "out", "cut", sample_hz=0)
    for i in range(200):
        fastprof.instant("tick", i=i)
    stats = rec.stop()
    (segment,) = stats.segments
    data = gzip.decompress(segment.read_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(data)[: len(gzip.compress(data)) // 2])
    proc = _python(tmp_path, f"import fastprof\nfastprof.read_trace({str(cut)!r})\nprint('read')\n")
    assert proc.returncode == 0 and proc.stdout == "read\n", proc.stderr
    # One line per note (the gzip stream's end, then what was salvaged).
    lines = proc.stderr.splitlines()
    assert lines and all(ln.startswith(f"fastprof: {cut}: ") for ln in lines), proc.stderr
    assert any("salvaged" in ln for ln in lines), proc.stderr
    assert "fastprof: fastprof:" not in proc.stderr and "FastprofWarning" not in proc.stderr


CORE = """
import sys, warnings
import fastprof

rec = fastprof.start("runs-" + "-".join(sys.argv[1:]), "core", sample_hz=0)
if sys.argv[1:] == ["record"]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fastprof.instant(123)  # not a name: dropped, counted, said once
    print([(w.category.__name__, str(w.message)) for w in caught])
else:
    fastprof.instant(123)
rec.stop()
print("recorded")
"""


def test_a_message_the_core_says_is_one_line(tmp_path: Path) -> None:
    # The core says it on stderr at once (from whatever thread) and issues the
    # FastprofWarning for filters: the warning's own display adds nothing.
    proc = _python(tmp_path, CORE)
    assert proc.returncode == 0 and proc.stdout.endswith("recorded\n"), proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fastprof: fastprof.instant() got a int as its name"), lines
    # Still a FastprofWarning for code that records warnings, and still said.
    rec = _python(tmp_path, CORE, "record")
    assert rec.returncode == 0, rec.stderr
    assert rec.stderr == proc.stderr
    assert "('FastprofWarning', 'fastprof.instant() got a int as its name" in rec.stdout, rec.stdout


OTHERS = """
import gc, sys, warnings
if sys.argv[1] == "with":
    import fastprof
warnings.warn("a library's own warning")
warnings.warn("a deprecation", DeprecationWarning)
f = open(__file__)
del f
gc.collect()
"""


def test_other_warnings_show_as_before(tmp_path: Path) -> None:
    # Python's display, source line and tracemalloc's allocation site included.
    flags = ("-X", "tracemalloc=5", "-W", "always::ResourceWarning")
    without = _python(tmp_path, OTHERS, "without", flags=flags)
    with_ = _python(tmp_path, OTHERS, "with", flags=flags)
    assert without.returncode == 0 and with_.returncode == 0, with_.stderr
    assert "job.py:5: UserWarning: a library's own warning" in without.stderr
    assert "Object allocated at" in without.stderr, without.stderr
    assert with_.stderr == without.stderr


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("fastprof: x", "fastprof: x\n"),
        ("fastprof run: x", "fastprof run: x\n"),
        ("path: salvaged: y", "fastprof: path: salvaged: y\n"),
        ("  fastprof: z\n", "fastprof: z\n"),
    ],
)
def test_line(message: str, shown: str) -> None:
    assert _warning_display.line(message) == shown


SINK_FAILS = """
import shutil, sys, time, warnings
import fastprof
out = sys.argv[1]
rec = fastprof.Recorder(out_dir=out, run_name="r", sample_hz=0, flush_interval=0.05).start()
shutil.rmtree(out)
open(out, "w").close()  # a file where the run directory was: the writer's next write fails
for i in range(20000):
    with fastprof.span("x", i=i):
        pass
time.sleep(0.5)
with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    rec.stop()
for w in got:
    warnings.showwarning(w.message, w.category, w.filename, w.lineno)  # as Python would show them
print(sorted(type(w.message).__name__ + ": " + str(w.message)[:40] for w in got))
"""


def test_a_failure_the_core_said_is_not_said_again_at_stop(tmp_path: Path) -> None:
    """The writer's failure is said by the core when it happens; the stop's
    warnings for it (a notice, "stopped recording early") are still
    FastprofWarnings, shown as nothing: one line on stderr, not two."""
    script = tmp_path / "job.py"
    script.write_text(SINK_FAILS)
    p = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fastprof: ") and "recording stopped" in lines[0], p.stderr
    assert "FastprofWarning: fastprof: stopped recording early" in p.stdout, p.stdout
