"""A memory limit on the workers (``--memory-limit``, RLIMIT_AS): a backend that needs more ends
with an "oom" row saying so, and the run goes on to the next backend (issue 31's synthetic OOM)."""

from __future__ import annotations

import sys

import pytest

from kiln.bench.runner import run_bench
from kiln.cli_bench import _bench_config
from tests.bench.test_gpu_rows import options

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is what the limit sets (Linux)")


def test_a_worker_over_its_memory_limit_is_an_oom_row_and_the_run_goes_on(tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config = _bench_config(
        options(models=(tiny_onnx,), backends=("kiln", "onnxruntime"), duration=0.2, memory_limit_mb=96)
    )
    rows = run_bench(config, tmp_path / "work")["records"]
    assert [r["backend"] for r in rows] == ["kiln", "onnxruntime"]  # both ran: one OOM ends nothing else
    for row in rows:
        if row["status"] == "unavailable":  # onnxruntime not installed (the peers extra)
            continue
        assert row["status"] == "oom", row
        assert "96 MB" in row["error"] and "RLIMIT_AS" in row["error"]


def test_without_a_limit_the_same_run_is_ok(tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config = _bench_config(options(models=(tiny_onnx,), backends=("kiln",), duration=0.2))
    (row,) = run_bench(config, tmp_path / "work")["records"]
    assert row["status"] == "ok", row
