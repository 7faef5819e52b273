"""Lowerings of index-driven ops: GatherElements, ArgMax/ArgMin, Trilu, CumSum/CumProd.

Every index read from a tensor is bounds-checked: an out-of-range index sets the status word
(reported as an error naming the node) and a safe index is used, so memory stays in bounds.
"""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Node
from kiln.ir.types import DType
from kiln.lower.kir import (
    Assign,
    Binary,
    Cast,
    Const,
    Expr,
    For,
    If,
    Index,
    Kernel,
    Let,
    Load,
    Schedule,
    Select,
    Stmt,
    Store,
    add,
    affine,
    i64,
)
from kiln.lower.lowering import CannotLower, Lowerer, default_schedule, nest, strides
from kiln.lower.pointwise import NATIVE_FLOATS


def _checked_index(lw: Lowerer, raw_value: Expr, size: int, code: int) -> tuple[list[Stmt], Expr]:
    raw, picked = lw.scalar(DType.INT64, "g"), lw.scalar(DType.INT64, "p")
    bad = Binary("||", Binary("<", raw, i64(-size)), Binary(">=", raw, i64(size)))
    return [
        Let(raw, Cast(DType.INT64, raw_value)),
        If(bad, [Store(lw.status, i64(0), Const(code, DType.INT32))]),
        Let(picked, Select(bad, i64(0), Select(Binary("<", raw, i64(0)), add(raw, i64(size)), raw))),
    ], picked


def lower_gather_elements(lw: Lowerer, node: Node) -> list[Kernel]:
    data, indices, out = node.inputs[0], node.inputs[1], node.outputs[0]
    assert data is not None and indices is not None
    shape, index_shape = lw.shape(data), lw.shape(indices)
    axis = node.attrs.get("axis", 0) % len(shape)
    src, idx, dst = lw.buffer(data), lw.buffer(indices), lw.buffer(out)
    code = lw.kernel_count + 1
    data_strides, index_strides = strides(shape), strides(index_shape)

    def body(loop: list[Index]) -> list[Stmt]:
        stmts, picked = _checked_index(lw, Load(idx, affine(list(zip(loop, index_strides)))), shape[axis], code)  # type: ignore[arg-type]
        read = affine([(picked if a == axis else i, data_strides[a]) for a, i in enumerate(loop)])  # type: ignore[misc]
        return [*stmts, Store(dst, affine(list(zip(loop, index_strides))), Load(src, read))]  # type: ignore[arg-type]

    if 0 in index_shape:
        return []
    stmts, loop = nest(lw, index_shape, body)
    return [lw.kernel(node, "copy", stmts, [data, indices], [out], default_schedule(lw.target, index_shape, loop))]


def _scan_axis(lw: Lowerer, node: Node, axis_default: int, emit) -> list[Kernel]:  # type: ignore[no-untyped-def]
    """A kernel looping over every position but ``axis``; ``emit(base, k, at, stride, outer_index)``
    gives the statements for one position (``at`` addresses element k along the axis)."""
    data, out = node.inputs[0], node.outputs[0]
    assert data is not None
    shape = lw.shape(data)
    if not shape or 0 in shape:
        raise CannotLower(f"{node.op} of an empty or scalar tensor")
    axis = node.attrs.get("axis", axis_default) % len(shape)
    data_strides = strides(shape)
    outer_axes = [a for a in range(len(shape)) if a != axis]
    outer_shape = tuple(shape[a] for a in outer_axes)

    def body(loop: list[Index]) -> list[Stmt]:
        base = affine([(i, data_strides[a]) for i, a in zip(loop, outer_axes)])  # type: ignore[misc]
        k = lw.index("k")
        at = add(base, Binary("*", k, i64(data_strides[axis])))
        return emit(base, k, at, shape[axis], affine(list(zip(loop, strides(outer_shape)))))  # type: ignore[arg-type]

    stmts, _ = nest(lw, outer_shape, body)
    return [lw.kernel(node, "reduction", stmts, [data], [out], Schedule())]


