"""The GPU rows of kiln bench: present by default, runnable only where a CUDA device is, and chosen
as a group with --device."""

from __future__ import annotations

import pytest

from kiln.bench.backends import BACKENDS, DEFAULT_BACKENDS, GPU_BACKENDS, backend_class
from kiln.bench.backends.gpu_backends import no_cuda_device
from kiln.cli_bench import _bench_config


def options(**given):  # type: ignore[no-untyped-def]
    base = dict(
        models=(), backends=(), scenarios=(), batches=(), threads=2, duration=1.0, min_iterations=1, warmup=0,
        soak=0, inflight=1, rate=None, seq=None, timeout=60.0, dataset=None, dataset_limit=None, plugins=(),
        no_agreement=True, device="all",
    )  # fmt: skip
    base.update(given)
    return base


def test_device_picks_the_cpu_rows_the_cuda_rows_or_both():
    assert set(GPU_BACKENDS) == {"kiln-gpu", "tensorrt", "onnxruntime-cuda", "torch.compile-cuda"} <= set(BACKENDS)
    assert _bench_config(options(device="cuda")).backends == list(GPU_BACKENDS)
    cpu = _bench_config(options(device="cpu")).backends
    assert "kiln" in cpu and not set(cpu) & set(GPU_BACKENDS)
    both = _bench_config(options()).backends
    assert set(both) == set(DEFAULT_BACKENDS) | set(GPU_BACKENDS) and len(both) == len(set(both))
    assert _bench_config(options(device="cuda", backends=("kiln",))).backends == ["kiln"]  # explicit wins


@pytest.mark.parametrize("name", ["kiln-gpu", "onnxruntime-cuda", "torch.compile-cuda"])
def test_a_cuda_row_on_a_machine_without_a_cuda_device_says_so(name):
    if no_cuda_device() is None:
        pytest.skip("this machine has a CUDA device: the row runs")
    backend = backend_class(name)(threads=2)
    assert backend.device == "cuda"  # energy from NVML
    reason = backend.availability()
    assert reason is not None and "no CUDA device" in reason


def test_the_gpu_targets_transfer_timers_are_in_its_row(tiny_onnx, tmp_path, monkeypatch):
    """kiln-gpu-interpret: kiln-gpu's kernels, arena and transfers in Triton's interpreter (no GPU
    needed); its row carries the runtime's host->device / kernel / device->host split."""
    pytest.importorskip("triton", reason="the gpu target needs Triton (kiln's gpu extra)")
    from kiln.bench.runner import run_bench

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config = _bench_config(options(models=(tiny_onnx,), backends=("kiln-gpu-interpret",), threads=1, duration=0.2))
    (row,) = run_bench(config, tmp_path / "work")["records"]
    assert row["status"] == "ok", row
    assert row["simulated"] == "Triton interpreter"
    times = row["transfers"]
    assert times["runs"] >= 2 and times["upload_ms"] > 0 and times["compute_ms"] > 0 and times["download_ms"] > 0
