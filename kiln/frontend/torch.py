"""PyTorch frontend: a torch.nn.Module plus example inputs -> kiln Graph, through ``torch.export``.

The module is exported (core ATen after torch's decompositions) and converted straight to kiln's IR
by ``kiln.frontend.fx``: no ONNX in between, no TorchScript. ``dynamic_shapes`` (torch.export's
argument) makes dims symbolic: they become kiln's symbolic dims, bound per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.ir.graph import Graph


def import_torch(module: Any, example_inputs: Any, dynamic_shapes: Any = None) -> Graph:
    """Export ``module`` called on ``example_inputs`` (a tensor, tuple, or dict name -> tensor)."""
    import torch

    from kiln.frontend.fx import UnsupportedFxOp, import_exported

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
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    except Exception as err:  # torch's own error, reported as a kiln error naming the stage
        raise KilnError(f"torch.export failed for {type(module).__name__}: {type(err).__name__}: {err}") from err
    finally:
        module.train(was_training)
    try:
        return import_exported(program, names)
    except UnsupportedFxOp as err:
        raise KilnError(f"{type(module).__name__}: {err}") from None


def _tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    return torch.from_numpy(np.asarray(value))
