"""The report people read: summary first (each backend relative to the fastest, agreement beside
it), unavailable backends one line per reason, one explanation for the noise marker; checked on
synthetic runs (no benchmarking here) and, where headless Chromium exists, on the rendered page."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kiln.bench import report

LONG_REASON = "no maintained converter from ONNX to this framework; " * 6  # wraps to many lines in a table


def _latency(p50: float, noisy: bool = False) -> dict:
    percentiles = list(np.linspace(p50 * 0.9, p50 * 1.3, 21))
    return {
        "n": 200, "p50": p50, "p90": p50 * 1.1, "p99": p50 * 1.2, "mean": p50, "std": p50 * 0.05,
        "cv": 0.2 if noisy else 0.03, "noisy": noisy, "min": p50 * 0.9, "max": p50 * 1.3, "ci95": 0.01,
        "too_few": {}, "percentiles": percentiles,
    }  # fmt: skip


def _ok(model: str, backend: str, p50: float, noisy: bool = False, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {
        "model": model, "backend": backend, "batch": 1, "scenario": "single-stream", "threads": 2,
        "status": "ok", "latency_ms": _latency(p50, noisy), "compile_s": 1.0, "first_run_ms": p50 * 2,
        "throughput": 1e3 / p50, "peak_rss_mb": 100.0, "agreement": {"rel_l2": 1e-6, "top1_agreement": 1.0},
        **extra,
    }  # fmt: skip


def _unavailable(model: str, backend: str, reason: str) -> dict:
    return {
        "model": model, "backend": backend, "batch": 1, "scenario": "single-stream", "threads": 2,
        "status": "unavailable", "error": reason,
    }  # fmt: skip


def synthetic_run() -> dict:
    records = []
    for model, base in (("resnet50", 40.0), ("bert-base", 95.0)):
        records += [
            _ok(model, "kiln", base),
            _ok(model, "onnxruntime", base * 1.5),
            _ok(model, "openvino", base * 1.2, noisy=model == "bert-base"),
            _ok(model, "torch.compile", base * 1.25),
            _unavailable(model, "jax", LONG_REASON),
            _unavailable(model, "kiln-gpu", "no CUDA device (no NVIDIA driver)"),
            _unavailable(model, "tensorrt", "no CUDA device (no NVIDIA driver)"),
            _unavailable(model, "onnxruntime-cuda", "no CUDA device (no NVIDIA driver)"),
        ]
    records.append({**_ok("resnet50", "fake-crash", 1.0), "status": "crash", "error": "exited with code 7"})
    return {
        "run_id": "20261123T000000-1",
        "created": "2026-11-23T00:00:00",
        "machine": {"cpu": "Test CPU", "flags": ["avx2", "avx512f"], "usable_cpus": 2, "memory_gb": 8, "os": "Linux"},
        "config": {"threads": 2},
        "records": records,
        "interrupted": False,
    }


def test_the_summary_puts_each_backend_against_the_fastest():
    groups = report.summary(synthetic_run())
    assert [(g["model"], g["scenario"]) for g in groups] == [
        ("bert-base", "single-stream"),
        ("resnet50", "single-stream"),
    ]
    resnet = groups[1]["rows"]
    assert [r["backend"] for r in resnet] == ["kiln", "openvino", "torch.compile", "onnxruntime"]
    assert [round(r["vs_fastest"], 2) for r in resnet] == [1.0, 1.2, 1.25, 1.5]
    assert all("relL2" in r["agreement"] for r in resnet)
    assert [r["backend"] for r in groups[0]["rows"] if r["noisy"]] == ["openvino"]


def test_unavailable_backends_are_one_line_per_reason_and_noise_one_explanation():
    run = synthetic_run()
    lines = report.notes(run)
    missing = [line for line in lines if line.startswith("unavailable:")]
    assert len(missing) == 2, missing  # the CUDA reason once for three backends, the long one once
    cuda = next(line for line in missing if "CUDA" in line)
    assert "kiln-gpu" in cuda and "onnxruntime-cuda" in cuda and "tensorrt" in cuda
    assert all(len(line) < 200 for line in missing)  # the long reason shortened
    noise = [line for line in lines if report.NOISY in line]
    assert len(noise) == 1 and "1 row(s)" in noise[0]
    rows = report.ran(run)
    assert all(r["status"] != "unavailable" for r in rows) and len(rows) == 9  # crash kept


def test_an_invalid_loadgen_verdict_is_explained_in_words():
    run = synthetic_run()
    assert not any(line.startswith("LoadGen:") for line in report.notes(run))
    ran = [r for r in run["records"] if r.get("status") == "ok"]
    ran[0]["loadgen"] = {"result": "INVALID", "failed": ["Early stopping satisfied"]}
    ran[1]["loadgen"] = {"result": "VALID", "failed": []}
    (line,) = [line for line in report.notes(run) if line.startswith("LoadGen:")]
    assert "INVALID on 1 row(s) (Early stopping satisfied)" in line and "a longer --duration" in line


def test_the_page_starts_with_the_summary(tmp_path):
    run = synthetic_run()
    paths = report.write_all(run, tmp_path)
    page = paths["html"].read_text()
    order = [
        page.index(marker) for marker in ("Test CPU", "<h2>Summary", 'alt="summary"', "not run here", "<h2>Details")
    ]
    assert order == sorted(order), order
    assert page.count("<b>jax</b>") == 1 and "…</span>" in page  # one shortened line (full text: its title)
    assert page.count("<b>kiln-gpu, onnxruntime-cuda, tensorrt</b>") == 1  # one line for three backends, two models
    details = page[page.index("<h2>Details") :]
    assert "jax" not in re.sub(r"<pre>.*?</pre>", "", details, flags=re.S)  # unavailable rows are not detail rows
    assert "fake-crash" in details  # a failed job is
    assert page.count(report.NOISY) >= 2  # marker in the summary table and in the details' cv


def test_the_first_screen_shows_the_summary_plot(tmp_path):
    """Rendered in headless Chromium at a laptop's 1400 x 900: the summary's bars (kiln orange,
    peers blue) are on the first screen."""
    from benchmarks.render_report import find_browser, render

    if find_browser() is None:
        pytest.skip("no headless Chromium here (apt-get install chromium) to render the report")
    from PIL import Image

    paths = report.write_all(synthetic_run(), tmp_path)
    png = tmp_path / "first-screen.png"
    render(paths["html"], png, width=1400, height=900)
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.int32)
    orange = (np.abs(pixels - [0xDD, 0x84, 0x52]).sum(axis=2) < 40).sum()
    blue = (np.abs(pixels - [0x4C, 0x72, 0xB0]).sum(axis=2) < 40).sum()
    assert orange > 200 and blue > 200, (orange, blue)


def test_offline_groups_compare_throughput_not_queueing_latency():
    run = synthetic_run()
    fast = {**_ok("resnet50", "kiln", 4000.0), "scenario": "offline", "throughput": 50.0}  # queueing latency
    slow = {**_ok("resnet50", "onnxruntime", 3000.0), "scenario": "offline", "throughput": 25.0}
    run["records"] = [fast, slow]
    (group,) = report.summary(run)
    assert [r["backend"] for r in group["rows"]] == ["kiln", "onnxruntime"]
    assert group["rows"][1]["vs_fastest"] == 2.0 and "throughput" in group["metric"]
