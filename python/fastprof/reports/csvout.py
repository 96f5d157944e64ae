"""CSV output: one file per table of the report (``time.csv``, ``steps.csv``,
``loaders.csv`` ...), a header row and one row per item. A table with no row
is not written (a file with a header only says less than its absence, and
the report says why the table is empty: ``system.gpu.reason``,
``ranks.note``). Non-finite numbers are spelt as the trace spells them."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from fastprof.reports.finite import spelt

#: Every table a report can have, in order (``breakdown`` only with a
#: breakdown: its per-step rows come from the breakdown's columns, not from
#: the document, which holds per-rank totals since report v2).
TABLES = (
    "time",
    "speed",
    "train_ranks",
    "loaders",
    "validation",
    "gpus",
    "host",
    "overhead",
    "ranks",
    "slowest_rank_per_step",
    "recommendations",
    "breakdown",
)


def tables(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The report's tables held in the document: name -> rows (flat dicts of
    scalars). Every one of :data:`TABLES` but ``breakdown``."""
    speed, system, ranks = doc["speed"], doc["system"], doc["ranks"]
    out: dict[str, list[dict[str, Any]]] = {
        "time": doc["time"]["rows"],
        "speed": [
            {
                "iterations_per_s": speed["train"]["iterations_per_s"],
                "samples_per_s": speed["train"]["samples_per_s"],
                "batch_size": speed["batch_size"]["value"],
                "warmup_steps_excluded": speed["warmup"]["steps_excluded"],
                **{f"step_{k}": v for k, v in speed["step_time"].items() if k != "trend"},
                **{f"trend_{k}": v for k, v in speed["step_time"]["trend"].items()},
            }
        ],
        "train_ranks": speed["train"]["per_rank"],
        "loaders": speed["loaders"],
        "validation": speed["validation"],
        "gpus": system["gpu"]["devices"],
        "host": system["host"],
        "overhead": system["overhead"],
        "ranks": ranks["per_rank"],
        "slowest_rank_per_step": ranks["slowest"],
        "recommendations": doc["recommendations"]["checks"],
    }
    return out


def write_csv(doc: dict[str, Any], out_dir: Path, breakdown: Any = None) -> list[Path]:
    """Write one CSV per table that has rows into ``out_dir``, the report's
    staging folder (moved in whole by ``reports.report._write``, so no
    temporary files); returns the files written, breakdown.csv among them
    when ``breakdown`` (a ``reports.breakdown.Breakdown``) wrote it there as
    its rows were computed."""
    written = []
    for name, rows in spelt(tables(doc)).items():
        if not rows:
            continue
        path = out_dir / f"{name}.csv"
        fields: list[str] = []
        for r in rows:
            fields.extend(k for k in r if k not in fields)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r in rows:
                w.writerow({k: "" if v is None else v for k, v in r.items()})
        written.append(path)
    if breakdown is not None and len(breakdown) and breakdown.csv_path is not None:
        if breakdown.csv_path.parent != out_dir or not breakdown.csv_path.is_file():
            raise RuntimeError(f"breakdown.csv was not written into {out_dir}")
        written.append(breakdown.csv_path)
    return written
