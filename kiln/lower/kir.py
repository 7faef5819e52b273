"""Kernel IR: loop nests over flat buffers, with affine index expressions.

A ``Kernel`` is the algorithm: loops (``For``), conditionals (``If``), scalar locals (``Let``,
``Assign``) and stores into buffers. How loops run (parallel across cores, vectorized, unrolled)
is a ``Schedule`` kept beside it and applied by the code generator to loops by name, so a
schedule can change speed but never results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.ir.types import DType
from kiln.lower.kir_expr import (  # the expressions, re-exported: kir is the kernel IR's one name
    BINARY_OPS as BINARY_OPS,
)
from kiln.lower.kir_expr import (
    COMPARISONS as COMPARISONS,
)
from kiln.lower.kir_expr import (
    MAX_NESTING as MAX_NESTING,
)
from kiln.lower.kir_expr import (
    UNARY_OPS as UNARY_OPS,
)
from kiln.lower.kir_expr import (
    Binary as Binary,
)
from kiln.lower.kir_expr import (
    Buffer as Buffer,
)
from kiln.lower.kir_expr import (
    Cast as Cast,
)
from kiln.lower.kir_expr import (
    Const as Const,
)
from kiln.lower.kir_expr import (
    Expr as Expr,
)
from kiln.lower.kir_expr import (
    Index as Index,
)
from kiln.lower.kir_expr import (
    Load as Load,
)
from kiln.lower.kir_expr import (
    Scalar as Scalar,
)
from kiln.lower.kir_expr import (
    Select as Select,
)
from kiln.lower.kir_expr import (
    Unary as Unary,
)
from kiln.lower.kir_expr import (
    add as add,
)
from kiln.lower.kir_expr import (
    affine as affine,
)
from kiln.lower.kir_expr import (
    conditional_operands as conditional_operands,
)
from kiln.lower.kir_expr import (
    dtypes_of as dtypes_of,
)
from kiln.lower.kir_expr import (
    evaluated_always as evaluated_always,
)
from kiln.lower.kir_expr import (
    i64 as i64,
)
from kiln.lower.kir_expr import (
    map_expr as map_expr,
)
from kiln.lower.kir_expr import (
    mul as mul,
)
from kiln.lower.kir_expr import (
    operands as operands,
)
from kiln.lower.kir_expr import (
    postorder as postorder,
)
from kiln.lower.kir_expr import (
    shared_nodes as shared_nodes,
)

# the run-time length a kernel's sizes may be expressions of (``Kernel.length`` says where it is read)
LENGTH = Scalar("kiln_len", DType.INT64)
# the run-time dims a kernel's sizes may be expressions of (``kiln.driver.spatial``): ``kiln_d<i>``
# is the model's i-th symbolic dim at this call (``Kernel.dims`` says where the vector is read)
DIM_PREFIX = "kiln_d"
# the plan's status word (table slot 0, outside memory planning): kernels that find bad data
# (an index out of range) store a code there, whatever their writes say
STATUS_NAME = "status"


def run_time_dim(index: int) -> Scalar:
    return Scalar(f"{DIM_PREFIX}{index}", DType.INT64)


def is_run_time_scalar(name: str) -> bool:
    """``kiln_len`` or a ``kiln_d<i>``: declared at the top of every function that reads it."""
    return name == LENGTH.name or (name.startswith(DIM_PREFIX) and name[len(DIM_PREFIX) :].isdigit())


@dataclass
class For:
    """``for index in [start, extent)``; bounds are usually constants, and may be scalars (the
    tile bounds a helper function receives)."""

    index: Index
    extent: int | Expr
    body: list[Stmt]
    start: int | Expr = 0


@dataclass
class If:
    cond: Expr
    body: list[Stmt]


@dataclass
class Let:
    scalar: Scalar
    value: Expr


@dataclass
class Assign:
    scalar: Scalar
    value: Expr


@dataclass
class Store:
    buffer: Buffer
    index: Expr
    value: Expr


# -- engine calls: typed descriptions of work a target's engine does (no C names, no C structs) ------


@dataclass(frozen=True, eq=False)
class MatrixOperand:
    """Batched matrices in a flat buffer: element [b][r][c] at b*batch_stride + r*row_stride +
    c*col_stride."""

    buffer: Buffer
    batch_stride: int
    row_stride: int
    col_stride: int = 1


@dataclass(frozen=True, eq=False)
class PackedOperand:
    """A constant operand re-laid out when the plan is built in the panels of the target's
    micro-tile: A as [batch][ceil(m/panel)][k][panel] (``engine.pack_rows``), B as
    [batch][ceil(n/panel)][k][panel] (``pack_cols``), zero padded; ``batch_stride`` elements
    between batch elements' panels (0: one matrix shared by the whole batch)."""

    buffer: Buffer
    batch_stride: int
    panel: int  # rows (A) or columns (B) per panel
    layout: str = "f32"  # or the bf16 path's: "bf16-rows" (engine.pack_rows_bf16), "bf16-pairs" (pack_pairs_bf16)


