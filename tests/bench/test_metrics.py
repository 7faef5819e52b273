import time

import numpy as np
import pytest

from kiln.bench import metrics, scenarios


def test_latency_stats_percentiles_ci_and_noise():
    stats = metrics.latency_stats([0.001 * i for i in range(1, 101)])  # 1..100 ms
    assert stats["n"] == 100
    assert stats["p50"] == pytest.approx(50.5)
    assert stats["p90"] == pytest.approx(90.1)
    assert stats["p99"] == pytest.approx(99.01)
    assert stats["mean"] == pytest.approx(50.5)
    low, high = stats["ci95"]
    assert low < 50.5 < high and high - low == pytest.approx(2 * 1.96 * stats["std"] / 10)
    assert stats["noisy"] is True  # cv ~ 0.57
    steady = metrics.latency_stats([0.010] * 20)
    assert steady["cv"] == 0.0 and steady["noisy"] is False


def test_percentiles_the_sample_count_cannot_support_are_not_reported():
    few = metrics.latency_stats([0.001 * i for i in range(1, 21)])  # 20 samples
    assert few["p50"] == pytest.approx(10.5) and few["p90"] is not None
    assert few["p99"] is None and few["too_few"] == {"p99": "20 samples < 100"}
    assert metrics.latency_stats([0.001] * 5)["p90"] is None


def test_rss_growth_slope_is_mb_per_thousand_with_its_interval():
    rng = np.random.default_rng(1)
    samples = [(n, 100_000_000 + n * 2_000 + int(rng.integers(0, 50_000))) for n in range(0, 5000, 250)]
    estimate = metrics.growth_estimate(samples)  # 2 kB per inference, plus noise
    assert estimate["mb_per_1k"] == pytest.approx(2.0, abs=0.1)
    low, high = estimate["ci95"]
    assert low < estimate["mb_per_1k"] < high and high - low < 0.5


def test_rss_growth_of_a_short_run_is_not_extrapolated():
    samples = [(n, 100_000_000 + n * 50_000_000) for n in range(0, 29, 3)]  # 29 inferences, wildly growing
    estimate = metrics.growth_estimate(samples)
    assert estimate["mb_per_1k"] is None and estimate["note"].startswith("run too short: 27 inferences")
    assert metrics.growth_per_thousand(samples) is None


def test_energy_from_powercap_counters(tmp_path, monkeypatch):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    counter = zone / "energy_uj"
    counter.write_text("5000000")
    monkeypatch.setenv("KILN_POWERCAP_ROOT", str(tmp_path))
    meter = metrics.EnergyMeter.detect()
    assert meter.available and meter.read_joules() == 5.0
    counter.write_text("7500000")
    assert meter.read_joules() == 7.5
    # 12 J over 2 s with a 1 W idle baseline, 100 inferences: (12 - 2) / 100 J each.
    assert metrics.energy_per_inference(12.0, 2.0, 1.0, 100) == pytest.approx(0.1)


def test_energy_unavailable_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_POWERCAP_ROOT", str(tmp_path / "absent"))
    meter = metrics.EnergyMeter.detect()
    assert not meter.available and "does not exist" in meter.reason
    monkeypatch.setenv("KILN_POWERCAP_ROOT", str(tmp_path))
    assert "no readable RAPL" in metrics.EnergyMeter.detect().reason


def test_agreement_reports_errors_and_top1():
    reference = [np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]], np.float32)]
    close = [reference[0] + 1e-6]
    result = metrics.agreement(close, reference, classifier=True)
    assert result["top1_agreement"] == 1.0 and result["rel_l2"] < 1e-5
    flipped = [np.array([[0.9, 0.1, 0.0], [0.8, 0.1, 0.1]], np.float32)]
    assert metrics.agreement(flipped, reference, classifier=True)["top1_agreement"] == 0.5
    assert "shape" in metrics.agreement([np.zeros(3)], reference, classifier=False)["error"]


def _sleepy(seconds):
    def run(feeds):
        time.sleep(seconds)
        return [np.zeros(1)]

    return run


def test_single_stream_meets_duration_and_iterations():
    result = scenarios.single_stream(_sleepy(0.002), {}, duration=0.1, min_iterations=20)
    assert result["iterations"] >= 20 and result["seconds"] >= 0.1
    assert result["latency_ms"]["p50"] >= 2.0
    assert result["throughput"] == pytest.approx(result["iterations"] / result["seconds"])


def test_median_latency_runs_warmup_then_exactly_the_timed_calls():
    calls = []

    def run(feeds):
        calls.append(feeds)
        time.sleep(0.002 if len(calls) > 3 else 0.0)

    median = scenarios.median_latency_ms(run, {}, runs=5, warmup=3)
    assert len(calls) == 8
    assert 1.5 <= median < 100  # the timed calls sleep 2 ms; the warm-up ones do not count
