"""Lowerings that move data without arithmetic: Transpose, Concat, Split, Slice, Gather, Pad (each
a loop nest of loads and stores; Gather's indices bounds-checked into the status word), and
ConstantOfShape (a fill)."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError
from kiln.ir.graph import Node, Value
from kiln.ir.sized import size_product
from kiln.ir.types import DType
from kiln.lower.kir import (
    Binary,
    Cast,
    Const,
    Expr,
    If,
    Index,
    Kernel,
    Let,
    Load,
    Select,
    Stmt,
    Store,
    add,
    affine,
    i64,
)
from kiln.lower.lowering import CannotLower, Lowerer, default_schedule, nest, strides


def lower_transpose(lw: Lowerer, node: Node) -> list[Kernel]:
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    in_shape, out_shape = lw.shape(source), lw.shape(out)
    perm = node.attrs.get("perm") or tuple(range(len(in_shape)))[::-1]
    in_strides = strides(in_shape)
    src, dst = lw.buffer(source), lw.buffer(out)

    def body(indices: list[Index]) -> list[Stmt]:
        read = affine([(indices[j], in_strides[perm[j]]) for j in range(len(out_shape))])  # type: ignore[misc]
        return [Store(dst, affine(list(zip(indices, strides(out_shape)))), Load(src, read))]  # type: ignore[arg-type]

    stmts, indices = nest(lw, out_shape, body)
    return [lw.kernel(node, "copy", stmts, [source], [out], default_schedule(lw.target, out_shape, indices))]


def _offset_copy(
    lw: Lowerer, node: Node, source: Value, out: Value, axis: int, offset: int, into_output: bool
) -> Kernel:
    """Copy ``source`` into ``out`` at ``offset`` along ``axis`` (Concat), or out of it (Split)."""
    small = lw.shape(source) if into_output else lw.shape(out)
    big = lw.shape(out) if into_output else lw.shape(source)
    src, dst = lw.buffer(source), lw.buffer(out)
    # the dims from ``axis`` on are one contiguous block in each (only ``axis`` differs): a row
    # per index of the dims before it, each a long contiguous copy (a KV cache's past into its
    # present: 12 rows of past*64 floats, not 12*past loops of 64)
    rows, block = size_product(small[:axis]), size_product(small[axis:])
    big_block, start = size_product(big[axis:]), offset * size_product(big[axis + 1 :])

    def body(indices: list[Index]) -> list[Stmt]:
        row, i = indices
        big_index = affine([(row, big_block), (i, 1)], start)  # type: ignore[arg-type]
        small_index = affine([(row, block), (i, 1)])  # type: ignore[arg-type]
        if into_output:
            return [Store(dst, big_index, Load(src, small_index))]
        return [Store(dst, small_index, Load(src, big_index))]

    shape = (rows, block)
    stmts, indices = nest(lw, shape, body)
    return lw.kernel(node, "copy", stmts, [source], [out], default_schedule(lw.target, shape, indices))


def lower_concat(lw: Lowerer, node: Node) -> list[Kernel]:
    out = node.outputs[0]
    axis = node.attrs["axis"] % len(lw.shape(out))
    kernels, offset = [], 0
    for value in node.inputs:
        assert value is not None
        if lw.shape(value)[axis]:
            kernels.append(_offset_copy(lw, node, value, out, axis, offset, into_output=True))
        offset += lw.shape(value)[axis]
    return kernels


def lower_cache_append(lw: Lowerer, node: Node) -> list[Kernel]:
    """A KV cache's present in its past's buffer (``kiln.passes.cache_in_place``): the past is
    there already, at the layout's strides; only the new rows are written, after it."""
    past, new = node.inputs
    out = node.outputs[0]
    assert past is not None and new is not None
    if lw.root(out) is not lw.root(past):
        raise KilnError(f"node {node.label}: the present is not in its past's buffer (kiln bug)")
    axis = int(node.attrs["axis"])
    shape = lw.shape(new)
    big, small = strides(lw.layout(out)), strides(shape)
    src, dst = lw.buffer(new), lw.buffer(out)
    start = lw.shape(past)[axis] * big[axis]
    if not size_product(shape):
        return []

    def body(indices: list[Index]) -> list[Stmt]:
        at = affine(list(zip(indices, big)), start)  # type: ignore[arg-type]
        return [Store(dst, at, Load(src, affine(list(zip(indices, small)))))]  # type: ignore[arg-type]

    stmts, indices = nest(lw, shape, body)
    return [lw.kernel(node, "copy", stmts, [new], [out], default_schedule(lw.target, shape, indices))]


