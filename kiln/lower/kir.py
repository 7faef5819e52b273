"""Kernel IR: loop nests over flat buffers, with affine index expressions.

A ``Kernel`` is the algorithm: loops (``For``), conditionals (``If``), scalar locals (``Let``,
``Assign``) and stores into buffers. How loops run (parallel across cores, vectorized, unrolled)
is a ``Schedule`` kept beside it and applied by the code generator to loops by name, so a
schedule can change speed but never results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.ir.types import DType

# -- expressions --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class Index:
    """A loop index (int64)."""

    name: str


@dataclass(frozen=True)
class Scalar:
    """A local scalar variable of ``dtype``."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class Load:
    buffer: Buffer
    index: Expr


# The kernel IR's operators: names of what they compute, not of any language's functions; each
# target renders them through its own table (the C renderer's picks kiln's vectorizable float32
# exp/tanh/erf, libm for the rest). Integer / and % truncate toward zero and are total: by zero
# they give 0 (as NumPy does), the most negative value by -1 wraps (x / -1 = -x, x % -1 = 0);
# renderers whose operators trap there (C: SIGFPE) guard them. Comparisons and && || give booleans.
# ``max`` and ``min`` follow np.maximum/np.minimum: a NaN in either operand is the result.
BINARY_OPS = frozenset(
    {
        "+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||", "&", "|", "^", "<<", ">>",
        "pow", "fmod", "max", "min",
    }
)  # fmt: skip
UNARY_OPS = frozenset(
    {
        "-", "!", "abs", "exp", "log", "sqrt", "tanh", "erf", "floor", "ceil",
        "round_even",  # to the nearest integer, halves to even (ONNX Round, NumPy rint)
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
        "bf16_to_f32",  # a bfloat16 value widened to float32 (exact)
    }
)  # fmt: skip
COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!=", "&&", "||"})


@dataclass(frozen=True)
class Binary:
    op: str  # one of BINARY_OPS
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"not a kernel-IR binary operator: {self.op!r}")


@dataclass(frozen=True)
class Unary:
    op: str  # one of UNARY_OPS
    a: Expr

    def __post_init__(self) -> None:
        if self.op not in UNARY_OPS:
            raise ValueError(f"not a kernel-IR unary operator: {self.op!r}")


@dataclass(frozen=True)
class Select:
    cond: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Cast:
    dtype: DType
    a: Expr


Expr = Const | Index | Scalar | Load | Binary | Unary | Select | Cast


def dtypes_of(root: Expr) -> dict[int, DType]:
    """The type of every node of ``root`` (by id), in one iterative walk (C's usual arithmetic
    conversions: a float operand makes the result float, the wider float wins; comparisons and
    logic give booleans)."""
    known: dict[int, DType] = {}
    for node in postorder(root):
        if isinstance(node, Const):
            found = node.dtype
        elif isinstance(node, Index):
            found = DType.INT64
        elif isinstance(node, Scalar):
            found = node.dtype
        elif isinstance(node, Load):
            found = node.buffer.dtype
        elif isinstance(node, Cast):
            found = node.dtype
        elif isinstance(node, Select):
            found = _wider(known[id(node.a)], known[id(node.b)])
        elif isinstance(node, Binary):
            found = DType.BOOL if node.op in COMPARISONS else _wider(known[id(node.a)], known[id(node.b)])
        else:  # Unary
            found = DType.BOOL if node.op == "!" else (DType.FLOAT32 if node.op == "bf16_to_f32" else known[id(node.a)])
        known[id(node)] = found
    return known


def _wider(a: DType, b: DType) -> DType:
    if a.is_float or b.is_float:
        floats = [t for t in (a, b) if t.is_float]
        return max(floats, key=lambda t: t.numpy.itemsize)
    return max((a, b), key=lambda t: t.numpy.itemsize)


