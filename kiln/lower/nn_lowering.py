"""Lowerings of reductions, softmax, layer norm, matrix products and the other normalizations
(convolution and pooling: ``window_lowering``).

Sums of float32 data accumulate in double: NumPy's pairwise summation (the reference) is more
accurate than a naive float32 loop, and the compiled code must stay within 1e-4 of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kiln.ir.graph import Node, Value
from kiln.ir.sized import size_product
from kiln.ir.types import DType
from kiln.lower.engine import Epilogue
from kiln.lower.integer_reduce import lower_integer_extreme, reduced_axes
from kiln.lower.kir import (
    Assign,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    Index,
    Kernel,
    Let,
    Load,
    Schedule,
    Select,
    Stmt,
    Store,
    Unary,
    add,
    affine,
    i64,
)
from kiln.lower.lowering import CannotLower, Lowerer, default_schedule, nest, strides
from kiln.lower.pointwise import FLOAT_OPS, NATIVE_FLOATS
from kiln.lower.target import PARALLEL_MIN

F64 = DType.FLOAT64


def require_float(lw: Lowerer, node: Node) -> DType:
    dtype = node.inputs[0].type.dtype  # type: ignore[union-attr]
    if dtype not in NATIVE_FLOATS:
        raise CannotLower(f"{node.op} on {dtype.short} has no native lowering")
    return dtype


def _split_axes(shape: tuple[int, ...], reduced: set[int]) -> tuple[list[int], list[int]]:
    return [a for a in range(len(shape)) if a not in reduced], sorted(reduced)


# -- reductions ---------------------------------------------------------------------------------------

_REDUCE = {  # op: (initial value, combine(acc, x), finish(acc, count))
    "ReduceSum": (0.0, lambda acc, x: Binary("+", acc, x), lambda acc, n: acc),
    "ReduceMean": (0.0, lambda acc, x: Binary("+", acc, x), lambda acc, n: Binary("/", acc, Const(float(n), F64))),
    "ReduceSumSquare": (0.0, lambda acc, x: Binary("+", acc, Binary("*", x, x)), lambda acc, n: acc),
    "ReduceL1": (0.0, lambda acc, x: Binary("+", acc, Unary("abs", x)), lambda acc, n: acc),
    "ReduceL2": (0.0, lambda acc, x: Binary("+", acc, Binary("*", x, x)), lambda acc, n: Unary("sqrt", acc)),
    "ReduceLogSum": (0.0, lambda acc, x: Binary("+", acc, x), lambda acc, n: Unary("log", acc)),
    "ReduceProd": (1.0, lambda acc, x: Binary("*", acc, x), lambda acc, n: acc),
    "ReduceMax": (-math.inf, lambda acc, x: FLOAT_OPS["Max"]([acc, x], {}, F64), lambda acc, n: acc),
    "ReduceMin": (math.inf, lambda acc, x: FLOAT_OPS["Min"]([acc, x], {}, F64), lambda acc, n: acc),
    "GlobalAveragePool": (
        0.0,
        lambda acc, x: Binary("+", acc, x),
        lambda acc, n: Binary("/", acc, Const(float(n), F64)),
    ),
    "GlobalMaxPool": (-math.inf, lambda acc, x: FLOAT_OPS["Max"]([acc, x], {}, F64), lambda acc, n: acc),
}


def lower_reduce(lw: Lowerer, node: Node) -> list[Kernel]:
    integer = node.inputs[0].type.dtype.numpy.kind in "iu"  # type: ignore[union-attr]
    if node.op in ("ReduceMax", "ReduceMin", "ReduceSum") and integer:
        return lower_integer_extreme(lw, node)
    dtype = require_float(lw, node)
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    shape = lw.shape(source)
    rank = len(shape)
    axes = reduced_axes(lw, node, rank)
    if any(shape[a] == 0 for a in axes) and node.op not in (
        "ReduceSum",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceProd",
    ):
        raise CannotLower("reduction over an empty axis")  # mean/max/min of nothing: left to the reference
    kept, reduced = _split_axes(shape, axes)
    if reduced and kept and kept[-1] == rank - 1 and shape[-1] >= lw.target.lanes(dtype):
        return [_reduce_rows(lw, node, shape, kept, reduced, dtype)]
    initial, combine, finish = _REDUCE[node.op]
    count = size_product([shape[a] for a in reduced]) if reduced else 1
    src, dst = lw.buffer(source), lw.buffer(out)
    in_strides = strides(shape)
    out_strides = strides(tuple(shape[a] for a in kept))

    def outer(indices: list[Index]) -> list[Stmt]:
        acc = lw.scalar(F64, "acc")
        inner_indices = [lw.index("r") for _ in reduced]
        position = {a: i for a, i in zip(kept, indices)} | {a: i for a, i in zip(reduced, inner_indices)}
        read = affine([(position[a], in_strides[a]) for a in range(rank)])  # type: ignore[misc]
        body: list[Stmt] = [Assign(acc, combine(acc, Cast(F64, Load(src, read))))]
        for index, axis in reversed(list(zip(inner_indices, reduced))):
            body = [For(index, shape[axis], body)]
        write = affine(list(zip(indices, out_strides)))  # type: ignore[arg-type]
        return [Let(acc, Const(initial, F64)), *body, Store(dst, write, Cast(dtype, finish(acc, count)))]

    kept_shape = tuple(shape[a] for a in kept)
    stmts, indices = nest(lw, kept_shape, outer)
    schedule = Schedule(
        parallel=indices[0].name if indices and size_product(shape) >= PARALLEL_MIN and kept_shape[0] > 1 else None
    )
    return [lw.kernel(node, "reduction", stmts, [source], [out], schedule)]


def _reduce_rows(lw: Lowerer, node: Node, shape, kept, reduced, dtype: DType) -> Kernel:  # type: ignore[no-untyped-def]
    """A reduction keeping the innermost axis (channels-last pooling, [N, H, W, C] over H and W):
    a row of running sums (float64, in scratch) the length of that axis, each input row added to
    it element by element (contiguous, vectorized), in the order the general kernel adds."""
    initial, combine, finish = _REDUCE[node.op]
    count = size_product([shape[a] for a in reduced])
    width = shape[-1]
    src, dst = lw.buffer(node.inputs[0]), lw.buffer(node.outputs[0])  # type: ignore[arg-type]
    sums = lw.scratch_buffer(F64, width, hint="rsum")
    in_strides, rank = strides(shape), len(shape)
    outer = [lw.index("o") for _ in kept[:-1]]
    inner = [lw.index("r") for _ in reduced]
    c, c2, c3 = lw.index("c"), lw.index("c"), lw.index("c")
    position = dict(zip(kept[:-1], outer)) | dict(zip(reduced, inner))
    read = affine([(position[a], in_strides[a]) for a in range(rank - 1)] + [(c2, 1)])  # type: ignore[misc]
    body: list[Stmt] = [For(c2, width, [Store(sums, c2, combine(Load(sums, c2), Cast(F64, Load(src, read))))])]
    for index, axis in reversed(list(zip(inner, reduced))):
        body = [For(index, shape[axis], body)]
    out_strides = strides(tuple(shape[a] for a in kept))
    write = affine([*zip(outer, out_strides[:-1]), (c3, 1)])  # type: ignore[list-item]
    stmts: list[Stmt] = [
        For(c, width, [Store(sums, c, Const(initial, F64))]),
        *body,
        For(c3, width, [Store(dst, write, Cast(dtype, finish(Load(sums, c3), count)))]),
    ]
    for index, axis in reversed(list(zip(outer, kept[:-1]))):
        stmts = [For(index, shape[axis], stmts)]
    lw.kernel_count += 1
    return Kernel(
        f"k{lw.kernel_count}", "reduction", stmts, [src], [dst, sums], [node.label],
        Schedule(vectorize=c2.name, simd=(c.name, c3.name)),
    )  # fmt: skip


# -- softmax and layer normalization ---------------------------------------------------------------


def lower_softmax(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = require_float(lw, node)
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    shape = lw.shape(source)
    rank = len(shape)
    axis = node.attrs.get("axis", -1) % rank
    length = shape[axis]
    src, dst = lw.buffer(source), lw.buffer(out)
    in_strides = strides(shape)
    outer_axes = [a for a in range(rank) if a != axis]

    def body(indices: list[Index]) -> list[Stmt]:
        base = affine([(i, in_strides[a]) for i, a in zip(indices, outer_axes)])  # type: ignore[misc]
        k = lw.index("k")
        at = add(base, Binary("*", k, i64(in_strides[axis])))
        high, total = lw.scalar(dtype, "m"), lw.scalar(F64, "sum")
        shifted = Binary("-", Load(src, at), high)
        if dtype is DType.FLOAT32 and node.op != "LogSoftmax":
            # one exp per element (kiln's vectorizable expf), stored, then scaled by 1 / sum
            inverse = lw.scalar(dtype, "inv")
            scaled: Expr = Binary("*", Load(dst, at), inverse)
            if node.op == "SafeSoftmax":  # a NaN row (NaN input, or all -inf) becomes zeros
                scaled = Select(Binary("!=", total, total), Const(0, dtype), scaled)
            e = lw.scalar(dtype, "e")
            return [
                Let(high, Const(-math.inf, dtype)),
                For(k, length, [Assign(high, FLOAT_OPS["Max"]([high, Load(src, at)], {}, dtype))]),
                Let(total, Const(0.0, F64)),
                For(
                    k,
                    length,
                    [
                        Let(e, Unary("exp", shifted)),
                        Store(dst, at, e),
                        Assign(total, Binary("+", total, Cast(F64, e))),
                    ],
                ),
                Let(inverse, Cast(dtype, Binary("/", Const(1.0, F64), total))),
                For(k, length, [Store(dst, at, scaled)]),
            ]
        if node.op == "LogSoftmax":
            final: Expr = Cast(dtype, Binary("-", Cast(F64, shifted), Unary("log", total)))
        else:
            final = Cast(dtype, Binary("/", Unary("exp", Cast(F64, shifted)), total))
        if node.op == "SafeSoftmax":  # a NaN row (NaN input, or all -inf) becomes zeros
            final = Select(Binary("!=", total, total), Const(0, dtype), final)
        return [
            Let(high, Const(-math.inf, dtype)),
            For(k, length, [Assign(high, FLOAT_OPS["Max"]([high, Load(src, at)], {}, dtype))]),
            Let(total, Const(0.0, F64)),
            For(k, length, [Assign(total, Binary("+", total, Unary("exp", Cast(F64, shifted))))]),
            For(k, length, [Store(dst, at, final)]),
        ]

    outer_shape = tuple(shape[a] for a in outer_axes)
    stmts, indices = nest(lw, outer_shape, body)
    parallel = indices[0].name if indices and size_product(shape) >= PARALLEL_MIN and outer_shape[0] > 1 else None
    return [lw.kernel(node, "normalize", stmts, [source], [out], Schedule(parallel=parallel))]


def lower_layer_norm(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = require_float(lw, node)
    source, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    assert source is not None and scale is not None
    shape = lw.shape(source)
    axis = node.attrs.get("axis", -1) % len(shape)
    inner = size_product(shape[axis:])
    outer = size_product(shape[:axis])
    for value in (scale, bias):
        if value is not None and lw.buffer(value).size not in (1, inner):
            raise CannotLower("LayerNormalization scale/bias broadcast other than over the normalized dims")

    def param(value: Value | None) -> Callable[[Expr, Index], Expr] | None:  # per element of the row
        if value is None:
            return None
        buffer = lw.buffer(value)
        return lambda row, k: Load(buffer, i64(0) if buffer.size == 1 else k)

    return _normalize_rows(lw, node, outer, inner, dtype, param(scale), param(bias), stats=list(node.outputs[1:]))


def lower_instance_norm(lw: Lowerer, node: Node) -> list[Kernel]:
    """InstanceNormalization: each (image, channel) plane normalized over its spatial dims, then
    that channel's scale and bias."""
    dtype = require_float(lw, node)
    source, scale, bias = node.inputs[0], node.inputs[1], node.inputs[2]
    assert source is not None and scale is not None and bias is not None
    shape = lw.shape(source)
    if len(shape) < 3:
        raise CannotLower("InstanceNormalization needs [N, C, spatial...]")
    channels = shape[1]
    scale_buf, bias_buf = lw.buffer(scale), lw.buffer(bias)

    def per_channel(buffer: Buffer) -> Callable[[Expr, Index], Expr]:
        return lambda row, k: Load(buffer, Binary("%", row, i64(channels)))

    inner = size_product(shape[2:])
    return _normalize_rows(lw, node, shape[0] * channels, inner, dtype, per_channel(scale_buf), per_channel(bias_buf))


