"""MLPerf LoadGen (``mlcommons-loadgen``, its Python module ``mlperf_loadgen``) as kiln bench's
scenario engine: SingleStream, MultiStream, Server and Offline issued by LoadGen itself, with its
settings (minimum duration, minimum query count, target latency and percentile) and its validity
verdict (VALID / INVALID and which of its checks failed) read back from its summary log.

The system under test is a pool of ``inflight`` threads that take LoadGen's samples from a queue,
run the session on the sample's inputs (a small query sample library of distinct inputs) and
report completion. Every sample's latency, issue to completion, is also timed here for the
report's distributions; LoadGen's own percentiles and QPS are kept beside them.
"""

from __future__ import annotations

import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bench.metrics import latency_stats, rss_bytes
from kiln.output_files import ensure_folder

RSS_SAMPLES = 50  # at least this many RSS samples per run (at most twice as many)

Run = Callable[[dict[str, np.ndarray]], Any]

SCENARIOS = {"single-stream": "SingleStream", "multi-stream": "MultiStream", "server": "Server", "offline": "Offline"}
MULTI_STREAM_SAMPLES = 8  # MLPerf's samples per MultiStream query


def unavailable() -> str | None:
    """Why LoadGen cannot run here, or None."""
    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError as err:
        return f"mlcommons-loadgen is not installed ({err}); pip install mlcommons-loadgen (make setup installs it)"
    return None


