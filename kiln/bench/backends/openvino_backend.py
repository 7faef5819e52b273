"""OpenVINO on the CPU with an explicit f32 inference precision (its default on CPUs with bf16
support is bf16, which is a different accuracy class; ask for it with precision=bf16).
Compile = read + compile + export the blob; load = import the blob."""

from __future__ import annotations

import io
import threading
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session


class _OpenVinoSession(Session):
    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.local = threading.local()  # an infer request per thread: requests are not shareable

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request = getattr(self.local, "request", None)
        if request is None:
            request = self.local.request = self.compiled.create_infer_request()
        results = request.infer(feeds)
        return [np.array(results[output]) for output in self.compiled.outputs]


class OpenVinoBackend(Backend):
    name = "openvino"
    requires = ("openvino",)
    precision = "f32"

    def version(self) -> str:
        import openvino

        return openvino.__version__

    def _properties(self) -> dict[str, Any]:
        return {
            "INFERENCE_NUM_THREADS": self.threads,
            "INFERENCE_PRECISION_HINT": self.precision,
            "PERFORMANCE_HINT": "LATENCY",
        }

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "device": "CPU", **self._properties()}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import openvino

        core = openvino.Core()
        network = core.read_model(str(model.onnx_path))
        network.reshape({name: array.shape for name, array in example.items()})
        compiled = core.compile_model(network, "CPU", self._properties())
        blob = io.BytesIO()
        compiled.export_model(blob)
        self.artifact = blob.getvalue()

    def load(self) -> Session:
        import openvino

        core = openvino.Core()
        compiled = core.import_model(io.BytesIO(self.artifact), "CPU", self._properties())
        return _OpenVinoSession(compiled)


class OpenVinoBf16Backend(OpenVinoBackend):
    name = "openvino-bf16"
    precision = "bf16"


class OpenVinoInt8Backend(OpenVinoBackend):
    """OpenVINO's int8: NNCF post-training quantization (``nncf.quantize``, its default preset:
    symmetric int8) on the calibration inputs every int8 row gets, then the CPU plugin at its
    default precision. NNCF is an optional extra (``make peers-int8``)."""

    name = "openvino-int8"
    requires = ("openvino", "nncf")
    precision = "f32"  # the int8 layers come from the quantized model; the rest stays f32

    def config(self) -> dict[str, Any]:
        return {**super().config(), "quantization": "nncf.quantize (default preset), 10 calibration samples"}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import nncf
        import openvino

        from kiln.bench.backends.onnxruntime_backend import CALIBRATION_SEEDS

        core = openvino.Core()
        network = core.read_model(str(model.onnx_path))
        network.reshape({name: array.shape for name, array in example.items()})
        samples = [model.inputs(seed=seed, batch=1) for seed in CALIBRATION_SEEDS]
        quantized = nncf.quantize(network, nncf.Dataset(samples), subset_size=len(samples))
        compiled = core.compile_model(quantized, "CPU", self._properties())
        blob = io.BytesIO()
        compiled.export_model(blob)
        self.artifact = blob.getvalue()
