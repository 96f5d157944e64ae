"""Every code block of README.md runs as written.

A ```python block is a complete program: it runs alone, in an empty
directory, as ``python block.py`` in a subprocess on CPU, and must exit 0
with no traceback and no warning from fastprof.

A ```bash block's commands run in README order, in one working directory
holding what the Python blocks wrote (their ``fastprof_runs/`` and ``runs/``)
and what a reader of the shell examples brings: plain training scripts
``train.py`` and ``mypkg/train.py`` (no fastprof in them), a second run
``runs/new`` to diff against ``runs/base``, and, while the block with
``fastprof trigger`` runs, a live job recording into ``runs/my-run``. A
command passes with exit status 0, or 1 where its comment says "exit 1";
``<run>`` is the newest run the block's earlier commands made under
``fastprof_runs/`` and ``<pid>`` the live job's pid.

A ```text block is a listing, not a program. A block right after a
``<!-- not run: why -->`` line is skipped; any other block that does not run
fails here, and so does a fence without one of these three languages.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from moto_s3 import MotoServer

README = Path(__file__).resolve().parents[3] / "README.md"
LANGS = ("python", "bash", "text")
NOT_RUN = re.compile(r"^<!-- not run: (?P<why>\S.*\S) -->$")
# A warning raised from fastprof's own code, or of its category: a README
# program that works does not warn (Lightning prints warnings without their
# category, hence the path form).
FASTPROF_WARNING = re.compile(r"FastprofWarning|[/\\]fastprof[/\\][\w/\\]+\.py:\d+: ")
LIVE_RUN = "runs/my-run"

TRAIN_SCRIPT = """\
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--lr", type=float, default=0.01)
args = p.parse_args()
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
loader = torch.utils.data.DataLoader(torch.randn(128, 16), batch_size=8)
for epoch in range(args.epochs):
    for x in loader:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
"""

# The job `fastprof trigger` asks: steps until a STOP file appears. Captures
# follow each other without the default 30 s apart, and no slow step of a
# loaded machine starts one of its own.
LIVE_JOB = """\
import sys
import time
from pathlib import Path

import torch

import fastprof

out, name = sys.argv[1].split("/")
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
triggers = fastprof.Triggers(min_interval_s=0, anomaly=False, poll_s=0.1)
with fastprof.Profiler(out, name, schedule="never", triggers=triggers) as prof:
    while not Path("STOP").exists():
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
        time.sleep(0.02)
"""


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # the reason given in the README, or None

    @property
    def id(self) -> str:
        return f"{self.lang}-L{self.line}"


def blocks(text: str | None = None) -> list[Block]:
    lines = (README.read_text() if text is None else text).splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        lang = lines[i][3:].strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"README.md:{i + 1}: code block never closed"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = NOT_RUN.match(before.strip())
        out.append(Block(i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n", m["why"] if m else None))
        i = end + 1
    return out


#: A real S3 server (moto's) for the blocks that name an ``s3://`` bucket,
#: started once when README has one; the blocks reach it through the
#: standard AWS environment, as a user's job reaches its store.
_S3: MotoServer | None = None


def _s3_env() -> dict[str, str]:
    global _S3
    text = README.read_text()
    buckets = sorted(set(re.findall(r"s3://([a-z0-9][a-z0-9.-]+)/", text)))
    if not buckets:
        return {}
    if _S3 is None:
        import s3fs

        server = MotoServer()
        server.start()
        atexit.register(server.stop)
        os.environ.update(server.env())
        s3fs.S3FileSystem.clear_instance_cache()
        for b in buckets:
            s3fs.S3FileSystem().mkdir(b)
        _S3 = server
    return _S3.env()


#: The blocks' spool for store runs: their own, so that a run another test
#: or an earlier session left unsent in the machine's default spool (which
#: keeps the run's name, rightly) cannot rename the blocks' runs.
_SPOOL = tempfile.mkdtemp(prefix="readme-spool-")
atexit.register(shutil.rmtree, _SPOOL, True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(_s3_env())
    env["FASTPROF_SPOOL_DIR"] = _SPOOL
    # `fastprof`, `torchrun`: the console scripts beside this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # torchrun's rendezvous on a port no other test is using (its --master-port).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env["PET_MASTER_PORT"] = str(s.getsockname()[1])
    return env


def _said(p: subprocess.CompletedProcess[str]) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"


def _bad_output(p: subprocess.CompletedProcess[str]) -> str | None:
    both = p.stdout + p.stderr
    if "Traceback (most recent call last)" in both or "Exception ignored" in both:
        return "a traceback"
    m = FASTPROF_WARNING.search(p.stderr)
    if m:
        line = next(x for x in p.stderr.splitlines() if m.group(0) in x)
        return f"a fastprof warning: {line.strip()}"
    return None


# ---------------------------------------------------------------- python

_python_runs: dict[int, tuple[Path, subprocess.CompletedProcess[str]]] = {}


def _run_python(block: Block, factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Run a Python block once per session, alone in a new directory."""
    if block.line not in _python_runs:
        d = factory.mktemp(f"readme-py-L{block.line}")
        (d / "block.py").write_text(block.text)
        try:
            p = subprocess.run(
                [sys.executable, "block.py"], cwd=d, env=_env(), capture_output=True, text=True, timeout=240
            )
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"README.md:{block.line}: the Python block did not finish in 240 s\n{e.stdout!r}\n{e.stderr!r}")
        _python_runs[block.line] = (d, p)
    return _python_runs[block.line]


