"""ONNX Runtime (CPU execution provider). Compile = optimize and save the optimized model; load =
open that file with graph optimization off."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session


class OrtSession(Session):
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
        return OrtSession(session)


CALIBRATION_SEEDS = range(1, 11)  # every int8 backend calibrates on these, at batch 1 whatever the batch run
# (seed 0 is benchmarked): one calibration set per model, so a batch sweep compares like with like


class OnnxRuntimeInt8Backend(OnnxRuntimeBackend):
    """onnxruntime's static post-training quantization (``quantize_static``: QDQ format, int8
    weights per channel, uint8 activations, min-max calibration) on the calibration inputs kiln's
    int8 row gets, then the CPU execution provider."""

    name = "onnxruntime-int8"

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "quantization": "quantize_static QDQ, per-channel s8 weights, u8 activations, minmax",
        }

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process

        samples = [model.inputs(seed=seed, batch=1) for seed in CALIBRATION_SEEDS]

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.items = iter(samples)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.items, None)

        folder = tempfile.mkdtemp(prefix="kiln-ort-int8-")
        prepared, quantized = os.path.join(folder, "prepared.onnx"), os.path.join(folder, "int8.onnx")
        try:
            quant_pre_process(str(model.onnx_path), prepared, skip_symbolic_shape=True)
        except Exception:  # pre-processing is an optimization: quantize the model as it is
            prepared = str(model.onnx_path)
        quantize_static(
            prepared,
            quantized,
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        handle, optimized = tempfile.mkstemp(suffix=".ort.onnx")
        os.close(handle)
        import onnxruntime

        options = self._options(optimize=True)
        options.optimized_model_filepath = optimized
        onnxruntime.InferenceSession(quantized, options, providers=["CPUExecutionProvider"])
        self.artifact = optimized
