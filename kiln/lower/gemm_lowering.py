"""Matrix products and convolutions through the matrix-multiply engine (``kiln/backends/cpu/gemm.c``).

A float32 MatMul becomes ``C[b] = A[b] . B[b]``; a 2-D (or 1-D) convolution with one group
becomes, per image, ``Y[OC, OH*OW] = W[OC, IC*KH*KW] . im2col(X)`` (1x1 stride-1 convolutions
read X directly). Constant operands (the weights) are packed once, when the plan is built, into
the panel layout the micro-kernel streams (``packed_constant``); the others are packed per cache
block at run time. Fused epilogues (bias, activation, residual) become a helper function the
engine applies to each finished micro-tile.

Cases the engine does not cover (other dtypes, grouped convolutions, general batch broadcasting,
non-constant convolution weights, empty reductions) keep the loop-nest lowerings of
``nn_lowering``, which are also the reference the engine is tested against.
"""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Node
from kiln.ir.sized import size_product
from kiln.ir.types import DType
from kiln.lower import winograd
from kiln.lower.engine import (
    BF16_BLOCK,
    INT8_K,
    WEIGHT_FORMATS,
    Epilogue,
    NotForEngine,
    activation_quantization,
    batch_position,
    blocking,
    conv_output_indexing,
    engine_kernel,
    epilogue_helper,
    pack_cols,
    pack_cols_int4,
    pack_cols_int8,
    pack_pairs_bf16,
    pack_quads_int8,
    pack_rows,
    pack_rows_bf16,
    pack_rows_int8,
    quantize_channels,
    row_major_flat,
    tile_finish,
)
from kiln.lower.kir import (
    Binary,
    DirectOperand,
    Expr,
    GemmSpec,
    Im2colOperand,
    Kernel,
    MatrixOperand,
    PackedOperand,
    QuantSpec,
    i64,
)
from kiln.lower.lowering import CannotLower, Lowerer
from kiln.lower.narrow_store import bf16_given, narrow_store
from kiln.lower.window_lowering import conv_window
from kiln.passes.layout import DIRECT_MAX_TAPS, DIRECT_MIN_CHANNELS, range_key

I64 = DType.INT64


# -- MatMul --------------------------------------------------------------------------------------------


