"""kiln's own timing loops: warm-up, a fixed-length single stream (the benchmark scripts'
in-process comparisons), the soak run of a leak check, and the RSS growth estimate. kiln bench's
scenarios themselves are MLPerf LoadGen's (``kiln.bench.loadgen``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.bench.metrics import (
    EnergyMeter,
    NvmlEnergyMeter,
    energy_per_inference,
    growth_estimate,
    latency_stats,
    rss_bytes,
)

Run = Callable[[dict[str, np.ndarray]], Any]
MAX_ITERATIONS = 1_000_000


def warm_up(run: Run, feeds: dict[str, np.ndarray], iterations: int) -> list[float]:
    """Run ``iterations`` times unmeasured; returns each run's seconds (a first estimate)."""
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - start)
    return times


def median_latency_ms(run: Run, feeds: dict[str, np.ndarray], runs: int, warmup: int = 5) -> float:
    """Median latency of ``runs`` calls after ``warmup`` (a single-stream run of fixed length, for
    benchmark scripts that compare backends in one process)."""
    warm_up(run, feeds, warmup)
    return float(single_stream(run, feeds, 0.0, runs)["latency_ms"]["p50"])


def growth(samples: list[tuple[int, int]]) -> dict[str, Any]:
    estimate = growth_estimate(samples)
    found = {"rss_growth_mb_per_1k": estimate["mb_per_1k"], "rss_growth_ci95": estimate["ci95"]}
    if estimate["note"]:
        found["rss_growth_note"] = estimate["note"]
    return found


def soak(run: Run, feeds: dict[str, np.ndarray], inferences: int, rss_samples: int = 50) -> dict[str, Any]:
    """``inferences`` runs back to back, RSS sampled evenly: the growth estimate of a leak check."""
    every = max(1, inferences // rss_samples)
    samples = [(0, rss_bytes())]
    for count in range(1, inferences + 1):
        run(feeds)
        if count % every == 0:
            samples.append((count, rss_bytes()))
    return {**growth(samples), "soak_inferences": inferences}


def single_stream(
    run: Run,
    feeds: dict[str, np.ndarray],
    duration: float,
    min_iterations: int,
    meter: EnergyMeter | NvmlEnergyMeter | None = None,
    rss_samples: int = 50,
) -> dict[str, Any]:
    """Run until ``duration`` seconds and ``min_iterations`` have both passed."""
    idle = meter.idle_watts(0.5) if meter and meter.available else 0.0
    energy_start = meter.read_joules() if meter and meter.available else 0.0
    latencies: list[float] = []
    samples: list[tuple[int, int]] = [(0, rss_bytes())]
    every = 1
    start = time.perf_counter()
    while True:
        begin = time.perf_counter()
        run(feeds)
        latencies.append(time.perf_counter() - begin)
        count = len(latencies)
        if count % every == 0:
            samples.append((count, rss_bytes()))
            if len(samples) > rss_samples * 2:  # keep the sampling sparse on long runs
                samples = samples[::2]
                every *= 2
        elapsed = time.perf_counter() - start
        if (elapsed >= duration and count >= min_iterations) or count >= MAX_ITERATIONS:
            break
    result: dict[str, Any] = {
        "latency_ms": latency_stats(latencies),
        "throughput": count / elapsed,
        **growth(samples),
        "iterations": count,
        "seconds": elapsed,
    }
    if meter and meter.available:
        joules = meter.read_joules() - energy_start
        result["energy"] = {
            "joules_per_inference": energy_per_inference(joules, elapsed, idle, count),
            "idle_watts": idle,
        }
    return result