def _normalize_rows(
    lw: Lowerer,
    node: Node,
    outer: int,
    inner: int,
    dtype: DType,
    scale: Callable[[Expr, Index], Expr] | None,
    bias: Callable[[Expr, Index], Expr] | None,
    stats: list[Value] | None = None,
) -> list[Kernel]:
    """``outer`` rows of ``inner`` elements of the node's first input, each normalized to mean 0
    and variance 1 (statistics in double, the rows in parallel), times ``scale(row, k)`` plus
    ``bias(row, k)``; ``stats``: outputs for each row's mean and inverse standard deviation."""
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    src, dst = lw.buffer(source), lw.buffer(out)
    stat_buffers = [lw.buffer(v) for v in (stats or [])]

    def body(indices: list[Index]) -> list[Stmt]:
        row = Binary("*", indices[0], i64(inner))
        k = lw.index("k")
        at = add(row, k)
        mean, var, inv = lw.scalar(F64, "mean"), lw.scalar(F64, "var"), lw.scalar(F64, "inv")
        centered = Binary("-", Cast(F64, Load(src, at)), mean)
        normalized: Expr = Binary("*", centered, inv)
        if scale is not None:
            normalized = Binary("*", normalized, Cast(F64, scale(indices[0], k)))
        if bias is not None:
            normalized = Binary("+", normalized, Cast(F64, bias(indices[0], k)))
        return [
            Let(mean, Const(0.0, F64)),
            For(k, inner, [Assign(mean, Binary("+", mean, Cast(F64, Load(src, at))))]),
            Assign(mean, Binary("/", mean, Const(float(inner), F64))),
            Let(var, Const(0.0, F64)),
            For(k, inner, [Assign(var, Binary("+", var, Binary("*", centered, centered)))]),
            Let(
                inv,
                Binary(
                    "/",
                    Const(1.0, F64),
                    Unary("sqrt", Binary("+", Binary("/", var, Const(float(inner), F64)), Const(epsilon, F64))),
                ),
            ),
            For(k, inner, [Store(dst, at, Cast(dtype, normalized))]),
            *[Store(buffer, indices[0], Cast(buffer.dtype, stat)) for buffer, stat in zip(stat_buffers, (mean, inv))],
        ]

    stmts, indices = nest(lw, (outer,), body)
    parallel = indices[0].name if outer > 1 and outer * inner >= PARALLEL_MIN else None
    return [lw.kernel(node, "normalize", stmts, list(node.inputs), list(node.outputs), Schedule(parallel=parallel))]


