"""PyTorch eager and torch.compile (inductor). They need the model as a torch module, which the
zoo provides; an ONNX file given by path has none, and gets that as its reason."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session, Unavailable


class _TorchSession(Session):
    def __init__(self, module: Any) -> None:
        self.module = module
        self.lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        tensors = [torch.from_numpy(v) for v in feeds.values()]
        with torch.inference_mode():
            output = self.module(*tensors)
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        return [o.detach().numpy() for o in outputs]


class TorchEagerBackend(Backend):
    name = "torch"
    requires = ("torch",)
    needs_torch_module = True

    def version(self) -> str:
        import torch

        return torch.__version__

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "mode": "eager, inference_mode"}

    def _module(self, model: Any) -> Any:
        import torch

        torch.set_num_threads(self.threads)
        module = model.torch_module()
        if module is None:
            raise Unavailable("model has no torch module (an ONNX file given by path)")
        return module.eval()

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        self.artifact = self._module(model)

    def load(self) -> Session:
        return _TorchSession(self.artifact)


class TorchCompileBackend(TorchEagerBackend):
    name = "torch.compile"

    def config(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "mode": "torch.compile(backend='inductor')",
            "compile_includes": "the first call, which compiles",
        }

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import torch

        compiled = torch.compile(self._module(model), backend="inductor")
        session = _TorchSession(compiled)
        session.run(example)  # inductor compiles on the first call
        self.artifact = compiled


class TorchCompileKilnBackend(TorchEagerBackend):
    """torch.compile with kiln as its backend (``backend="kiln"``): what a PyTorch user gets from
    kiln without leaving PyTorch, next to inductor on the same module."""

    name = "torch.compile-kiln"

    def config(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "mode": "torch.compile(backend='kiln'), target cpu",
            "compile_includes": "the first call, which compiles",
        }

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import torch

        import kiln.torch_backend  # noqa: F401  (the entry point registers it too, when installed)

        compiled = torch.compile(self._module(model), backend="kiln", options={"threads": self.threads})
        _TorchSession(compiled).run(example)  # dynamo captures and kiln compiles on the first call
        self.artifact = compiled