def operands(e: Expr) -> tuple[Expr, ...]:
    """The subexpressions ``e`` reads directly."""
    if isinstance(e, Load):
        return (e.index,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, (Unary, Cast)):
        return (e.a,)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def postorder(root: Expr) -> list[Expr]:
    """Each distinct node of an expression once (by identity: lowering shares operands, so an
    expression is a DAG), operands before their users. Iterative: a chain of 10,000 fused ops is
    an expression 10,000 deep, and walking it as a tree would cost 2^depth where ops share."""
    order: list[Expr] = []
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(operands(node)))
    return order


def map_expr(root: Expr, change: Callable[[Expr], Expr]) -> Expr:
    """``root`` rebuilt bottom-up with ``change`` applied to every node (each distinct node once:
    shared operands stay shared); nodes ``change`` leaves alone keep their identity."""
    done: dict[int, Expr] = {}
    for original in postorder(root):
        kids = operands(original)
        new = [done[id(k)] for k in kids]
        node = original
        if any(n is not k for n, k in zip(new, kids)):
            if isinstance(node, Load):
                node = Load(node.buffer, new[0])
            elif isinstance(node, Binary):
                node = Binary(node.op, new[0], new[1])
            elif isinstance(node, (Unary, Cast)):
                node = Unary(node.op, new[0]) if isinstance(node, Unary) else Cast(node.dtype, new[0])
            elif isinstance(node, Select):
                node = Select(new[0], new[1], new[2])
        done[id(original)] = change(node)
    return done[id(root)]


def conditional_operands(e: Expr) -> tuple[Expr, ...]:
    """Operands evaluated only on some paths: a select's branches, the right side of && and ||."""
    if isinstance(e, Select):
        return (e.a, e.b)
    if isinstance(e, Binary) and e.op in ("&&", "||"):
        return (e.b,)
    return ()


def evaluated_always(root: Expr, order: list[Expr] | None = None) -> set[int]:
    """The nodes (by id) every evaluation of ``root`` evaluates: those reachable without passing
    through a select's branch or the right side of && and || (``order``: ``postorder(root)``)."""
    always = {id(root)}
    for node in reversed(order if order is not None else postorder(root)):  # users before operands
        if id(node) in always:
            skipped = {id(c) for c in conditional_operands(node)}
            always.update(id(c) for c in operands(node) if id(c) not in skipped)
    return always


MAX_NESTING = 16  # operators deep before a subexpression is bound to a name of its own


def shared_nodes(root: Expr) -> set[int]:
    """The nodes of ``root`` (by id) to compute once into a named temporary when it is written
    out: those used more than once and those nesting past MAX_NESTING (written as a tree, a DAG
    of n shared selects is 2^n long). Only nodes evaluated on every path qualify (a load under a
    select may be out of bounds on the path that does not take it), unless they hold no load and
    no division (safe to evaluate anywhere)."""
    order = postorder(root)
    uses: dict[int, int] = {}
    for node in order:
        for child in operands(node):
            uses[id(child)] = uses.get(id(child), 0) + 1
    always = evaluated_always(root, order)
    harmless: dict[int, bool] = {}
    height: dict[int, int] = {}
    bound: set[int] = set()
    for node in order:
        children = operands(node)
        harmless[id(node)] = (
            not isinstance(node, Load)
            and not (isinstance(node, Binary) and node.op in ("/", "%"))
            and all(harmless[id(c)] for c in children)
        )
        height[id(node)] = 1 + max((height[id(c)] for c in children), default=-1)
        wanted = children and node is not root and (uses.get(id(node), 0) > 1 or height[id(node)] >= MAX_NESTING)
        if wanted and (id(node) in always or harmless[id(node)]):
            bound.add(id(node))
            height[id(node)] = 0
    return bound


def add(a: Expr, b: Expr) -> Expr:
    """a + b, folding integer constants so index expressions stay small."""
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value, a.dtype)  # type: ignore[operator]
    return Binary("+", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value, a.dtype)  # type: ignore[operator]
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Const):
            if x.value == 0:
                return Const(0, DType.INT64)
            if x.value == 1:
                return y
    return Binary("*", a, b)


def i64(value: int) -> Const:
    return Const(int(value), DType.INT64)