# -- matrix products -----------------------------------------------------------------------------------


def lower_matmul(lw: Lowerer, node: Node, epilogue: Epilogue | None = None) -> list[Kernel]:
    dtype = require_float(lw, node)
    a, b, out = node.inputs[0], node.inputs[1], node.outputs[0]
    assert a is not None and b is not None
    a_shape, b_shape, out_shape = lw.shape(a), lw.shape(b), lw.shape(out)
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise CannotLower("MatMul with a 1-D operand")
    m, k_size, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = out_shape[:-2]
    a_buf, b_buf, dst = lw.buffer(a), lw.buffer(b), lw.buffer(out)
    i, j, kk = lw.index("i"), lw.index("j"), lw.index("k")

    def batch_offset(shape: tuple[int, ...], indices: list[Index]) -> Expr:
        """Offset of the broadcast batch element of an operand of ``shape``."""
        matrix = shape[-1] * shape[-2]
        lead = shape[:-2]
        pad = len(batch) - len(lead)
        lead_strides = strides(lead)
        return affine([(indices[pad + i], lead_strides[i] * matrix) for i, size in enumerate(lead) if size != 1])  # type: ignore[misc]

    def body(indices: list[Index]) -> list[Stmt]:
        out_base = affine([(idx, st * m * n) for idx, st in zip(indices, strides(batch))])  # type: ignore[misc]
        a_base, b_base = batch_offset(a_shape, indices), batch_offset(b_shape, indices)
        row = add(out_base, Binary("*", i, i64(n)))
        a_value = lw.scalar(dtype, "a")
        target = add(row, j)
        # out[i, :] = sum_k A[i, k] * B[k, :], the inner loop contiguous and vectorizable
        inner = [
            For(j, n, [Store(dst, target, Const(0, dtype))]),
            For(
                kk,
                k_size,
                [
                    Let(a_value, Load(a_buf, add(a_base, add(Binary("*", i, i64(k_size)), kk)))),
                    For(
                        j,
                        n,
                        [
                            Store(
                                dst,
                                target,
                                Binary(
                                    "+",
                                    Load(dst, target),
                                    Binary("*", a_value, Load(b_buf, add(b_base, add(Binary("*", kk, i64(n)), j)))),
                                ),
                            )
                        ],
                    ),
                ],
            ),
        ]
        if epilogue is not None:  # fused: finish the row while it is in cache
            inner.append(For(j, n, [Store(dst, target, epilogue([*indices, i, j], Load(dst, target), target))]))
        return [For(i, m, inner)]

    stmts, indices = nest(lw, batch, body, hint="bt")
    work = size_product(out_shape) * k_size
    # across cores: the batch loop when there is a batch, else the rows
    parallel = indices[0].name if indices and batch[0] > 1 else i.name
    return [
        lw.kernel(
            node,
            "matmul",
            stmts,
            [a, b],
            [out],
            Schedule(parallel=parallel if work >= PARALLEL_MIN else None, vectorize=j.name),
        )
    ]