def _best(
    lw: Lowerer, src, dtype: DType, base: Expr, k: Index, at: Expr, length: int, better: str, last: bool
) -> tuple[list[Stmt], Expr]:  # type: ignore[no-untyped-def]
    """Statements finding the index of the best element along the axis (NumPy's rules: the first
    NaN wins; ties go to the first, or with ``last`` the last, occurrence)."""
    value = Load(src, at)
    best, where = lw.scalar(dtype, "best"), lw.scalar(DType.INT64, "at")
    wins: Expr = Binary(better + ("=" if last else ""), value, best)
    if dtype in NATIVE_FLOATS:
        wins = Binary("&&", Binary("==", best, best), Binary("||", Binary("!=", value, value), wins))
    stmts: list[Stmt] = [
        Let(best, Load(src, base)),
        Let(where, i64(0)),
        For(k, length, [If(wins, [Assign(best, value), Assign(where, k)])]),
    ]
    return stmts, where


def lower_argext(lw: Lowerer, node: Node) -> list[Kernel]:
    src, dst = lw.buffer(node.inputs[0]), lw.buffer(node.outputs[0])  # type: ignore[arg-type]
    dtype = node.inputs[0].type.dtype  # type: ignore[union-attr]
    better = ">" if node.op == "ArgMax" else "<"
    last = bool(node.attrs.get("select_last_index", 0))

    def emit(base, k, at, length, out_index):  # type: ignore[no-untyped-def]
        stmts, where = _best(lw, src, dtype, base, k, at, length, better, last)
        return [*stmts, Store(dst, out_index, where)]

    return _scan_axis(lw, node, 0, emit)


def lower_trilu(lw: Lowerer, node: Node) -> list[Kernel]:
    data, out = node.inputs[0], node.outputs[0]
    assert data is not None
    shape = lw.shape(data)
    if len(shape) < 2:
        raise CannotLower("Trilu needs rank >= 2")
    k_value = lw.constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if len(node.inputs) > 1 and node.inputs[1] is not None and k_value is None:
        raise CannotLower("Trilu's k is not constant")
    k = int(k_value.reshape(-1)[0]) if k_value is not None else 0
    upper = bool(node.attrs.get("upper", 1))
    src, dst = lw.buffer(data), lw.buffer(out)
    zero = Const(0, data.type.dtype)  # type: ignore[union-attr]

    def body(loop: list[Index]) -> list[Stmt]:
        row, col = loop[-2], loop[-1]
        offset = Binary("-", col, row)
        keep = Binary(">=", offset, i64(k)) if upper else Binary("<=", offset, i64(k))
        at = affine(list(zip(loop, strides(shape))))  # type: ignore[arg-type]
        return [Store(dst, at, Select(keep, Load(src, at), zero))]

    if 0 in shape:
        return []
    stmts, loop = nest(lw, shape, body)
    return [lw.kernel(node, "pointwise", stmts, [data], [out], default_schedule(lw.target, shape, loop))]


def lower_cumulative(lw: Lowerer, node: Node) -> list[Kernel]:
    data, out = node.inputs[0], node.outputs[0]
    assert data is not None
    shape = lw.shape(data)
    axis_value = lw.constant(node.inputs[1])
    if axis_value is None or not shape:
        raise CannotLower("CumSum/CumProd with a non-constant axis")
    axis = int(axis_value.reshape(-1)[0]) % len(shape)
    exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))
    dtype = data.type.dtype  # type: ignore[union-attr]
    product = node.op == "CumProd"
    src, dst = lw.buffer(data), lw.buffer(out)
    data_strides = strides(shape)
    outer_axes = [a for a in range(len(shape)) if a != axis]
    length = shape[axis]

    def body(loop: list[Index]) -> list[Stmt]:
        base = affine([(i, data_strides[a]) for i, a in zip(loop, outer_axes)])  # type: ignore[misc]
        k = lw.index("k")
        position = Binary("-", i64(length - 1), k) if reverse else k
        at = add(base, Binary("*", position, i64(data_strides[axis])))
        acc = lw.scalar(dtype, "acc")
        combine = Binary("*" if product else "+", acc, Load(src, at))
        step = [Store(dst, at, acc), Assign(acc, combine)] if exclusive else [Assign(acc, combine), Store(dst, at, acc)]
        return [Let(acc, Const(1 if product else 0, dtype)), For(k, length, step)]

    if 0 in shape:
        return []
    stmts, _ = nest(lw, tuple(shape[a] for a in outer_axes), body)
    return [lw.kernel(node, "reduction", stmts, [data], [out], Schedule())]


LOWERINGS = {
    "GatherElements": lower_gather_elements,
    "ArgMax": lower_argext,
    "ArgMin": lower_argext,
    "Trilu": lower_trilu,
    "CumSum": lower_cumulative,
    "CumProd": lower_cumulative,
}


