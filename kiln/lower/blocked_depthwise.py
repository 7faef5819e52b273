"""Depthwise convolution on small planes, vectorized across channels (``blocked_depthwise``)."""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Node
from kiln.ir.types import DType
from kiln.lower.engine import Epilogue
from kiln.lower.kir import (
    Binary,
    Buffer,
    Const,
    Expr,
    For,
    Kernel,
    Load,
    Schedule,
    Stmt,
    Store,
    add,
    affine,
    buffers_in,
    i64,
)
from kiln.lower.lowering import Lowerer

F32 = DType.FLOAT32


BLOCKED_MAX_PLANE = 28 * 28  # output pixels per plane up to which depthwise runs channel-blocked
BLOCKED_MIN_TAPS = 25  # 5x5 and larger: enough work per pixel to pay for the two interleaving copies


def blocked_depthwise(  # type: ignore[no-untyped-def]
    lw: Lowerer, node: Node, dtype: DType, rank: int, shapes, window, group: int, epilogue: Epilogue | None
) -> Kernel | None:
    """Depthwise convolution on small planes (EfficientNet's 14x14 and 7x7 5x5 layers, ConvNeXt's
    7x7), vectorized across channels instead of along rows too short for a vector: per block of
    ``lanes`` channels, the input planes are copied channel-interleaved into a zero-bordered
    scratch (so every tap is inside it and no output needs a bounds test), each output pixel's
    ``lanes`` channels are one vector (bias + every tap times its channels' weights, packed
    tap-major at compile time; epilogue applied), and the block is written back as planes.
    None when channels do not fill whole blocks or planes are large (rows vectorize well there)."""
    x_shape, w_shape, out_shape = shapes
    (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = window
    batch, channels, height, width = x_shape
    out_channels, group_channels, kernel_h, kernel_w = w_shape
    out_h, out_w = out_shape[2], out_shape[3]
    lanes = lw.target.lanes(dtype)
    if group_channels != 1 or group != channels or out_channels != channels or lanes < 4 or channels % lanes:
        return None
    if out_h * out_w > BLOCKED_MAX_PLANE or kernel_h * kernel_w < BLOCKED_MIN_TAPS or dtype is not F32:
        return None
    pad_h = max(height + pad_t, (out_h - 1) * stride_h + (kernel_h - 1) * dil_h + 1)
    pad_w = max(width + pad_l, (out_w - 1) * stride_w + (kernel_w - 1) * dil_w + 1)
    blocks = channels // lanes
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    x_buf, dst = lw.buffer(x), lw.buffer(out)  # type: ignore[arg-type]
    taps = kernel_h * kernel_w
    weights = lw.constant(w)
    if weights is None:
        return None
    packed = _pack_depthwise(lw, w, weights, blocks, lanes, taps)
    plane_in, plane_out = pad_h * pad_w * lanes, out_h * out_w * lanes
    padded = lw.scratch_buffer(F32, batch * blocks * plane_in, hint="dwpad")
    result = lw.scratch_buffer(F32, batch * blocks * plane_out, hint="dwout")
    n, cb, c = lw.index("n"), lw.index("cb"), lw.index("c")
    ih, iw, oh, ow, p = lw.index("ih"), lw.index("iw"), lw.index("oh"), lw.index("ow"), lw.index("p")
    block = add(Binary("*", n, i64(blocks)), cb)
    channel = add(Binary("*", cb, i64(lanes)), c)
    in_base = Binary("*", block, i64(plane_in))
    out_base = Binary("*", block, i64(plane_out))

    def plane_of(size: int) -> Expr:  # where (n, channel)'s plane of ``size`` elements starts
        return Binary("*", add(Binary("*", n, i64(channels)), channel), i64(size))

    zero = [For(p, plane_in, [Store(padded, add(in_base, p), Const(0.0, F32))])]
    fill = _blocked_fill(
        padded, x_buf, in_base, plane_of(height * width), (ih, iw, c), (height, width, lanes), (pad_w, pad_t, pad_l)
    )
    value: Expr = Load(lw.buffer(bias), channel) if bias is not None else Const(0.0, F32)
    value = _blocked_taps(
        value,
        packed,
        padded,
        in_base,
        (oh, ow, c, cb),
        (kernel_h, kernel_w, dil_h, dil_w),
        (stride_h, stride_w, pad_w, lanes),
    )
    target = add(plane_of(out_h * out_w), affine([(oh, out_w), (ow, 1)]))  # type: ignore[list-item]
    if epilogue is not None:
        position: list[Expr] = [n, channel, oh, ow] if rank == 4 else [n, channel, ow]
        value = epilogue(position, value, target)
    compute, back = _blocked_store(
        lw, value, result, dst, out_base, (n, cb, oh, ow, c, p), (out_h, out_w, lanes, channels)
    )
    stmts: list[Stmt] = [For(n, batch, [For(cb, blocks, [*zero, fill, compute, back])])]
    lw.kernel_count += 1
    kernel = Kernel(
        f"k{lw.kernel_count}",
        "depthwise-conv",
        stmts,
        [b for b in buffers_in(stmts) if b not in (dst, padded, result)],
        [dst, padded, result],
        [node.label],
        Schedule(parallel=cb.name, vectorize=c.name, simd=(p.name,)),
        flops=2 * int(np.prod(out_shape)) * taps,
    )
    return kernel


def _pack_depthwise(lw: Lowerer, w, weights, blocks: int, lanes: int, taps: int) -> Buffer:  # type: ignore[no-untyped-def]
    """The weights as [block][tap][lane]: one tap's weights for a block of channels are one vector."""
    return lw.packed_constant(
        ("depthwise-blocked", w.name, lanes),
        lambda: np.ascontiguousarray(
            weights.reshape(blocks, lanes, taps).transpose(0, 2, 1).astype(np.float32)
        ).reshape(-1),
    )


def _blocked_store(lw: Lowerer, value, result, dst, out_base, indices, sizes):  # type: ignore[no-untyped-def]
    """Each output pixel's channels stored as one vector in the block's scratch, then written
    back as planes: one channel at a time (c2, scalar), its pixels contiguous (p, vectorized)."""
    n, cb, oh, ow, c, p = indices
    out_h, out_w, lanes, channels = sizes
    compute = For(
        oh,
        out_h,
        [
            For(
                ow,
                out_w,
                [
                    For(
                        c,
                        lanes,
                        [Store(result, add(out_base, affine([(oh, out_w * lanes), (ow, lanes), (c, 1)])), value)],
                    )
                ],
            )
        ],  # type: ignore[list-item]
    )
    c2 = lw.index("c")
    plane2 = Binary("*", add(Binary("*", n, i64(channels)), add(Binary("*", cb, i64(lanes)), c2)), i64(out_h * out_w))
    back = For(
        c2,
        lanes,
        [
            For(
                p,
                out_h * out_w,
                [Store(dst, add(plane2, p), Load(result, add(out_base, affine([(p, lanes), (c2, 1)]))))],
            )
        ],  # type: ignore[list-item]
    )
    return compute, back


def _blocked_fill(padded, x_buf, in_base, plane, indices, sizes, pads) -> For:  # type: ignore[no-untyped-def]
    """The copy of a block's input planes into the zero-bordered, channel-interleaved scratch:
    gathers along the channels (one plane apart), contiguous stores (it vectorizes over c)."""
    ih, iw, c = indices
    height, width, lanes = sizes
    pad_w, pad_t, pad_l = pads
    at = add(in_base, affine([(ih, pad_w * lanes), (iw, lanes), (c, 1)], (pad_t * pad_w + pad_l) * lanes))
    copy = Store(padded, at, Load(x_buf, add(plane, affine([(ih, width), (iw, 1)]))))  # type: ignore[list-item]
    return For(ih, height, [For(iw, width, [For(c, lanes, [copy])])])


def _blocked_taps(value, packed, padded, in_base, indices, kernel, strides) -> Expr:  # type: ignore[no-untyped-def]
    """``value`` plus every tap times its channels' weights (one vector per tap)."""
    oh, ow, c, cb = indices
    kernel_h, kernel_w, dil_h, dil_w = kernel
    stride_h, stride_w, pad_w, lanes = strides
    taps = kernel_h * kernel_w
    for kh in range(kernel_h):
        for kw in range(kernel_w):
            tap = kh * kernel_w + kw
            at = add(
                in_base,
                affine(
                    [(oh, stride_h * pad_w * lanes), (ow, stride_w * lanes), (c, 1)],  # type: ignore[list-item]
                    (kh * dil_h * pad_w + kw * dil_w) * lanes,
                ),
            )
            weight = Load(packed, affine([(cb, taps * lanes), (c, 1)], tap * lanes))  # type: ignore[list-item]
            value = Binary("+", value, Binary("*", weight, Load(padded, at)))
    return value
