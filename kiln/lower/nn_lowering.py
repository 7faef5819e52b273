"""Lowerings of reductions, softmax, layer norm, matrix products, convolution and pooling.

Sums of float32 data accumulate in double: NumPy's pairwise summation (the reference) is more
accurate than a naive float32 loop, and the compiled code must stay within 1e-4 of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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
    Unary,
    add,
    affine,
    i64,
)
from kiln.lower.lowering import PARALLEL_MIN, CannotLower, Lowerer, default_schedule, nest, strides
from kiln.lower.pointwise import FLOAT_OPS, NATIVE_FLOATS, fn

F64 = DType.FLOAT64


def _require_float(lw: Lowerer, node: Node) -> DType:
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
    "ReduceL1": (0.0, lambda acc, x: Binary("+", acc, Unary("fabs", x)), lambda acc, n: acc),
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
    dtype = _require_float(lw, node)
    source, out = node.inputs[0], node.outputs[0]
    assert source is not None
    shape = lw.shape(source)
    rank = len(shape)
    if node.op.startswith("Global"):
        axes = set(range(2, rank))
    else:
        raw = lw.constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if len(node.inputs) > 1 and node.inputs[1] is not None and raw is None:
            raise CannotLower("reduction axes are not constant")
        if raw is None or raw.size == 0:
            if node.attrs.get("noop_with_empty_axes"):
                raise CannotLower("noop reduction (left to the reference)")
            axes = set(range(rank))
        else:
            axes = {int(a) % rank for a in raw}
    if any(shape[a] == 0 for a in axes) and node.op not in (
        "ReduceSum",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceProd",
    ):
        raise CannotLower("reduction over an empty axis")  # mean/max/min of nothing: left to the reference
    kept, reduced = _split_axes(shape, axes)
    initial, combine, finish = _REDUCE[node.op]
    count = int(np.prod([shape[a] for a in reduced])) if reduced else 1
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
        parallel=indices[0].name if indices and int(np.prod(shape)) >= PARALLEL_MIN and kept_shape[0] > 1 else None
    )
    return [lw.kernel(node, "reduction", stmts, [source], [out], schedule)]


# -- softmax and layer normalization ---------------------------------------------------------------


def lower_softmax(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = _require_float(lw, node)
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
                        Let(e, fn("exp", shifted, dtype)),
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
    parallel = indices[0].name if indices and int(np.prod(shape)) >= PARALLEL_MIN and outer_shape[0] > 1 else None
    return [lw.kernel(node, "normalize", stmts, [source], [out], Schedule(parallel=parallel))]


def lower_layer_norm(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = _require_float(lw, node)
    source, scale, bias, out = (
        node.inputs[0],
        node.inputs[1],
        node.inputs[2] if len(node.inputs) > 2 else None,
        node.outputs[0],
    )
    stats = [lw.buffer(v) for v in node.outputs[1:]]  # Mean, InvStdDev (stash type)
    assert source is not None and scale is not None
    shape = lw.shape(source)
    axis = node.attrs.get("axis", -1) % len(shape)
    inner_shape = shape[axis:]
    inner = int(np.prod(inner_shape))
    outer = int(np.prod(shape[:axis]))
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    src, dst, scale_buf = lw.buffer(source), lw.buffer(out), lw.buffer(scale)
    bias_buf = lw.buffer(bias) if bias is not None else None
    for value in (scale, bias):
        if value is not None and lw.buffer(value).size not in (1, inner):
            raise CannotLower("LayerNormalization scale/bias broadcast other than over the normalized dims")

    def param(buffer, k: Index) -> Expr:  # type: ignore[no-untyped-def]
        return Load(buffer, i64(0) if buffer.size == 1 else k)

    def body(indices: list[Index]) -> list[Stmt]:
        row = Binary("*", indices[0], i64(inner))
        k = lw.index("k")
        at = add(row, k)
        mean, var, inv = lw.scalar(F64, "mean"), lw.scalar(F64, "var"), lw.scalar(F64, "inv")
        centered = Binary("-", Cast(F64, Load(src, at)), mean)
        normalized: Expr = Binary("*", Binary("*", centered, inv), Cast(F64, param(scale_buf, k)))
        if bias_buf is not None:
            normalized = Binary("+", normalized, Cast(F64, param(bias_buf, k)))
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
            *[Store(buffer, indices[0], Cast(buffer.dtype, stat)) for buffer, stat in zip(stats, (mean, inv))],
        ]

    stmts, indices = nest(lw, (outer,), body)
    parallel = indices[0].name if outer > 1 and outer * inner >= PARALLEL_MIN else None
    return [lw.kernel(node, "normalize", stmts, [source, scale, bias], list(node.outputs), Schedule(parallel=parallel))]


# -- matrix products -----------------------------------------------------------------------------------


Epilogue = Callable[[list[Expr], Expr, Expr], Expr]  # (output position, value, flat output index) -> final value


def lower_matmul(lw: Lowerer, node: Node, epilogue: Epilogue | None = None) -> list[Kernel]:
    dtype = _require_float(lw, node)
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
    work = int(np.prod(out_shape)) * k_size
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


# -- convolution and pooling -------------------------------------------------------------------------


def _window(
    node: Node, spatial: int, in_dims: tuple[int, ...], out_dims: tuple[int, ...], kernel: tuple[int, ...]
) -> tuple[list[int], list[int], list[int]]:
    """Strides, dilations and leading pads (auto_pad resolved)."""
    stride = list(node.attrs.get("strides") or [1] * spatial)
    dilation = list(node.attrs.get("dilations") or [1] * spatial)
    pads = list(node.attrs.get("pads") or [0] * (2 * spatial))
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for axis in range(spatial):
            total = max(
                (out_dims[axis] - 1) * stride[axis] + (kernel[axis] - 1) * dilation[axis] + 1 - in_dims[axis], 0
            )
            pads[axis] = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
    elif auto_pad == "VALID":
        pads = [0] * (2 * spatial)
    return stride, dilation, pads[:spatial]


def lower_conv(lw: Lowerer, node: Node, epilogue: Epilogue | None = None) -> list[Kernel]:
    dtype = _require_float(lw, node)
    rank = len(lw.shape(node.inputs[0]))  # type: ignore[arg-type]
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    assert x is not None and w is not None
    x_shape, w_shape, out_shape = lw.shape(x), lw.shape(w), lw.shape(out)
    if len(x_shape) == 3:  # 1-D: the same loops with a height of 1
        (stride_w,), (dil_w,), (pad_l,) = _window(node, 1, x_shape[2:], out_shape[2:], w_shape[2:])
        stride_h, dil_h, pad_t = 1, 1, 0
        x_shape, w_shape, out_shape = (
            (x_shape[0], x_shape[1], 1, x_shape[2]),
            (*w_shape[:2], 1, w_shape[2]),
            (*out_shape[:2], 1, out_shape[2]),
        )
    elif len(x_shape) == 4:
        (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = _window(node, 2, x_shape[2:], out_shape[2:], w_shape[2:])
    else:
        raise CannotLower("only 1-D and 2-D convolutions are lowered natively so far")
    batch, _, height, width = x_shape
    out_channels, group_channels, kernel_h, kernel_w = w_shape
    _, _, out_h, out_w = out_shape
    group = int(node.attrs.get("group", 1))
    per_group = out_channels // group
    x_buf, w_buf, dst = lw.buffer(x), lw.buffer(w), lw.buffer(out)
    bias_buf = lw.buffer(bias) if bias is not None else None

    def valid(kernel_pos: int, stride: int, dilation: int, pad: int, size: int, out_size: int) -> tuple[int, int]:
        """Output positions whose input position o*stride - pad + k*dilation is inside [0, size)."""
        shift = kernel_pos * dilation - pad
        low = max(0, -(shift // stride) if shift < 0 else 0)
        while low < out_size and low * stride + shift < 0:
            low += 1
        high = out_size
        while high > low and (high - 1) * stride + shift >= size:
            high -= 1
        return low, high

    n, oc, ic = lw.index("n"), lw.index("oc"), lw.index("ic")
    oh, ow = lw.index("oh"), lw.index("ow")
    plane = add(Binary("*", n, i64(out_channels * out_h * out_w)), Binary("*", oc, i64(out_h * out_w)))
    group_index = Binary("/", oc, i64(per_group))
    in_channel = add(Binary("*", group_index, i64(group_channels)), ic)
    init_value: Expr = Load(bias_buf, oc) if bias_buf is not None else Const(0, dtype)
    body: list[Stmt] = [For(oh, out_h * out_w, [Store(dst, add(plane, oh), init_value)])]
    taps: list[Stmt] = []
    for kh in range(kernel_h):
        h_low, h_high = valid(kh, stride_h, dil_h, pad_t, height, out_h)
        for kw in range(kernel_w):
            w_low, w_high = valid(kw, stride_w, dil_w, pad_l, width, out_w)
            if h_low >= h_high or w_low >= w_high:
                continue
            weight = lw.scalar(dtype, "w")
            row = add(oh, i64(h_low))
            col = add(ow, i64(w_low))
            in_row = add(Binary("*", row, i64(stride_h)), i64(kh * dil_h - pad_t))
            in_col = add(Binary("*", col, i64(stride_w)), i64(kw * dil_w - pad_l))
            x_index = add(
                Binary("*", add(Binary("*", n, i64(x_shape[1])), in_channel), i64(height * width)),
                add(Binary("*", in_row, i64(width)), in_col),
            )
            y_index = add(plane, add(Binary("*", row, i64(out_w)), col))
            w_index = add(
                Binary("*", add(Binary("*", oc, i64(group_channels)), ic), i64(kernel_h * kernel_w)),
                i64(kh * kernel_w + kw),
            )
            taps.append(Let(weight, Load(w_buf, w_index)))
            taps.append(
                For(
                    oh,
                    h_high - h_low,
                    [
                        For(
                            ow,
                            w_high - w_low,
                            [
                                Store(
                                    dst,
                                    y_index,
                                    Binary("+", Load(dst, y_index), Binary("*", weight, Load(x_buf, x_index))),
                                )
                            ],
                        )
                    ],
                )
            )
    body.append(For(ic, group_channels, taps))
    if epilogue is not None:  # fused: finish each output plane while it is in cache
        at = add(plane, add(Binary("*", oh, i64(out_w)), ow))
        position: list[Expr] = [n, oc, oh, ow] if rank == 4 else [n, oc, ow]
        body.append(For(oh, out_h, [For(ow, out_w, [Store(dst, at, epilogue(position, Load(dst, at), at))])]))
    stmts: list[Stmt] = [For(n, batch, [For(oc, out_channels, body)])]
    schedule = Schedule(parallel=oc.name, vectorize=ow.name)
    # depthwise (one input channel per output channel, MobileNet's 3x3 layers) is this kernel's
    # main user: per output plane, each tap a contiguous vectorized run over the valid interior
    depthwise = group > 1 and group_channels == 1 and group == x_shape[1]
    kernel = lw.kernel(node, "depthwise-conv" if depthwise else "conv", stmts, [x, w, bias], [out], schedule)
    kernel.flops = 2 * int(np.prod(out_shape)) * group_channels * kernel_h * kernel_w
    return [kernel]


def lower_pool(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = _require_float(lw, node)
    if len(node.outputs) > 1:
        raise CannotLower("MaxPool's indices output")
    x, out = node.inputs[0], node.outputs[0]
    assert x is not None
    x_shape, out_shape = lw.shape(x), lw.shape(out)
    kernel = tuple(node.attrs["kernel_shape"])
    pads = list(node.attrs.get("pads") or [0] * (2 * len(kernel)))
    if len(x_shape) == 3:  # 1-D: the 2-D loops with a height of 1
        (stride_w,), (dil_w,), (pad_l,) = _window(node, 1, x_shape[2:], out_shape[2:], kernel)
        stride_h, dil_h, pad_t, pad_b, pad_r = 1, 1, 0, 0, pads[1]
        kernel = (1, kernel[0])
        x_shape, out_shape = (*x_shape[:2], 1, x_shape[2]), (*out_shape[:2], 1, out_shape[2])
    elif len(x_shape) == 4:
        (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = _window(node, 2, x_shape[2:], out_shape[2:], kernel)
        pad_b, pad_r = pads[2], pads[3]
    else:
        raise CannotLower("only 1-D and 2-D pooling are lowered natively so far")
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        pad_b, pad_r = pad_t, pad_l
    _, channels, height, width = x_shape
    is_max = node.op == "MaxPool"
    if is_max and dtype is DType.FLOAT32:
        window = (kernel, (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l))
        return [_max_pool_rows(lw, node, x_shape, out_shape, window)]
    power = float(node.attrs.get("p", 2)) if node.op == "LpPool" else None
    include_pad = bool(node.attrs.get("count_include_pad", 0))
    x_buf, dst = lw.buffer(x), lw.buffer(out)

    def body(indices: list[Index]) -> list[Stmt]:
        nc, oh, ow = indices
        acc, count, padded = lw.scalar(F64, "acc"), lw.scalar(DType.INT64, "cnt"), lw.scalar(DType.INT64, "pad")
        kh, kw = lw.index("kh"), lw.index("kw")
        ih = add(add(Binary("*", oh, i64(stride_h)), Binary("*", kh, i64(dil_h))), i64(-pad_t))
        iw = add(add(Binary("*", ow, i64(stride_w)), Binary("*", kw, i64(dil_w))), i64(-pad_l))
        inside = Binary(
            "&&",
            Binary("&&", Binary(">=", ih, i64(0)), Binary("<", ih, i64(height))),
            Binary("&&", Binary(">=", iw, i64(0)), Binary("<", iw, i64(width))),
        )
        in_padded = Binary("&&", Binary("<", ih, i64(height + pad_b)), Binary("<", iw, i64(width + pad_r)))
        value = Cast(F64, Load(x_buf, add(Binary("*", nc, i64(height * width)), add(Binary("*", ih, i64(width)), iw))))
        if is_max:
            update = FLOAT_OPS["Max"]([acc, value], {}, F64)
        elif power is not None:  # LpPool: (sum |x|^p)^(1/p)
            update = Binary("+", acc, Binary("pow", Unary("fabs", value), Const(power, F64)))
        else:
            update = Binary("+", acc, value)
        taps = [
            For(
                kh,
                kernel[0],
                [
                    For(
                        kw,
                        kernel[1],
                        [
                            If(inside, [Assign(acc, update), Assign(count, add(count, i64(1)))]),
                            If(in_padded, [Assign(padded, add(padded, i64(1)))]),
                        ],
                    )
                ],
            )
        ]
        divisor = padded if include_pad else count
        if is_max:
            final: Expr = acc
        elif power is not None:
            final = Binary("pow", acc, Const(1.0 / power, F64))
        else:
            final = Binary("/", acc, Cast(F64, divisor))
        target = affine([(nc, out_shape[2] * out_shape[3]), (oh, out_shape[3]), (ow, 1)])  # type: ignore[list-item]
        return [
            Let(acc, Const(-math.inf if is_max else 0.0, F64)),
            Let(count, i64(0)),
            Let(padded, i64(0)),
            *taps,
            Store(dst, target, Cast(dtype, final)),
        ]

    loop_shape = (x_shape[0] * channels, out_shape[2], out_shape[3])
    stmts, indices = nest(lw, loop_shape, body)
    return [lw.kernel(node, "pool", stmts, [x], [out], default_schedule(loop_shape, indices))]


def _max_pool_rows(lw: Lowerer, node: Node, x_shape, out_shape, window) -> Kernel:  # type: ignore[no-untyped-def]
    """float32 MaxPool by output rows: each row starts at -inf and takes the max with one input
    row per tap, over the output columns whose input column is inside the image (computed here,
    so the inner loop has no bounds tests and vectorizes); rows whose input row is outside skip
    the tap. Max is exact in float32; NaN propagates as in the reference."""
    (kernel_h, kernel_w), (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = window
    _, channels, height, width = x_shape
    out_h, out_w = out_shape[2], out_shape[3]
    x_buf, dst = lw.buffer(node.inputs[0]), lw.buffer(node.outputs[0])  # type: ignore[arg-type]
    nc, oh, ow = lw.index("nc"), lw.index("oh"), lw.index("ow")
    row = add(Binary("*", nc, i64(out_h * out_w)), Binary("*", oh, i64(out_w)))
    at = add(row, ow)
    body: list[Stmt] = [For(ow, out_w, [Store(dst, at, Const(-math.inf, DType.FLOAT32))])]
    for kh in range(kernel_h):
        ih = add(Binary("*", oh, i64(stride_h)), i64(kh * dil_h - pad_t))
        taps: list[Stmt] = []
        for kw in range(kernel_w):
            shift = kw * dil_w - pad_l
            low = 0
            while low < out_w and low * stride_w + shift < 0:
                low += 1
            high = out_w
            while high > low and (high - 1) * stride_w + shift >= width:
                high -= 1
            if low >= high:
                continue
            source = add(
                add(Binary("*", nc, i64(height * width)), Binary("*", ih, i64(width))),
                add(Binary("*", ow, i64(stride_w)), i64(shift)),
            )
            update = FLOAT_OPS["Max"]([Load(dst, at), Load(x_buf, source)], {}, DType.FLOAT32)
            taps.append(For(ow, high, [Store(dst, at, update)], start=low))
        inside = Binary("&&", Binary(">=", ih, i64(0)), Binary("<", ih, i64(height)))
        body.append(If(inside, taps))
    stmts: list[Stmt] = [For(nc, x_shape[0] * channels, [For(oh, out_h, body)])]
    parallel = nc.name if x_shape[0] * channels > 1 else None
    return lw.kernel(
        node, "pool", stmts, [node.inputs[0]], [node.outputs[0]], Schedule(parallel=parallel, vectorize=ow.name)
    )


LOWERINGS = {
    **{op: lower_reduce for op in _REDUCE},
    "Softmax": lower_softmax,
    "LogSoftmax": lower_softmax,
    "LayerNormalization": lower_layer_norm,
    "MatMul": lower_matmul,
    "Conv": lower_conv,
    "MaxPool": lower_pool,
    "AveragePool": lower_pool,
    "LpPool": lower_pool,
}


def lower_lp_normalization(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = _require_float(lw, node)
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
        term = Unary("fabs", x) if power == 1 else Binary("*", x, x)
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
    dtype = _require_float(lw, node)
    if len(node.outputs) > 1 or node.attrs.get("training_mode"):
        raise CannotLower("BatchNormalization in training mode")
    x, scale, bias, mean, var = node.inputs[:5]
    out = node.outputs[0]
    assert x is not None and scale is not None and bias is not None and mean is not None and var is not None
    shape = lw.shape(x)
    channels = shape[1] if len(shape) > 1 else 1
    spatial = int(np.prod(shape[2:])) if len(shape) > 2 else 1
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
    return [lw.kernel(node, "normalize", stmts, [x, scale, bias, mean, var], [out], default_schedule(loop_shape, loop))]


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
    after = int(np.prod(shape[axis + 1 :])) if shape else 1

    def body(loop: list[Index]) -> list[Stmt]:
        i = loop[0]
        channel = i64(0) if scale_size == 1 else Binary("%", Binary("/", i, i64(after)), i64(scale_size))
        # divide in the input's precision, as NumPy does: a wider division rounds ties differently
        work = x.type.dtype if x.type.dtype in NATIVE_FLOATS else F64  # type: ignore[union-attr]
        s = Cast(work, Load(scale_buf, channel))
        z = Cast(work, Load(zero_buf, channel)) if zero_buf is not None else Const(0.0, work)
        value = Cast(work, Load(src, i))
        if quantize:
            rounded = Cast(F64, Binary("+", Unary("nearbyint", Binary("/", value, s)), z))  # half to even
            clamped = Select(
                Binary("<", rounded, Const(float(info.min), F64)),
                Const(float(info.min), F64),
                Select(Binary(">", rounded, Const(float(info.max), F64)), Const(float(info.max), F64), rounded),
            )  # type: ignore[union-attr]
            return [Store(dst, i, Cast(out_dtype, clamped))]
        return [Store(dst, i, Cast(out_dtype, Binary("*", Binary("-", value, z), s)))]

    stmts, loop = nest(lw, (dst.size,), body)
    return [lw.kernel(node, "pointwise", stmts, [x, scale, zero], [out], default_schedule((dst.size,), loop))]


LOWERINGS.update(
    {
        "LpNormalization": lower_lp_normalization,
        "BatchNormalization": lower_batch_norm,
        "QuantizeLinear": lower_quantize,
        "DequantizeLinear": lower_quantize,
    }
)
