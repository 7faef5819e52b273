"""MLPerf LoadGen as kiln bench's scenario engine, on sleeping "models" (no benchmarking here):
each scenario issued by LoadGen, its verdict and the reasons read back."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kiln.bench import loadgen

pytestmark = pytest.mark.skipif(
    loadgen.unavailable() is not None, reason=str(loadgen.unavailable())
)  # a core dependency (make setup installs it); skipped only in a bare environment

SAMPLES = [{"x": np.full(1, i, np.float32)} for i in range(4)]


def sleepy(seconds: float, seen: list | None = None):  # type: ignore[no-untyped-def]
    def run(feeds):  # type: ignore[no-untyped-def]
        if seen is not None:
            seen.append(int(feeds["x"][0]))
        time.sleep(seconds)
        return [np.zeros(1)]

    return run


def test_single_stream_is_issued_by_loadgen_and_valid_when_long_enough():
    seen: list[int] = []
    result = loadgen.run_scenario(sleepy(0.002, seen), SAMPLES, "single-stream", 0.4, 64, expected_latency_s=0.002)
    verdict = result["loadgen"]
    assert verdict["result"] == "VALID", verdict
    assert verdict["checks"] and all(verdict["checks"].values())
    assert result["iterations"] >= 64 and len(seen) == result["iterations"]
    assert set(seen) == {0, 1, 2, 3}  # LoadGen chose samples from the whole library
    assert result["latency_ms"]["p50"] >= 2.0
    assert verdict["figures"]["90.00 percentile latency (ms)"] >= 2.0
    assert loadgen.verdict_text(verdict) == "VALID"


def test_the_latency_percentile_is_loadgens_setting():
    result = loadgen.run_scenario(
        sleepy(0.002), SAMPLES, "single-stream", 0.3, 64, expected_latency_s=0.002, percentile=0.5
    )
    assert result["loadgen"]["settings"]["latency_percentile"] == 0.5
    assert "50.0th percentile latency (ms)" in result["loadgen"]["figures"]  # what LoadGen judged
    with pytest.raises(ValueError, match="fraction"):
        loadgen.run_scenario(sleepy(0.001), SAMPLES, "single-stream", 0.01, 1, percentile=90)


def test_too_short_a_run_is_invalid_with_the_reason():
    result = loadgen.run_scenario(sleepy(0.002), SAMPLES, "single-stream", 0.02, 5, expected_latency_s=0.002)
    verdict = result["loadgen"]
    assert verdict["result"] == "INVALID"
    assert "Early stopping satisfied" in verdict["failed"]
    assert verdict["why"] and any("queries" in line for line in verdict["why"])
    assert loadgen.verdict_text(verdict).startswith("INVALID (Early stopping satisfied: no")


def overlapping(seconds: float):  # type: ignore[no-untyped-def]
    """A sleeping model that records the most requests it ever had running at once."""
    import threading

    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def run(feeds):  # type: ignore[no-untyped-def]
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(seconds)
        with lock:
            state["now"] -= 1
        return [np.zeros(1)]

    return run, state


def test_offline_keeps_every_thread_busy():
    # counted, not timed: requests in flight at once (a timing ratio fails on a loaded machine)
    run, state = overlapping(0.01)
    one = loadgen.run_scenario(run, SAMPLES, "offline", 0.3, 1, inflight=1, batch=4, expected_latency_s=0.01)
    assert state["most"] == 1
    run, state = overlapping(0.01)
    four = loadgen.run_scenario(run, SAMPLES, "offline", 0.3, 1, inflight=4, batch=4, expected_latency_s=0.01)
    assert state["most"] == 4  # every one of the four threads served a request at the same time
    assert one["throughput"] == pytest.approx(one["iterations"] * 4 / one["seconds"], rel=1e-6)
    assert four["loadgen"]["result"] in ("VALID", "INVALID") and "Samples per second" in four["loadgen"]["figures"]


def test_server_arrivals_follow_the_target_rate_and_queueing_counts():
    rates = []
    for _ in range(3):  # a rate is timed: a machine busy with other work may starve one attempt
        result = loadgen.run_scenario(
            sleepy(0.004), SAMPLES, "server", 0.6, 20, inflight=1, expected_latency_s=0.004, rate=80
        )
        verdict = result["loadgen"]
        assert verdict["settings"]["target_qps"] == 80
        assert result["latency_ms"]["p50"] >= 4.0  # request latency: issue to completion, queueing included
        assert "Performance constraints satisfied" in verdict["checks"]
        rates.append(verdict["figures"]["Completed samples per second"])
        if rates[-1] == pytest.approx(80, rel=0.35):
            break
    assert rates[-1] == pytest.approx(80, rel=0.35), rates


def test_multi_stream_queries_carry_eight_samples():
    result = loadgen.run_scenario(sleepy(0.001), SAMPLES, "multi-stream", 0.3, 10, inflight=2, expected_latency_s=0.001)
    assert result["loadgen"]["settings"]["samples_per_query"] == loadgen.MULTI_STREAM_SAMPLES
    assert result["iterations"] % loadgen.MULTI_STREAM_SAMPLES == 0 and result["iterations"] >= 80


def test_an_error_in_the_model_fails_the_run_after_loadgen_finishes():
    def broken(feeds):  # type: ignore[no-untyped-def]
        raise ValueError("kernel exploded")

    with pytest.raises(ValueError, match="kernel exploded"):
        loadgen.run_scenario(broken, SAMPLES, "single-stream", 0.05, 5, expected_latency_s=0.001)


SUMMARY = """================================================
MLPerf Results Summary
================================================
SUT name : PySUT
Scenario : Offline
Mode     : PerformanceOnly
Samples per second: 477.982
Result is : INVALID
  Min duration satisfied : NO
  Min queries satisfied : Yes
  Early stopping satisfied: Yes
