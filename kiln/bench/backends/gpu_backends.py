"""The rows of a GPU machine: kiln's gpu target, onnxruntime's CUDA execution provider and
torch.compile (inductor) on CUDA, beside TensorRT (``other_backends``). Each runs only where a
CUDA device is; elsewhere its row says "unavailable: no CUDA device". Energy comes from NVML
(``device = "cuda"``)."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session
from kiln.bench.backends.kiln_backend import KilnBackend
from kiln.bench.backends.onnxruntime_backend import OnnxRuntimeBackend, OrtSession
from kiln.bench.backends.torch_backends import TorchCompileBackend


def no_cuda_device() -> str | None:
    """Why this machine has no CUDA device kiln's peers can use (None: it has one)."""
    if shutil.which("nvidia-smi") is None:
        return "no CUDA device (no NVIDIA driver: nvidia-smi not found)"
    try:
        import torch
    except ImportError:
        return "no CUDA device usable (PyTorch is not installed)"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False: install torch's CUDA build)"
    return None


class KilnGpuBackend(KilnBackend):
    """kiln's gpu target: its own Triton kernels (no vendor library), one device arena, weights
    uploaded once."""

    name = "kiln-gpu"
    target = "gpu"
    device = "cuda"

    @property
    def native(self) -> bool:
        return True

    def availability(self) -> str | None:
        return no_cuda_device() or super().availability()

    def config(self) -> dict[str, Any]:
        import torch

        return {**super().config(), "device": torch.cuda.get_device_name(0), "products": "fp32 (IEEE tl.dot)"}

    def run_figures(self) -> dict[str, Any]:
        """The gpu target's own timers: per run, host->device, kernels, device->host (ms)."""
        from kiln.backends.gpu import transfer_times

        model = getattr(self, "loaded", None)
        if model is None or not hasattr(model, "executables"):
            return {}
        times = transfer_times([runner for executable in model.executables() for runner in executable.runners])
        return {"transfers": times} if times else {}


class KilnGpuInterpretBackend(KilnGpuBackend):
    """The same kernels, arena and transfers as kiln-gpu, run by Triton's interpreter with the CPU
    standing in for the device (``gpu:interpret``): a simulation, for small models, labelled so;
    its timings are the interpreter's, its transfer split is the runtime's own."""

    name = "kiln-gpu-interpret"
    target = "gpu:interpret"
    device = "cpu"
    simulated = "Triton interpreter"

    def availability(self) -> str | None:
        return KilnBackend.availability(self)

    def config(self) -> dict[str, Any]:
        return {**KilnBackend.config(self), "device": "CPU (Triton interpreter)"}


class OnnxRuntimeCudaBackend(OnnxRuntimeBackend):
    """onnxruntime with the CUDA execution provider (the onnxruntime-gpu package)."""

    name = "onnxruntime-cuda"
    device = "cuda"
    provider = "CUDAExecutionProvider"

    def availability(self) -> str | None:
        reason = no_cuda_device() or super().availability()
        if reason:
            return reason
        import onnxruntime

        if self.provider not in onnxruntime.get_available_providers():
            return "this onnxruntime has no CUDA execution provider (install onnxruntime-gpu)"
        return None

    def config(self) -> dict[str, Any]:
        return {**super().config(), "provider": self.provider, "fallback": "CPUExecutionProvider"}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        self.artifact = str(model.onnx_path)  # optimized for the device at session creation (load)

    def load(self) -> Session:
        import onnxruntime

        session = onnxruntime.InferenceSession(
            self.artifact, self._options(optimize=True), providers=[self.provider, "CPUExecutionProvider"]
        )
        return OrtSession(session)


class _CudaTorchSession(Session):
    def __init__(self, module: Any) -> None:
        self.module = module

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        tensors = [torch.from_numpy(v).cuda() for v in feeds.values()]
        with torch.inference_mode():
            output = self.module(*tensors)
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        return [o.detach().cpu().numpy() for o in outputs]


class TorchCompileCudaBackend(TorchCompileBackend):
    """torch.compile (inductor: its own Triton kernels) on the CUDA device."""

    name = "torch.compile-cuda"
    device = "cuda"

    def availability(self) -> str | None:
        return no_cuda_device() or super().availability()

    def config(self) -> dict[str, Any]:
        return {**super().config(), "device": "cuda:0"}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import torch

        compiled = torch.compile(self._module(model).cuda(), backend="inductor")
        _CudaTorchSession(compiled).run(example)  # inductor compiles on the first call
        self.artifact = compiled

    def load(self) -> Session:
        return _CudaTorchSession(self.artifact)


__all__ = ["Backend", "KilnGpuBackend", "OnnxRuntimeCudaBackend", "TorchCompileCudaBackend", "no_cuda_device"]
