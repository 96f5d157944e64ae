"""Soak of the always-on recorder: does a long job keep flat memory and bounded disk?

One process records for ``--seconds`` (default one hour) what a long training job would:
the sampler at 100 Hz, 1,000 spans/s from a Python loop (a step counter every 100 spans,
one span in ten with args), the flight-recorder window on (``window_seconds``), and the
disk cap on (``max_disk``, small ``segment_size``, so segments rotate all along).

Every ``--every`` seconds (default 60) it prints one line of the curve: RSS, the disk the
rank's segment files take (and the most seen since the last line: the files are summed
every second), the segment files on disk and how many the cap has deleted so far, the spans
recorded. The curve is rewritten as JSON after every line (``--curve``, default
``soak_curve.json`` beside the run directory, out of the merge's way), so a run cut short
still leaves its part.

Verdicts at the end: RSS after the warm-up stays within ``--rss-slack`` (10 MB); the disk
never exceeded ``max_disk``. The warm-up is what fills by design, then stays: each recording
thread's ring (``buffer_size`` slots of 24 B, committed as first written, so until the ring has
wrapped once: about 500 s for this loop's thread and 1,000 s for the sampler's at these rates),
the sampler's history (``sample_history`` samples per metric: 655 s at 100 Hz), the flight
window, plus a minute; it is decided at the first curve point from the measured record rates.
The host-wide series sampled at ``sample_system_hz`` (10 Hz) fill their history in 6,554 s,
so they still add ~5 MB per hour after it (bounded, and counted against the slack).

Run: nice -n 10 python benches/bench_soak.py [--seconds 3600] [--max-disk 32MiB]
     [--segment-size 1MiB] [--sample-hz 100] [--spans-per-s 1000] [--window-seconds 60]
     [--out DIR] [--curve PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import fastprof
from _util import machine, verdict

MB = 1e6


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def segment_files(rank_dir: Path) -> tuple[int, int, int]:
    """(bytes, files, lowest index) of the rank's segment files now; a file
    renamed or deleted while listing is skipped (the next reading sees it)."""
    total = files = 0
    lowest = -1
    try:
        entries = list(os.scandir(rank_dir))
    except FileNotFoundError:
        return 0, 0, -1
    for e in entries:
        if not e.name.startswith("fastprof."):
            continue
        try:
            total += e.stat().st_size
        except FileNotFoundError:
            continue
        files += 1
        index = int(e.name.split(".")[1])
        lowest = index if lowest < 0 else min(lowest, index)
    return total, files, lowest


def write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--every", type=float, default=60, help="seconds between curve points (default 60)")
    ap.add_argument("--sample-hz", type=float, default=100)
    ap.add_argument("--spans-per-s", type=float, default=1000)
    ap.add_argument("--window-seconds", type=float, default=60)
    ap.add_argument("--max-disk", default="32MiB")
    ap.add_argument("--segment-size", default="1MiB")
    ap.add_argument("--rss-slack", type=float, default=10, help="MB RSS may move after the warm-up (default 10)")
    ap.add_argument("--out", default=None, help="parent of the run directory (default: a temporary directory)")
    ap.add_argument("--curve", default=None, help="curve JSON path (default: soak_curve.json beside the run directory)")
    a = ap.parse_args()

    out = Path(a.out or tempfile.mkdtemp(prefix="fastprof-soak-"))
    rec = fastprof.Recorder(
        out,
        "soak",
        sample_hz=a.sample_hz,
        window_seconds=a.window_seconds,
        max_disk=a.max_disk,
        segment_size=a.segment_size,
    )
    o = rec.options
    history_s = o.sample_history / a.sample_hz
    ring_slots = 1 << (o.buffer_size - 1).bit_length()
    # This loop's ring: a begin and an end per span, a step marker per 100.
    loop_rate = 2 * a.spans_per_s + a.spans_per_s / 100
    warmup = min(max(history_s, ring_slots / loop_rate) + a.window_seconds + 60, a.seconds / 2)
    curve_path = Path(a.curve) if a.curve else o.out_dir / "soak_curve.json"
    print(f"machine: {machine()}")
    print(
        f"soak: {a.seconds:g} s, sampler {a.sample_hz:g} Hz, {a.spans_per_s:g} spans/s, flight window "
        f"{a.window_seconds:g} s, max_disk {o.max_disk} B, segment_size {o.segment_size} B; warm-up at least "
        f"{warmup:.0f} s (sampler history {o.sample_history} samples = {history_s:.0f} s, this loop's ring "
        f"{ring_slots} slots = {ring_slots / loop_rate:.0f} s; + window + 60 s), set at the first point"
    )
    print(f"run directory {o.run_dir}, curve {curve_path}")
    print(f"{'t [s]':>7} {'RSS [MB]':>9} {'disk [MB]':>10} {'max [MB]':>9} {'files':>6} {'deleted':>8} {'spans':>10}")

    doc: dict[str, Any] = {
        "machine": machine(),
        "config": {
            "seconds": a.seconds,
            "sample_hz": a.sample_hz,
            "spans_per_s": a.spans_per_s,
            "window_seconds": a.window_seconds,
            "max_disk": o.max_disk,
            "segment_size": o.segment_size,
            "sample_history": o.sample_history,
            "warmup_s": warmup,
            "rss_slack_mb": a.rss_slack,
        },
        "points": [],
    }
    points: list[dict[str, Any]] = doc["points"]
    rec.start()
    rank_dir = rec.trace_dir
    names = [fastprof.name_id("soak.work"), fastprof.name_id("soak.io")]
    t0 = time.monotonic()
    next_point = t0 + a.every
    next_disk = t0 + 1.0
    disk_max_all = disk_max_window = 0
    spans = 0
    step = 0
    tick = 0.01  # 10 ms of spans at a time, then sleep to the pace
    per_tick = a.spans_per_s * tick
    due = 0.0
    while True:
        now = time.monotonic()
        if now - t0 >= a.seconds:
            break
        due += per_tick
        while spans < due:
            if spans % 10 == 0:
                with fastprof.span(names[1], n=spans):
                    pass
            else:
                with fastprof.span(names[0]):
                    pass
            spans += 1
            if spans % 100 == 0:
                step += 1
                rec.mark_step(step)
        if now >= next_disk:
            next_disk += 1.0
            disk, _, _ = segment_files(rank_dir)
            disk_max_window = max(disk_max_window, disk)
            disk_max_all = max(disk_max_all, disk)
        if now >= next_point:
            next_point += a.every
            if not points:
                # The sampler's ring fills at the rate of its records (one per
                # metric per tick), measured now.
                # (from each series' own span: its history may be full already).
                sampler_rate = sum(
                    (len(t) - 1) * 1e9 / (int(t[-1]) - int(t[0]))
                    for t, _ in rec.counters().values()
                    if len(t) > 1 and t[-1] > t[0]
                )
                if sampler_rate > 0:
                    warmup = min(
                        max(history_s, ring_slots / loop_rate, ring_slots / sampler_rate) + a.window_seconds + 60,
                        a.seconds / 2,
                    )
                doc["config"]["warmup_s"] = warmup
                doc["config"]["sampler_records_per_s"] = sampler_rate
                wrap = ring_slots / max(sampler_rate, 1e-9)
                said = f"sampler {sampler_rate:.0f} records/s: its ring wraps in {wrap:.0f} s"
                print(f"        ({said}; warm-up {warmup:.0f} s)")
            disk, files, lowest = segment_files(rank_dir)
            p = {
                "t_s": round(now - t0, 1),
                "rss_bytes": rss_bytes(),
                "disk_bytes": disk,
                "disk_max_bytes": max(disk_max_window, disk),
                "files": files,
                "deleted": max(lowest, 0),
                "spans": spans,
            }
            disk_max_window = 0
            points.append(p)
            print(
                f"{p['t_s']:7.0f} {p['rss_bytes'] / MB:9.1f} {disk / MB:10.2f} {p['disk_max_bytes'] / MB:9.2f} "
                f"{files:6d} {p['deleted']:8d} {spans:10d}",
                flush=True,
            )
            write_json(curve_path, doc)
        sleep = t0 + (spans / a.spans_per_s) - time.monotonic()
        if sleep > 0:
            time.sleep(min(sleep, tick))
    # Beside the run directory: a trace inside it would be merged as the rank's own.
    dump = rec.dump(o.out_dir / "soak_flight.json.gz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stats = rec.stop()
    for w in caught:
        print(f"warning: {w.message}")
    disk, files, _ = segment_files(rank_dir)
    disk_max_all = max(disk_max_all, disk)

    after = [p["rss_bytes"] for p in points if p["t_s"] >= warmup]
    growth = (max(after) - min(after)) / MB if len(after) >= 2 else None
    rotated = stats.rotated or {}
    doc["result"] = {
        "elapsed_s": round(time.monotonic() - t0, 1),
        "spans": spans,
        "spans_per_s": round(spans / (time.monotonic() - t0), 1),
        "events_written": stats.events_written,
        "dropped": stats.dropped,
        "rss_after_warmup_mb": {"min": min(after) / MB, "max": max(after) / MB} if after else None,
        "rss_growth_after_warmup_mb": growth,
        "disk_max_bytes": disk_max_all,
        "disk_final_bytes": disk,
        "max_disk": o.max_disk,
        "rotated": {k: v for k, v in rotated.items() if k != "deleted"},
        "flight_dump": {"events": dump.get("events"), "bytes": dump.get("bytes")},
        "rss_flat": growth is not None and growth <= a.rss_slack,
        "disk_under_cap": disk_max_all <= o.max_disk,
    }
    write_json(curve_path, doc)
    r = doc["result"]
    print()
    print(f"spans {spans} ({r['spans_per_s']}/s), events written {stats.events_written}, dropped {stats.dropped}")
    print(
        f"rotated away: {rotated.get('segments', 0)} segments, {rotated.get('bytes', 0) / MB:.1f} MB, "
        f"{rotated.get('events', 0)} events"
        + (
            f", trace time {rotated['ts_start'] / 1e6:.1f}-{rotated['ts_end'] / 1e6:.1f} s"
            if rotated.get("ts_start") is not None
            else ""
        )
    )
    print(f"flight dump: {dump.get('events')} events, {dump.get('bytes', 0) / MB:.2f} MB")
    if growth is None:
        print(f"RSS after warm-up: too few points past {warmup:.0f} s to judge  {verdict(False)}")
    else:
        print(
            f"RSS after warm-up ({len(after)} points): {min(after) / MB:.1f}-{max(after) / MB:.1f} MB, "
            f"moved {growth:.2f} MB (goal <= {a.rss_slack:g})  {verdict(growth <= a.rss_slack)}"
        )
    print(
        f"disk: at most {disk_max_all / MB:.2f} MB of max_disk {o.max_disk / MB:.2f} MB "
        f"({disk_max_all / o.max_disk:.0%})  {verdict(disk_max_all <= o.max_disk)}"
    )
    print(f"curve: {curve_path}")


if __name__ == "__main__":
    main()
