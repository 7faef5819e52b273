"""A peer behind kiln's server: ``kiln serve --runtime onnxruntime`` answers the same protocol
with onnxruntime running each ONNX file (the CPU execution provider, its graph optimizations on),
so served kiln can be compared with a peer served by the same code (``kiln bench -b
onnxruntime-served``). Requests are checked against the file's signature as kiln's are (kiln's
import of the file gives it); they are not joined into batches (nothing proves the peer's batch
sample-parallel)."""

from __future__ import annotations

from typing import Any

from kiln.driver.model import Model
from kiln.errors import ArgumentError, ExecutionError
from kiln.frontend.onnx import import_onnx

RUNTIMES = ("kiln", "onnxruntime")


class OnnxRuntimeModel(Model):
    """An ONNX file on onnxruntime with kiln's model interface (``run``, ``validate``, signature)."""

    target = "onnxruntime"

    def __init__(self, path: str, threads: int = 0) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise ArgumentError("--runtime onnxruntime needs onnxruntime (the 'peers' extra)") from None
        graph = import_onnx(path)
        super().__init__(None, graph)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.ranges: dict[str, tuple[int, int]] = {}

    def _execute(self, inputs: list[Any]) -> list[Any]:
        try:
            return self.session.run(None, dict(zip(self.input_names, inputs)))
        except Exception as err:  # onnxruntime's own failure on these values: the request's
            raise ExecutionError(f"onnxruntime: {str(err)[:400]}") from None
