"""The axes a reduction reads, and ReduceMax/ReduceMin/ReduceSum of integers (a position's maximum,
a mask's minimum, an attention mask's count of tokens: exact in the input's own type, no float on
the way; sums wrap as the type does)."""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Node
from kiln.ir.sized import size_product
from kiln.ir.types import DType
from kiln.lower.kir import (
    Assign,
    Binary,
    Cast,
    Const,
    For,
    Index,
    Kernel,
    Let,
    Load,
    Schedule,
    Select,
    Stmt,
    Store,
    affine,
)
from kiln.lower.lowering import CannotLower, Lowerer, nest, strides
from kiln.lower.target import PARALLEL_MIN


def reduced_axes(lw: Lowerer, node: Node, rank: int) -> set[int]:
    """The axes ``node`` reduces (global pools: the spatial ones; no axes: all, unless a no-op)."""
    if node.op.startswith("Global"):
        return set(range(2, rank))
    given = node.inputs[1] if len(node.inputs) > 1 else None
    raw = lw.constant(given) if given is not None else None
    if given is not None and raw is None:
        raise CannotLower("reduction axes are not constant")
    if raw is None or raw.size == 0:
        if node.attrs.get("noop_with_empty_axes"):
            raise CannotLower("noop reduction (left to the reference)")
        return set(range(rank))
    return {int(a) % rank for a in raw}


def lower_integer_extreme(lw: Lowerer, node: Node) -> list[Kernel]:
    """ReduceMax/ReduceMin of an integer tensor: each output the extreme of its inputs, kept in the
    input's type (the first of equal values is as good as any: integers have no NaN); ReduceSum:
    summed in uint64 (wrapping, defined in C) and stored in the input's type, which wraps it as
    two's complement does."""
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    dtype: DType = source.type.dtype  # type: ignore[union-attr]
    shape = lw.shape(source)
    rank = len(shape)
    axes = reduced_axes(lw, node, rank)
    total = node.op == "ReduceSum"
    if any(shape[a] == 0 for a in axes) and not total:
        raise CannotLower("reduction over an empty axis")  # the extreme of nothing: the reference's
    kept, reduced = [a for a in range(rank) if a not in axes], sorted(axes)
    info = np.iinfo(dtype.numpy)
    kind = DType.UINT64 if total else dtype
    start = Const(0 if total else int(info.min if node.op == "ReduceMax" else info.max), kind)
    better = ">" if node.op == "ReduceMax" else "<"
    src, dst = lw.buffer(source), lw.buffer(out)
    in_strides, out_strides = strides(shape), strides(tuple(shape[a] for a in kept))

    def outer(indices: list[Index]) -> list[Stmt]:
        acc = lw.scalar(kind, "acc")
        inner = [lw.index("r") for _ in reduced]
        position = dict(zip(kept, indices)) | dict(zip(reduced, inner))
        x = Load(src, affine([(position[a], in_strides[a]) for a in range(rank)]))  # type: ignore[misc]
        step = Binary("+", acc, Cast(kind, x)) if total else Select(Binary(better, x, acc), x, acc)
        body: list[Stmt] = [Assign(acc, step)]
        for index, axis in reversed(list(zip(inner, reduced))):
            body = [For(index, shape[axis], body)]
        write = affine(list(zip(indices, out_strides)))  # type: ignore[arg-type]
        return [Let(acc, start), *body, Store(dst, write, Cast(dtype, acc) if total else acc)]

    kept_shape = tuple(shape[a] for a in kept)
    stmts, indices = nest(lw, kept_shape, outer)
    big = size_product(shape) >= PARALLEL_MIN and bool(kept_shape) and kept_shape[0] > 1
    return [lw.kernel(node, "reduction", stmts, [source], [out], Schedule(parallel=indices[0].name if big else None))]