def affine(terms: list[tuple[Expr, int]], offset: int = 0) -> Expr:
    """sum(index * stride) + offset."""
    expr: Expr = i64(offset)
    for index, stride in terms:
        if stride:
            expr = add(expr, mul(index, i64(stride)))
    return expr


# -- statements ---------------------------------------------------------------------------------------


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
    """A stride-1 convolution's input read in place by the reduced-precision paths' direct
    convolution (gemm_lowp.c): the NCHW images (image b at b*batch_stride) converted once into a
    padded channels-last copy whose rows, one per output pixel, are the product's A rows tap by tap
    (no im2col). ``geometry`` = (C, H, W, KH, KW, pad top, pad left, OH, OW); the product's A
    operand then holds the weights as B panels, K ordered (tap, channel padded to the k unit)."""

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
    precision: str = "fp32"  # "bf16": operands rounded to bfloat16, float32 sums (gemm_bf16.c); "int8"
    quant: QuantSpec | None = None  # int8's quantization (gemm_int8.c)


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
    """Winograd output transform: ``products`` [(tile+2)^2][out_channels][tiles] back to tiles of
    the NCHW ``dest`` [batch, out_channels, out_h, out_w], plus ``bias`` per channel, then
    ``epilogue`` per finished row of tiles."""

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


EngineCall = GemmSpec | WinogradInput | WinogradOutput | AttentionSpec
ENGINE_CALLS = (GemmSpec, WinogradInput, WinogradOutput, AttentionSpec)


def epilogue_of(call: EngineCall) -> Function | None:
    """The helper an engine call runs on its finished tiles (None: no epilogue)."""
    return None if isinstance(call, WinogradInput) else call.epilogue


def engine_buffers(call: EngineCall) -> list[Buffer]:
    """Every buffer an engine call reads or writes (its epilogue's excluded), in a fixed order."""
    if isinstance(call, GemmSpec):
        quant = [call.quant.scale, call.quant.offset] if call.quant is not None else []
        return [call.a.buffer, call.b.buffer, *quant, call.out]
    if isinstance(call, WinogradInput):
        return [call.source, call.dest]
    if isinstance(call, WinogradOutput):
        return [call.products, call.dest, *([call.bias] if call.bias is not None else [])]
    return [call.q.buffer, call.kt.buffer, call.v.buffer, call.out.buffer, call.scores]


Stmt = For | If | Let | Assign | Store | GemmSpec | WinogradInput | WinogradOutput | AttentionSpec


# -- buffers and kernels ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Buffer:
    """A flat array of ``size`` elements of ``dtype`` (identity is the buffer)."""

    name: str
    dtype: DType
    size: int

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.numpy.itemsize


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

    def visit(e: object) -> None:
        for node in postorder(e):  # type: ignore[arg-type]
            if isinstance(node, Load):
                found[node.buffer] = None

    def walk(stmts: list[Stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, For):
                for bound in (stmt.start, stmt.extent):
                    visit(bound)
                walk(stmt.body)
            elif isinstance(stmt, If):
                visit(stmt.cond)
                walk(stmt.body)
            elif isinstance(stmt, (Let, Assign)):
                visit(stmt.value)
            elif isinstance(stmt, Store):
                visit(stmt.index)
                visit(stmt.value)
                found[stmt.buffer] = None
            elif isinstance(stmt, ENGINE_CALLS):
                found.update((b, None) for b in engine_buffers(stmt))
                epilogue = epilogue_of(stmt)
                if epilogue is not None:
                    walk(epilogue.body)

    walk(body)
    return list(found)


def kernel_precision(kernel: Kernel) -> str:
    """What a kernel's matrix products compute in: ``bf16`` or ``int8`` when it calls the engine's
    reduced-precision paths, else ``fp32`` (every other kernel computes in its tensors' types)."""
    found: list[str] = []

    def find(body: list[Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (GemmSpec, AttentionSpec)) and stmt.precision != "fp32":
                found.append(stmt.precision)
            elif isinstance(stmt, (For, If)):
                find(stmt.body)

    find(kernel.body)
    return found[0] if found else "fp32"
