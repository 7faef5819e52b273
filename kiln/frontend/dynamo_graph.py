"""Reading and rewriting the FX graphs dynamo hands a backend (``kiln.torch_backend``): which
placeholders are weights, sizes or inputs, the dims dynamo traced as symbols and their bounds,
and the rewrites kiln makes before tracing a graph symbolically."""

from __future__ import annotations

import re
from typing import Any


def static_context(arg: Any) -> Any:
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    return StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC] * arg.dim())


def writes_as_outputs(traced: Any) -> list[int]:
    """A functionalized trace's writes to its placeholders (``copy_(input, value)``, what
    ``functionalize`` leaves of ``x.mul_(2)`` or ``self.count += 1``) become its last outputs;
    returns the placeholders' positions in the order of those outputs (the last write of each)."""
    import torch

    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    output = next(n for n in traced.graph.nodes if n.op == "output")
    written: dict[int, Any] = {}
    for node in list(traced.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default and node.args[0] in placeholders:
            destination = placeholders.index(node.args[0])
            with traced.graph.inserting_before(node):
                value = traced.graph.call_function(torch.ops.aten.copy.default, tuple(node.args), dict(node.kwargs))
            value.meta = dict(node.meta)
            node.replace_all_uses_with(value)
            traced.graph.erase_node(node)
            written.pop(destination, None)  # the last write of a placeholder is the one kept
            written[destination] = value
    if written:
        results = output.args[0]
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        output.args = (tuple(results + list(written.values())),)
        traced.recompile()
    return list(written)


def is_size(value: Any) -> bool:
    import torch

    return isinstance(value, torch.SymInt) or (isinstance(value, int) and not isinstance(value, bool))


def example(node: Any) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def dynamic_dims(placeholders: list[Any]) -> dict[int, dict[int, str]]:
    """Per input position, the dims dynamo traced as symbols (its placeholders' example values)."""
    import torch

    found: dict[int, dict[int, str]] = {}
    for i, node in enumerate(placeholders):
        value = example(node)
        if not isinstance(value, torch.Tensor):
            continue
        dims = {
            d: str(size.node.expr)
            for d, size in enumerate(value.shape)
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number
        }
        if dims:
            found[i] = dims
    return found


def unified(dynamic: dict[int, dict[int, str]], example_inputs: list[Any]) -> dict[int, dict[int, str]]:
    """``dynamic`` with one symbol for the dims at the same place of several inputs that have the
    same size (dynamo gives ``input_ids`` and ``attention_mask`` a batch symbol each when nothing
    in the graph equates them; kiln proves sample-parallel batches over one)."""
    first: dict[tuple[int, int], str] = {}
    unified: dict[int, dict[int, str]] = {}
    for position, dims in dynamic.items():
        unified[position] = {}
        for d, symbol in dims.items():
            size = int(example_inputs[position].shape[d])
            unified[position][d] = first.setdefault((d, size), symbol)
    renamed = {old: unified[p][d] for p, dims in dynamic.items() for d, old in dims.items()}
    return {p: {d: renamed.get(symbol, symbol) for d, symbol in dims.items()} for p, dims in unified.items()}


def symbol_bounds(placeholders: list[Any]) -> dict[str, tuple[int, int | None]]:
    """Dynamo's value range of each symbolic input dim (``mark_dynamic``'s min and max; its
    upper bound None where it has none)."""
    import torch

    found: dict[str, tuple[int, int | None]] = {}
    for node in placeholders:
        value = example(node)
        if not isinstance(value, torch.Tensor):
            continue
        for size in value.shape:
            if not isinstance(size, torch.SymInt) or size.node.expr.is_number:
                continue
            bounds = size.node.shape_env.var_to_range.get(size.node.expr)
            low = max(1, _finite(getattr(bounds, "lower", None)) or 1)
            high = _finite(getattr(bounds, "upper", None))  # None: int_oo, unbounded
            found[str(size.node.expr)] = (low, high if high is None or high >= low else None)
    return found


def _finite(bound: Any) -> int | None:
    """A sympy bound as an int (None: infinite, or not a number)."""
    if isinstance(bound, int):
        return bound
    if not getattr(bound, "is_Integer", False):  # sympy's Integer (torch's int_oo is not one)
        return None
    return int(bound)


def concrete(value: Any) -> bool:
    """A real tensor or number (not one of dynamo's symbolic sizes or fake tensors)."""
    import torch

    if isinstance(value, torch.Tensor):
        return all(isinstance(d, int) for d in value.shape) and not type(value).__name__.startswith("Fake")
    return isinstance(value, (int, float, bool))


def is_weight(node: Any, value: Any) -> bool:
    """A tensor dynamo reached through an attribute (``L['self']._modules['fc']._parameters['weight']``,
    a BatchNorm's ``eps`` under ``dynamic=True``), not a call's argument (``L['x']``, ``L['args'][0]``)
    or a global (which may change between calls)."""
    import torch

    if isinstance(value, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    name = name() if callable(name) else name
    if not isinstance(name, str):  # no source recorded: dynamo's placeholder names
        return "_parameters_" in node.name or "_buffers_" in node.name
    match = re.match(r"L\[[^\]]*\](\[[^\]]*\])*", name)
    return match is not None and name[match.end() :].startswith(".") and isinstance(value, torch.Tensor)


def scalars_folded(gm: Any, placeholders: list[Any], example_inputs: list[Any], weights: set[int]) -> Any:
    """A copy of ``gm`` whose ``weight.item()`` calls are the weights' numbers (dynamo passes a
    module's float attributes as 0-d tensors under ``dynamic=True``; tracing ``item`` on a fake
    tensor would be a data-dependent size)."""
    import copy

    import torch
    from torch.fx.node import map_arg

    items = [
        (node, example_inputs[placeholders.index(node.args[0])].item())
        for node in gm.graph.nodes
        if node.op == "call_method"
        and node.target == "item"
        and node.args[0] in placeholders
        and placeholders.index(node.args[0]) in weights
    ]
    if not items:
        return gm
    graph = copy.deepcopy(gm.graph)
    mapping = {old: new for old, new in zip(gm.graph.nodes, graph.nodes)}
    for node, number in items:
        twin = mapping[node]
        for user in list(twin.users):
            user.args = map_arg(user.args, lambda n, twin=twin, number=number: number if n is twin else n)
            user.kwargs = map_arg(user.kwargs, lambda n, twin=twin, number=number: number if n is twin else n)
        graph.erase_node(twin)
    return torch.fx.GraphModule(gm, graph)


def fixed_sizes(fakes: list[Any]) -> set[str]:
    """The trace's size symbols that torch has since resolved to numbers (by a guard)."""
    found = set()
    for fake in fakes:
        for size in getattr(fake, "shape", ()):
            node = getattr(size, "node", None)
            if node is not None and getattr(node, "_expr", None) is not None and node.expr.is_number:
                found.add(str(node._expr))
    return found


def linear_by_symbolic_sizes(x: Any, weight: Any, bias: Any = None) -> Any:
    """``linear(x, weight, bias)`` with the rows flattened by ``x``'s own (symbolic) sizes: one
    ``addmm`` over ``[rows, in]`` viewed back, as torch's linear computes it, the bias in the
    product (kiln's Gemm epilogue)."""
    import torch

    if x.dim() <= 2:
        return torch.nn.functional.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    out = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
    return out.view(*x.shape[:-1], weight.shape[0])


def linears_by_symbolic_sizes(gm: Any) -> Any:
    """A copy of ``gm`` whose ``linear`` calls flatten by symbolic sizes
    (``linear_by_symbolic_sizes``): torch's linear on a 3-D input with a bias flattens it by its
    integer sizes (``_flatten_nd_linear``), which under functionalization specializes every
    symbolic dim of the input (the batch and sequence length of each transformer layer's
    projections)."""
    import copy

    import torch

    linears = (torch._C._nn.linear, torch.nn.functional.linear)
    if not any(node.op == "call_function" and node.target in linears for node in gm.graph.nodes):
        return gm
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        if node.op == "call_function" and node.target in linears:
            node.target = linear_by_symbolic_sizes
    return torch.fx.GraphModule(gm, graph)
