"""The hang evidence's reading of a DataLoader worker's ``faulthandler``
dump (issue #37): a real dump of this process parsed back, and where a
worker is from its threads (its main thread's innermost frame of the job's
code; none when it is idle in torch's loop)."""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

from fastprof.profiler.drivers.hang.evidence import parse_dump
from fastprof.profiler.drivers.hang.verdict import worker_where


def _here(path: Path) -> int:
    with open(path, "w") as f:
        line = sys._getframe().f_lineno + 1
        faulthandler.dump_traceback(file=f, all_threads=True)
    return line


def test_a_real_dump_is_parsed_innermost_first(tmp_path: Path) -> None:
    line = _here(tmp_path / "dump.txt")
    threads = parse_dump((tmp_path / "dump.txt").read_text())
    (me,) = [t for t in threads if t["current"]]
    assert me["frames"][0] == {"file": __file__, "line": line, "function": "_here"}
    assert me["frames"][1]["function"] == "test_a_real_dump_is_parsed_innermost_first"
    assert all(t["id"].startswith("0x") for t in threads)


def test_a_worker_is_where_its_main_thread_is_in_the_jobs_code() -> None:
    loop = os.path.join(os.sep, "venv", "site-packages", "torch", "utils", "data", "_utils", "worker.py")
    fetch = os.path.join(os.sep, "venv", "site-packages", "torch", "utils", "data", "_utils", "fetch.py")
    queue = os.path.join(os.sep, "usr", "lib", "python3.11", "multiprocessing", "queues.py")
    user = os.path.join(os.sep, "job", "data.py")
    busy = [
        {"id": "0x2", "current": False, "frames": [{"file": queue, "line": 1, "function": "get"}]},
        {
            "id": "0x1",
            "current": True,
            "frames": [
                {"file": user, "line": 17, "function": "__getitem__"},
                {"file": fetch, "line": 52, "function": "fetch"},
                {"file": loop, "line": 349, "function": "_worker_loop"},
            ],
        },
    ]
    assert worker_where(busy) == {"file": user, "line": 17, "function": "__getitem__"}
    idle = [{"id": "0x1", "current": True, "frames": [{"file": loop, "line": 320, "function": "_worker_loop"}]}]
    assert worker_where(idle) is None
    assert worker_where([]) is None
