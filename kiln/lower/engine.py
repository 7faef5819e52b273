"""What every lowering onto an engine shares (the matrix-multiply engine, Winograd, attention):
operand packing, the epilogue helper a finished tile runs, the fused chain composed around an
anchor, and the output coordinates an epilogue sees. Engines themselves are the targets'."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kiln.ir.graph import Node, Value
from kiln.ir.sized import size_product
from kiln.ir.types import DType
from kiln.lower.kir import (
    Binary,
    Buffer,
    Expr,
    For,
    Function,
    GemmSpec,
    If,
    Index,
    Kernel,
    Load,
    Scalar,
    Schedule,
    Stmt,
    Store,
    TileFinish,
    Unary,
    add,
    buffers_in,
    i64,
)
from kiln.lower.lowering import Lowerer, broadcast_index, scalar_immediate, scalarize_for, strides

I64 = DType.INT64
BLOCKING = ("mc", "nc", "kc")  # what a tuned schedule of an engine product may set


def blocking(choice: dict) -> tuple[int, int, int]:
    """A schedule's cache blocking for the matrix-multiply engine (0: the engine's default)."""
    return tuple(int(choice.get(name, 0) or 0) for name in BLOCKING)  # type: ignore[return-value]


Epilogue = Callable[[list[Expr], Expr, Expr], Expr]  # (output position, value, flat output index) -> final value


class NotForEngine(Exception):
    """This node keeps the loop-nest lowering (the reason says why)."""


def pack_rows(matrices: np.ndarray, rows: int) -> np.ndarray:
    """[B, M, K] -> panels of ``rows`` rows, k-major: [B, ceil(M/rows), K, rows], zero padded."""
    batch, m, k = matrices.shape
    padded = -(-m // rows) * rows
    full = matrices
    if padded != m:  # (no padding copy when the rows divide: the caller's aligned copy is the one copy)
        full = np.zeros((batch, padded, k), dtype=np.float32)
        full[:, :m] = matrices
    return full.reshape(batch, padded // rows, rows, k).transpose(0, 1, 3, 2)


def pack_cols(matrices: np.ndarray, cols: int) -> np.ndarray:
    """[B, K, N] -> panels of ``cols`` columns: [B, ceil(N/cols), K, cols], zero padded."""
    batch, k, n = matrices.shape
    padded = -(-n // cols) * cols
    full = matrices
    if padded != n:
        full = np.zeros((batch, k, padded), dtype=np.float32)
        full[:, :, :n] = matrices
    return full.reshape(batch, k, padded // cols, cols).transpose(0, 2, 1, 3)


def pack_cols_int8(matrix: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] float32 weights -> (int8 panels [ceil(N/cols), K, cols], zero padded; float32 scales
    [N]): each column symmetric, its largest magnitude mapped to 127 (``quantize_channels``), the
    weight-only int8 path's B (gemm_w8.c). Quantized a block of panels at a time: the float
    temporaries stay a block's, not the matrix's (a 151,936-token head is 545 MB of float32)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    k, n = matrix.shape
    panels = -(-n // cols)
    packed = np.zeros((panels, k, cols), np.int8)
    scales = np.empty(n, np.float32)
    step = max(1, (1 << 22) // max(1, k * cols))  # panels per block: ~16 MB of float32 temporaries
    for first in range(0, panels, step):
        lo, hi = first * cols, min(n, (first + step) * cols)
        quantized_t, scales[lo:hi] = quantize_channels(matrix[:, lo:hi].T)  # [hi - lo, K]
        block = np.zeros((k, -(-(hi - lo) // cols) * cols), np.int8)
        block[:, : hi - lo] = quantized_t.T
        packed[first : first + block.shape[1] // cols] = block.reshape(k, -1, cols).transpose(1, 0, 2)
    return packed, scales


# the weight-only precisions: the constant weights of matrix products narrow, activations and
# sums float32 (no calibration: what a memory-bound decode step reads is weights) -> (bits, k-steps
# per group (0: one scale per column), symmetric, the format of a prompt's rows: "" (float32),
# "bf16" or "int8"). int4 groups of 32 by default (llama.cpp's Q4_0, ONNX Runtime GenAI's builder),
# 128 the coarser choice; "-asym": a float offset per group too. A prompt's rows (a product of many
# rows: compute-bound), a decode step's few rows as without a suffix: "-bf16": the weights widened
# to bfloat16, the activations rounded to it, float32 sums (gemm_wbf16.c, the bf16 path's kernels:
# AVX512_BF16 or AMX); "-a8": the activations quantized to int8 per row as the product runs (the
# row's range, no calibration), the weights widened to int8 per column, exact int32 sums
# (gemm_wa8.c, the int8 path's kernels: AVX512-VNNI, AVX-VNNI or AMX-INT8)
_FORMATS = {
    "int8-weights": (8, 0, True),
    "int4-weights": (4, 32, True),
    "int4-weights-asym": (4, 32, False),
    "int4-weights-g128": (4, 128, True),
    "int4-weights-g128-asym": (4, 128, False),
}
PROMPT_SUFFIXES = {"": "", "-bf16": "bf16", "-a8": "int8"}
WEIGHT_FORMATS = {
    f"{name}{suffix}": (*form, prompt) for suffix, prompt in PROMPT_SUFFIXES.items() for name, form in _FORMATS.items()
}
W4_CHUNK = 8  # the int4 path's k-steps per 32-bit word: one nibble each (gemm_w4.c)
HALF_MAX = 65504.0  # the largest float16: int4 scales are stored as float16


def quantize_groups(matrix: np.ndarray, group: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[K, N] float32 weights -> 4-bit codes per group of ``group`` consecutive k of each column
    (uint8 [Kp, N], Kp = K rounded up to the group; the padding encodes 0), float32 scales and
    offsets [Kp / group, N] with weight = code * scale + offset. Symmetric: the group's
    largest-magnitude value v gives scale = v / -8 and offset = -8 * scale (codes 0..15 around
    8), as llama.cpp's Q4_0 and ONNX's symmetric MatMulNBits; asymmetric: scale = (max - min) / 15
    and offset = min (Q4_1's). Scales are rounded to float16 (stored so: llama.cpp's Q4_0 does
    too; 4.5 bits a weight at groups of 32, not 5), within its range, before the codes are made
    from them; offsets stay float32."""
    matrix = np.asarray(matrix, dtype=np.float32)
    k, n = matrix.shape
    padded = -(-k // group) * group
    full = np.zeros((padded, n), np.float32)
    full[:k] = matrix
    blocks = full.reshape(padded // group, group, n)
    if symmetric:
        picked = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None, :], axis=1)[:, 0, :]
        scales = _half(picked / -8.0)
        offsets = -8.0 * scales
    else:
        low, high = blocks.min(axis=1), blocks.max(axis=1)
        scales, offsets = _half((high - low) / 15.0), low
    safe = np.where(scales == 0, 1.0, scales)[:, None, :]
    codes = np.rint((blocks - offsets[:, None, :]) / safe)
    codes = np.clip(np.where(scales[:, None, :] == 0, 8 if symmetric else 0, codes), 0, 15)  # (a constant group)
    return codes.astype(np.uint8).reshape(padded, n), scales.astype(np.float32), offsets.astype(np.float32)