def run_scenario(
    run: Run,
    samples: Sequence[dict[str, np.ndarray]],
    scenario: str,
    duration: float,
    min_queries: int,
    inflight: int = 1,
    batch: int = 1,
    expected_latency_s: float | None = None,
    rate: float | None = None,
    target_latency_ms: float | None = None,
    percentile: float | None = None,
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """One LoadGen performance run of ``scenario`` (kiln bench's name, ``SCENARIOS``).

    ``expected_latency_s``: a measured single run (LoadGen sizes its queries from it);
    ``rate``: the Server scenario's target queries per second; ``target_latency_ms``: the Server's
    latency bound (default 4x the expected latency, at least 10 ms); ``percentile``: the latency
    percentile LoadGen judges (its defaults: 0.90 single-stream, 0.99 multi-stream and server).
    """
    import mlperf_loadgen as lg

    expected = max(expected_latency_s or 0.01, 1e-5)
    settings, target_ns = _test_settings(
        lg, scenario, duration, min_queries, inflight, expected, rate, target_latency_ms, percentile
    )
    server = _Server(lg, run, samples, inflight)
    count = len(samples)
    sut = lg.ConstructSUT(server.issue, server.flush)
    qsl = lg.ConstructQSL(count, count, lambda _: None, lambda _: None)
    with tempfile.TemporaryDirectory(prefix="kiln-loadgen-") as scratch:
        out = Path(log_dir or scratch)
        ensure_folder(out, "LoadGen log folder", parents=True)
        log_settings = lg.LogSettings()
        log_settings.log_output.outdir = str(out)
        log_settings.log_output.copy_summary_to_stdout = False
        start = time.perf_counter()
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
        finally:
            elapsed = time.perf_counter() - start
            server.stop()
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        verdict = parse_summary((out / "mlperf_log_summary.txt").read_text())
    if server.errors:
        raise server.errors[0]
    verdict["settings"] = {
        "min_duration_ms": settings.min_duration_ms,
        "min_query_count": settings.min_query_count,
        "target_latency_ms": target_ns / 1e6 if scenario == "server" else None,
        "target_qps": settings.server_target_qps if scenario == "server" else None,
        "samples_per_query": MULTI_STREAM_SAMPLES if scenario == "multi-stream" else 1,
        "latency_percentile": percentile,
        "inflight": inflight,
    }
    result: dict[str, Any] = {
        "loadgen": verdict,
        "latency_ms": latency_stats(server.latencies),
        "throughput": len(server.latencies) * batch / elapsed if elapsed else 0.0,
        "iterations": len(server.latencies),
        "seconds": elapsed,
        "rss_samples": server.rss,
    }
    return result


def _test_settings(lg, scenario, duration, min_queries, inflight, expected, rate, target_latency_ms, percentile):  # type: ignore[no-untyped-def]
    """LoadGen's TestSettings for one performance run (and the Server's latency bound, ns)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"LoadGen has no scenario {scenario!r}; kiln bench's: {', '.join(SCENARIOS)}")
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, SCENARIOS[scenario])
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(duration * 1000)
    settings.min_query_count = max(1, int(min_queries))
    capacity = inflight / expected  # queries per second the threads can serve
    target_ns = int((target_latency_ms or max(4e3 * expected, 10.0)) * 1e6)
    if percentile is not None and not 0 < percentile < 1:
        raise ValueError(f"a latency percentile is a fraction in (0, 1), not {percentile}")
    if scenario == "single-stream":
        settings.single_stream_expected_latency_ns = int(expected * 1e9)
        if percentile is not None:
            settings.single_stream_target_latency_percentile = float(percentile)
    elif scenario == "multi-stream":
        settings.multi_stream_samples_per_query = MULTI_STREAM_SAMPLES
        settings.multi_stream_expected_latency_ns = int(expected * 1e9 * MULTI_STREAM_SAMPLES / inflight)
        if percentile is not None:
            settings.multi_stream_target_latency_percentile = float(percentile)
    elif scenario == "server":
        settings.server_target_qps = float(rate or 0.7 * capacity)
        settings.server_target_latency_ns = target_ns
        if percentile is not None:
            settings.server_target_latency_percentile = float(percentile)
    else:  # offline: one query of about duration x capacity samples
        settings.offline_expected_qps = float(capacity)
    settings.max_duration_ms = int(max(4 * duration, duration + 30) * 1000)  # a guard, not a target
    return settings, target_ns


class _Server:
    """The system under test: ``inflight`` threads serving LoadGen's queries from one queue, each
    query's latency recorded (and the process's RSS: after every query at first, then every 2nd,
    4th, ... so a run of any length keeps 50-100 samples, enough for the growth estimate); the first error stops the
    work (LoadGen still gets its completions) and is raised after the run."""

    def __init__(self, lg, run, samples, inflight: int) -> None:  # type: ignore[no-untyped-def]
        self.lg, self.run, self.samples = lg, run, samples
        self.work: queue.Queue[Any] = queue.Queue()
        self.latencies: list[float] = []
        self.rss: list[tuple[int, int]] = [(0, rss_bytes())]
        self.every = 1  # RSS sampled every this many completions (doubling as samples accumulate)
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.serve, daemon=True, name=f"kiln-sut-{i}") for i in range(inflight)]
        for thread in self.threads:
            thread.start()

    def serve(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            issued, sample_id, index = item
            try:
                if not self.errors:
                    self.run(self.samples[index % len(self.samples)])
            except BaseException as err:
                self.errors.append(err)
            done = time.perf_counter()
            with self.lock:
                self.latencies.append(done - issued)
                if len(self.latencies) % self.every == 0:
                    self.rss.append((len(self.latencies), rss_bytes()))
                    if len(self.rss) > 2 * RSS_SAMPLES:  # sparser on long runs, as single_stream's
                        self.rss = self.rss[::2]
                        self.every *= 2
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(sample_id, 0, 0)])

    def issue(self, query_samples: Any) -> None:
        now = time.perf_counter()
        for sample in query_samples:
            self.work.put((now, sample.id, sample.index))

    def flush(self) -> None:
        return None

    def stop(self) -> None:
        """Every serving thread told to end, and ended."""
        for _ in self.threads:
            self.work.put(None)
        for thread in self.threads:
            thread.join()


_CHECK = re.compile(r"^\s*(.+?satisfied)\s*:\s*(\w+)\s*$")
_VALUE = re.compile(r"^\s*(.+?)\s*:\s*([-+0-9.eE]+)\s*$")


def parse_summary(text: str) -> dict[str, Any]:
    """LoadGen's ``mlperf_log_summary.txt``: the verdict, each check, why (recommendations and the
    early-stopping explanation), and its numbers (QPS, latency percentiles in ms)."""
    found: dict[str, Any] = {"result": None, "checks": {}, "why": [], "figures": {}}
    section = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Result is"):
            found["result"] = stripped.split(":", 1)[1].strip()
            continue
        check = _CHECK.match(line)
        if check:
            found["checks"][check.group(1).strip()] = check.group(2).lower() in ("yes", "true")
            continue
        if stripped in ("Recommendations:", "Early Stopping Result:"):
            section = stripped
            continue
        if stripped.startswith("===="):
            section = None
            continue
        if section and stripped:
            if stripped.startswith("*"):
                found["why"].append(stripped.lstrip("* ").strip())
            elif found["why"]:  # a continuation line
                found["why"][-1] += " " + stripped
            continue
        value = _VALUE.match(line)
        if value:
            name, number = value.group(1).strip(), float(value.group(2))
            if name.endswith("(ns)"):
                found["figures"][name.replace("(ns)", "(ms)")] = number / 1e6
            else:
                found["figures"][name] = number
    found["failed"] = sorted(name for name, ok in found["checks"].items() if not ok)
    return found


def verdict_text(loadgen: dict[str, Any] | None) -> str:
    """``VALID``, or ``INVALID (Min duration satisfied: no)``: what a report's cell shows."""
    if not loadgen or not loadgen.get("result"):
        return "-"
    if loadgen["result"] == "VALID":
        return "VALID"
    failed = ", ".join(f"{name}: no" for name in loadgen.get("failed", [])) or "see LoadGen's log"
    return f"{loadgen['result']} ({failed})"