Recommendations:
 * Increase expected QPS so the loadgen pre-generates a larger (coalesced) query.

================================================
Additional Stats
================================================
Min latency (ns)                : 2047001
50.00 percentile latency (ns)   : 2091271
"""


def test_the_summary_parser_reads_verdict_checks_reasons_and_figures():
    found = loadgen.parse_summary(SUMMARY)
    assert found["result"] == "INVALID"
    assert found["checks"] == {
        "Min duration satisfied": False,
        "Min queries satisfied": True,
        "Early stopping satisfied": True,
    }
    assert found["failed"] == ["Min duration satisfied"]
    assert found["why"] == ["Increase expected QPS so the loadgen pre-generates a larger (coalesced) query."]
    assert found["figures"]["Samples per second"] == pytest.approx(477.982)
    assert found["figures"]["50.00 percentile latency (ms)"] == pytest.approx(2.091271)


def test_a_run_just_long_enough_for_a_growth_estimate_gets_one_whatever_the_machines_speed():
    """The RSS is sampled after every query at first and more sparsely as samples accumulate, so
    a run of the minimum length the growth estimate needs (200 inferences) has its 10 samples
    however few queries the duration allowed (a slow or busy machine), and a long run keeps at
    most about a hundred."""
    from kiln.bench.metrics import MIN_GROWTH_INFERENCES, MIN_GROWTH_SAMPLES, growth_estimate

    short = loadgen.run_scenario(sleepy(0.0), SAMPLES, "single-stream", 0.0, MIN_GROWTH_INFERENCES)
    assert short["iterations"] >= MIN_GROWTH_INFERENCES
    assert len(short["rss_samples"]) >= MIN_GROWTH_SAMPLES
    assert growth_estimate(short["rss_samples"])["mb_per_1k"] is not None
    long = loadgen.run_scenario(sleepy(0.0), SAMPLES, "single-stream", 0.0, 5000)
    assert MIN_GROWTH_SAMPLES <= len(long["rss_samples"]) <= 2 * loadgen.RSS_SAMPLES + 1
    counts = [count for count, _ in long["rss_samples"]]
    assert counts == sorted(counts) and counts[-1] >= 5000 - 2 * (counts[-1] - counts[-2])
