"""Winograd convolution for 3x3, stride-1 kernels: F(m x m, 3 x 3) with m = 2 or 4.

Each output tile of m x m pixels is computed from an (m+2) x (m+2) input patch d as
``Y = A^T [(G g G^T) * (B^T d B)] A``: the elementwise product over the a x a transform points
becomes a^2 independent matrix products ``M[p] = U[p] (OC x IC) . V[p] (IC x tiles)`` run by the
matrix-multiply engine, so a 3x3 convolution costs a^2 / (9 m^2) of the direct multiplies
(F(2,3): 1/2.25, F(4,3): 1/4). Three kernels:

1. input transform: every (image, channel, tile) patch -> V[p][c][t] (zero padding applied here);
2. the engine: batch of a^2 products with the transformed weights U packed once, ahead of time;
3. output transform: Y = A^T M A per (image, out channel, tile), then bias and the fused epilogue,
   written straight into the output (partial edge tiles clipped).

The transform matrices are Lavin & Gray's (interpolation points 0, +-1, +-2 and infinity for
F(4,3); 0, +-1, infinity for F(2,3)); tests check them against the direct convolution, and
larger tiles trade accuracy for speed (F(4,3) errors are ~10x F(2,3)'s, still far below 1e-4).
"""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Node
from kiln.ir.types import DType
from kiln.lower.engine import blocking, conv_output_indexing, epilogue_helper, pack_cols, pack_rows
from kiln.lower.kir import (
    GemmSpec,
    Kernel,
    MatrixOperand,
    PackedOperand,
    Stmt,
    WinogradInput,
    WinogradOutput,
    buffers_in,
)

F32 = DType.FLOAT32