LOWERINGS = {
    **{op: lower_reduce for op in _REDUCE},
    "Softmax": lower_softmax,
    "LogSoftmax": lower_softmax,
    "LayerNormalization": lower_layer_norm,
    "InstanceNormalization": lower_instance_norm,
    "MatMul": lower_matmul,
}


def lower_lp_normalization(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = require_float(lw, node)
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    shape = lw.shape(source)
    axis = node.attrs.get("axis", -1) % len(shape)
    power = int(node.attrs.get("p", 2))
    if power not in (1, 2):
        raise CannotLower(f"LpNormalization with p={power}")
    src, dst = lw.buffer(source), lw.buffer(out)
    data_strides = strides(shape)
    outer_axes = [a for a in range(len(shape)) if a != axis]

    def body(loop: list[Index]) -> list[Stmt]:
        base = affine([(i, data_strides[a]) for i, a in zip(loop, outer_axes)])  # type: ignore[misc]
        k = lw.index("k")
        at = add(base, Binary("*", k, i64(data_strides[axis])))
        norm = lw.scalar(F64, "norm")
        x = Cast(F64, Load(src, at))
        term = Unary("abs", x) if power == 1 else Binary("*", x, x)
        total = norm if power == 1 else Unary("sqrt", norm)
        # zero norm gives 0, as the reference's where(norm == 0, 0, x / norm)
        return [
            Let(norm, Const(0.0, F64)),
            For(k, shape[axis], [Assign(norm, Binary("+", norm, term))]),
            For(
                k,
                shape[axis],
                [
                    Store(
                        dst,
                        at,
                        Cast(
                            dtype, Select(Binary("==", norm, Const(0.0, F64)), Const(0.0, F64), Binary("/", x, total))
                        ),
                    )
                ],
            ),
        ]

    stmts, _ = nest(lw, tuple(shape[a] for a in outer_axes), body)
    return [lw.kernel(node, "normalize", stmts, [source], [out], Schedule())]


def lower_batch_norm(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = require_float(lw, node)
    if len(node.outputs) > 1 or node.attrs.get("training_mode"):
        raise CannotLower("BatchNormalization in training mode")
    x, scale, bias, mean, var = node.inputs[:5]
    out = node.outputs[0]
    assert x is not None and scale is not None and bias is not None and mean is not None and var is not None
    shape = lw.shape(x)
    channels = shape[1] if len(shape) > 1 else 1
    spatial = size_product(shape[2:]) if len(shape) > 2 else 1
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    bufs = [lw.buffer(v) for v in (scale, bias, mean, var)]
    src, dst = lw.buffer(x), lw.buffer(out)

    def body(loop: list[Index]) -> list[Stmt]:
        n, c, s = loop
        at = affine([(n, channels * spatial), (c, spatial), (s, 1)])  # type: ignore[list-item]
        gamma, beta, mu, sigma = (Cast(F64, Load(b, c)) for b in bufs)
        normalized = Binary(
            "+",
            Binary(
                "*",
                gamma,
                Binary(
                    "/",
                    Binary("-", Cast(F64, Load(src, at)), mu),
                    Unary("sqrt", Binary("+", sigma, Const(epsilon, F64))),
                ),
            ),
            beta,
        )
        return [Store(dst, at, Cast(dtype, normalized))]

    loop_shape = (shape[0], channels, spatial)
    stmts, loop = nest(lw, loop_shape, body)
    return [
        lw.kernel(
            node, "normalize", stmts, [x, scale, bias, mean, var], [out], default_schedule(lw.target, loop_shape, loop)
        )
    ]


def lower_quantize(lw: Lowerer, node: Node) -> list[Kernel]:
    x, scale, out = node.inputs[0], node.inputs[1], node.outputs[0]
    zero = node.inputs[2] if len(node.inputs) > 2 else None
    assert x is not None and scale is not None
    shape = lw.shape(x)
    if node.attrs.get("block_size"):
        raise CannotLower("blocked quantization")
    scale_size = lw.buffer(scale).size
    axis = node.attrs.get("axis", 1) % max(len(shape), 1) if shape else 0
    src, scale_buf, dst = lw.buffer(x), lw.buffer(scale), lw.buffer(out)
    zero_buf = lw.buffer(zero) if zero is not None else None
    out_dtype = out.type.dtype  # type: ignore[union-attr]
    quantize = node.op == "QuantizeLinear"
    if quantize and out_dtype not in (DType.INT8, DType.UINT8, DType.INT16, DType.UINT16):
        raise CannotLower(f"QuantizeLinear to {out_dtype.short}")
    info = np.iinfo(out_dtype.numpy) if quantize else None
    after = size_product(shape[axis + 1 :]) if shape else 1

    def body(loop: list[Index]) -> list[Stmt]:
        i = loop[0]
        channel = i64(0) if scale_size == 1 else Binary("%", Binary("/", i, i64(after)), i64(scale_size))
        # divide in the input's precision, as NumPy does: a wider division rounds ties differently
        work = x.type.dtype if x.type.dtype in NATIVE_FLOATS else F64  # type: ignore[union-attr]
        s = Cast(work, Load(scale_buf, channel))
        z = Cast(work, Load(zero_buf, channel)) if zero_buf is not None else Const(0.0, work)
        value = Cast(work, Load(src, i))
        if quantize:
            rounded = Cast(F64, Binary("+", Unary("round_even", Binary("/", value, s)), z))  # half to even
            clamped = Select(
                Binary("<", rounded, Const(float(info.min), F64)),
                Const(float(info.min), F64),
                Select(Binary(">", rounded, Const(float(info.max), F64)), Const(float(info.max), F64), rounded),
            )  # type: ignore[union-attr]
            return [Store(dst, i, Cast(out_dtype, clamped))]
        return [Store(dst, i, Cast(out_dtype, Binary("*", Binary("-", value, z), s)))]

    stmts, loop = nest(lw, (dst.size,), body)
    return [
        lw.kernel(node, "pointwise", stmts, [x, scale, zero], [out], default_schedule(lw.target, (dst.size,), loop))
    ]


def lower_dynamic_quantize(lw: Lowerer, node: Node) -> list[Kernel]:
    """DynamicQuantizeLinear as ONNX's reference computes it, in float32: the range [min(0, min x),
    max(0, max x)], scale = (max - min) / 255 (1 when the range is empty), zero point =
    round(clamp(-min / scale, 0, 255)), y = clamp(round(x / scale) + zero point, 0, 255), rounding
    half to even. One serial kernel (a reduction, then the quantization); a NaN quantizes to 0
    (C's cast of NaN to an integer is undefined)."""
    x = node.inputs[0]
    assert x is not None
    if x.type.dtype is not DType.FLOAT32:  # type: ignore[union-attr]
        raise CannotLower("DynamicQuantizeLinear of non-float32")
    y, scale_out, zero_out = node.outputs
    f32, u8 = DType.FLOAT32, DType.UINT8
    src, dst, scale_buf, zero_buf = lw.buffer(x), lw.buffer(y), lw.buffer(scale_out), lw.buffer(zero_out)
    high, low, scale, zero = (lw.scalar(f32, hint) for hint in ("high", "low", "scale", "zero"))
    i, j = lw.index("i"), lw.index("j")

    def clamp(value: Expr) -> Expr:
        finite = Select(Binary("==", value, value), value, Const(0.0, f32))
        return Select(
            Binary("<", finite, Const(0.0, f32)),
            Const(0.0, f32),
            Select(Binary(">", finite, Const(255.0, f32)), Const(255.0, f32), finite),
        )

    element = Load(src, i)
    stmts: list[Stmt] = [
        Let(high, Const(0.0, f32)),
        Let(low, Const(0.0, f32)),
        For(
            i,
            src.size,
            [
                Assign(high, Select(Binary(">", element, high), element, high)),
                Assign(low, Select(Binary("<", element, low), element, low)),
            ],
        ),
        Let(
            scale,
            Binary("/", Select(Binary("==", high, low), Const(1.0, f32), Binary("-", high, low)), Const(255.0, f32)),
        ),
        Let(zero, Unary("round_even", clamp(Binary("-", Const(0.0, f32), Binary("/", low, scale))))),
        For(
            j,
            src.size,
            [Store(dst, j, Cast(u8, clamp(Binary("+", Unary("round_even", Binary("/", Load(src, j), scale)), zero))))],
        ),
        Store(scale_buf, i64(0), scale),
        Store(zero_buf, i64(0), Cast(u8, zero)),
    ]
    return [lw.kernel(node, "quantize", stmts, [x], [y, scale_out, zero_out], Schedule())]


LOWERINGS.update(
    {
        "DynamicQuantizeLinear": lower_dynamic_quantize,
        "LpNormalization": lower_lp_normalization,
        "BatchNormalization": lower_batch_norm,
        "QuantizeLinear": lower_quantize,
        "DequantizeLinear": lower_quantize,
    }
)