@dataclass(frozen=True, eq=False)
class Im2colOperand:
    """B as the im2col matrix of a batch of NCHW images, gathered by the engine block by block:
    ``geometry`` = (C, H, W, KH, KW, stride H, stride W, dilation H, dilation W, pad top, pad
    left, OH, OW); image b starts at b*batch_stride."""

    buffer: Buffer
    batch_stride: int
    geometry: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class DirectOperand:
    """A convolution's input read in place by the reduced-precision paths' direct convolution
    (gemm_lowp.c): the images (image b at b*batch_stride) converted once into a padded
    channels-last copy (split into stride phases) whose rows, one per output pixel, are the
    product's A rows tap by tap (no im2col). ``geometry`` = (C, H, W, KH, KW, pad top, pad left,
    OH, OW, stride h, stride w, channels last): with channels last (1) the input is NHWC and the
    product writes an NHWC output (rows = pixels, columns = output channels), else both are NCHW.
    The product's A operand holds the weights as B panels, K ordered (tap, channel padded to the
    k unit)."""

    buffer: Buffer
    batch_stride: int
    geometry: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class QuantSpec:
    """An int8 product's quantization (gemm_int8.c): the float activations are quantized as
    q = clamp(round(x * inv) + zero, 0, qmax); the int32 sums become float32 as
    (sum + offset[ch]) * scale[ch], channel = the output's row (``rows``: a convolution) or
    column (a MatMul)."""

    scale: Buffer  # float32 per channel
    offset: Buffer  # int32 per channel
    rows: bool
    inv: float
    zero: int
    qmax: int
    # the activations already quantized exactly so (uint8, the float operand's indexing) by the
    # product that computed them (its ``Requantize``): read instead of quantizing them again
    given: Buffer | None = None


@dataclass(frozen=True, eq=False)
class Requantize:
    """An int8 product's finished output (after its epilogue) also stored as the activations of
    the int8 products that read it: q = clamp(rint(x * inv) + zero, 0, qmax), NaN -> 0 (their
    ``QuantSpec``'s own formula and parameters, so they read ``dest`` instead of quantizing the
    float output again; ``dest`` is uint8 with the output's indexing). The next layer's
    activations leave the producer's finish as int8: no quantize pass of their own. ``bf16``: a
    bf16 product's output rounded to bfloat16 (to nearest even, the conversion its bf16 readers
    would do; ``dest`` uint16, ``inv``/``zero``/``qmax`` unused), read by them in place
    (``GemmSpec.given``)."""

    dest: Buffer
    inv: float
    zero: int
    qmax: int
    # the float output is read by nothing else (``kiln.lower.quantized_only``): the engine finishes
    # each tile in a scratch with the product's ``TileFinish`` and stores only these bytes
    only: bool = False
    bf16: bool = False


@dataclass(frozen=True)
class TileFinish:
    """A fused epilogue of the simplest kind, which the CPU engine applies to a tile's accumulators
    in registers instead of calling the ``epilogue`` helper (which computes the same, and is what
    every other consumer of the spec runs): + ``row`` (one value per output row: a convolution's
    bias), + ``col`` (per column: a linear layer's), then Relu (x < 0 ? 0 : x) and the bounds
    (x <= lo ? lo : x, then x >= hi ? hi : x) of a Clip."""

    row: Buffer | None = None
    col: Buffer | None = None
    relu: bool = False
    lo: float = float("-inf")
    hi: float = float("inf")


