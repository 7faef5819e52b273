"""PyTorch frontend: a torch.nn.Module plus example inputs -> kiln Graph, through ONNX.

The module is exported with torch's TorchScript-based ONNX exporter (opset 17) in memory and then
imported like any ONNX model, so the two frontends share every converter and check.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.ir.graph import Graph

TORCH_OPSET = 17


def import_torch(module: Any, example_inputs: Any, opset: int = TORCH_OPSET) -> Graph:
    """Export ``module`` called on ``example_inputs`` (a tensor, tuple, or dict name -> tensor)."""
    import torch

    from kiln.frontend.onnx import import_onnx

    if example_inputs is None:
        raise KilnError("compiling a torch module needs example_inputs (a tensor, a tuple, or a dict)")
    if isinstance(example_inputs, Mapping):
        names = list(example_inputs)
        args = tuple(_tensor(v) for v in example_inputs.values())
    elif isinstance(example_inputs, Sequence) and not isinstance(example_inputs, (str, bytes)):
        args = tuple(_tensor(v) for v in example_inputs)
        names = [f"input{i}" if len(args) > 1 else "input" for i in range(len(args))]
    else:
        args = (_tensor(example_inputs),)
        names = ["input"]
    buffer = io.BytesIO()
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            torch.onnx.export(module, args, buffer, input_names=names, opset_version=opset, dynamo=False)
    except Exception as err:  # torch's own error, reported as a kiln error naming the stage
        raise KilnError(f"torch.onnx.export failed for {type(module).__name__}: {type(err).__name__}: {err}") from err
    finally:
        module.train(was_training)
    return import_onnx(buffer.getvalue())


def _tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    return torch.from_numpy(np.asarray(value))
