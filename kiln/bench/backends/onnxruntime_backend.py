"""ONNX Runtime (CPU execution provider). Compile = optimize and save the optimized model; load =
open that file with graph optimization off."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session


class _OrtSession(Session):
    def __init__(self, session: Any) -> None:
        self.session = session

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    requires = ("onnxruntime",)

    def version(self) -> str:
        import onnxruntime

        return onnxruntime.__version__

    def _options(self, optimize: bool) -> Any:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = (
            onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
            if optimize
            else onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        return options

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "provider": "CPUExecutionProvider", "graph_optimization": "ORT_ENABLE_ALL"}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import onnxruntime

        handle, optimized = tempfile.mkstemp(suffix=".ort.onnx")
        os.close(handle)
        options = self._options(optimize=True)
        options.optimized_model_filepath = optimized
        onnxruntime.InferenceSession(str(model.onnx_path), options, providers=["CPUExecutionProvider"])
        self.artifact = optimized

    def load(self) -> Session:
        import onnxruntime

        session = onnxruntime.InferenceSession(
            self.artifact, self._options(optimize=False), providers=["CPUExecutionProvider"]
        )
        return _OrtSession(session)