@dataclass
class GemmSpec:
    """``out[b] = A[b] . B[b]`` for b < batch (A: m x k, B: k x n) on the target's matrix-multiply
    engine; out is row-major (``ldc`` elements per row, ``out_batch_stride`` per batch element).
    ``blocking`` (mc, nc, kc) is the schedule's cache blocking (0: the engine's default);
    ``epilogue`` finishes each output tile (bias, the fused chain)."""

    batch: int
    m: int
    n: int
    k: int
    a: MatrixOperand | PackedOperand
    b: MatrixOperand | PackedOperand | Im2colOperand | DirectOperand
    out: Buffer
    out_batch_stride: int
    ldc: int
    blocking: tuple[int, int, int] = (0, 0, 0)
    epilogue: Function | None = None
    precision: str = "fp32"  # "bf16": operands rounded to bfloat16, float32 sums (gemm_bf16.c); "int8"; "w8"; "w4"
    quant: QuantSpec | None = None  # int8's quantization (gemm_int8.c)
    finish: TileFinish | None = None  # the epilogue, when this simple, in the engine's registers (fp32)
    requant: Requantize | None = None  # int8, bf16: the output also stored narrow for its readers
    # bf16: the activations (A of a MatMul, a channels-last convolution's input) rounded to bfloat16
    # already by their producer (its ``Requantize``, ``bf16``), read instead of converting them here
    given: Buffer | None = None
    # "w8" (weight-only int8, gemm_w8.c): B's per-column float32 scales (B is int8 panels, "w8-cols");
    # "w4" (weight-only int4, gemm_w4.c): B's per-group scales, ``offsets`` (None: symmetric) and
    # the k-steps of a ``group`` (B is words of eight 4-bit codes, "w4-cols")
    scales: Buffer | None = None
    offsets: Buffer | None = None
    group: int = 0
    # "w8", "w4": the format many rows run in: "bf16" (gemm_wbf16.c), "int8" (gemm_wa8.c), "" (float32)
    prompt: str = ""


@dataclass
class WinogradInput:
    """Winograd F(tile x tile, 3x3) input transform: every (tile+2)-square tile of the NCHW
    ``source`` [batch, channels, height, width] (zero padded by pad_top/pad_left) transformed into
    ``dest`` [(tile+2)^2][channels][batch * tiles_h * tiles_w]."""

    tile: int
    source: Buffer
    dest: Buffer
    batch: int
    channels: int
    height: int
    width: int
    pad_top: int
    pad_left: int
    tiles_h: int
    tiles_w: int


@dataclass
class WinogradOutput:
    """Winograd output transform: ``products`` [(tile+2)^2][out_channels][tiles] (``tile_major``:
    [(tile+2)^2][tiles][out_channels]) back to tiles of the NCHW ``dest`` [batch, out_channels,
    out_h, out_w], plus ``bias`` per channel, then ``epilogue`` per finished row of tiles."""

    tile: int
    products: Buffer
    dest: Buffer
    bias: Buffer | None
    batch: int
    out_channels: int
    out_h: int
    out_w: int
    tiles_h: int
    tiles_w: int
    epilogue: Function | None = None
    tile_major: bool = False


@dataclass(frozen=True, eq=False)
class AttentionOperand:
    """How one attention operand's slices sit in its buffer: slice s = (o, i) with o = s / inner,
    i = s % inner starts at o*outer_stride + i*inner_stride; its element [r][c] is at
    r*row_stride + c*col_stride (heads split and merged by strides, not copies)."""

    buffer: Buffer
    inner: int
    outer_stride: int
    inner_stride: int
    row_stride: int
    col_stride: int