def lower_matmul_gemm(lw: Lowerer, node: Node, epilogue: Epilogue | None = None) -> list[Kernel]:
    a, b, out = node.inputs[0], node.inputs[1], node.outputs[0]
    assert a is not None and b is not None
    if "gemm" not in lw.target.engines:
        raise NotForEngine(f"target {lw.target.name} has no matrix-multiply engine")
    if any(v.type.dtype is not DType.FLOAT32 for v in (a, b)):  # type: ignore[union-attr]
        raise NotForEngine("the engine multiplies float32")
    a_shape, b_shape, out_shape = lw.shape(a), lw.shape(b), lw.shape(out)
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise NotForEngine("1-D operand")
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    if 0 in (m, k, n):
        raise NotForEngine("empty matrix")
    batch_shape = out_shape[:-2]
    batch = size_product(batch_shape) if batch_shape else 1
    a_count = size_product(a_shape[:-2]) if len(a_shape) > 2 else 1
    b_count = size_product(b_shape[:-2]) if len(b_shape) > 2 else 1
    dst, a_buf = lw.buffer(out), lw.buffer(a)
    lw.buffer(b)  # (made here, after A's: buffers are numbered in the order they are made)
    rows = m
    if b_count == 1 and lw.constant(a) is None:
        # B shared by every batch element: the batch folds into the rows of one product
        rows, batch, a_count = m * batch, 1, 1
    for count, name in ((a_count, "A"), (b_count, "B")):
        if count not in (1, batch):
            raise NotForEngine(f"{name} broadcasts over part of the batch")
    a_const, b_const = lw.constant(a), lw.constant(b)
    a_operand: MatrixOperand | PackedOperand
    b_operand: MatrixOperand | PackedOperand
    # int8: float activations (A) times one constant weight matrix (B)
    activations = a if a_const is None and b_const is not None and b_count == 1 else None
    precision = _precision_of(lw, node, activations)
    quant, given, scales, narrow, prompt = None, None, None, None, ""
    if lw.precision in WEIGHT_FORMATS and activations is not None:
        # weight-only int8 (int4): B narrow panels with column (group) scales, A read in place
        # (gemm_w8.c, gemm_w4.c)
        a_operand = MatrixOperand(a_buf, 0 if a_count == 1 else m * k, k, 1)
        matrix = np.asarray(b_const, dtype=np.float32).reshape(k, n)
        precision, b_operand, scales, narrow = _weight_only(lw, b, matrix, WEIGHT_FORMATS[lw.precision])
        prompt = WEIGHT_FORMATS[lw.precision][3] if scales is not None else ""
    elif precision == "int8":
        a_operand = MatrixOperand(a_buf, 0 if a_count == 1 else m * k, k, 1)
        b_operand, quant = _int8_weights(
            lw, node, b, np.asarray(b_const, dtype=np.float32).reshape(b_count, k, n), a, rows=False
        )
    elif precision == "bf16":
        a_operand, b_operand = _bf16_operands(lw, a, b, a_count, b_count, m, k, n)
        if a_const is None and b_const is not None and b_count == 1:
            given = bf16_given(lw, a)
    else:
        a_operand, b_operand = _fp32_operands(lw, a, b, a_count, b_count, m, k, n)
    choice, source = lw.choice(node)
    lw.kernel_count += 1
    name = f"k{lw.kernel_count}"
    helper = None
    if epilogue is not None:
        flat_of = row_major_flat(m, n)

        def position_of(bt: Expr, i: Expr, j: Expr) -> list[Expr]:
            if rows != m:  # folded batch: row i is (batch element i / m, row i % m)
                return [*batch_position(Binary("/", i, i64(m)), batch_shape), Binary("%", i, i64(m)), j]
            return [*batch_position(bt, batch_shape), i, j]

        # (a weight-only product whose prompt rows run the bf16 or int8 kernels: their 32 x 32
        # blocks are where an epilogue's time goes; a decode step's row or two take the general loop)
        tile = _tile(prompt or precision)
        helper = epilogue_helper(lw, name, dst, position_of, flat_of, epilogue, None, tile=tile)
    finish = tile_finish(lw, epilogue, None, out_shape, None, len(out_shape) - 1) if helper is not None else None
    stmt = GemmSpec(
        batch, rows, n, k, a_operand, b_operand, dst, m * n, n, _blocking(precision, choice), helper, precision, quant,
        finish, narrow_store(lw, out, precision), given, scales, *(narrow or (None, 0)), prompt,
    )  # fmt: skip
    return [engine_kernel(name, "matmul", stmt, dst, node, 2 * batch * rows * n * k, source)]


