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
    return import_torch_ranged(module, example_inputs, dynamic_shapes)[0]


def import_torch_ranged(
    module: Any, example_inputs: Any, dynamic_shapes: Any = None
) -> tuple[Graph, dict[str, tuple[int, int]]]:
    """``import_torch``, and the ranges ``dynamic_shapes`` declared (``Dim("batch", min=1,
    max=64)``) for the graph's symbolic input dims (unbounded ones are left out)."""
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
        graph = import_exported(program, names)
    except UnsupportedFxOp as err:
        raise KilnError(f"{type(module).__name__}: {err}") from None
    ranges = _ranges(program, graph)
    names_of = _dim_names(graph, dynamic_shapes, names)
    if names_of:  # torch's s31 becomes the user's Dim("batch") in kiln's types, ranges and errors
        from kiln.ir.graph import rename_symbols

        graph = rename_symbols(graph, names_of)
        ranges = {names_of.get(k, k): v for k, v in ranges.items()}
    return graph, ranges


def _dim_names(graph: Graph, dynamic_shapes: Any, names: list[str]) -> dict[str, str]:
    """torch's symbol -> the name of the ``Dim`` the user gave for it (``dynamic_shapes`` as a
    tuple/list in argument order or a dict by input name), where the names are distinct."""
    if isinstance(dynamic_shapes, Mapping):
        specs = [dynamic_shapes.get(name) for name in names]
    elif isinstance(dynamic_shapes, Sequence) and not isinstance(dynamic_shapes, (str, bytes)):
        specs = list(dynamic_shapes)
    else:
        return {}
    found: dict[str, str] = {}
    for value, spec in zip(graph.inputs, specs):
        shape = getattr(value.type, "shape", None) or ()
        items = (
            spec.items()
            if isinstance(spec, Mapping)
            else enumerate(spec or ())
            if isinstance(spec, (list, tuple))
            else ()
        )
        for axis, dim in items:
            name = getattr(dim, "__name__", None)
            if isinstance(axis, int) and 0 <= axis < len(shape) and isinstance(shape[axis], str) and name:
                if name.isidentifier() and found.get(shape[axis], name) == name:
                    found[shape[axis]] = name
    taken = [n for n in found.values()]
    existing = {d for v in graph.inputs for d in getattr(v.type, "shape", None) or () if isinstance(d, str)}
    if len(set(taken)) != len(taken) or (set(taken) & existing) - set(found):
        return {}  # two symbols under one name, or a name torch already uses: keep torch's
    return found


def _ranges(program: Any, graph: Graph) -> dict[str, tuple[int, int]]:
    symbols = {d for v in graph.inputs for d in getattr(v.type, "shape", None) or () if isinstance(d, str)}
    ranges = {}
    for symbol, bounds in getattr(program, "range_constraints", {}).items():
        name = str(symbol)
        try:
            low, high = int(bounds.lower), int(bounds.upper)
        except (TypeError, ValueError, OverflowError):  # int_oo: unbounded, the default range
            continue
        if name in symbols and 0 <= low <= high:
            ranges[name] = (low, high)
    return ranges


def _tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    return torch.from_numpy(np.asarray(value))
