"""Per-sample indices in the batching proof (``kiln.passes.batching``): integers computed from the
count of samples that point into each sample's own block of a flattened tensor, the way exporters
spell per-sample mask lookups, and the size symbols and ranges they are built from.

``Index`` values come from ``Range(0, count)`` (sample ``b`` holds ``b``). A constant scale and
offsets keep them ints (``flat_mask[b*128 + j]``); scaling by a *size* read from a shape
(``Gather(Shape(mask), 1)``: ``seq``) makes the block symbolic, and adding a ``Range(0, n)`` gives
each sample ``n`` offsets: the TorchScript exports' ``flat_mask[b*seq + j]`` (``block = span =
seq``), which a Gather from the mask flattened to ``[batch*seq]`` reads sample by sample.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kiln.ir import dims as sizes
from kiln.ir.graph import Node, Value
from kiln.ir.types import TensorType
from kiln.ops.symbolic_dims import ONE, Monomial, as_expr, dim_of, product_name


@dataclass(frozen=True)
class Index:
    """Integers that point into each sample's own block: along the dim named ``dim`` of its type
    (the samples' dim, under a name inference gave it), the value at sample ``b`` lies in
    ``[b*scale + low, b*scale + high)``; made by ``Range(0, count)`` (the exporters' per-sample
    mask lookups: ``flat_mask[b*128 + j]``), kept by scaling and adding offsets, and read by a
    Gather from a flattened batched tensor with ``scale`` indices per sample.

    With ``block`` (a size from a shape), the value at sample ``b`` is ``b*block + j`` with
    ``0 <= j < span`` instead (``scale``, ``low``, ``high`` then unused)."""

    dim: str
    scale: int
    low: int
    high: int
    exact: bool = True  # False: only its shape may be used (a Max that changes chunks' values)
    block: Monomial | None = None
    span: Monomial = ONE


@dataclass(frozen=True)
class SampleTuple:
    """Index tuples along the last dim whose first component is the sample's own number (the
    dynamo exports' ``mask[b, j]`` lookups: Concat of Range(0, count) and offsets, for GatherND)."""

    dim: str


VALUE_PRESERVING = frozenset({"Cast", "Squeeze", "Unsqueeze", "Reshape", "Identity", "Flatten"})


def _source(value: Value, producers: dict[Value, Node]) -> Node | None:
    """The node that computed ``value``'s integers, through ops that only move or re-type them."""
    node = producers.get(value)
    while node is not None and node.op in VALUE_PRESERVING and node.inputs and node.inputs[0] is not None:
        if node.op == "Cast" and not _integer(node.outputs[0]):
            return None
        node = producers.get(node.inputs[0])
    return node


def _integer(value: Value) -> bool:
    return isinstance(value.type, TensorType) and value.type.dtype.numpy.kind in "iu"


def constant_ints(value: Value | None, constants: dict[Value, np.ndarray]) -> list[int] | None:
    """``value``'s integers when it is an integer constant (axes, indices, pads...), else None."""
    array = constants.get(value) if value is not None else None  # type: ignore[arg-type]
    if array is None or np.asarray(array).dtype.kind not in "iu":
        return None
    return [int(x) for x in np.asarray(array).reshape(-1)]


def size_name(value: Value, producers: dict[Value, Node], constants: dict[Value, np.ndarray]) -> str | None:
    """The symbol a scalar holds when it is a tensor's size read from its shape
    (``Gather(Shape(mask), 1)`` of a ``[batch, seq]`` mask: ``seq``), else None."""
    if not isinstance(value.type, TensorType) or value.type.shape not in ((), (1,)):
        return None
    gather = _source(value, producers)
    if gather is None or gather.op != "Gather" or int(gather.attrs.get("axis", 0)) != 0:
        return None
    index = constant_ints(gather.inputs[1], constants)
    shape_node = producers.get(gather.inputs[0])  # type: ignore[arg-type]
    if index is None or len(index) != 1 or shape_node is None or shape_node.op != "Shape":
        return None
    dims = shape_node.inputs[0].type.shape if isinstance(shape_node.inputs[0].type, TensorType) else None  # type: ignore[union-attr]
    if not dims:
        return None
    start, end = int(shape_node.attrs.get("start", 0)), shape_node.attrs.get("end")
    chosen = list(dims)[slice(start, None if end is None else int(end))]
    if not -len(chosen) <= index[0] < len(chosen):
        return None
    found = chosen[index[0]]
    return found if isinstance(found, str) else None


def range_span(value: Value, producers: dict[Value, Node], constants: dict[Value, np.ndarray]) -> Monomial | None:
    """``n`` when ``value``'s integers are ``Range(0, n, 1)``'s, moved or re-typed (each in
    ``[0, n)``), else None."""
    node = _source(value, producers)
    if node is None or node.op != "Range" or constant_ints(node.inputs[0], constants) != [0]:
        return None
    if constant_ints(node.inputs[2], constants) != [1] or node.inputs[1] is None:
        return None
    name = size_name(node.inputs[1], producers, constants)  # n read from a shape: its symbol
    if name is not None:
        return Monomial(1, (name,))
    shape = node.outputs[0].type.shape if isinstance(node.outputs[0].type, TensorType) else None
    return Monomial.of([shape[0]]) if shape and len(shape) == 1 else None


def blocked(
    node: Node,
    state: Index,
    other: Value | None,
    producers: dict[Value, Node],
    constants: dict[Value, np.ndarray],
) -> Index | None:
    """``state`` scaled by a size from a shape (a symbolic block) or given ``Range`` offsets within
    its block; None when ``node`` is neither."""
    if other is None or not state.exact:
        return None
    if node.op == "Mul" and state.block is None and (state.scale, state.low, state.high) == (1, 0, 1):
        name = size_name(other, producers, constants)
        return replace(state, block=Monomial(1, (name,))) if name is not None else None
    if node.op == "Add" and state.block is not None and state.span == ONE:
        span = range_span(other, producers, constants)
        return replace(state, span=span) if span is not None else None
    return None


def reads_own_block(state: Index, per: Monomial) -> tuple[str, ...] | None:
    """Whether a Gather along a flattened batched tensor's axis 0, holding ``per`` indices per
    sample, reads with ``state`` only each sample's own block: None where not, else the guards
    that must be 0 where that holds only at some sizes: offsets counted by another size than the
    block's (a decode step's mask [batch, total] read at b*total + j for j < past+1:
    ``max(0, past+1-total)``)."""
    if state.block is not None:
        if state.block != per:
            return None
        if state.span in (ONE, per):
            return ()
        span, block = as_expr(product_name(state.span)), as_expr(product_name(per))
        excess = sizes.extreme(False, sizes.sub(span, block), sizes.const(0))
        return () if excess == sizes.const(0) else (sizes.text(excess),)
    return () if per == Monomial(state.scale) and 0 <= state.low and state.high <= state.scale else None


def scatters_within_samples(node: Node, batched: list[tuple[int, int]]) -> bool:
    """A ScatterND whose sample-independent index tuples address only dims before the samples'
    (the tokens shifted right of BART's dynamo export: a [seq, batch] transpose written at rows
    1..seq-1), so each sample's slice of the updates lands in its own slice of the data."""
    indices = node.inputs[1]
    shape = indices.type.shape if indices is not None and isinstance(indices.type, TensorType) else None
    if not shape or not isinstance(shape[-1], int) or not batched or batched[0][0] != 0:
        return False
    depth, data_axis = shape[-1], batched[0][1]
    if data_axis < depth:  # an index tuple picks the sample: another rule's (SampleTuple)
        return False
    updates_axis = len(shape) - 1 + data_axis - depth
    return batched == [(0, data_axis), (2, updates_axis)]


def scatters_own_tuples(node: Node, indices: object, data: tuple | None, updates: tuple | None, dim: str) -> bool:
    """A ScatterND whose index tuples are led by each sample's own number (``indices`` a
    ``SampleTuple`` along ``dim``: TorchScript's index_put of ``x[:, 1:] = y``), data and updates
    holding the samples (their (axis, per)) in their leading index dims: each sample's updates land
    in its own slice."""
    value = node.inputs[1]
    index_shape = list(value.type.shape or ()) if value is not None and isinstance(value.type, TensorType) else []
    return (
        isinstance(indices, SampleTuple)
        and data == (0, ONE)
        and index_shape.count(dim) == 1
        and updates == (index_shape.index(dim), ONE)
    )


def rows_per_sample(
    symbol: str, shape_in: tuple, shape_out: tuple, axis_in: int, axis: int
) -> tuple[Monomial, str | None] | None:
    """Indices per sample of an output dim that is the count times an expression free of it
    (``16*((h+1)//2)*batch``), where no other dim in or out holds the count: the reshape's own
    element count check makes each sample's block its rows (both sides are the count times sizes
    free of it, equal at every binding that runs). With a guard (an expression that must be 0)
    where the dim is such a product floor-divided by a number (``(batch*h*w)//16``: each sample's
    rows are whole only where ``h*w % 16`` is 0)."""
    others = [d for i, d in enumerate(shape_out) if i != axis] + [d for i, d in enumerate(shape_in) if i != axis_in]
    if any(isinstance(d, str) and symbol in sizes.symbols(sizes.parse(d)) for d in others):
        return None
    out = as_expr(shape_out[axis])
    guard = None
    per = sizes.divide(out, sizes.sym(symbol))
    floor = out.atom
    if per is None and isinstance(floor, sizes.Floor):
        whole = sizes.divide(floor.inner, sizes.sym(symbol))
        if whole is not None:
            per, guard = sizes.floordiv(whole, floor.k), sizes.text(sizes.mod(whole, floor.k))
    if per is None or symbol in sizes.symbols(per) or sizes.bounds(per)[0] < 0:
        return None
    return Monomial.of([dim_of(per)]), guard
