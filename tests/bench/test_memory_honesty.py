"""The peak memory a bench job reports is its own process's, not what it inherited from the large
process that started it (getrusage's ru_maxrss is carried across fork and exec on Linux)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kiln.bench.metrics import peak_rss_bytes, rss_bytes
from kiln.bench.runner import BenchConfig, run_bench


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and ru_maxrss semantics are Linux's")
def test_a_small_jobs_peak_is_its_own_while_its_parent_holds_a_gigabyte(tiny_onnx, tmp_path):
    ballast = np.ones(1 << 28, np.float32)  # 1 GiB, touched: this process's RSS and peak include it
    assert rss_bytes() > 1 << 30 and peak_rss_bytes() > 1 << 30
    config = BenchConfig(models=[tiny_onnx], backends=["kiln"], duration=0.2, min_iterations=3)
    (record,) = run_bench(config, tmp_path)["records"]
    assert record["status"] == "ok", record
    assert 1 < record["peak_rss_mb"] < 700, record["peak_rss_mb"]  # a tiny model's worker: far below 1 GiB
    # each phase's own peak (compiling; loading and running), the job's peak the larger of them
    assert 1 < record["peak_compile_mb"] <= record["peak_rss_mb"] + 1e-6
    assert 1 < record["peak_run_mb"] <= record["peak_rss_mb"] + 1e-6
    assert max(record["peak_compile_mb"], record["peak_run_mb"]) == pytest.approx(record["peak_rss_mb"])
    del ballast


def test_nothing_but_kilns_own_work_is_inside_kilns_timed_compile_of_a_zoo_model(tmp_path, monkeypatch):
    """A zoo model's ONNX file is exported by the parent once; kiln's cold compile (timed, with an
    empty cache of its own) must not export it again: torch imported in the worker during the
    measured region means someone else's work is in kiln's compile time and peak memory."""
    pytest.importorskip("torch", reason="exporting a zoo model needs torch (the zoo extra)")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config = BenchConfig(models=["gcn"], backends=["kiln"], duration=0.2, min_iterations=3)
    (record,) = run_bench(config, tmp_path / "out")["records"]
    assert record["status"] == "ok", record
    assert "imported_while_measured" in record
    assert not {"torch", "transformers", "onnxscript"} & set(record["imported_while_measured"]), record[
        "imported_while_measured"
    ]