def lower_hardmax(lw: Lowerer, node: Node) -> list[Kernel]:
    src, dst = lw.buffer(node.inputs[0]), lw.buffer(node.outputs[0])  # type: ignore[arg-type]
    dtype = node.inputs[0].type.dtype  # type: ignore[union-attr]

    def emit(base, k, at, length, out_index):  # type: ignore[no-untyped-def]
        stmts, where = _best(lw, src, dtype, base, k, at, length, ">", False)
        return [
            *stmts,
            For(k, length, [Store(dst, at, Select(Binary("==", k, where), Const(1, dtype), Const(0, dtype)))]),
        ]

    return _scan_axis(lw, node, -1, emit)


def _scattered(reduction: str, old: Expr, new: Expr) -> Expr:
    """What a scatter stores where ``old`` was: ``new``, or the two combined by its reduction."""
    return {
        "none": new,
        "add": Binary("+", old, new),
        "mul": Binary("*", old, new),
        "max": Select(Binary(">", new, old), new, old),
        "min": Select(Binary("<", new, old), new, old),
    }[reduction]


def lower_scatter_elements(lw: Lowerer, node: Node) -> list[Kernel]:
    data, indices, updates, out = node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0]
    assert data is not None and indices is not None and updates is not None
    shape, index_shape = lw.shape(data), lw.shape(indices)
    axis = node.attrs.get("axis", 0) % len(shape)
    reduction = node.attrs.get("reduction", "none")
    src, idx, upd, dst = lw.buffer(data), lw.buffer(indices), lw.buffer(updates), lw.buffer(out)
    code = lw.kernel_count + 1
    data_strides, index_strides = strides(shape), strides(index_shape)
    copy, _ = nest(lw, (dst.size,), lambda i: [Store(dst, i[0], Load(src, i[0]))])

    def body(loop: list[Index]) -> list[Stmt]:
        at = affine(list(zip(loop, index_strides)))  # type: ignore[arg-type]
        stmts, picked = _checked_index(lw, Load(idx, at), shape[axis], code)
        target = affine([(picked if a == axis else i, data_strides[a]) for a, i in enumerate(loop)])  # type: ignore[misc]
        return [*stmts, Store(dst, target, _scattered(reduction, Load(dst, target), Load(upd, at)))]

    scatter, _ = nest(lw, index_shape, body) if 0 not in index_shape else ([], [])
    # serial: duplicate indices must be applied in order
    return [lw.kernel(node, "copy", copy + scatter, [data, indices, updates], [out], Schedule())]


def lower_gather_nd(lw: Lowerer, node: Node) -> list[Kernel]:
    """GatherND: out[p, s] = data[p[:b], indices[p, 0..k-1], s] for the output's index positions p
    (the first b of them batch dims shared with data) and slice positions s; every index checked
    (negative counts from the end, out of range stops the run with the node named)."""
    data, indices, out = node.inputs[0], node.inputs[1], node.outputs[0]
    assert data is not None and indices is not None
    shape, index_shape, out_shape = lw.shape(data), lw.shape(indices), lw.shape(out)
    batch = int(node.attrs.get("batch_dims", 0))
    depth = index_shape[-1]
    if not index_shape or batch + depth > len(shape):
        raise CannotLower("GatherND indices deeper than the data")
    # index tuples that are their own grid's coordinates (the dynamo exports' mask[b, j] with
    # broadcast aranges): each read from its loop, no index buffer — folded, that buffer's layout
    # follows the sizes, which kernels taking the sizes at run time cannot share
    grid = _coordinate_columns(lw.constant(indices), depth) if batch == 0 else None
    src, dst = lw.buffer(data), lw.buffer(out)
    idx = lw.buffer(indices) if grid is None else None
    code = lw.kernel_count + 1
    data_strides, index_strides, out_strides = strides(shape), strides(index_shape), strides(out_shape)
    positions = len(index_shape) - 1  # output dims that walk the indices tensor

    def checked(loop: list[Index], at: Expr, j: int) -> tuple[list[Stmt], Expr]:
        size = shape[batch + j]
        if grid is None:
            return _checked_index(lw, Load(idx, add(at, i64(j))), size, code)  # type: ignore[arg-type]
        raw = i64(0) if grid[j] is None else loop[grid[j]]  # (never negative: past the dim stops the run)
        bad = [If(Binary(">=", raw, i64(size)), [Store(lw.status, i64(0), Const(code, DType.INT32))])]
        return bad, Select(Binary("<", raw, i64(size)), raw, i64(0))

    def body(loop: list[Index]) -> list[Stmt]:
        at = affine(list(zip(loop[:positions], index_strides[:positions])))  # type: ignore[arg-type]
        stmts: list[Stmt] = []
        read: list[tuple[Expr, int]] = [(loop[a], data_strides[a]) for a in range(batch)]
        for j in range(depth):
            checks, picked = checked(loop, at, j)
            stmts.extend(checks)
            read.append((picked, data_strides[batch + j]))
        read.extend((loop[positions + a], data_strides[batch + depth + a]) for a in range(len(shape) - batch - depth))
        return [*stmts, Store(dst, affine(list(zip(loop, out_strides))), Load(src, affine(read)))]  # type: ignore[arg-type]

    if 0 in out_shape:
        return []
    stmts, loop = nest(lw, out_shape, body)
    reads = [data] if grid is not None else [data, indices]
    return [lw.kernel(node, "copy", stmts, reads, [out], default_schedule(lw.target, out_shape, loop))]


