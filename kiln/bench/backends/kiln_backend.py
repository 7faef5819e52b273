"""kiln itself, on any of its targets (``kiln`` is the default target; ``kiln-<target>`` names one)."""

from __future__ import annotations

from typing import Any

import numpy as np

import kiln
from kiln.bench.backends.base import Backend, Session


class _KilnSession(Session):
    def __init__(self, model: Any) -> None:
        self.model = model

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.model.run(feeds).values())

    def close(self) -> None:
        self.model.close()


class KilnBackend(Backend):
    name = "kiln"
    target = kiln.TARGETS[0]

    def version(self) -> str:
        return kiln.__version__

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "target": self.target}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import tempfile

        compiled = kiln.compile(str(model.onnx_path), target=self.target, dims=_dims_of(model, example))
        if self.target == "cpu":
            # compile = build the artifact; load = read it back, as a deployment would
            handle, path = tempfile.mkstemp(suffix=".kiln")
            import os

            os.close(handle)
            compiled.save(path)
            self.artifact = path
        else:
            self.artifact = compiled

    def load(self) -> Session:
        if self.target == "cpu":
            return _KilnSession(kiln.load(self.artifact))
        return _KilnSession(self.artifact)  # the reference has no artifact: load time is ~0


class KilnReferenceBackend(KilnBackend):
    """kiln's reference interpreter: the oracle, exact and slow."""

    name = "kiln-reference"
    target = "reference"


def _dims_of(model: Any, example: dict[str, np.ndarray]) -> dict[str, int] | None:
    """The symbolic dims the example inputs bind (so compile time is measured up front)."""
    import onnx

    from kiln.frontend.onnx import type_from_proto
    from kiln.ir.types import TensorType

    dims: dict[str, int] = {}
    for info in onnx.load(str(model.onnx_path), load_external_data=False).graph.input:
        value_type = type_from_proto(info.type, info.name)
        if info.name in example and isinstance(value_type, TensorType) and value_type.shape:
            for dim, size in zip(value_type.shape, example[info.name].shape):
                if isinstance(dim, str):
                    dims[dim] = int(size)
    return dims or None