@dataclass
class AttentionSpec:
    """``out = softmax(epilogue(Q . K^T)) . V`` for each of ``batch`` slices (Q: queries x depth,
    K^T: depth x keys, V: keys x width), the scores of a slice in ``threads`` per-thread blocks of
    ``scores`` (queries x keys each) and never written elsewhere."""

    batch: int
    queries: int
    keys: int
    depth: int
    width: int
    q: AttentionOperand
    kt: AttentionOperand
    v: AttentionOperand
    out: AttentionOperand
    scores: Buffer
    threads: int
    epilogue: Function | None = None
    safe: bool = False  # a row whose softmax is NaN (all scores -inf: fully masked) gives zeros
    precision: str = "fp32"  # "bf16": Q . K^T and P . V on the engine's bf16 path (softmax in float32)
    # fp32 with a weight format's "-bf16" or "-a8": a prompt's many query rows on the bf16 path
    # (where the CPU has one), a decode step's few as fp32 (kiln_gemm_wide_run, gemm_wbf16.c)
    wide: bool = False
    # per-thread blocks of GROUP_ROWS x keys scores: a decode step's slices that share K and V (a
    # grouped head's query heads) taken together, each key and value read once for all their rows
    rows: Buffer | None = None


GROUP_ROWS = 4  # rows a group of slices takes together (attention.c's KILN_ATTENTION_FEW)


EngineCall = GemmSpec | WinogradInput | WinogradOutput | AttentionSpec
ENGINE_CALLS = (GemmSpec, WinogradInput, WinogradOutput, AttentionSpec)


def epilogue_of(call: EngineCall) -> Function | None:
    """The helper an engine call runs on its finished tiles (None: no epilogue)."""
    return None if isinstance(call, WinogradInput) else call.epilogue


def engine_buffers(call: EngineCall) -> list[Buffer]:
    """Every buffer an engine call reads or writes (its epilogue's excluded), in a fixed order."""
    if isinstance(call, GemmSpec):
        quant = [call.quant.scale, call.quant.offset] if call.quant is not None else []
        if call.quant is not None and call.quant.given is not None:
            quant.append(call.quant.given)
        if call.given is not None:
            quant.append(call.given)
        quant += [b for b in (call.scales, call.offsets) if b is not None]
        finish = [b for b in (call.finish.row, call.finish.col) if b is not None] if call.finish else []
        requant = [call.requant.dest] if call.requant is not None else []
        return [call.a.buffer, call.b.buffer, *quant, *finish, call.out, *requant]
    if isinstance(call, WinogradInput):
        return [call.source, call.dest]
    if isinstance(call, WinogradOutput):
        return [call.products, call.dest, *([call.bias] if call.bias is not None else [])]
    rows = [call.rows] if call.rows is not None else []
    return [call.q.buffer, call.kt.buffer, call.v.buffer, call.out.buffer, call.scores, *rows]


Stmt = For | If | Let | Assign | Store | GemmSpec | WinogradInput | WinogradOutput | AttentionSpec


# -- buffers and kernels ------------------------------------------------------------------------------


@dataclass
class Schedule:
    """How a kernel's loops run, by loop index name. Never changes what is computed."""

    parallel: str | None = None  # spread this loop's iterations across cores
    vectorize: str | None = None  # SIMD across this loop's iterations
    unroll: dict[str, int] = field(default_factory=dict)
    simd: tuple[str, ...] = ()  # further loops whose iterations are independent (SIMD them too)
    # for targets with other hardware: loops bound to GPU grid axes ("block.x", "thread.x"...) and
    # loops an HLS target pipelines (initiation interval). A renderer ignores what its hardware
    # has no use for (the cpu target ignores both): a schedule never changes results.
    bind: dict[str, str] = field(default_factory=dict)
    pipeline: dict[str, int] = field(default_factory=dict)


@dataclass
class Function:
    """A helper an engine calls (an epilogue), at file scope: ``params`` are int64 scalars; the
    buffers it touches come from the segment's buffer table."""

    name: str
    params: list[Scalar]
    body: list[Stmt]
    buffers: list[Buffer]
    engine_block: Buffer | None = None  # this buffer is the engine's per-call block (its address comes from the engine)
    schedule: Schedule = field(default_factory=Schedule)  # how its loops run (by their index names)
    # its sizes are expressions of the run-time length ``kiln_len``: read from this buffer (a
    # scalar int64 input), at least the int (``kiln.driver.extents``)
    length: tuple[Buffer, int] | None = None
    dims: tuple[Buffer, tuple[int, ...]] | None = None  # as Kernel.dims