def _coordinate_columns(indices: np.ndarray | None, depth: int) -> list[int | None] | None:
    """Per index column, the grid axis along which it is ``arange`` (the same along every other
    axis) or None where it is all zeros; None unless every column is one of those."""
    if indices is None or indices.dtype.kind not in "iu" or indices.ndim < 2 or indices.size == 0:
        return None
    grid = indices.shape[:-1]
    found: list[int | None] = []
    for j in range(depth):
        column = indices[..., j]
        if not column.any():
            found.append(None)
            continue
        for axis in range(len(grid)):
            ramp = np.arange(grid[axis]).reshape([-1 if a == axis else 1 for a in range(len(grid))])
            if grid[axis] > 1 and np.array_equal(column, np.broadcast_to(ramp, grid)):
                found.append(axis)
                break
        else:
            return None
    return found


def lower_scatter_nd(lw: Lowerer, node: Node) -> list[Kernel]:
    """ScatterND: out = data, then out[indices[p, 0..k-1], s] = updates[p, s] (or combined with
    what is there: add, mul, max, min) for every update position p and slice position s, in order
    (duplicate indices apply one after the other); every index checked (negative counts from the
    end, out of range stops the run with the node named). BART's "shift tokens right" and mBART's
    exports write their first token this way."""
    data, indices, updates, out = node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0]
    assert data is not None and indices is not None and updates is not None
    shape, index_shape = lw.shape(data), lw.shape(indices)
    if not index_shape or index_shape[-1] > len(shape):
        raise CannotLower("ScatterND indices deeper than the data")
    depth, positions = index_shape[-1], len(index_shape) - 1
    update_shape = [*index_shape[:-1], *shape[depth:]]
    src, idx, upd, dst = lw.buffer(data), lw.buffer(indices), lw.buffer(updates), lw.buffer(out)
    code = lw.kernel_count + 1
    data_strides, index_strides, update_strides = strides(shape), strides(index_shape), strides(update_shape)
    reduction = node.attrs.get("reduction", "none")
    copy, _ = nest(lw, (dst.size,), lambda i: [Store(dst, i[0], Load(src, i[0]))])

    def body(loop: list[Index]) -> list[Stmt]:
        at = affine(list(zip(loop[:positions], index_strides[:positions])))  # type: ignore[arg-type]
        stmts: list[Stmt] = []
        write: list[tuple[Expr, int]] = []
        for j in range(depth):
            checks, picked = _checked_index(lw, Load(idx, add(at, i64(j))), shape[j], code)
            stmts.extend(checks)
            write.append((picked, data_strides[j]))
        write.extend((loop[positions + a], data_strides[depth + a]) for a in range(len(shape) - depth))
        target = affine(write)  # type: ignore[arg-type]
        new = Load(upd, affine(list(zip(loop, update_strides))))  # type: ignore[arg-type]
        return [*stmts, Store(dst, target, _scattered(reduction, Load(dst, target), new))]

    scatter, _ = nest(lw, update_shape, body) if 0 not in update_shape else ([], [])
    # serial: duplicate indices must be applied in order
    return [lw.kernel(node, "copy", copy + scatter, [data, indices, updates], [out], Schedule())]


LOWERINGS.update(
    {
        "Hardmax": lower_hardmax,
        "ScatterElements": lower_scatter_elements,
        "ScatterND": lower_scatter_nd,
        "GatherND": lower_gather_nd,
    }
)
