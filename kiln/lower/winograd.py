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
from kiln.lower.kir import (
    Binary,
    Const,
    Expr,
    For,
    Gemm,
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
    buffers_in,
    i64,
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


def eligible(
    node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], out_shape: tuple[int, ...], window: tuple
) -> str:  # type: ignore[type-arg]
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


def _combine(coefficients: list[float], terms: list[Expr]) -> Expr:
    """sum(c * t) with zero terms skipped and unit coefficients not multiplied."""
    result: Expr | None = None
    for coefficient, term in zip(coefficients, terms):
        if coefficient == 0:
            continue
        magnitude = abs(coefficient)
        value = term if magnitude == 1 else Binary("*", Const(float(magnitude), F32), term)
        if result is None:
            result = value if coefficient > 0 else Binary("-", Const(0.0, F32), value)
        else:
            result = Binary("+" if coefficient > 0 else "-", result, value)
    return result if result is not None else Const(0.0, F32)


def lower_conv_winograd(
    lw, node: Node, epilogue, geometry: dict, bias_buf, m: int, choice: dict | None = None
) -> list[Kernel]:  # type: ignore[no-untyped-def]
    from kiln.codegen.target import Target
    from kiln.lower.gemm_lowering import pack_rows

    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    batch, channels, height, width = geometry["x_shape"]
    out_channels = geometry["w_shape"][0]
    out_h, out_w = geometry["out_shape"][2:]
    pad_t, pad_l = geometry["pads"]
    a = m + 2
    tiles_h, tiles_w = -(-out_h // m), -(-out_w // m)
    tiles = batch * tiles_h * tiles_w
    bt = TRANSFORMS[m]["BT"]
    at = TRANSFORMS[m]["AT"]
    x_buf, dst = lw.buffer(x), lw.buffer(out)
    transformed = lw.scratch_buffer(F32, a * a * channels * tiles, hint="wino_v")
    products = lw.scratch_buffer(F32, a * a * out_channels * tiles, hint="wino_m")
    target = Target.host()
    weights = lw.constant(w)
    u = weight_transform(np.asarray(weights), m)
    packed = lw.packed_constant(("winograd", w, m, target.gemm_rows), lambda: pack_rows(u, target.gemm_rows))
    panel_rows = -(-out_channels // target.gemm_rows) * target.gemm_rows

    # 1. input transform; tiles whose patch lies inside the image skip the bounds tests, and their
    # loop (over tile columns) is vectorized
    def input_body(n: Index, c: Index, th: Index, tw: Index, checked: bool) -> list[Stmt]:
        tile = add(Binary("*", add(Binary("*", n, i64(tiles_h)), th), i64(tiles_w)), tw)
        body: list[Stmt] = []
        patch: list[list[Expr]] = []
        for i in range(a):
            row: list[Expr] = []
            for j in range(a):
                ih = add(Binary("*", th, i64(m)), i64(i - pad_t))
                iw = add(Binary("*", tw, i64(m)), i64(j - pad_l))
                at_x = add(
                    Binary("*", add(Binary("*", n, i64(channels)), c), i64(height * width)),
                    add(Binary("*", ih, i64(width)), iw),
                )
                value: Expr = Load(x_buf, at_x)
                if checked:
                    inside = Binary(
                        "&&",
                        Binary("&&", Binary(">=", ih, i64(0)), Binary("<", ih, i64(height))),
                        Binary("&&", Binary(">=", iw, i64(0)), Binary("<", iw, i64(width))),
                    )
                    value = Select(inside, value, Const(0.0, F32))
                d = lw.scalar(F32, "d")
                body.append(Let(d, value))
                row.append(d)
            patch.append(row)
        half: list[list[Expr]] = []  # B^T d
        for xi in range(a):
            row = []
            for j in range(a):
                t = lw.scalar(F32, "t")
                body.append(Let(t, _combine(bt[xi], [patch[i][j] for i in range(a)])))
                row.append(t)
            half.append(row)
        for xi in range(a):
            for nu in range(a):
                value = _combine(bt[nu], half[xi])  # (B^T d) B: row xi times column nu of B = row nu of B^T
                at_v = add(
                    Binary("*", i64((xi * a + nu) * channels), i64(tiles)), add(Binary("*", c, i64(tiles)), tile)
                )
                body.append(Store(transformed, at_v, value))
        return body

    # tiles whose patch rows [t*m - pad, t*m - pad + a) lie inside [0, size)
    def inner_range(size: int, pad: int, count: int) -> tuple[int, int]:
        low = min(-(-pad // m), count)
        high = max(min((size - a + pad) // m + 1, count), low)
        return low, high

    h_low, h_high = inner_range(height, pad_t, tiles_h)
    w_low, w_high = inner_range(width, pad_l, tiles_w)
    n, c, th = lw.index("n"), lw.index("c"), lw.index("th")
    tw, tws = lw.index("tw"), lw.index("tws")
    inner_th = Binary("&&", Binary(">=", th, i64(h_low)), Binary("<", th, i64(h_high)))
    per_row: list[Stmt] = [
        If(inner_th, [
            For(tw, w_low, input_body(n, c, th, tw, True)),
            For(tws, w_high, input_body(n, c, th, tws, False), start=w_low),
            For(tw, tiles_w, input_body(n, c, th, tw, True), start=w_high),
        ]),
        If(Binary("||", Binary("<", th, i64(h_low)), Binary(">=", th, i64(h_high))), [For(tw, tiles_w, input_body(n, c, th, tw, True))]),
    ]  # fmt: skip
    stmts: list[Stmt] = [For(n, batch, [For(c, channels, [For(th, tiles_h, per_row)])])]
    lw.kernel_count += 1
    first = Kernel(
        f"k{lw.kernel_count}",
        "winograd-in",
        stmts,
        [x_buf],
        [transformed],
        [node.label],
        Schedule(parallel=c.name, vectorize=tws.name),
    )
    first.reads = [b for b in buffers_in(stmts) if b is not transformed]

    # 2. a*a products on the engine
    fields = {
        "batch": a * a, "M": out_channels, "N": tiles, "K": channels,
        "a_packed": packed, "a_pbs": panel_rows * channels,
        "b": transformed, "b_bs": channels * tiles, "b_rs": tiles, "b_cs": 1, "pack_b": "kiln_pack_b_strided",
        "c": products, "c_bs": out_channels * tiles, "ldc": tiles,
    }  # fmt: skip
    fields.update({k: int(v) for k, v in (choice or {}).items() if k in ("mc", "nc", "kc")})
    lw.kernel_count += 1
    stmt = Gemm(fields)  # type: ignore[arg-type]
    second = Kernel(
        f"k{lw.kernel_count}",
        "winograd-gemm",
        [stmt],
        [transformed, packed],
        [products],
        [node.label],
        flops=2 * a * a * out_channels * tiles * channels,
    )

    # 3. output transform, bias, epilogue; whole tiles (no clipping) in a vectorized loop
    def output_body(n: Index, o: Index, th: Index, tw: Index, checked: bool) -> list[Stmt]:
        tile = add(Binary("*", add(Binary("*", n, i64(tiles_h)), th), i64(tiles_w)), tw)
        body: list[Stmt] = []
        loaded: list[list[Expr]] = []
        for xi in range(a):
            row: list[Expr] = []
            for nu in range(a):
                s = lw.scalar(F32, "mm")
                body.append(
                    Let(
                        s,
                        Load(
                            products,
                            add(
                                Binary("*", i64((xi * a + nu) * out_channels), i64(tiles)),
                                add(Binary("*", o, i64(tiles)), tile),
                            ),
                        ),
                    )
                )
                row.append(s)
            loaded.append(row)
        partial: list[list[Expr]] = []  # A^T M
        for i in range(m):
            row = []
            for nu in range(a):
                s = lw.scalar(F32, "r")
                body.append(Let(s, _combine(at[i], [loaded[xi][nu] for xi in range(a)])))
                row.append(s)
            partial.append(row)
        for i in range(m):
            for j in range(m):
                value: Expr = _combine(at[j], partial[i])
                if bias_buf is not None:
                    value = Binary("+", value, Load(bias_buf, o))
                oh = add(Binary("*", th, i64(m)), i64(i))
                ow = add(Binary("*", tw, i64(m)), i64(j))
                flat = add(
                    Binary("*", add(Binary("*", n, i64(out_channels)), o), i64(out_h * out_w)),
                    add(Binary("*", oh, i64(out_w)), ow),
                )
                y = lw.scalar(F32, "y")
                finished: Expr = y if epilogue is None else epilogue([n, o, oh, ow], y, flat)
                store: list[Stmt] = [Let(y, value), Store(dst, flat, finished)]
                if checked:  # a clipped tile at the bottom or right edge
                    body.append(If(Binary("&&", Binary("<", oh, i64(out_h)), Binary("<", ow, i64(out_w))), store))
                else:
                    body.extend(store)
        return body

    full_h, full_w = out_h // m, out_w // m
    n, o, th = lw.index("n"), lw.index("o"), lw.index("th")
    tw, tws = lw.index("tw"), lw.index("tws")
    per_row = [
        If(Binary("<", th, i64(full_h)), [
            For(tws, full_w, output_body(n, o, th, tws, False)),
            For(tw, tiles_w, output_body(n, o, th, tw, True), start=full_w),
        ]),
        If(Binary(">=", th, i64(full_h)), [For(tw, tiles_w, output_body(n, o, th, tw, True))]),
    ]  # fmt: skip
    stmts = [For(n, batch, [For(o, out_channels, [For(th, tiles_h, per_row)])])]
    lw.kernel_count += 1
    third = Kernel(
        f"k{lw.kernel_count}",
        "winograd-out",
        stmts,
        [],
        [dst],
        [node.label],
        Schedule(parallel=o.name, vectorize=tws.name),
    )
    third.reads = [b for b in buffers_in(stmts) if b is not dst]
    return [first, second, third]