PYTHON = [b for b in blocks() if b.lang == "python"]


# Blocks that import torch take 10-30 s on a loaded 2-core machine (torch's
# import, torch.profiler windows, DataLoader workers): slow; the others stay
# in the quick loop.
_HEAVY = re.compile(r"^(import|from) (torch|lightning)\b", re.M)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if _HEAVY.search(b.text) else []) for b in PYTHON],
)
def test_python_block_runs_alone(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    if block.not_run:
        pytest.skip(f"README.md:{block.line}: not run: {block.not_run}")
    _, p = _run_python(block, tmp_path_factory)
    assert p.returncode == 0, f"README.md:{block.line}: the Python block failed\n{_said(p)}"
    bad = _bad_output(p)
    assert bad is None, f"README.md:{block.line}: the Python block printed {bad}\n{_said(p)}"


# ---------------------------------------------------------------- bash


def commands(block: Block) -> list[tuple[int, str]]:
    """(README line, command) of each command in a bash block."""
    out = []
    for n, raw in enumerate(block.text.splitlines(), start=block.line + 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append((n, line))
    return out


def _split(command: str) -> tuple[str, str]:
    """(the command, its trailing comment)."""
    m = re.search(r"\s#\s", command)
    return (command[: m.start()].strip(), command[m.end() :]) if m else (command, "")


def _runs(work: Path) -> set[Path]:
    return {p for p in (work / "fastprof_runs").glob("*") if p.is_dir()}


class ShellRoom:
    """The working directory the bash blocks run in, and the live job."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.env = _env()
        self.job: subprocess.Popen[str] | None = None

    def run(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["bash", "-c", command], cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(command, -1, str(e.stdout or ""), f"timed out after {timeout} s")

    def start_job(self) -> str | None:
        """Start the live job; what went wrong, or None."""
        (self.work / "live_job.py").write_text(LIVE_JOB)
        self.job = subprocess.Popen(
            [sys.executable, "live_job.py", LIVE_RUN],
            cwd=self.work,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        live = self.work / LIVE_RUN / "rank0" / "live.json"
        deadline = time.monotonic() + 120
        while not live.is_file():
            if self.job.poll() is not None or time.monotonic() > deadline:
                return f"the live job did not start: {self.stop_job() or 'no live.json in 120 s'}"
            time.sleep(0.2)
        return None

    def stop_job(self) -> str | None:
        """Stop the live job; what went wrong, or None."""
        job, self.job = self.job, None
        if job is None:
            return None
        (self.work / "STOP").touch()
        try:
            out, err = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
            out, err = job.communicate()
        if job.returncode != 0 or "Traceback" in err:
            return f"the live job ended with {job.returncode}\n{out[-3000:]}\n{err[-3000:]}"
        return None


@pytest.fixture
def room(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShellRoom]:
    work = tmp_path / "work"
    work.mkdir()
    # What the Python blocks wrote (one that failed fails its own test).
    # Default run names are timestamps, so two blocks may have picked the same.
    for block in PYTHON:
        if block.not_run:
            continue
        d, _ = _run_python(block, tmp_path_factory)
        for top in ("fastprof_runs", "runs"):
            for run in sorted((d / top).glob("*")) if (d / top).is_dir() else []:
                dest = work / top / run.name
                if dest.exists():
                    dest = work / top / f"{run.name}-L{block.line}"
                shutil.copytree(run, dest, symlinks=True)
    (work / "train.py").write_text(TRAIN_SCRIPT)
    (work / "mypkg").mkdir()
    (work / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg" / "train.py").write_text(TRAIN_SCRIPT)
    r = ShellRoom(work)
    p = r.run("fastprof run -o runs --run-name new -m mypkg.train --lr 0.1")
    assert p.returncode == 0, f"the run to diff against (runs/new) failed\n{_said(p)}"
    yield r
    r.stop_job()


def _fill(command: str, room: ShellRoom, made: list[Path]) -> str:
    def one(m: re.Match[str]) -> str:
        what = m.group(0)
        if what == "<run>" and made:
            return max(made, key=lambda p: p.stat().st_mtime_ns).name
        if what == "<pid>" and room.job is not None:
            return str(room.job.pid)
        pytest.fail(f"{command!r}: nothing stands for {what} here (mark the block not run, or teach this test)")

    return re.sub(r"<[a-z][a-z ]*>", one, command)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_bash_blocks_run_in_order(room: ShellRoom) -> None:
    failures: list[str] = []
    for block in blocks():
        if block.lang != "bash" or block.not_run:
            continue
        live = "fastprof trigger" in block.text
        if live and (why := room.start_job()):
            failures.append(f"README.md:{block.line}: {why}")
            continue
        before = _runs(room.work)
        for line, command in commands(block):
            code, comment = _split(command)
            t0 = time.monotonic()
            p = room.run(_fill(code, room, sorted(_runs(room.work) - before)))
            print(f"{time.monotonic() - t0:6.1f} s  exit {p.returncode}  README.md:{line}: {code}")
            allowed = (0, 1) if re.search(r"\bexit 1\b", comment) else (0,)
            bad = _bad_output(p)
            if p.returncode not in allowed or bad:
                why = bad or f"exit {p.returncode}, expected {' or '.join(map(str, allowed))}"
                failures.append(f"README.md:{line}: {command}\n  {why}\n{_said(p)}")
        if live and (why := room.stop_job()):
            failures.append(f"README.md:{block.line}: {why}")
    assert not failures, "\n\n".join(failures)


# ---------------------------------------------------------------- the rules


def test_every_block_says_what_it_is_and_skips_say_why() -> None:
    found = blocks()
    assert found, "no code blocks found in README.md"
    for b in found:
        assert b.lang in LANGS, f"README.md:{b.line}: a code block needs one of {LANGS} after its fence, got {b.lang!r}"
        assert b.lang != "text" or b.not_run is None, f"README.md:{b.line}: a text block is never run; no marker"
    # A marker that does not stand right before a block marks nothing.
    lines = README.read_text().splitlines()
    marked = {b.line for b in found if b.not_run}
    for n, line in enumerate(lines, start=1):
        if line.startswith("<!-- not run"):
            assert NOT_RUN.match(line.strip()), f"README.md:{n}: write it `<!-- not run: why -->`"
            nxt = next((m for m in range(n + 1, len(lines) + 1) if lines[m - 1].strip()), None)
            assert nxt in marked, f"README.md:{n}: a not-run marker must stand right before a code block"


def test_the_parser_sees_markers_languages_and_lines() -> None:
    """The rules above on a README of our own: what is marked, where."""
    text = (
        "x\n\n<!-- not run: installs things -->\n```bash\npip install .\n```\n\n"
        "```python\nprint(1)\n```\n```\nls\n```\n"
    )
    got = blocks(text)
    assert [(b.line, b.lang, b.not_run) for b in got] == [
        (4, "bash", "installs things"),
        (8, "python", None),
        (11, "", None),
    ]
    assert got[1].text == "print(1)\n"
    assert commands(Block(1, "bash", "# only a comment\nfastprof merge x   # -> x/trace.json.gz\n\n", None)) == [
        (3, "fastprof merge x   # -> x/trace.json.gz")
    ]
    assert _split("fastprof doctor --require gpu   # exit 1 unless here") == (
        "fastprof doctor --require gpu",
        "exit 1 unless here",
    )


def test_the_readme_names_every_verb() -> None:
    import argparse

    from fastprof.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(README.read_text().split())
    m = re.search(r"The commands: (.*?) \(`fastprof VERB --help` for each\)", text)
    assert m, "README.md: the sentence listing the commands is gone"
    named = set(re.findall(r"`(?:fastprof )?(\w+)`", m.group(1)))
    assert named == set(sub.choices), f"README names {sorted(named)}, the CLI has {sorted(sub.choices)}"
