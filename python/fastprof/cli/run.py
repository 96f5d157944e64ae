"""``fastprof run``: profile a training script with no change to it. The
script runs in this process as ``python script.py`` (or ``python -m
module``) would run it, under a ``fastprof.Profiler``: host sampling, steps
from ``optimizer.step()``, DataLoader passes timed, the run directory
written; at the end the report command is printed on stderr. The script's
stdout, stderr and exit status are its own.

Examples:
  fastprof run train.py --epochs 3
  fastprof run -o runs --run-name baseline -m mypkg.train --lr 0.1
  fastprof run --schedule epoch:warmup=1,active=4 train.py     # with a torch.profiler window
  fastprof run --run-name baseline --resume train.py           # a restarted job appends to its run
  torchrun --nproc-per-node 2 -m fastprof run train.py      # every rank in one run directory

Long-run defaults: no fixed torch.profiler window (schedule "never": a fixed
window costs Kineto's start-up and memory, and writes to stderr; --torch-window
or --schedule ask for one), triggers armed (fastprof trigger RUN_DIR, SIGUSR2,
a slow step: a torch window of a few steps from the next step, and a flight
dump; --no-torch-window leaves torch.profiler out entirely); sampling at the
options table's rate (--sample-hz, FASTPROF_SAMPLE_HZ). Every other option
comes from its FASTPROF_* variable.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import Any

from fastprof import run as zero
from fastprof._core import DEFAULT_SAMPLE_HZ, ConfigError
from fastprof._loop_api import RunHost
from fastprof.cli.args import location, option
from fastprof.cli.errors import CommandError
from fastprof.profiler.args import ProfilerArgs
from fastprof.recording.options import BY_NAME, _origin, _value
from fastprof.storage.urls import absolute, check_location


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "run",
        help="profile a script or module with no change to it (script.py | -m module [args...])",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="fastprof run [options] (script.py | -m module) [args ...]",
    )
    p.add_argument(
        "-o",
        "--out-dir",
        "--out",
        dest="out_dir",
        type=location,
        default=None,
        help="parent of the run directory (default: fastprof_runs)",
    )
    p.add_argument(
        "--run-name",
        default=None,
        help="run directory name (default: run-<timestamp>; torchrun: run-<rdzv id>, or from the torchrun agent "
        "when the id is 'none' on one node; give one across nodes); when an earlier run holds it, this run "
        "records in NAME-2 (-3, ...)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="append to an earlier run of the same --run-name (a job restarted after preemption) instead of "
        "taking NAME-2; the report shows the time between them as idle (FASTPROF_RESUME=1)",
    )
    p.add_argument(
        "--sample-hz",
        type=option("sample_hz"),
        default=None,
        help=f"sampler ticks per second, 0 = off (default: {DEFAULT_SAMPLE_HZ:g})",
    )
    p.add_argument(
        "--schedule",
        type=option("schedule"),
        default=None,
        help="torch.profiler windows on this schedule, e.g. epoch:warmup=1,active=4 or cyclic:wait=10,active=2",
    )
    p.add_argument(
        "--torch-window",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.profiler windows on the default schedule (default: only triggered ones; "
        "--no-torch-window: none at all)",
    )
    p.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="module",
        help="run a library module as a script, as python -m does (the rest are its arguments)",
    )
    p.add_argument("script", nargs=argparse.REMAINDER, help="the script and its arguments")
    p.set_defaults(run=run)


def _profiler_options(args: argparse.Namespace) -> dict[str, Any]:
    env = os.environ
    # Absolute: a script that changes directory must not move the run's files.
    out_dir = os.fspath(_value(BY_NAME["out_dir"], args.out_dir, env))
    if args.out_dir is None:  # FASTPROF_OUT_DIR: refused before the script starts, as -o is
        try:
            check_location(out_dir, _origin(BY_NAME["out_dir"], None, env))
        except ConfigError as e:
            raise CommandError(str(e), exit_code=2) from None
    out_dir = absolute(out_dir)  # a URL (s3://...) is the store's, kept as it is
    run_name = args.run_name if args.run_name is not None else _torchrun_run_name(env)
    kw: dict[str, Any] = {"out_dir": out_dir, "run_name": run_name, "sample_hz": args.sample_hz}
    if args.resume:
        kw["resume"] = True
    if args.schedule is not None:
        kw["schedule"] = args.schedule
    if args.torch_window is False:
        kw["torch"] = False
    elif args.torch_window or args.schedule is not None:
        kw["torch"] = True
    elif not (env.get("FASTPROF_TORCH", "").strip() or env.get("FASTPROF_SCHEDULE", "").strip()):
        # The long-run default: no fixed window, but torch.profiler ready for
        # the windows triggers ask for (fastprof trigger, SIGUSR2, a slow step).
        kw["schedule"] = "never"
    return kw


def _torchrun_run_name(env: Any) -> str | None:
    """The run name every rank of a one-node torchrun job agrees on when
    torchrun's rendezvous id is ``none`` (its default; the recorder names a
    run ``run-<id>`` otherwise): ``run-<agent start>-<agent pid>``, from the
    torchrun agent, the parent of every local rank. None when not under
    torchrun, or a name was given; across nodes nothing local is shared,
    so a name must be."""
    if "TORCHELASTIC_RUN_ID" not in env or env.get("FASTPROF_RUN_NAME", "").strip():
        return None
    if env["TORCHELASTIC_RUN_ID"] not in ("", "none"):
        return None
    try:
        world, local = int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return None
    if world < 2:
        return None
    if local != world:
        raise CommandError(
            f"torchrun across nodes ({world} ranks, {local} here) with rendezvous id 'none': the ranks cannot "
            "agree on a run directory; give --run-name NAME (or FASTPROF_RUN_NAME, or torchrun --rdzv-id)",
            exit_code=2,
        )
    agent = os.getppid()
    started = _started(agent)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started)) if started is not None else "torchrun"
    return f"run-{stamp}-{agent}"


def _started(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds), from /proc; None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def run(args: argparse.Namespace) -> int:
    if args.module is not None:
        if not args.module:
            raise CommandError("-m: give the module to run (-m module [args ...])", exit_code=2)
        name, rest = args.module[0], args.module[1:]
        if args.script:
            raise CommandError(f"give either a script or -m module, not both ({args.script[0]} and -m {name})", 2)
    else:
        words = list(args.script)
        if words[:1] == ["--"]:
            words = words[1:]
        if not words:
            raise CommandError("nothing to run: fastprof run [options] (script.py | -m module) [args ...]", 2)
        name, rest = words[0], words[1:]
    kw = _profiler_options(args)
    try:
        target = zero.module_target(name) if args.module is not None else zero.script_target(name)
    except zero.TargetError as e:
        raise CommandError(str(e), e.exit_code) from None
    except zero.CompileFailed as e:
        zero.print_exception(e.error)  # as Python prints a SyntaxError: no traceback
        return 1

    # A bad option: ConfigError, one line (exit 2), before the script runs.
    prof = ProfilerArgs(kw.pop("out_dir"), kw.pop("run_name"), kw).make()
    ended, discarded = zero.run(target, rest, prof)
    if discarded:
        _nothing_recorded(prof, target.label, ended)
    else:
        _next_command(prof, target.label)
    if ended is None:
        return 0
    if isinstance(ended, SystemExit):
        code = ended.code
        if code is None or isinstance(code, int):
            raise SystemExit(code)  # Python's own handling: None is 0, an int that status
        return 1  # a message: printed already (zero.run), and Python exits 1
    if type(ended) is KeyboardInterrupt:
        # Python ends an uncaught Ctrl-C by SIGINT once the interpreter is
        # finalised (the shell sees 130): an uncaught KeyboardInterrupt out
        # of here does exactly that. Its traceback is already printed.
        sys.excepthook = _silent
        ended.fastprof_script = True  # type: ignore[attr-defined]
        raise ended
    return 1


def _silent(*_: Any) -> None:
    pass


def _nothing_recorded(prof: RunHost, label: str, ended: BaseException | None) -> None:
    """Rank 0 says the run left nothing (it failed before its first step)."""
    if prof.rank != 0:
        return
    if isinstance(ended, SystemExit):
        how = f"exited with status {ended.code if isinstance(ended.code, int) else 1}"
    elif isinstance(ended, KeyboardInterrupt):
        how = "was interrupted"
    else:
        how = f"failed ({type(ended).__name__})"
    print(f"fastprof run: {label}: {how} before its first step; nothing recorded", file=sys.stderr, flush=True)


def _next_command(prof: RunHost, label: str) -> None:
    """Rank 0 says where the run is and which command reads it (stderr)."""
    if not prof.stopped or prof.rank != 0:
        return
    successor = prof.successor
    steps = successor.batch if successor is not None else prof.batch  # the script's own Profiler's
    run_dir = str(prof.run_dir)
    rel = os.path.relpath(run_dir)
    shown = rel if not rel.startswith("..") else run_dir
    run_url = prof.recorder.options.run_url
    if run_url is not None:
        shown = run_url
    world = int(prof.recorder.options.world_size)
    ranks = f", {world} ranks" if world > 1 else ""
    print(
        f"fastprof run: {label}: {steps} steps{ranks} recorded in {shown}\n"
        f"fastprof run: next: fastprof report {shlex.quote(shown)}",
        file=sys.stderr,
        flush=True,
    )