def lower_split(lw: Lowerer, node: Node) -> list[Kernel]:
    source = node.inputs[0]
    assert source is not None
    axis = node.attrs.get("axis", 0) % len(lw.shape(source))
    kernels, offset = [], 0
    for out in node.outputs:
        if lw.shape(out)[axis]:
            kernels.append(_offset_copy(lw, node, source, out, axis, offset, into_output=False))
        offset += lw.shape(out)[axis]
    return kernels


def lower_slice(lw: Lowerer, node: Node) -> list[Kernel]:
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    in_shape, out_shape = lw.shape(source), lw.shape(out)
    starts, ends = lw.constant(node.inputs[1]), lw.constant(node.inputs[2])
    axes = lw.constant(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    steps = lw.constant(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    if (
        starts is None
        or ends is None
        or (len(node.inputs) > 3 and node.inputs[3] is not None and axes is None)
        or (len(node.inputs) > 4 and node.inputs[4] is not None and steps is None)
    ):
        raise CannotLower("Slice with non-constant starts/ends/axes/steps")
    rank = len(in_shape)
    first = [0] * rank
    step = [1] * rank
    axis_list = [int(a) % rank for a in (axes if axes is not None else range(len(starts)))]
    step_list = [int(s) for s in (steps if steps is not None else [1] * len(starts))]
    for start, end, axis, stride in zip(starts, ends, axis_list, step_list):
        begin, _, _ = slice(int(start), int(end), stride).indices(in_shape[axis])
        first[axis], step[axis] = begin, stride
    in_strides = strides(in_shape)
    src, dst = lw.buffer(source), lw.buffer(out)

    def body(indices: list[Index]) -> list[Stmt]:
        offset = sum(f * s for f, s in zip(first, in_strides))
        read = affine([(idx, st * s) for idx, st, s in zip(indices, step, in_strides)], offset)  # type: ignore[misc]
        return [Store(dst, affine(list(zip(indices, strides(out_shape)))), Load(src, read))]  # type: ignore[arg-type]

    if dst.size == 0 or 0 in out_shape:
        return []
    stmts, indices = nest(lw, out_shape, body)
    return [lw.kernel(node, "copy", stmts, [source], [out], default_schedule(lw.target, out_shape, indices))]


def lower_gather(lw: Lowerer, node: Node) -> list[Kernel]:
    data, indices_value, out = node.inputs[0], node.inputs[1], node.outputs[0]
    assert data is not None and indices_value is not None
    data_shape, index_shape, out_shape = lw.shape(data), lw.shape(indices_value), lw.shape(out)
    if indices_value.type.dtype not in (DType.INT32, DType.INT64):  # type: ignore[union-attr]
        raise CannotLower("Gather indices must be int32/int64")
    axis = node.attrs.get("axis", 0) % len(data_shape)
    size = data_shape[axis]
    src, idx_buf, dst = lw.buffer(data), lw.buffer(indices_value), lw.buffer(out)
    data_strides = strides(data_shape)
    code = lw.kernel_count + 1  # this kernel's number, reported if an index is out of range

    def body(loop: list[Index]) -> list[Stmt]:
        before, middle, after = loop[:axis], loop[axis : axis + len(index_shape)], loop[axis + len(index_shape) :]
        raw = lw.scalar(DType.INT64, "g")
        picked = lw.scalar(DType.INT64, "p")
        bad = Binary("||", Binary("<", raw, i64(-size)), Binary(">=", raw, i64(size)))
        stmts: list[Stmt] = [
            Let(raw, Cast(DType.INT64, Load(idx_buf, affine(list(zip(middle, strides(index_shape))))))),  # type: ignore[arg-type]
            If(bad, [Store(lw.status, i64(0), Const(code, DType.INT32))]),
            # the index used is always in range, so memory stays safe whatever the input
            Let(picked, Select(bad, i64(0), Select(Binary("<", raw, i64(0)), add(raw, i64(size)), raw))),
        ]
        read = affine(
            [(i, data_strides[a]) for a, i in enumerate(before)]
            + [(picked, data_strides[axis])]
            + [(i, data_strides[axis + 1 + a]) for a, i in enumerate(after)]
        )  # type: ignore[misc]
        stmts.append(Store(dst, affine(list(zip(loop, strides(out_shape)))), Load(src, read)))  # type: ignore[arg-type]
        return stmts

    if 0 in out_shape:
        return []
    stmts, loop = nest(lw, out_shape, body)
    return [lw.kernel(node, "copy", stmts, [data, indices_value], [out], default_schedule(lw.target, out_shape, loop))]


def lower_pad(lw: Lowerer, node: Node) -> list[Kernel]:
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    mode = node.attrs.get("mode", "constant")
    pads = lw.constant(node.inputs[1])
    axes_input = node.inputs[3] if len(node.inputs) > 3 else None
    axes_value = lw.constant(axes_input)
    if pads is None or (axes_input is not None and axes_value is None):
        raise CannotLower("Pad with non-constant pads or axes")
    in_shape, out_shape = lw.shape(source), lw.shape(out)
    rank = len(in_shape)
    axes = [int(a) % rank for a in axes_value] if axes_value is not None else list(range(rank))
    begin = [0] * rank
    for i, axis in enumerate(axes):
        begin[axis] = int(pads[i])
    if mode != "constant" and 0 in in_shape:
        raise CannotLower(f"Pad mode {mode!r} of an empty tensor")
    fill: Expr = Const(0, source.type.dtype)  # type: ignore[union-attr]
    if mode == "constant" and len(node.inputs) > 2 and node.inputs[2] is not None:
        fill = Load(lw.buffer(node.inputs[2]), i64(0))
    src, dst = lw.buffer(source), lw.buffer(out)

    def source_position(position: Expr, size: int) -> Expr:
        """Where an out-of-range position reads from, for the edge/reflect/wrap modes."""
        if mode == "edge":
            return Select(
                Binary("<", position, i64(0)),
                i64(0),
                Select(Binary(">=", position, i64(size)), i64(size - 1), position),
            )
        if mode == "wrap":
            return Binary("%", add(Binary("%", position, i64(size)), i64(size)), i64(size))
        if mode == "reflect":
            if size == 1:
                return i64(0)
            period = 2 * (size - 1)
            folded = Binary("%", add(Binary("%", position, i64(period)), i64(period)), i64(period))
            return Select(Binary("<", folded, i64(size)), folded, Binary("-", i64(period), folded))
        raise CannotLower(f"Pad mode {mode!r}")

    def body(indices: list[Index]) -> list[Stmt]:
        inside: Expr = Const(True, DType.BOOL)
        terms = []
        for index, start, size, stride in zip(indices, begin, in_shape, strides(in_shape)):
            position = add(index, i64(-start))
            if mode == "constant":
                inside = Binary(
                    "&&", inside, Binary("&&", Binary(">=", position, i64(0)), Binary("<", position, i64(size)))
                )
                terms.append((position, stride))
            else:
                terms.append((source_position(position, size), stride))
        read = Load(src, affine(terms))  # type: ignore[arg-type]
        value = Select(inside, read, fill) if mode == "constant" else read
        return [Store(dst, affine(list(zip(indices, strides(out_shape)))), value)]  # type: ignore[arg-type]

    if 0 in out_shape:
        return []
    stmts, indices = nest(lw, out_shape, body)
    return [
        lw.kernel(
            node, "copy", stmts, [source, *node.inputs[2:3]], [out], default_schedule(lw.target, out_shape, indices)
        )
    ]


def lower_constant_of_shape(lw: Lowerer, node: Node) -> list[Kernel]:
    """The value (0.0 by default) at every element of the output's shape (the shape vector, read
    by inference, is not loaded). Usually folded; kept computed where its shape follows a length
    the kernels take at run time (``kiln.driver.extents``)."""
    out = node.outputs[0]
    dtype = out.type.dtype  # type: ignore[union-attr]
    if dtype in (DType.FLOAT16, DType.BFLOAT16) or dtype.numpy.kind not in "biuf":
        raise CannotLower(f"ConstantOfShape of {dtype.short} has no native lowering")
    given = node.attrs.get("value")
    value = np.asarray(0.0 if given is None else given).reshape(-1)
    if value.size != 1:
        raise CannotLower("ConstantOfShape's value must hold one element")
    dst = lw.buffer(out)
    number = value[0].item()
    fill = Const(bool(number) if dtype is DType.BOOL else number, dtype)
    body, indices = nest(lw, (dst.size,), lambda i: [Store(dst, i[0], fill)])
    return [lw.kernel(node, "copy", body, [], [out], default_schedule(lw.target, (dst.size,), indices))]


LOWERINGS = {
    "ConstantOfShape": lower_constant_of_shape,
    "Transpose": lower_transpose,
    "Concat": lower_concat,
    "kiln::CacheAppend": lower_cache_append,
    "Split": lower_split,
    "Slice": lower_slice,
    "Gather": lower_gather,
    "Pad": lower_pad,
}