TRANSFORMS = {
    2: {
        "BT": [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        "G": [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        "AT": [[1, 1, 1, 0], [0, 1, -1, -1]],
    },
    4: {
        "BT": [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ],
        "G": [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ],
        "AT": [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    },
}


def eligible(x_shape: tuple[int, ...], w_shape: tuple[int, ...], out_shape: tuple[int, ...], window: tuple) -> str:  # type: ignore[type-arg]
    """'' when Winograd applies (and is worth it), else why not."""
    (stride_h, stride_w), (dil_h, dil_w), _ = window
    if len(x_shape) != 4 or w_shape[2:] != (3, 3):
        return "not a 2-D 3x3 convolution"
    if (stride_h, stride_w, dil_h, dil_w) != (1, 1, 1, 1):
        return "strided or dilated"
    if w_shape[0] < 8 or w_shape[1] < 8:
        return "too few channels for the transforms to pay"
    if out_shape[2] * out_shape[3] < 16:
        return "output too small"
    return ""


def tile_size(out_shape: tuple[int, ...]) -> int:
    return 4 if min(out_shape[2], out_shape[3]) >= 8 else 2


def weight_transform(weights: np.ndarray, m: int) -> np.ndarray:
    """[OC, IC, 3, 3] -> U [a*a, OC, IC]."""
    g = np.array(TRANSFORMS[m]["G"], dtype=np.float32)
    # two products through BLAS: (G g) over the kernel rows, then (. G^T) over its columns
    left = np.tensordot(g, weights.astype(np.float32), axes=([1], [2]))  # [a, O, C, 3]
    u = np.tensordot(left, g, axes=([3], [1]))  # [a, O, C, a]
    a = m + 2
    return np.ascontiguousarray(u.transpose(0, 3, 1, 2), dtype=np.float32).reshape(
        a * a, weights.shape[0], weights.shape[1]
    )


def _product_operands(lw, w, m: int, transformed, sizes: tuple[int, int, int], tile_major: bool):  # type: ignore[no-untyped-def]
    """The a*a products' operands: M[p] = U[p] . V[p] (out channels x tiles), the weights packed as
    row panels; or, with fewer tiles than a panel of the engine's columns (a 7x7 or 14x14 output:
    16 tiles), where most of every panel would be padding, transposed: M[p]^T = V[p]^T . U[p]^T
    (tiles x out channels), the weights packed as column panels, the panels running across the
    output channels (the output transform then reads M tile-major)."""
    channels, out_channels, tiles = sizes
    target = lw.target
    u = weight_transform(np.asarray(lw.constant(w)), m)
    if tile_major:
        cols = target.gemm_cols
        packed = lw.packed_constant(("winograd-t", w, m, cols), lambda: pack_cols(u.transpose(0, 2, 1), cols))
        panels = -(-out_channels // cols) * cols
        return (
            MatrixOperand(transformed, channels * tiles, 1, tiles),
            PackedOperand(packed, panels * channels, cols),
        ), packed
    packed = lw.packed_constant(("winograd", w, m, target.gemm_rows), lambda: pack_rows(u, target.gemm_rows))
    panel_rows = -(-out_channels // target.gemm_rows) * target.gemm_rows
    a_operand = PackedOperand(packed, panel_rows * channels, target.gemm_rows)
    return (a_operand, MatrixOperand(transformed, channels * tiles, tiles, 1)), packed


def lower_conv_winograd(
    lw, node: Node, epilogue, geometry: dict, bias_buf, m: int, choice: dict | None = None
) -> list[Kernel]:  # type: ignore[no-untyped-def]
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    batch, channels, height, width = geometry["x_shape"]
    out_channels = geometry["w_shape"][0]
    out_h, out_w = geometry["out_shape"][2:]
    pad_t, pad_l = geometry["pads"]
    a = m + 2
    tiles_h, tiles_w = -(-out_h // m), -(-out_w // m)
    tiles = batch * tiles_h * tiles_w
    x_buf, dst = lw.buffer(x), lw.buffer(out)
    # the drivers index by this geometry: it must describe the buffers exactly
    assert x_buf.size == batch * channels * height * width, (x_buf, batch, channels, height, width)
    assert dst.size == batch * geometry["w_shape"][0] * out_h * out_w, (dst, geometry)
    transformed = lw.scratch_buffer(F32, a * a * channels * tiles, hint="wino_v")
    products = lw.scratch_buffer(F32, a * a * out_channels * tiles, hint="wino_m")
    target = lw.target
    tile_major = tiles < target.gemm_cols
    (a_operand, b_operand), packed = _product_operands(
        lw, w, m, transformed, (channels, out_channels, tiles), tile_major
    )
    rows, columns, ldc = (tiles, out_channels, out_channels) if tile_major else (out_channels, tiles, tiles)

    # 1. input transform (zero padding applied here)
    stmts: list[Stmt] = [
        WinogradInput(m, x_buf, transformed, batch, channels, height, width, pad_t, pad_l, tiles_h, tiles_w)
    ]
    lw.kernel_count += 1
    first = Kernel(f"k{lw.kernel_count}", "winograd-in", stmts, [x_buf], [transformed], [node.label])

    # 2. a*a products on the engine
    product = GemmSpec(
        a * a,
        rows,
        columns,
        channels,
        a_operand,
        b_operand,
        products,
        out_channels * tiles,
        ldc,
        blocking(choice or {}),
    )
    lw.kernel_count += 1
    second = Kernel(
        f"k{lw.kernel_count}",
        "winograd-gemm",
        [product],
        [transformed, packed],
        [products],
        [node.label],
        flops=2 * a * a * out_channels * tiles * channels,
    )  # type: ignore[arg-type]

    # 3. output transform + bias, then the fused epilogue per finished tile row, on the output
    # viewed as [image][channel][pixel]
    lw.kernel_count += 1
    name = f"k{lw.kernel_count}"
    helper = None
    if epilogue is not None:
        flat_of, position_of = conv_output_indexing(out_channels, geometry["out_shape"])
        helper = epilogue_helper(lw, name, dst, position_of, flat_of, epilogue, None)
    call = WinogradOutput(
        m, products, dst, bias_buf, batch, out_channels, out_h, out_w, tiles_h, tiles_w, helper, tile_major
    )
    third = Kernel(name, "winograd-out", [call], [], [dst], [node.label])
    third.reads = [b for b in buffers_in([call]) if b is not dst]
    return [first, second, third]
