"""MLPerf LoadGen's scenarios over a loaded ``Session``.

* single-stream: one request at a time; per-request latency.
* offline: ``inflight`` requests kept in flight by as many threads; throughput in samples/s.
* server: Poisson arrivals at ``rate`` requests/s served by ``inflight`` threads; request latency
  (arrival to completion, queueing included) and service latency (start to completion).
"""

from __future__ import annotations

import queue
import threading
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


def warm_up(run: Run, feeds: dict[str, np.ndarray], iterations: int) -> None:
    for _ in range(iterations):
        run(feeds)


def median_latency_ms(run: Run, feeds: dict[str, np.ndarray], runs: int, warmup: int = 5) -> float:
    """Median latency of ``runs`` calls after ``warmup`` (a single-stream run of fixed length, for
    benchmark scripts that compare backends in one process)."""
    warm_up(run, feeds, warmup)
    return float(single_stream(run, feeds, 0.0, runs)["latency_ms"]["p50"])


def _growth(samples: list[tuple[int, int]]) -> dict[str, Any]:
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
    return {**_growth(samples), "soak_inferences": inferences}


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
        **_growth(samples),
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


def offline(run: Run, feeds: dict[str, np.ndarray], duration: float, inflight: int, batch: int) -> dict[str, Any]:
    """Maximum throughput with ``inflight`` concurrent requests."""
    stop = time.perf_counter() + duration
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while time.perf_counter() < stop:
                begin = time.perf_counter()
                run(feeds)
                with lock:
                    latencies.append(time.perf_counter() - begin)
        except BaseException as err:
            errors.append(err)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(inflight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return {
        "latency_ms": latency_stats(latencies),
        "throughput": len(latencies) * batch / elapsed,
        "requests": len(latencies),
        "seconds": elapsed,
    }


def server(
    run: Run, feeds: dict[str, np.ndarray], duration: float, rate: float, inflight: int, seed: int = 0
) -> dict[str, Any]:
    """Poisson arrivals at ``rate``/s for ``duration`` s; waits for every issued request."""
    rng = np.random.default_rng(seed)
    arrivals: list[float] = []
    clock = 0.0
    while True:
        clock += rng.exponential(1.0 / rate)
        if clock > duration:
            break
        arrivals.append(clock)
    pending: queue.Queue[float | None] = queue.Queue()
    request_latency: list[float] = []
    service_latency: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def serve() -> None:
        while True:
            arrival = pending.get()
            if arrival is None:
                return
            try:
                begin = time.perf_counter()
                run(feeds)
                end = time.perf_counter()
            except BaseException as err:
                errors.append(err)
                continue
            with lock:
                request_latency.append(end - arrival)
                service_latency.append(end - begin)

    workers = [threading.Thread(target=serve) for _ in range(inflight)]
    for worker in workers:
        worker.start()
    origin = time.perf_counter()
    for offset in arrivals:
        delay = origin + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        pending.put(origin + offset)
    for _ in workers:
        pending.put(None)
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - origin
    if errors:
        raise errors[0]
    return {
        "target_rate": rate,
        "achieved_rate": len(request_latency) / elapsed if elapsed else 0.0,
        "request_latency_ms": latency_stats(request_latency),
        "service_latency_ms": latency_stats(service_latency),
        "latency_ms": latency_stats(request_latency),
        "requests": len(request_latency),
        "seconds": elapsed,
    }
