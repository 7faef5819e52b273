"""Lowerings of windowed ops as loop nests: convolution (the per-plane kernel grouped and depthwise
convolutions use, and the engine's reference) and pooling.

Sums of float32 data accumulate in double, as in ``nn_lowering``.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.ir.graph import Node
from kiln.ir.sized import smallest
from kiln.ir.types import DType
from kiln.lower.blocked_depthwise import blocked_depthwise
from kiln.lower.engine import Epilogue
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
    Stmt,
    Store,
    Unary,
    add,
    affine,
    i64,
)
from kiln.lower.lowering import CannotLower, Lowerer, default_schedule, nest
from kiln.lower.nn_lowering import F64, require_float
from kiln.lower.pixel_lowering import pixel_conv, pixel_nest
from kiln.lower.pointwise import FLOAT_OPS

F32 = DType.FLOAT32


def valid_range(kernel_pos: int, stride: int, dilation: int, pad: int, size: int, out_size: int) -> tuple[int, int]:
    """Output positions [low, high) whose input position o*stride - pad + k*dilation is inside
    [0, size): loops over them need no bounds tests."""
    shift = kernel_pos * dilation - pad
    low = max(0, -(shift // stride) if shift < 0 else 0)
    while low < out_size and low * stride + shift < 0:
        low += 1
    high = out_size
    while high > low and (high - 1) * stride + shift >= size:
        high -= 1
    return low, high


def conv_window(
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


DIRECT_MAX_TAPS = 64  # terms of one output's sum (channels per group x kernel taps)
DIRECT_MAX_EDGE = 16  # border rows/columns, each written out with its own valid taps


def window_interior(shapes, window):  # type: ignore[no-untyped-def]
    """Each tap's valid output rows and columns, and the interior every tap of which is inside
    (row_lo, row_hi, col_lo, col_hi); None when the border around it is too wide."""
    x_shape, w_shape, out_shape = shapes
    (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = window
    height, width = x_shape[2], x_shape[3]
    kernel_h, kernel_w = w_shape[2], w_shape[3]
    out_h, out_w = out_shape[2], out_shape[3]
    rows = [valid_range(kh, stride_h, dil_h, pad_t, height, out_h) for kh in range(kernel_h)]
    cols = [valid_range(kw, stride_w, dil_w, pad_l, width, out_w) for kw in range(kernel_w)]
    # the interior: outputs every tap of which is inside (a tap that is never inside makes it
    # empty; valid_range's low may then exceed the output size)
    row_lo = min(max(r[0] for r in rows), out_h)
    col_lo = min(max(c[0] for c in cols), out_w)
    row_hi = max(min(r[1] for r in rows), row_lo)
    col_hi = max(min(c[1] for c in cols), col_lo)
    if row_lo + (out_h - row_hi) > DIRECT_MAX_EDGE or col_lo + (out_w - col_hi) > DIRECT_MAX_EDGE:
        return None
    return rows, cols, (row_lo, row_hi, col_lo, col_hi)


def _direct_window(  # type: ignore[no-untyped-def]
    lw: Lowerer, node: Node, dtype: DType, rank: int, shapes, window, group: int, epilogue: Epilogue | None
) -> Kernel | None:
    """Depthwise and narrow grouped convolutions (MobileNet 3x3, EfficientNet 5x5, ConvNeXt 7x7)
    output by output: each output's whole sum in a register, stored once with the epilogue,
    vectorized along the row; the interior without bounds tests, the borders by
    ``_static_borders`` or ``_run_time_borders``. None when sums are too long or borders too wide."""
    (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = window
    (batch, in_channels, height, width), w_shape, out_shape = shapes
    out_channels, group_channels, kernel_h, kernel_w = w_shape
    out_h, out_w = out_shape[2], out_shape[3]
    if group_channels * kernel_h * kernel_w > DIRECT_MAX_TAPS or group == 1 or "direct-window" in lw.disabled:
        return None
    interior = window_interior(shapes, window)
    if interior is None:
        return None
    per_group = out_channels // group
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    x_buf, w_buf, dst = lw.buffer(x), lw.buffer(w), lw.buffer(out)  # type: ignore[arg-type]
    n, oc, oh, ow = lw.index("n"), lw.index("oc"), lw.index("oh"), lw.index("ow")
    first_channel = Binary("*", Binary("/", oc, i64(per_group)), i64(group_channels))
    taps = [(ic, kh, kw) for ic in range(group_channels) for kh in range(kernel_h) for kw in range(kernel_w)]
    weights = {tap: lw.scalar(dtype, "w") for tap in taps}
    prologue: list[Stmt] = [
        Let(weights[(ic, kh, kw)], Load(w_buf, add(Binary("*", oc, i64(len(taps))), i64(taps.index((ic, kh, kw))))))
        for ic, kh, kw in taps
    ]
    start = lw.scalar(dtype, "b")
    prologue.append(Let(start, Load(lw.buffer(bias), oc) if bias is not None else Const(0, dtype)))

    def output(row: Expr, col: Expr, kh_valid: list[int], kw_valid: list[int], guarded: bool = False) -> list[Stmt]:
        """One output's store: the taps in ``kh_valid`` x ``kw_valid``; ``guarded``: every tap,
        each tested at run time (inside the input) before it is read."""
        value: Expr = start
        tests: list[tuple[Expr, Expr]] = []
        for ic, kh, kw in taps:
            if kh not in kh_valid or kw not in kw_valid:
                continue
            in_row = add(Binary("*", row, i64(stride_h)), i64(kh * dil_h - pad_t))
            in_col = add(Binary("*", col, i64(stride_w)), i64(kw * dil_w - pad_l))
            channel = add(add(Binary("*", n, i64(in_channels)), first_channel), i64(ic))
            at = add(Binary("*", channel, i64(height * width)), add(Binary("*", in_row, i64(width)), in_col))
            term = Binary("*", weights[(ic, kh, kw)], Load(x_buf, at))
            if guarded:
                tests.append((_inside(in_row, height, in_col, width), term))
            else:
                value = Binary("+", value, term)
        target = add(
            Binary("*", add(Binary("*", n, i64(out_channels)), oc), i64(out_h * out_w)),
            add(Binary("*", row, i64(out_w)), col),
        )
        acc = lw.scalar(dtype, "acc") if guarded else None
        if acc is not None:
            value = acc
        if epilogue is not None:
            position: list[Expr] = [n, oc, row, col] if rank == 4 else [n, oc, col]
            value = epilogue(position, value, target)
        if acc is None:
            return [Store(dst, target, value)]
        sums = [If(test, [Assign(acc, Binary("+", acc, term))]) for test, term in tests]
        return [Let(acc, start), *sums, Store(dst, target, value)]

    body: list[Stmt] = list(prologue)
    if "size-specific" in lw.disabled:  # sizes taken at run time: borders of no fixed count
        every = (list(range(kernel_h)), list(range(kernel_w)))
        edges = _run_time_edges(shapes, window)
        body.extend(
            _run_time_borders(lw, lambda r, c, g=False: output(r, c, *every, guarded=g), oh, ow, edges, (out_h, out_w))
        )
    else:
        body.extend(_static_borders(output, (oh, ow), interior, (kernel_h, kernel_w), (out_h, out_w)))
    stmts: list[Stmt] = [For(n, batch, [For(oc, out_channels, body)])]
    depthwise = group_channels == 1 and group == in_channels
    kernel = lw.kernel(
        node, "depthwise-conv" if depthwise else "conv", stmts, [x, w, bias], [out],
        Schedule(parallel=oc.name, vectorize=ow.name),
    )  # fmt: skip
    kernel.flops = 2 * int(np.prod(out_shape)) * group_channels * kernel_h * kernel_w
    return kernel


def _static_borders(output, indices, interior, kernel, sizes) -> list[Stmt]:  # type: ignore[no-untyped-def]
    """The direct window's rows at one size: each border row and column written out with only
    the taps that fall inside (decided here), the interior in loops without tests."""
    oh, ow = indices
    rows, cols, (row_lo, row_hi, col_lo, col_hi) = interior
    kernel_h, kernel_w = kernel
    out_h, out_w = sizes

    def row_body(row: Expr, kh_valid: list[int]) -> list[Stmt]:
        body: list[Stmt] = []
        for c in [*range(col_lo), *range(col_hi, out_w)]:  # border columns, each with its own taps
            kw_valid = [kw for kw in range(kernel_w) if cols[kw][0] <= c < cols[kw][1]]
            body.extend(output(row, i64(c), kh_valid, kw_valid))
        if col_hi > col_lo:
            body.append(For(ow, col_hi, output(row, ow, kh_valid, list(range(kernel_w))), start=col_lo))
        return body

    body: list[Stmt] = []
    for r in [*range(row_lo), *range(row_hi, out_h)]:  # border rows
        body.extend(row_body(i64(r), [kh for kh in range(kernel_h) if rows[kh][0] <= r < rows[kh][1]]))
    if row_hi > row_lo:
        body.append(For(oh, row_hi, row_body(oh, list(range(kernel_h))), start=row_lo))
    return body


def _run_time_edges(shapes, window) -> tuple[int, int, int, int]:  # type: ignore[no-untyped-def]
    """The interior's (row_lo, row_hi, col_lo, col_hi) as formulas of the sizes at every size: the
    leading edges by the pads, the trailing ones where the last tap leaves the input (no clipping
    to the interior's start, which would make them another formula at small sizes)."""
    x_shape, w_shape, out_shape = shapes
    (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = window
    last_row, last_col = (w_shape[2] - 1) * dil_h - pad_t, (w_shape[3] - 1) * dil_w - pad_l
    # (ceil((size - last) / stride) as a floor division of what is 0 or more at any size the window
    # fits, and smallest(): at the run-time dims route's capacity both keep their expressions)
    return (
        _leading(pad_t, stride_h),
        smallest(out_shape[2], (x_shape[2] - last_row + stride_h - 1) // stride_h),
        _leading(pad_l, stride_w),
        smallest(out_shape[3], (x_shape[3] - last_col + stride_w - 1) // stride_w),
    )


def _leading(pad: int, stride: int) -> int:
    """Output rows (or columns) before the first whose every tap starts inside the input: the
    pad's, whatever the size."""
    return -(-pad // stride)


def _inside(row: Expr, height: int, col: Expr, width: int) -> Expr:
    def within(at: Expr, size: int) -> Expr:
        return Binary("&&", Binary(">=", at, i64(0)), Binary("<", at, i64(size)))

    return Binary("&&", within(row, height), within(col, width))


def _run_time_borders(lw: Lowerer, output, oh: Index, ow: Index, edges, sizes) -> list[Stmt]:  # type: ignore[no-untyped-def]
    """The direct window's rows with a structure no size changes (the run-time dims route lowers
    it at several sizes and reads the sizes from the differing integers): the leading border
    rows and columns (their count is the pads') one by one, the trailing ones (one more at odd
    sizes) as loops, each border output testing its taps at run time, the interior loops bounded
    by the sizes. No output is written twice (an epilogue may read what it overwrites)."""
    row_lo, row_hi, col_lo, col_hi = edges
    out_h, out_w = sizes
    trailing_row, trailing_col = Binary("max", i64(row_hi), i64(row_lo)), Binary("max", i64(col_hi), i64(col_lo))

    def border_row(row: Expr) -> list[Stmt]:
        col = lw.index("bw")
        return [For(col, out_w, output(row, col, True))]

    def interior_row(row: Expr) -> list[Stmt]:
        col = lw.index("bw")
        leading = [If(Binary("<", i64(c), i64(out_w)), output(row, i64(c), True)) for c in range(col_lo)]
        return [
            *leading,
            For(ow, col_hi, output(row, ow), start=col_lo),
            For(col, out_w, output(row, col, True), start=trailing_col),
        ]

    bottom = lw.index("bh")
    return [
        *(If(Binary("<", i64(r), i64(out_h)), border_row(i64(r))) for r in range(row_lo)),
        For(oh, row_hi, interior_row(oh), start=row_lo),
        For(bottom, out_h, border_row(bottom), start=trailing_row),
    ]


def _conv_2d(node: Node, x_shape, w_shape, out_shape):  # type: ignore[no-untyped-def]
    """Shapes and window of a 1-D or 2-D convolution as 2-D (1-D: a height of 1)."""
    if len(x_shape) == 3:  # 1-D: the same loops with a height of 1
        (stride_w,), (dil_w,), (pad_l,) = conv_window(node, 1, x_shape[2:], out_shape[2:], w_shape[2:])
        shapes = (
            (x_shape[0], x_shape[1], 1, x_shape[2]),
            (*w_shape[:2], 1, w_shape[2]),
            (*out_shape[:2], 1, out_shape[2]),
        )
        return shapes, ((1, stride_w), (1, dil_w), (0, pad_l))
    if len(x_shape) == 4:
        return (x_shape, w_shape, out_shape), conv_window(node, 2, x_shape[2:], out_shape[2:], w_shape[2:])
    raise CannotLower("only 1-D and 2-D convolutions are lowered natively so far")


def _conv_taps(
    lw: Lowerer, dtype: DType, buffers, indices, plane: Expr, in_channel: Expr, shapes, window
) -> list[Stmt]:  # type: ignore[no-untyped-def]
    """Per tap of the kernel: its weight, then a contiguous run over the outputs it reaches
    inside the input (no bounds test: the valid interior is computed here)."""
    x_buf, w_buf, dst = buffers
    n, oc, ic, oh, ow = indices
    x_shape, w_shape, out_shape = shapes
    (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = window
    _, _, height, width = x_shape
    _, group_channels, kernel_h, kernel_w = w_shape
    _, _, out_h, out_w = out_shape
    taps: list[Stmt] = []
    for kh in range(kernel_h):
        h_low, h_high = valid_range(kh, stride_h, dil_h, pad_t, height, out_h)
        for kw in range(kernel_w):
            w_low, w_high = valid_range(kw, stride_w, dil_w, pad_l, width, out_w)
            if (h_low >= h_high or w_low >= w_high) and "size-specific" not in lw.disabled:
                continue  # (a tap no output reaches: left out, where the sizes are the compiled ones)
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
    return taps


def lower_conv(lw: Lowerer, node: Node, epilogue: Epilogue | None = None) -> list[Kernel]:
    dtype = require_float(lw, node)
    rank = len(lw.shape(node.inputs[0]))  # type: ignore[arg-type]
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    assert x is not None and w is not None
    x_shape, w_shape, out_shape = lw.shape(x), lw.shape(w), lw.shape(out)
    (x_shape, w_shape, out_shape), window = _conv_2d(node, x_shape, w_shape, out_shape)
    batch = x_shape[0]
    out_channels, group_channels, kernel_h, kernel_w = w_shape
    _, _, out_h, out_w = out_shape
    group = int(node.attrs.get("group", 1))
    if lw.target.pixel_major:
        return [pixel_conv(lw, node, dtype, rank, (x_shape, w_shape, out_shape), window, group, epilogue)]
    blocked = blocked_depthwise(
        lw, node, dtype, rank, (x_shape, w_shape, out_shape), window, group, epilogue,
    )  # fmt: skip
    if blocked is not None:
        return [blocked]
    direct = _direct_window(
        lw, node, dtype, rank, (x_shape, w_shape, out_shape), window, group, epilogue,
    )  # fmt: skip
    if direct is not None:
        return [direct]
    per_group = out_channels // group
    x_buf, w_buf, dst = lw.buffer(x), lw.buffer(w), lw.buffer(out)
    bias_buf = lw.buffer(bias) if bias is not None else None

    n, oc, ic = lw.index("n"), lw.index("oc"), lw.index("ic")
    oh, ow = lw.index("oh"), lw.index("ow")
    plane = add(Binary("*", n, i64(out_channels * out_h * out_w)), Binary("*", oc, i64(out_h * out_w)))
    group_index = Binary("/", oc, i64(per_group))
    in_channel = add(Binary("*", group_index, i64(group_channels)), ic)
    init_value: Expr = Load(bias_buf, oc) if bias_buf is not None else Const(0, dtype)
    body: list[Stmt] = [For(oh, out_h * out_w, [Store(dst, add(plane, oh), init_value)])]
    taps = _conv_taps(
        lw, dtype, (x_buf, w_buf, dst), (n, oc, ic, oh, ow), plane, in_channel,
        (x_shape, w_shape, out_shape), window,
    )  # fmt: skip
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


def _pool_2d(node: Node, x_shape, out_shape):  # type: ignore[no-untyped-def]
    """A 1-D or 2-D pooling as 2-D (1-D: a height of 1): shapes, kernel, and (strides,
    dilations, (top, left, bottom, right) pads)."""
    kernel = tuple(node.attrs["kernel_shape"])
    pads = list(node.attrs.get("pads") or [0] * (2 * len(kernel)))
    if len(x_shape) == 3:  # 1-D: the 2-D loops with a height of 1
        (stride_w,), (dil_w,), (pad_l,) = conv_window(node, 1, x_shape[2:], out_shape[2:], kernel)
        stride_h, dil_h, pad_t, pad_b, pad_r = 1, 1, 0, 0, pads[1]
        kernel = (1, kernel[0])
        x_shape, out_shape = (*x_shape[:2], 1, x_shape[2]), (*out_shape[:2], 1, out_shape[2])
    elif len(x_shape) == 4:
        (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = conv_window(node, 2, x_shape[2:], out_shape[2:], kernel)
        pad_b, pad_r = pads[2], pads[3]
    else:
        raise CannotLower("only 1-D and 2-D pooling are lowered natively so far")
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        pad_b, pad_r = pad_t, pad_l
    return x_shape, out_shape, kernel, ((stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l, pad_b, pad_r))


def lower_pool(lw: Lowerer, node: Node) -> list[Kernel]:
    dtype = require_float(lw, node)
    if len(node.outputs) > 1:
        raise CannotLower("MaxPool's indices output")
    x, out = node.inputs[0], node.outputs[0]
    assert x is not None
    x_shape, out_shape = lw.shape(x), lw.shape(out)
    x_shape, out_shape, kernel, window = _pool_2d(node, x_shape, out_shape)
    (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l, pad_b, pad_r) = window
    _, channels, height, width = x_shape
    is_max = node.op == "MaxPool"
    if is_max and dtype is F32 and not lw.target.pixel_major:
        window = (kernel, (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l))
        return [_max_pool_rows(lw, node, x_shape, out_shape, window)]
    power = float(node.attrs.get("p", 2)) if node.op == "LpPool" else None
    include_pad = bool(node.attrs.get("count_include_pad", 0))
    x_buf, dst = lw.buffer(x), lw.buffer(out)

    def body(indices: list[Expr]) -> list[Stmt]:
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
            update = Binary("+", acc, Binary("pow", Unary("abs", value), Const(power, F64)))
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

    if lw.target.pixel_major:  # pixel by pixel, every channel's window inside

        def channels_of(n: Index, oh: Index, ow: Index) -> list[Stmt]:
            c = lw.index("c")
            return [For(c, channels, body([add(Binary("*", n, i64(channels)), c), oh, ow]))]

        stmts, schedule = pixel_nest(lw, x_shape[0], out_shape[2], out_shape[3], channels_of)
        return [lw.kernel(node, "pool", stmts, [x], [out], schedule)]
    loop_shape = (x_shape[0] * channels, out_shape[2], out_shape[3])
    stmts, indices = nest(lw, loop_shape, body)
    return [lw.kernel(node, "pool", stmts, [x], [out], default_schedule(lw.target, loop_shape, indices))]


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
    body: list[Stmt] = [For(ow, out_w, [Store(dst, at, Const(-math.inf, F32))])]
    for kh in range(kernel_h):
        ih = add(Binary("*", oh, i64(stride_h)), i64(kh * dil_h - pad_t))
        taps: list[Stmt] = []
        for kw in range(kernel_w):
            shift = kw * dil_w - pad_l
            low, high = valid_range(kw, stride_w, dil_w, pad_l, width, out_w)
            if low >= high:
                continue
            source = add(
                add(Binary("*", nc, i64(height * width)), Binary("*", ih, i64(width))),
                add(Binary("*", ow, i64(stride_w)), i64(shift)),
            )
            update = FLOAT_OPS["Max"]([Load(dst, at), Load(x_buf, source)], {}, F32)
            taps.append(For(ow, high, [Store(dst, at, update)], start=low))
        inside = Binary("&&", Binary(">=", ih, i64(0)), Binary("<", ih, i64(height)))
        body.append(If(inside, taps))
    stmts: list[Stmt] = [For(nc, x_shape[0] * channels, [For(oh, out_h, body)])]
    parallel = nc.name if x_shape[0] * channels > 1 else None
    return lw.kernel(
        node, "pool", stmts, [node.inputs[0]], [node.outputs[0]], Schedule(parallel=parallel, vectorize=ow.name)
    )


LOWERINGS = {"Conv": lower_conv, "MaxPool": lower_pool, "AveragePool": lower_pool, "LpPool": lower_pool}