@dataclass
class Kernel:
    name: str
    kind: str  # pointwise | reduction | matmul | conv | pool | copy | normalize
    body: list[Stmt]
    reads: list[Buffer]
    writes: list[Buffer]
    sources: list[str]  # labels of the graph nodes it computes
    schedule: Schedule = field(default_factory=Schedule)
    flops: int = 0  # floating-point operations of a matrix product or convolution (for profiles)
    tuning: str = "default"  # where its schedule came from: default | tuned | cached
    length: tuple[Buffer, int] | None = None  # as Function.length: where ``kiln_len`` comes from
    # its sizes are expressions of run-time dims ``kiln_d<i>``: the int64 vector in this buffer (the
    # model's every symbolic dim at this call) and the indices it reads
    dims: tuple[Buffer, tuple[int, ...]] | None = None


def loops(body: list[Stmt]) -> list[For]:
    """Every loop in ``body``, outermost first."""
    found: list[For] = []
    for stmt in body:
        if isinstance(stmt, For):
            found.append(stmt)
            found.extend(loops(stmt.body))
        elif isinstance(stmt, If):
            found.extend(loops(stmt.body))
    return found


def buffers_in(body: list[Stmt]) -> list[Buffer]:
    """Every buffer ``body`` loads or stores (including through gemm calls and their helpers), in
    order of first use."""
    found: dict[Buffer, None] = {}
    seen: set[int] = set()  # expressions walked (shared operands once: a fused chain is a DAG)

    def visit(e: object) -> None:
        # postorder's order (operands first), loads only, without building the whole order
        stack: list[tuple[Any, bool]] = [(e, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                found[node.buffer] = None
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, Load):
                stack.append((node, True))
            stack.extend((child, False) for child in reversed(operands(node)))

    def engine(call: Any) -> None:
        found.update((b, None) for b in engine_buffers(call))
        epilogue = epilogue_of(call)
        if epilogue is not None:
            walk_statements(epilogue.body, visit, lambda s: found.update({s.buffer: None}), engine)

    walk_statements(body, visit, lambda s: found.update({s.buffer: None}), engine)
    return list(found)


def walk_statements(body: list[Stmt], visit: Any, stored: Any = None, engine: Any = None) -> None:
    """Every expression of ``body`` in statement order to ``visit`` (loop bounds that are
    expressions, conditions, values, store indices and values), each Store to ``stored`` after
    its expressions, each engine call to ``engine``."""
    for stmt in body:
        if isinstance(stmt, For):
            for bound in (stmt.start, stmt.extent):
                if not isinstance(bound, int):
                    visit(bound)
            walk_statements(stmt.body, visit, stored, engine)
        elif isinstance(stmt, If):
            visit(stmt.cond)
            walk_statements(stmt.body, visit, stored, engine)
        elif isinstance(stmt, (Let, Assign)):
            visit(stmt.value)
        elif isinstance(stmt, Store):
            visit(stmt.index)
            visit(stmt.value)
            if stored is not None:
                stored(stmt)
        elif isinstance(stmt, ENGINE_CALLS) and engine is not None:
            engine(stmt)


def engine_calls(kernel: Kernel) -> list[GemmSpec | AttentionSpec]:
    """The engine calls (matrix products, attention) in a kernel's body, in order: the engine
    parallelizes them itself."""
    found: list[GemmSpec | AttentionSpec] = []

    def find(body: list[Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (GemmSpec, AttentionSpec)):
                found.append(stmt)
            elif isinstance(stmt, (For, If)):
                find(stmt.body)

    find(kernel.body)
    return found


def kernel_precision(kernel: Kernel) -> str:
    """What a kernel's matrix products compute in: ``bf16``, ``int8``, ``w8`` or ``w4`` when it calls the engine's
    reduced-precision paths, else ``fp32`` (every other kernel computes in its tensors' types)."""
    found = [call.precision for call in engine_calls(kernel) if call.precision != "fp32"]
    return found[0] if found else "fp32"
