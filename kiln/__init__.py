"""kiln: an ML compiler. ``kiln.compile(model)`` -> a model with ``run``, ``__call__`` and ``submit``."""

from __future__ import annotations

from typing import Any

from kiln.errors import (
    ExecutionError,
    InputError,
    InvalidModelError,
    KilnError,
    ModelLoadError,
    ShapeInferenceError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

TARGETS = ("reference",)


def compile(model: Any, target: str = "reference", example_inputs: Any = None) -> Any:
    """Compile ``model`` (ONNX path/bytes/ModelProto, kiln Graph, or torch module + example inputs).

    Returns a model object with ``run(dict) -> dict``, ``__call__`` and ``submit -> Future``.
    Raises UnsupportedModelError listing every unsupported construct, ModelLoadError for unreadable
    files, and KilnError for an unknown target.
    """
    from kiln.frontend import to_graph
    from kiln.runtime.model import ReferenceModel

    if target not in TARGETS:
        raise KilnError(f"unknown target {target!r}; available targets: {', '.join(TARGETS)}")
    graph = to_graph(model, example_inputs)
    return ReferenceModel(graph)


__all__ = [
    "ExecutionError",
    "InputError",
    "InvalidModelError",
    "KilnError",
    "ModelLoadError",
    "ShapeInferenceError",
    "UnsupportedModelError",
    "compile",
]