def _fp32_operands(lw: Lowerer, a, b, a_count: int, b_count: int, m: int, k: int, n: int):  # type: ignore[no-untyped-def]
    """The float32 engine's operands: constant ones packed into the micro-tile's panels once
    (``pack_rows``, ``pack_cols``), the others read as strided matrices."""
    target, a_const, b_const = lw.target, lw.constant(a), lw.constant(b)
    a_operand: MatrixOperand | PackedOperand = MatrixOperand(lw.buffer(a), 0 if a_count == 1 else m * k, k, 1)
    b_operand: MatrixOperand | PackedOperand = MatrixOperand(lw.buffer(b), 0 if b_count == 1 else k * n, n, 1)
    if a_const is not None:
        rows = np.asarray(a_const, dtype=np.float32).reshape(a_count, m, k)
        a_operand = PackedOperand(
            lw.packed_constant(("rows", a, target.gemm_rows), lambda: pack_rows(rows, target.gemm_rows)),
            0 if a_count == 1 else -(-m // target.gemm_rows) * target.gemm_rows * k,
            target.gemm_rows,
        )
    if b_const is not None:
        cols = np.asarray(b_const, dtype=np.float32).reshape(b_count, k, n)
        b_operand = PackedOperand(
            lw.packed_constant(("cols", b, target.gemm_cols), lambda: pack_cols(cols, target.gemm_cols)),
            0 if b_count == 1 else -(-n // target.gemm_cols) * target.gemm_cols * k,
            target.gemm_cols,
        )
    return a_operand, b_operand


def _weight_only(lw: Lowerer, weights, matrix: np.ndarray, form: tuple[int, int, bool, bool]):  # type: ignore[no-untyped-def]
    """Weight-only int8 (int4): the [K, N] weights as narrow panels of the engine's columns and
    their per-column (per-group) scales (``pack_cols_int8``, ``pack_cols_int4``), each a constant
    of the plan, quantized once. Returns the engine path, B, its scales and, for int4, the
    offsets (None: symmetric) and the group."""
    cols, (bits, group, symmetric, _) = lw.target.gemm_cols, form
    made: list[tuple] = []

    def quantized() -> tuple:
        if not made:
            made.append(pack_cols_int8(matrix, cols) if bits == 8 else pack_cols_int4(matrix, cols, group, symmetric))
        return made[0]

    layout = f"w{bits}-cols"
    key = (layout, weights, cols, group, symmetric)
    packed = lw.packed_constant(key, lambda: quantized()[0])
    scales = lw.packed_constant((*key, "scales"), lambda: quantized()[1])
    if bits == 8:
        return "w8", PackedOperand(packed, 0, cols, layout), scales, None
    offsets = None if symmetric else lw.packed_constant((*key, "offsets"), lambda: quantized()[2])
    return "w4", PackedOperand(packed, 0, cols, layout), scales, (offsets, group)


def _precision_of(lw: Lowerer, node: Node, activations) -> str:  # type: ignore[no-untyped-def]
    """What this product computes in: the compile's precision, except int8 where the node has
    no calibrated activation range (or ``activations`` is None: no float input x constant
    weights) or is kept in fp32 (mixed precision), which then computes in fp32."""
    if activations is not None and "kiln_qdq" in node.attrs:
        return "int8"  # a pre-quantized (QDQ) model's product: int8 with the model's own quantization
    if lw.precision in WEIGHT_FORMATS:  # (its products are chosen by lower_matmul_gemm; the rest: fp32)
        return "fp32"
    if lw.precision != "int8":
        return lw.precision
    if activations is None or node.name in lw.keep_fp32 or range_key(node.attrs, activations) not in lw.ranges:
        return "fp32"
    return "int8"


def _channel_weights(node: Node, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[C, K] float weights as (int8 [C, K], scales [C]) per output channel: kiln's symmetric
    quantization, or a pre-quantized model's own scales (``kiln_qdq_weight_scale``), which give
    its int8 values back exactly."""
    given = node.attrs.get("kiln_qdq_weight_scale")
    if given is None:
        return quantize_channels(matrix)
    steps = np.asarray(given, np.float32)
    return np.clip(np.rint(matrix / steps[:, None]), -128, 127).astype(np.int8), steps


def _int8_weights(lw: Lowerer, node: Node, weights, matrices: np.ndarray, activations, rows: bool, pack: bool = True):  # type: ignore[no-untyped-def]
    """The int8 operand of the weights and the product's QuantSpec: ``matrices`` [count, K, N]
    (a MatMul's B: channel = column) or [1, C, K] (a convolution's A, ``rows``: channel = row),
    quantized per channel; the activations' per-tensor quantization from their calibrated range,
    or a pre-quantized model's own (``kiln_qdq``, ``kiln_qdq_weight_scale``: kiln.passes.quantized)."""
    given = node.attrs.get("kiln_qdq")
    if given is not None:
        scale, zero, qmax = float(given[0]), int(given[1]), 255
    else:
        lo, hi = lw.ranges[range_key(node.attrs, activations)]
        qmax = lw.target.int8_max
        scale, zero = activation_quantization(lo, hi, qmax)

    if rows:
        quantized, channel_scales = _channel_weights(node, matrices[0])  # [C, K]
        sums = quantized.astype(np.int64).sum(axis=1)
        operand = None  # (a direct convolution packs its weights itself: _direct_weights)
        if pack:
            packed = lw.packed_constant(("int8-rows", weights), lambda: pack_rows_int8(quantized[None]))
            operand = PackedOperand(packed, 0, BF16_BLOCK, "int8-rows")
    else:
        quantized_t, channel_scales = _channel_weights(node, matrices[0].T)  # [N, K]
        quantized = quantized_t.T
        sums = quantized_t.astype(np.int64).sum(axis=1)
        packed = lw.packed_constant(("int8-quads", weights), lambda: pack_quads_int8(quantized[None]))
        operand = PackedOperand(packed, 0, BF16_BLOCK, "int8-quads")
    scales = (channel_scales.astype(np.float64) * scale).astype(np.float32)
    offsets = (-zero * sums).astype(np.int32)
    key = (weights, activations.name, scale, zero)
    scale_buf = lw.packed_constant(("int8-scale", *key), lambda: scales)
    offset_buf = lw.packed_constant(("int8-offset", *key), lambda: offsets)
    inv = float(np.float32(1.0 / scale))
    stored = lw.quantized.get(activations)  # quantized already, as this product would, by their producer
    given = stored.dest if stored is not None and (stored.inv, stored.zero, stored.qmax) == (inv, zero, qmax) else None
    return operand, QuantSpec(scale_buf, offset_buf, rows, inv, zero, qmax, given)


def _direct_weights(lw: Lowerer, node: Node, w, weights: np.ndarray, x, precision: str, quant):  # type: ignore[no-untyped-def]
    """A direct convolution's weights (gemm_lowp.c): [OC, C, KH, KW] as B panels over the output
    channels with K = (tap, channel), each tap's channels padded to the format's k unit (int8 64,
    bf16 32); returns the operand and K. int8: quantized per output channel exactly as
    ``_int8_weights`` did for the same product (its QuantSpec applies unchanged)."""
    out_channels, channels, kernel_h, kernel_w = weights.shape
    unit = INT8_K if precision == "int8" else BF16_BLOCK
    padded = -(-channels // unit) * unit
    taps = kernel_h * kernel_w

    def by_tap(matrix: np.ndarray, dtype) -> np.ndarray:  # [OC, C*KH*KW] -> [1, taps * padded, OC]
        grid = np.zeros((taps, padded, out_channels), dtype=dtype)
        grid[:, :channels, :] = matrix.reshape(out_channels, channels, taps).transpose(2, 1, 0)
        return grid.reshape(1, taps * padded, out_channels)

    if precision == "int8":
        quantized, _ = _channel_weights(node, weights.reshape(out_channels, -1))
        packed = lw.packed_constant(("int8-taps", w), lambda: pack_quads_int8(by_tap(quantized, np.int8)))
        return PackedOperand(packed, 0, BF16_BLOCK, "int8-quads"), taps * padded
    packed = lw.packed_constant(
        ("bf16-taps", w), lambda: pack_pairs_bf16(by_tap(weights.reshape(out_channels, -1), np.float32))
    )
    return PackedOperand(packed, 0, BF16_BLOCK, "bf16-pairs"), taps * padded


def _blocking(precision: str, choice: dict) -> tuple[int, int, int]:
    """The tuned cache blocking: the float32 engine's (the tuner measures that path; the
    reduced-precision paths' blocks are their own defaults)."""
    return blocking(choice) if precision == "fp32" else (0, 0, 0)


def _tile(precision: str) -> tuple[int, int] | None:
    """The block the engine finishes at a time: the reduced-precision paths' 32 x 32, else the
    float micro-tile."""
    return (BF16_BLOCK, BF16_BLOCK) if precision not in ("fp32", "w8", "w4") else None


def _bf16_operands(lw: Lowerer, a, b, a_count: int, b_count: int, m: int, k: int, n: int):  # type: ignore[no-untyped-def]
    """A MatMul's operands for the bf16 path: constants packed as bf16 once (A as rows, B as
    k-pair panels), the others read as float32 and converted by the engine block by block."""
    target = lw.target
    a_const, b_const = lw.constant(a), lw.constant(b)
    padded_k = -(-k // BF16_BLOCK) * BF16_BLOCK
    a_operand: MatrixOperand | PackedOperand
    b_operand: MatrixOperand | PackedOperand
    if a_const is not None:
        matrices = np.asarray(a_const, dtype=np.float32).reshape(a_count, m, k)
        a_operand = PackedOperand(
            lw.packed_constant(("bf16-rows", a), lambda: pack_rows_bf16(matrices)),
            0 if a_count == 1 else -(-m // BF16_BLOCK) * BF16_BLOCK * padded_k,
            BF16_BLOCK,
            "bf16-rows",
        )
    else:
        a_operand = MatrixOperand(lw.buffer(a), 0 if a_count == 1 else m * k, k, 1)
    if b_const is not None:
        matrices = np.asarray(b_const, dtype=np.float32).reshape(b_count, k, n)
        b_operand = PackedOperand(
            lw.packed_constant(("bf16-pairs", b), lambda: pack_pairs_bf16(matrices)),
            0 if b_count == 1 else -(-n // BF16_BLOCK) * BF16_BLOCK * padded_k,
            BF16_BLOCK,
            "bf16-pairs",
        )
    else:
        b_operand = MatrixOperand(lw.buffer(b), 0 if b_count == 1 else k * n, n, 1)
    assert target.gemm_cols == BF16_BLOCK, "the bf16 path packs B in the avx512 engine's 32-column panels"
    return a_operand, b_operand


# -- Conv ------------------------------------------------------------------------------------------------


def lower_conv_gemm(lw: Lowerer, node: Node, epilogue: Epilogue | None = None) -> list[Kernel]:
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    assert x is not None and w is not None
    if "gemm" not in lw.target.engines:
        raise NotForEngine(f"target {lw.target.name} has no matrix-multiply engine")
    if any(v.type.dtype is not DType.FLOAT32 for v in (x, w)):  # type: ignore[union-attr]
        raise NotForEngine("the engine multiplies float32")
    if int(node.attrs.get("group", 1)) != 1:
        raise NotForEngine("grouped convolution")
    weights = lw.constant(w)
    if weights is None:
        raise NotForEngine("weights are not constant")
    x_shape, w_shape, out_shape = lw.shape(x), lw.shape(w), lw.shape(out)
    choice, source = lw.choice(node)  # algorithm and blocking (the tuning database: one lookup)
    precision = _precision_of(lw, node, x)
    bias_buf = lw.buffer(bias) if bias is not None else None
    geometry, window = _conv_geometry(node, x_shape, w_shape, out_shape)
    if window is not None:
        kernels = _winograd(lw, node, epilogue, (x_shape, w_shape, out_shape), window, bias_buf, precision, choice)
        if kernels is not None:
            for kernel in kernels:
                kernel.tuning = source
            return kernels
    channels, _, _, kernel_h, kernel_w = geometry[:5]
    out_channels = w_shape[0]
    pixels = size_product(out_shape[2:])
    reduction = channels * kernel_h * kernel_w
    if 0 in (pixels, reduction, out_channels):
        raise NotForEngine("empty convolution")
    _, dst = lw.buffer(x), lw.buffer(out)  # in this order: buffers are numbered as they are first used
    matrix = np.asarray(weights, dtype=np.float32).reshape(1, out_channels, reduction)
    a_operand, b_operand, reduction, quant, pointwise = _conv_operands(
        lw, node, (x, w), weights, matrix, precision, geometry, (x_shape, out_shape), reduction
    )
    lw.kernel_count += 1
    name = f"k{lw.kernel_count}"
    helper = None
    if epilogue is not None or bias_buf is not None:
        flat_of, position_of = conv_output_indexing(out_channels, out_shape)
        helper = epilogue_helper(lw, name, dst, position_of, flat_of, epilogue, bias_buf, tile=_tile(precision))
    finish = tile_finish(lw, epilogue, bias_buf, out_shape, 1, None) if helper is not None else None
    stmt = GemmSpec(
        x_shape[0],
        out_channels,
        pixels,
        reduction,
        a_operand,
        b_operand,
        dst,
        out_channels * pixels,
        pixels,
        _blocking(precision, choice),
        helper,
        precision,
        quant,
        finish,
        narrow_store(lw, out, precision),
    )
    kind = "conv1x1" if pointwise else "conv"
    flops = 2 * x_shape[0] * out_channels * pixels * channels * kernel_h * kernel_w
    return [engine_kernel(name, kind, stmt, dst, node, flops, source)]


def _conv_geometry(node: Node, x_shape, w_shape, out_shape):  # type: ignore[no-untyped-def]
    """The engine's convolution geometry (channels, height, width, kernel, strides, dilations,
    pads, output size), and the 2-D window (None for 1-D: no Winograd)."""
    if len(x_shape) == 3:
        (stride_w,), (dil_w,), (pad_l,) = conv_window(node, 1, x_shape[2:], out_shape[2:], w_shape[2:])
        return (x_shape[1], 1, x_shape[2], 1, w_shape[2], 1, stride_w, 1, dil_w, 0, pad_l, 1, out_shape[2]), None
    if len(x_shape) != 4:
        raise NotForEngine("3-D convolution")
    window = conv_window(node, 2, x_shape[2:], out_shape[2:], w_shape[2:])
    (stride_h, stride_w), (dil_h, dil_w), (pad_t, pad_l) = window
    geometry = (
        x_shape[1],
        x_shape[2],
        x_shape[3],
        w_shape[2],
        w_shape[3],
        stride_h,
        stride_w,
        dil_h,
        dil_w,
        pad_t,
        pad_l,
        out_shape[2],
        out_shape[3],
    )
    return geometry, window


def _winograd(lw: Lowerer, node: Node, epilogue, shapes, window, bias_buf, precision: str, choice: dict):  # type: ignore[no-untyped-def]
    """The Winograd kernels when the schedule, the precision and the shapes allow them, else None."""
    x_shape, w_shape, out_shape = shapes
    algorithm = choice.get("algorithm", "")
    if (
        algorithm == "im2col"
        or precision != "fp32"  # bf16, int8: im2col on their paths (Winograd's transforms are float32)
        or "winograd" in lw.disabled
        or "winograd" not in lw.target.engines
        or winograd.eligible(x_shape, w_shape, out_shape, window)
    ):
        return None
    (pad_t, pad_l) = window[2]
    geometry = {"x_shape": x_shape, "w_shape": w_shape, "out_shape": out_shape, "pads": (pad_t, pad_l)}
    tile = {"winograd4": 4, "winograd2": 2}.get(algorithm) or winograd.tile_size(out_shape)
    return winograd.lower_conv_winograd(lw, node, epilogue, geometry, bias_buf, tile, choice)


def _conv_operands(lw: Lowerer, node: Node, values, weights, matrix, precision: str, geometry, shapes, reduction: int):  # type: ignore[no-untyped-def]
    """The engine's A operand (the weights, packed for the precision's path) and B operand (X in
    place, as a matrix for a pointwise convolution, through im2col, or direct channels-last),
    with the reduction length, the int8 quantization and whether it is pointwise."""
    x, w = values
    x_shape, _ = shapes
    target = lw.target
    x_buf = lw.buffer(x)
    channels, height, width, kernel_h, kernel_w = geometry[:5]
    quant = None
    direct = (
        precision != "fp32"
        and len(x_shape) == 4
        and kernel_h * kernel_w <= DIRECT_MAX_TAPS
        and (kernel_h * kernel_w > 1 or geometry[5:7] != (1, 1))  # (a 1x1 of stride 1 is a plain product)
        and geometry[7:9] == (1, 1)  # dilation 1
        and channels >= DIRECT_MIN_CHANNELS
        and "direct" not in lw.disabled
    )
    if precision == "int8":
        a_operand, quant = _int8_weights(lw, node, w, matrix, x, rows=True, pack=not direct)
    elif precision == "bf16" and not direct:
        a_operand = PackedOperand(
            lw.packed_constant(("bf16-rows", w), lambda: pack_rows_bf16(matrix)), 0, BF16_BLOCK, "bf16-rows"
        )
    elif precision == "fp32":
        packed = lw.packed_constant(("rows", w, target.gemm_rows), lambda: pack_rows(matrix, target.gemm_rows))
        a_operand = PackedOperand(packed, 0, target.gemm_rows)
    pointwise = kernel_h == kernel_w == 1 and geometry[5:11] == (1, 1, 1, 1, 0, 0)
    image = channels * height * width
    b_operand: MatrixOperand | Im2colOperand | DirectOperand
    if direct:  # the weights as B panels in (tap, channel) order; X read in place, channels-last
        a_operand, reduction = _direct_weights(lw, node, w, np.asarray(weights, np.float32), x, precision, quant)
        b_operand = DirectOperand(x_buf, image, (*geometry[:5], *geometry[9:13], *geometry[5:7], 0))
    elif pointwise:  # 1x1, stride 1, no padding: X is already the [IC, H*W] matrix
        b_operand = MatrixOperand(x_buf, image, height * width, 1)
    else:
        b_operand = Im2colOperand(x_buf, image, tuple(int(g) for g in geometry))
    return a_operand, b_operand, reduction, quant, pointwise


def lower_conv_nhwc(lw: Lowerer, node: Node, epilogue: Epilogue | None = None) -> list[Kernel]:
    """kiln::ConvNHWC (a channels-last region's convolution, ``kiln.passes.layout``): the int8 and
    bf16 paths' direct convolution reading the NHWC input in place (int8: the bytes its producer
    stored quantized) and writing the NHWC output, (pixel, channel) the product's (row, column):
    the epilogue is indexed as a MatMul's, the bias an Add in it."""
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    assert x is not None and w is not None
    if "gemm" not in lw.target.engines:
        raise NotForEngine(f"target {lw.target.name} has no matrix-multiply engine")
    weights = lw.constant(w)
    precision = _precision_of(lw, node, x)
    if precision == "fp32" or weights is None:  # kiln.passes.layout makes it only where it is not
        raise CannotLower(f"{node.label}: a channels-last convolution runs on the int8 and bf16 paths only")
    (batch, height, width, channels), out_shape = lw.shape(x), lw.shape(out)
    out_channels, _, kernel_h, kernel_w = weights.shape
    _, out_h, out_w, _ = out_shape
    strides = tuple(int(v) for v in node.attrs.get("strides") or (1, 1))
    pads = tuple(int(v) for v in node.attrs.get("pads") or (0, 0, 0, 0))
    if tuple(node.attrs.get("dilations") or (1, 1)) != (1, 1) or kernel_h * kernel_w > DIRECT_MAX_TAPS:
        raise CannotLower(f"{node.label}: the direct convolution takes no dilation and at most {DIRECT_MAX_TAPS} taps")
    choice, source = lw.choice(node)
    x_buf, dst = lw.buffer(x), lw.buffer(out)
    quant = None
    if precision == "int8":
        matrix = np.asarray(weights, np.float32).reshape(1, out_channels, -1)
        _, quant = _int8_weights(lw, node, w, matrix, x, rows=True, pack=False)
    a_operand, reduction = _direct_weights(lw, node, w, np.asarray(weights, np.float32), x, precision, quant)
    geometry = (channels, height, width, kernel_h, kernel_w, pads[0], pads[1], out_h, out_w, *strides, 1)
    b_operand = DirectOperand(x_buf, height * width * channels, geometry)
    pixels = out_h * out_w
    lw.kernel_count += 1
    name = f"k{lw.kernel_count}"
    helper = None
    if epilogue is not None:
        flat_of = row_major_flat(pixels, out_channels)

        def position_of(bt: Expr, i: Expr, j: Expr) -> list[Expr]:
            return [bt, Binary("/", i, i64(out_w)), Binary("%", i, i64(out_w)), j]

        helper = epilogue_helper(lw, name, dst, position_of, flat_of, epilogue, None, tile=_tile(precision))
    finish = tile_finish(lw, epilogue, None, out_shape, None, 3) if epilogue is not None else None
    stmt = GemmSpec(
        batch, pixels, out_channels, reduction, a_operand, b_operand, dst, pixels * out_channels, out_channels,
        _blocking(precision, choice), helper, precision, quant, finish,
        narrow_store(lw, out, precision), bf16_given(lw, x) if precision == "bf16" else None,
    )  # fmt: skip
    flops = 2 * batch * out_channels * pixels * channels * kernel_h * kernel_w
    return [engine_kernel(name, "conv", stmt, dst, node, flops, source)]


# -- choosing ------------------------------------------------------------------------------------------


# the engine's rules: tried before the loop nests (``kiln.lower.families``), which take a node the
# engine refuses (NotForEngine)
ENGINE_LOWERINGS = {"MatMul": lower_matmul_gemm, "Conv": lower_conv_gemm, "kiln::ConvNHWC": lower_conv_nhwc}
