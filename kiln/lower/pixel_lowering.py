"""Convolutions and poolings pixel by pixel, for targets whose hardware takes a stream of pixels
(``Target.pixel_major``: the fpga target).

Loops ``n, oh, ow`` outside; inside one output pixel every output channel's sum over input
channels and taps (a conv) or every channel's window (a pool). The ``ow`` loop is marked in the
schedule's ``pipeline`` (interval 0: the target's own, its reuse factor), so an HLS pipeline
takes one output pixel per interval with the pixel's channels and taps unrolled — the structure
of hls4ml's io_parallel convolution, and the order a line buffer can feed. Padding is a
condition on the input row and column (the tap contributes nothing outside the image).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.graph import Node
from kiln.ir.types import DType
from kiln.lower.engine import Epilogue
from kiln.lower.kir import (
    Assign,
    Binary,
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
    add,
    i64,
)
from kiln.lower.lowering import Lowerer


def inside(ih: Expr, iw: Expr, height: int, width: int) -> Expr:
    return Binary(
        "&&",
        Binary("&&", Binary(">=", ih, i64(0)), Binary("<", ih, i64(height))),
        Binary("&&", Binary(">=", iw, i64(0)), Binary("<", iw, i64(width))),
    )


def pixel_nest(
    lw: Lowerer, batch: int, out_h: int, out_w: int, body: Callable[[Index, Index, Index], list[Stmt]]
) -> tuple[list[Stmt], Schedule]:
    """``for n, oh, ow: body(n, oh, ow)`` with ``ow`` the pipelined loop."""
    n, oh, ow = lw.index("n"), lw.index("oh"), lw.index("ow")
    stmts: list[Stmt] = [For(n, batch, [For(oh, out_h, [For(ow, out_w, body(n, oh, ow))])])]
    return stmts, Schedule(pipeline={ow.name: 0})


def pixel_conv(  # type: ignore[no-untyped-def]
    lw: Lowerer, node: Node, dtype: DType, rank: int, shapes, window, group: int, epilogue: Epilogue | None
) -> Kernel:
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    x_shape, w_shape, out_shape = shapes
    (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = window
    batch, channels, height, width = x_shape
    out_channels, group_channels, kernel_h, kernel_w = w_shape
    out_h, out_w = out_shape[2], out_shape[3]
    per_group = out_channels // group
    x_buf, w_buf, dst = lw.buffer(x), lw.buffer(w), lw.buffer(out)  # type: ignore[arg-type]
    bias_buf = lw.buffer(bias) if bias is not None else None

    def body(n: Index, oh: Index, ow: Index) -> list[Stmt]:
        oc, ic, kh, kw = lw.index("oc"), lw.index("ic"), lw.index("kh"), lw.index("kw")
        acc = lw.scalar(dtype, "acc")
        ih = add(add(Binary("*", oh, i64(stride_h)), Binary("*", kh, i64(dil_h))), i64(-pad_t))
        iw = add(add(Binary("*", ow, i64(stride_w)), Binary("*", kw, i64(dil_w))), i64(-pad_l))
        channel = add(Binary("*", Binary("/", oc, i64(per_group)), i64(group_channels)), ic)
        source = add(
            Binary("*", add(Binary("*", n, i64(channels)), channel), i64(height * width)),
            add(Binary("*", ih, i64(width)), iw),
        )
        weight = add(
            Binary("*", add(Binary("*", oc, i64(group_channels)), ic), i64(kernel_h * kernel_w)),
            add(Binary("*", kh, i64(kernel_w)), kw),
        )
        term = Binary("*", Load(x_buf, source), Load(w_buf, weight))
        taps = For(
            kh,
            kernel_h,
            [For(kw, kernel_w, [If(inside(ih, iw, height, width), [Assign(acc, Binary("+", acc, term))])])],
        )
        at = add(
            Binary("*", add(Binary("*", n, i64(out_channels)), oc), i64(out_h * out_w)),
            add(Binary("*", oh, i64(out_w)), ow),
        )
        value: Expr = acc
        if epilogue is not None:
            position: list[Expr] = [n, oc, oh, ow] if rank == 4 else [n, oc, ow]
            value = epilogue(position, acc, at)
        start: Expr = Load(bias_buf, oc) if bias_buf is not None else Const(0.0, dtype)
        return [For(oc, out_channels, [Let(acc, start), For(ic, group_channels, [taps]), Store(dst, at, value)])]

    stmts, schedule = pixel_nest(lw, batch, out_h, out_w, body)
    kind = "depthwise-conv" if group > 1 and group_channels == 1 and group == channels else "conv"
    kernel = lw.kernel(node, kind, stmts, [x, w, bias], [out], schedule)
    kernel.flops = 2 * batch * out_channels * out_h * out_w * group_channels * kernel_h * kernel_w
    return kernel
