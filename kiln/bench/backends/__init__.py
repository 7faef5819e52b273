"""Benchmark backends by name. Every peer is optional: a missing one is a row with its reason."""

from __future__ import annotations

import importlib

from kiln.bench.backends.base import Backend, Session, Unavailable

# name -> "module:Class"; plugins (tests, users) may add to it with ``register``.
BACKENDS: dict[str, str] = {
    "kiln": "kiln.bench.backends.kiln_backend:KilnBackend",
    "kiln-avx2": "kiln.bench.backends.kiln_backend:KilnAvx2Backend",
    "kiln-bf16": "kiln.bench.backends.kiln_backend:KilnBf16Backend",
    "kiln-int8": "kiln.bench.backends.kiln_backend:KilnInt8Backend",
    "kiln-reference": "kiln.bench.backends.kiln_backend:KilnReferenceBackend",
    "kiln-served": "kiln.bench.backends.served_backend:KilnServedBackend",
    "kiln-c": "kiln.bench.backends.kiln_c_backend:KilnCBackend",
    "onnxruntime": "kiln.bench.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "onnxruntime-int8": "kiln.bench.backends.onnxruntime_backend:OnnxRuntimeInt8Backend",
    "onnxruntime-served": "kiln.bench.backends.served_backend:OnnxRuntimeServedBackend",
    "openvino": "kiln.bench.backends.openvino_backend:OpenVinoBackend",
    "openvino-bf16": "kiln.bench.backends.openvino_backend:OpenVinoBf16Backend",
    "openvino-int8": "kiln.bench.backends.openvino_backend:OpenVinoInt8Backend",
    "torch": "kiln.bench.backends.torch_backends:TorchEagerBackend",
    "torch.compile": "kiln.bench.backends.torch_backends:TorchCompileBackend",
    "torch.compile-kiln": "kiln.bench.backends.torch_backends:TorchCompileKilnBackend",
    "kiln-gpu": "kiln.bench.backends.gpu_backends:KilnGpuBackend",
    "kiln-gpu-interpret": "kiln.bench.backends.gpu_backends:KilnGpuInterpretBackend",
    "onnxruntime-cuda": "kiln.bench.backends.gpu_backends:OnnxRuntimeCudaBackend",
    "torch.compile-cuda": "kiln.bench.backends.gpu_backends:TorchCompileCudaBackend",
    "tvm": "kiln.bench.backends.other_backends:TvmBackend",
    "iree": "kiln.bench.backends.other_backends:IreeBackend",
    "jax": "kiln.bench.backends.jax_backend:JaxBackend",
    "tensorrt": "kiln.bench.backends.other_backends:TensorRtBackend",
    "kiln-fpga": "kiln.bench.backends.fpga_backends:KilnFpgaBackend",
    "hls4ml": "kiln.bench.backends.fpga_backends:Hls4mlBackend",
}
DEFAULT_BACKENDS = (
    "kiln",
    "onnxruntime",
    "openvino",
    "torch",
    "torch.compile",
    "torch.compile-kiln",
    "tvm",
    "iree",
    "jax",
    "tensorrt",
)
# the rows of a CUDA device (``kiln bench --device cuda``; on a machine without one: "unavailable")
GPU_BACKENDS = ("kiln-gpu", "tensorrt", "onnxruntime-cuda", "torch.compile-cuda")
# the FPGA rows (``kiln bench --device fpga``): C simulations, labelled "(csim)", with estimates
FPGA_BACKENDS = ("kiln-fpga", "hls4ml")


def register(name: str, location: str) -> None:
    """Add a backend: ``location`` is "module:Class" of a ``Backend`` subclass."""
    BACKENDS[name] = location


def backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    module_name, _, class_name = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


__all__ = [
    "BACKENDS",
    "DEFAULT_BACKENDS",
    "FPGA_BACKENDS",
    "GPU_BACKENDS",
    "Backend",
    "Session",
    "Unavailable",
    "backend_class",
    "register",
]