def _half(scales: np.ndarray) -> np.ndarray:
    """Scales rounded to float16 (within its range), as float32."""
    return np.clip(scales, -HALF_MAX, HALF_MAX).astype(np.float16).astype(np.float32)


def pack_cols_int4(matrix: np.ndarray, cols: int, group: int, symmetric: bool):  # type: ignore[no-untyped-def]
    """[K, N] float32 weights -> the int4 path's B (gemm_w4.c): 32-bit words [ceil(N/cols),
    Kp/8, cols] holding eight k-steps of a column (k-step t in bits 4t..4t+3), float16 scales (as
    their uint16 bits) and float32 offsets [ceil(N/cols), Kp/group, cols] (``quantize_groups``;
    padded columns 0). Offsets are None when symmetric (the engine takes -8 x scale). Quantized a
    block of panels at a time: the float temporaries stay a block's."""
    matrix = np.asarray(matrix, dtype=np.float32)
    k, n = matrix.shape
    padded, panels = -(-k // group) * group, -(-n // cols)
    words = np.zeros((panels, padded // W4_CHUNK, cols), np.uint32)
    scales = np.zeros((panels, padded // group, cols), np.float32)
    offsets = np.zeros_like(scales)
    step = max(1, (1 << 22) // max(1, k * cols))  # panels per block: ~16 MB of float32 temporaries
    for first in range(0, panels, step):
        lo, hi = first * cols, min(n, (first + step) * cols)
        codes, s, o = quantize_groups(matrix[:, lo:hi], group, symmetric)
        width = -(-(hi - lo) // cols) * cols
        grid = np.zeros((padded // W4_CHUNK, W4_CHUNK, width), np.uint32)
        grid.reshape(padded, width)[:, : hi - lo] = codes
        packed = np.zeros((padded // W4_CHUNK, width), np.uint32)
        for t in range(W4_CHUNK):
            packed |= grid[:, t, :] << np.uint32(4 * t)
        count = width // cols
        words[first : first + count] = packed.reshape(-1, count, cols).transpose(1, 0, 2)
        for source, dest in ((s, scales), (o, offsets)):
            block = np.zeros((source.shape[0], width), np.float32)
            block[:, : hi - lo] = source
            dest[first : first + count] = block.reshape(-1, count, cols).transpose(1, 0, 2)
    return words, scales.astype(np.float16).view(np.uint16), None if symmetric else offsets


BF16_BLOCK = 32  # the bf16 path's block (gemm_bf16.c): rows of A and columns of a B panel; K padded to it


def _bf16_bits(array: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even as the engine's
    own conversion (gemm_bf16.c: kiln_bf16_round and VCVTNEPS2BF16) rounds."""
    import ml_dtypes

    return np.asarray(array, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def pack_rows_bf16(matrices: np.ndarray) -> np.ndarray:
    """[B, M, K] float32 -> bf16 rows [B, Mp, Kp] (uint16 bits), Mp and Kp rounded up to the
    bf16 block, zero padded: the constant A of the bf16 path."""
    batch, m, k = matrices.shape
    size = BF16_BLOCK
    out = np.zeros((batch, -(-m // size) * size, -(-k // size) * size), dtype=np.uint16)
    out[:, :m, :k] = _bf16_bits(matrices)
    return out


def pack_pairs_bf16(matrices: np.ndarray) -> np.ndarray:
    """[B, K, N] float32 -> bf16 k-pair panels [B, Np/32, Kp/2, 32, 2] (uint16 bits), zero
    padded: element (k, j) of panel p at [p, k // 2, j % 32, k % 2] with j = 32p + j % 32. The
    layout of the AMX tile unit's B operand and of the AVX-512-BF16 dot products."""
    batch, k, n = matrices.shape
    size = BF16_BLOCK
    kp, np_ = -(-k // size) * size, -(-n // size) * size
    full = np.zeros((batch, kp, np_), dtype=np.uint16)
    full[:, :k, :n] = _bf16_bits(matrices)
    return np.ascontiguousarray(full.reshape(batch, kp // 2, 2, np_ // size, size).transpose(0, 3, 1, 4, 2))


INT8_K = 64  # the int8 path's k unit (gemm_int8.c: an AMX-INT8 A tile row holds 64 k)


def quantize_channels(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[C, K] float32 -> (int8 [C, K] in [-127, 127], float32 scales [C]): each channel (row)
    symmetric, its largest magnitude mapped to 127 (an all-zero channel gets scale 1)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    largest = np.abs(matrix).max(axis=1) if matrix.size else np.zeros(matrix.shape[0], np.float32)
    scales = np.where(largest > 0, largest / 127.0, 1.0).astype(np.float32)
    quantized = np.clip(np.rint(matrix / scales[:, None]), -127, 127).astype(np.int8)
    return quantized, scales


def activation_quantization(lo: float, hi: float, qmax: int) -> tuple[float, int]:
    """(scale, zero point) of per-tensor unsigned activations in [0, qmax] covering [lo, hi]
    (widened to include 0, so zero padding is exact: it quantizes to the zero point)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not np.isfinite(lo) or not np.isfinite(hi) or hi <= lo:
        return 1.0, 0
    scale = float(np.float32((hi - lo) / qmax))
    zero = int(min(max(round(-lo / scale), 0), qmax))
    return scale, zero


def pack_rows_int8(matrices: np.ndarray) -> np.ndarray:
    """[B, M, K] int8 -> rows [B, Mp, Kp], Mp a multiple of 32, Kp of 64, zero padded."""
    batch, m, k = matrices.shape
    out = np.zeros((batch, -(-m // BF16_BLOCK) * BF16_BLOCK, -(-k // INT8_K) * INT8_K), dtype=np.int8)
    out[:, :m, :k] = matrices
    return out


def pack_quads_int8(matrices: np.ndarray) -> np.ndarray:
    """[B, K, N] int8 -> k-quad panels [B, Np/32, Kp/4, 32, 4], zero padded: element (k, j) of
    panel p at [p, k // 4, j % 32, k % 4]; the VNNI and AMX-INT8 B operand layout."""
    batch, k, n = matrices.shape
    kp, np_ = -(-k // INT8_K) * INT8_K, -(-n // BF16_BLOCK) * BF16_BLOCK
    full = np.zeros((batch, kp, np_), dtype=np.int8)
    full[:, :k, :n] = matrices
    return np.ascontiguousarray(full.reshape(batch, kp // 4, 4, np_ // BF16_BLOCK, BF16_BLOCK).transpose(0, 3, 1, 4, 2))


def epilogue_helper(
    lw: Lowerer,
    kernel_name: str,
    dst: Buffer,
    position_of,
    flat_of,
    epilogue: Epilogue | None,
    bias: Buffer | None,  # type: ignore[no-untyped-def]
    engine_block: bool = False,
    tile: tuple[int, int] | None = None,
) -> Function:
    """``static void <name>(g, bt, i0, i1, j0, j1)``: finishes rows [i0, i1) x columns [j0, j1)
    of batch element ``bt`` of the output: bias, then the fused chain. ``tile``: the engine's
    whole tile (rows, columns), unrolled and vectorized (default: the target's micro-tile)."""
    bt, i0, i1, j0, j1 = (Scalar(name, I64) for name in ("bt", "i0", "i1", "j0", "j1"))

    def finish(row: Expr, col: Expr) -> Stmt:
        flat = flat_of(bt, row, col)
        value: Expr = Load(dst, flat)
        if bias is not None:
            value = Binary("+", value, Load(bias, row))
        if epilogue is not None:
            value = epilogue(position_of(bt, row, col), value, flat)
        return Store(dst, flat, value)

    # a whole micro-tile (the common case) with constant trip counts: unrolled and vectorized
    # while the tile is in L1; edge tiles take the general loops
    target = lw.target
    r, c = Index("r"), Index("c")
    i, j = Index("i"), Index("j")
    tile_rows, tile_cols = tile or (target.gemm_rows, target.gemm_cols)
    whole = Binary(
        "&&",
        Binary("==", Binary("-", i1, i0), i64(tile_rows)),
        Binary("==", Binary("-", j1, j0), i64(tile_cols)),
    )
    body: list[Stmt] = [
        If(whole, [For(r, tile_rows, [For(c, tile_cols, [finish(add(i0, r), add(j0, c))])])]),
        If(Unary("!", whole), [For(i, i1, [For(j, j1, [finish(i, j)], start=j0)], start=i0)]),
    ]
    # a tile row's inner loops ("c" of a whole micro-tile, "j" of an edge tile) touch one element
    # per iteration: vectorized even when the epilogue reads scalars from buffers a compiler cannot
    # prove unaliased (GELU's constants); the attention engine runs its scores block through "j"
    schedule = Schedule(vectorize=c.name, simd=(j.name,))
    return Function(
        f"kiln_{kernel_name}_epilogue",
        [bt, i0, i1, j0, j1],
        body,
        buffers_in(body),
        dst if engine_block else None,
        schedule,
    )


def batch_position(bt: Expr, shape: tuple[int, ...]) -> list[Expr]:
    """The indices of flat batch element ``bt`` over ``shape`` (row-major)."""
    position: list[Expr] = []
    for axis, stride in enumerate(strides(shape)):
        index: Expr = Binary("/", bt, i64(stride)) if stride != 1 else bt
        position.append(Binary("%", index, i64(shape[axis])) if axis else index)
    return position


def engine_kernel(name: str, kind: str, stmt: GemmSpec, dst: Buffer, node: Node, flops: int, source: str) -> Kernel:
    """A kernel that is one call into the engine: it writes ``dst`` (and the quantized copy of an
    int8 product's ``Requantize``) and reads every other buffer the call names."""
    writes = [dst] if stmt.requant is None else [dst, stmt.requant.dest]
    reads = [b for b in buffers_in([stmt]) if b not in writes]
    return Kernel(name, kind, [stmt], reads, writes, [node.label], flops=flops, tuning=source)


def row_major_flat(rows: int, cols: int):  # type: ignore[no-untyped-def]
    """``flat_of`` for an output of ``rows`` x ``cols`` per batch element, row-major: the engine's
    (batch, row, column) as a flat index (a MatMul's, a channels-last convolution's)."""

    def flat_of(bt: Expr, i: Expr, j: Expr) -> Expr:
        return add(add(Binary("*", bt, i64(rows * cols)), Binary("*", i, i64(cols))), j)

    return flat_of


def conv_output_indexing(out_channels: int, out_shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """(flat_of, position_of) for a convolution output viewed as [image][channel][pixel]: the
    engine's (batch, row, column) coordinates of an epilogue."""
    pixels = size_product(out_shape[2:])
    out_w = out_shape[-1]

    def position_of(bt: Expr, i: Expr, j: Expr) -> list[Expr]:
        if len(out_shape) == 3:
            return [bt, i, j]
        return [bt, i, Binary("/", j, i64(out_w)), Binary("%", j, i64(out_w))]

    return row_major_flat(out_channels, pixels), position_of


@dataclass
class ComposedChain:
    """``compose_chain``'s result: an ``Epilogue`` (call it), and the chain it composes, which an
    engine may recognize as one it runs its own way (``tile_finish``)."""

    compose: Callable[[list[Expr], Expr | None, Expr | None], Expr]
    chain: list[Node]
    bindings: dict[Value, Value]
    start: Value | None

    def __call__(self, position: list[Expr], value: Expr | None, flat: Expr | None = None) -> Expr:
        return self.compose(position, value, flat)


def tile_finish(
    lw: Lowerer, epilogue: Epilogue | None, row_bias: Buffer | None, out_shape: tuple[int, ...], row_axis: int | None,
    col_axis: int | None,
) -> TileFinish | None:  # fmt: skip
    """The epilogue as a ``TileFinish`` the engine applies in registers, when it is that simple:
    ``row_bias`` (a convolution's own bias), then at most one Add of a constant varying along the
    output's ``row_axis`` or ``col_axis`` only, then at most a Relu or a Clip with constant bounds.
    None for anything else (the helper then runs it)."""
    if epilogue is not None and not isinstance(epilogue, ComposedChain):
        return None
    chain = list(epilogue.chain) if epilogue is not None else []
    current = epilogue.start if epilogue is not None else None
    row, col, relu, lo, hi = row_bias, None, False, float("-inf"), float("inf")
    if chain and chain[0].op == "Add" and not chain[0].domain and current in chain[0].inputs:
        node = chain.pop(0)
        others = [v for v in node.inputs if v is not current]
        array = lw.constant(epilogue.bindings[others[0]]) if len(others) == 1 and epilogue is not None else None
        if array is None or array.dtype != np.float32 or array.ndim > len(out_shape):
            return None
        expanded = array.reshape((1,) * (len(out_shape) - array.ndim) + array.shape)
        varying = [axis for axis, size in enumerate(expanded.shape) if size != 1]
        if len(varying) != 1 or expanded.shape[varying[0]] != out_shape[varying[0]]:
            return None
        vector = lw.buffer(epilogue.bindings[others[0]])  # one axis varies: its values are the buffer, in order
        if varying[0] == row_axis and row is None:
            row = vector
        elif varying[0] == col_axis:
            col = vector
        else:
            return None
        current = node.outputs[0]
    if chain and not chain[0].domain and chain[0].inputs[0] is current and chain[0].op in ("Relu", "Clip"):
        node = chain.pop(0)
        relu = node.op == "Relu"
        bounds = [lw.constant(epilogue.bindings[v]) if v is not None else None for v in node.inputs[1:]]  # type: ignore[union-attr]
        if any(b is not None and (b.size != 1 or np.isnan(b).any()) for b in bounds):
            return None
        if any(v is not None and b is None for v, b in zip(node.inputs[1:], bounds)):
            return None  # a bound computed at run time
        if len(bounds) > 0 and bounds[0] is not None:
            lo = float(bounds[0].reshape(-1)[0])
        if len(bounds) > 1 and bounds[1] is not None:
            hi = float(bounds[1].reshape(-1)[0])
    if chain or (row is None and col is None and not relu and lo == float("-inf") and hi == float("inf")):
        return None
    return TileFinish(row, col, relu, lo, hi)


def compose_chain(
    lw: Lowerer, chain: list[Node], bindings: dict[Value, Value], out_shape: tuple[int, ...], start: Value | None
) -> ComposedChain:
    """The composed expression of ``chain`` at an output position (``flat``: the same position as a
    flat index, which operands of the output's own shape use directly); ``start`` (the anchor's
    output, if any) takes the value passed in."""

    def compose(position: list[Expr], value: Expr | None, flat: Expr | None = None) -> Expr:
        computed: dict[Value, Expr] = {}
        if start is not None and value is not None:
            computed[start] = value

        def operand(v: Value) -> Expr:
            if v in computed:
                return computed[v]
            actual = bindings[v]
            immediate = scalar_immediate(lw, actual)
            if immediate is not None:
                # a scalar constant (a scale, a Clip bound, GELU's sqrt(2)) is an immediate: no load
                # per element, and the scalar rules (x / c as a product) can see it
                return immediate
            buffer = lw.buffer(actual)
            if buffer.size == 1:
                return Load(buffer, i64(0))
            if flat is not None and lw.shape(actual) == out_shape:
                return Load(buffer, flat)
            return Load(buffer, broadcast_index(lw.shape(actual), out_shape, position))  # type: ignore[arg-type]

        result: Expr | None = value
        for node in chain:
            dtypes = [v.type.dtype for v in node.inputs if v is not None]  # type: ignore[union-attr]
            scalarize = scalarize_for(node, dtypes, lw.target.float_to_int)
            result = scalarize([None if v is None else operand(v) for v in node.inputs])  # type: ignore[arg-type]
            computed[node.outputs[0]] = result
        assert result is not None
        return result

    return ComposedChain(compose, list(chain), bindings, start)
