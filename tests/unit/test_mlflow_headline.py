"""The headline numbers logged to MLflow, from a hand-written report
document with two GPUs and two ranks (no GPU on the test machine)."""

from __future__ import annotations

import math

from fastprof.integrations.mlflow import headline


def test_headline_sums_energy_and_takes_peaks() -> None:
    doc = {
        "wall": {"duration_s": 12.5},
        "speed": {
            "train": {"iterations_per_s": 4.0, "samples_per_s": None},
            "step_time": {"count": 40, "mean_s": 0.25, "p50_s": 0.24, "p95_s": 0.3, "max_s": 0.5},
        },
        "system": {
            "gpu": {
                "devices": [
                    {"util_mean_pct": 80.0, "mem_used_peak_b": 3e9, "energy_j": 1000.0, "energy_per_sample_j": 2.0},
                    {"util_mean_pct": 60.0, "mem_used_peak_b": 5e9, "energy_j": 500.0, "energy_per_sample_j": None},
                ]
            },
            "host": [{"rss_peak_b": 2e9}, {"rss_peak_b": None}, {"rss_peak_b": 3e9}],
        },
        "recommendations": {
            "items": [{"rule": "dataloader"}],
            "checks": [{"rule": "gpu_utilization", "measured": 70.0}, {"rule": "dataloader", "measured": 12.5}],
        },
    }
    h = headline(doc)
    assert h == {
        "train_iterations_per_s": 4.0,
        "step_mean_s": 0.25,
        "step_p50_s": 0.24,
        "step_p95_s": 0.3,
        "step_max_s": 0.5,
        "steps": 40.0,
        "wall_s": 12.5,
        "peak_rss_bytes": 3e9,
        "dataloader_share_pct": 12.5,
        "gpu_util_mean_pct": 70.0,
        "gpu_mem_peak_bytes": 5e9,
        "energy_j": 1500.0,
        "energy_per_sample_j": 2.0,
        "recommendations": 1.0,
    }


def test_headline_leaves_out_missing_and_non_finite() -> None:
    doc = {"speed": {"train": {"iterations_per_s": math.nan}, "step_time": {"p50_s": math.inf}}, "system": {}}
    assert headline(doc) == {}
