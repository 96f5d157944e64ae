"""Span enter+exit cost, side by side in one run.

Compares, per span (enter + exit), with a recorder running and its writer
thread draining:
  * the floor: two empty ``_core`` calls, and an empty ``_core`` context
    manager (the same ``with`` machinery as a span, recording nothing);
  * fastprof: ``with name:``, ``name.begin()/fastprof.end()``, ``with fastprof.span("str"):``;
  * a Composer-style pure-Python marker (appends (name, phase, time_ns, thread id));
  * ``torch.profiler.record_function`` with no profiler active.
Cases are interleaved round by round; the best round of each is reported.

Targets (issue #2): span <= 2.0x the floor, >= 3x faster than the Python
marker, >= 40x faster than record_function.

Run: python benches/bench_span.py
"""

from __future__ import annotations

import tempfile
import threading
import time
import warnings

import fastprof
from _util import best, interleaved, machine, verdict
from fastprof import _core

N = 200_000
ROUNDS = 9


def main() -> None:
    noop = _core._noop
    null = _core._NullSpan()
    fwd = fastprof.name_id("forward")
    begin, end = fwd.begin, fastprof.end
    span = fastprof.span
    events: list[tuple[str, str, int, int]] = []

    def floor_calls() -> None:
        for _ in range(N):
            noop()
            noop()

    def floor_with() -> None:
        for _ in range(N):
            with null:
                pass

    def fp_with() -> None:
        for _ in range(N):
            with fwd:
                pass

    def fp_begin_end() -> None:
        for _ in range(N):
            begin()
            end()

    def fp_span_str() -> None:
        for _ in range(N):
            with span("forward"):
                pass

    def marker() -> None:
        app, now, ident = events.append, time.time_ns, threading.get_ident
        for _ in range(N):
            app(("forward", "B", now(), ident()))
            app(("forward", "E", now(), ident()))
        events.clear()

    rf_n = N // 20

    def record_function() -> None:
        import torch

        rf = torch.profiler.record_function
        for _ in range(rf_n):
            with rf("forward"):
                pass

    have_torch = True
    try:
        import torch  # noqa: F401
    except ImportError:
        have_torch = False

    inactive = interleaved({"inactive": fp_with}, 3)["inactive"]
    cases = {
        "floor: 2 empty _core calls": floor_calls,
        "floor: empty _core `with`": floor_with,
        "fastprof `with name:`": fp_with,
        "fastprof begin()/end()": fp_begin_end,
        "fastprof `with span('str')`": fp_span_str,
        "Composer-style Python marker": marker,
    }
    if have_torch:
        cases["torch record_function (no profiler)"] = record_function
    with tempfile.TemporaryDirectory() as tmp:
        rec = fastprof.start(tmp, "bench-span")
        times = interleaved(cases, ROUNDS)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            stats = rec.stop()
    per = {k: best(v) / N * 1e9 for k, v in times.items()}
    if have_torch:
        per["torch record_function (no profiler)"] = best(times["torch record_function (no profiler)"]) / rf_n * 1e9
    per["fastprof `with name:` (no recorder)"] = best(inactive) / N * 1e9

    print(f"machine: {machine()}")
    print(f"{N} spans per case, best of {ROUNDS} interleaved rounds; ns per span (enter+exit)\n")
    for k, v in per.items():
        print(f"  {k:<40} {v:8.1f} ns")
    calls, wfloor = per["floor: 2 empty _core calls"], per["floor: empty _core `with`"]
    w, be = per["fastprof `with name:`"], per["fastprof begin()/end()"]
    mk = per["Composer-style Python marker"]
    print("\nratios")
    print(f"  begin()/end() / 2 empty calls       {be / calls:6.2f}x   target <= 2.0x  {verdict(be / calls <= 2.0)}")
    print(f"  `with name:` / empty `with`         {w / wfloor:6.2f}x   target <= 2.0x  {verdict(w / wfloor <= 2.0)}")
    alone = wfloor / calls
    print(f"  `with name:` / 2 empty calls        {w / calls:6.2f}x   (the with statement alone costs {alone:.2f}x)")
    print(f"  Python marker / `with name:`        {mk / w:6.2f}x   target >= 3x    {verdict(mk / w >= 3)}")
    print(f"  Python marker / begin()/end()       {mk / be:6.2f}x   target >= 3x    {verdict(mk / be >= 3)}")
    if have_torch:
        rf = per["torch record_function (no profiler)"]
        print(f"  record_function / `with name:`      {rf / w:6.1f}x   target >= 40x   {verdict(rf / w >= 40)}")
    print(f"\nwriter: {stats.events_written} events written, {stats.dropped} dropped")


if __name__ == "__main__":
    main()
