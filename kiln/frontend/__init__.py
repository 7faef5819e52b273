"""Frontends: ONNX models and PyTorch modules -> kiln's graph IR."""

from __future__ import annotations

from typing import Any

from kiln.errors import KilnError
from kiln.ir.graph import Graph


def to_graph_ranged(
    model: Any, example_inputs: Any = None, dynamic_shapes: Any = None
) -> tuple[Graph, dict[str, tuple[int, int]]]:
    """``to_graph``, and the ranges the model declares for its symbolic dims (torch.export's
    ``Dim(name, min=, max=)``; none for other models)."""
    if _is_torch_module(model):
        from kiln.frontend.torch import import_torch_ranged

        return import_torch_ranged(model, example_inputs, dynamic_shapes)
    return to_graph(model, example_inputs, dynamic_shapes), {}


def to_graph(model: Any, example_inputs: Any = None, dynamic_shapes: Any = None) -> Graph:
    """Import whatever the user gave: a Graph, ONNX (path, bytes, ModelProto) or a torch module
    (through torch.export; ``dynamic_shapes`` is its argument: those dims become symbolic)."""
    if isinstance(model, Graph):
        return model
    if _is_torch_module(model):
        from kiln.frontend.torch import import_torch

        return import_torch(model, example_inputs, dynamic_shapes)
    if example_inputs is not None:
        raise KilnError("example_inputs are only used with a torch module")
    from kiln.frontend.onnx import import_onnx

    return import_onnx(model)


def _is_torch_module(model: Any) -> bool:
    module = type(model).__module__
    if not module.startswith("torch") and not hasattr(model, "state_dict"):
        return False
    try:
        import torch
    except ImportError:
        return False
    return isinstance(model, torch.nn.Module)
