"""Kernel IR -> Triton: the ``gpu`` target's renderer (expressions, statements, loop nests; the
engine calls' kernels are ``engines.py``, the module that holds them all ``module.py``).

Every kernel becomes one or more ``@triton.jit`` functions and a launch each, in one Python module
(its text is the target's "source"; ``LAUNCHES`` at its end says, per segment, which function runs
on which grid with which buffers and block sizes):

* a loop nest: its outermost loops that ``lanes.lane_depth`` proves independent become lanes
  (``BLOCK`` iterations per program, ``tl.arange``), everything inside runs in order per lane with
  lane-shaped values; conditionals become masks (a load under a false condition or an unused select
  branch is masked off, so no lane reads out of bounds), loads and stores are masked by the lanes
  that exist. A nest with nothing provably independent runs in one sequential program.
* a matrix product or convolution (``GemmSpec``): a tiled ``tl.dot`` kernel whose operands are read
  through their layouts (row-major, the CPU engine's packed panels, or a convolution's input as an
  implicit GEMM: im2col addresses computed in the kernel, padding masked), with the fused
  epilogue applied to the accumulator tile before its one store.
* attention (``AttentionSpec``): one flash-attention kernel, online softmax over key blocks, the
  scale/mask chain applied to each score tile in registers; scores are never written to memory.

Integer division and remainder follow C (truncation), as the kernel IR says; float math goes to
Triton's ``tl`` functions and, where it has none, to libdevice (the interpreter gets NumPy ones).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.backends.gpu.lanes import lane_depth, perfect_nest, vector_loop
from kiln.errors import KilnError
from kiln.ir.types import DType
from kiln.lower.kir import (
    COMPARISONS,
    Assign,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    Index,
    Kernel,
    Let,
    Load,
    Scalar,
    Select,
    Stmt,
    Store,
    Unary,
    dtypes_of,
    shared_nodes,
)

TL_TYPES = {
    DType.FLOAT32: "tl.float32",
    DType.FLOAT64: "tl.float64",
    DType.FLOAT16: "tl.float16",
    DType.BFLOAT16: "tl.uint16",  # raw bits, as the C renderer keeps them
    DType.INT8: "tl.int8",
    DType.INT16: "tl.int16",
    DType.INT32: "tl.int32",
    DType.INT64: "tl.int64",
    DType.UINT8: "tl.uint8",
    DType.UINT16: "tl.uint16",
    DType.UINT32: "tl.uint32",
    DType.UINT64: "tl.uint64",
    DType.BOOL: "tl.int1",
}
# pointer types of a kernel's arguments, as triton.compile's signature names them
POINTER_TYPES = {
    DType.FLOAT32: "*fp32",
    DType.FLOAT64: "*fp64",
    DType.FLOAT16: "*fp16",
    DType.BFLOAT16: "*u16",
    DType.INT8: "*i8",
    DType.INT16: "*i16",
    DType.INT32: "*i32",
    DType.INT64: "*i64",
    DType.UINT8: "*u8",
    DType.UINT16: "*u16",
    DType.UINT32: "*u32",
    DType.UINT64: "*u64",
    DType.BOOL: "*i1",
}
TL_FUNCTIONS = {
    "abs": "tl.abs",
    "exp": "tl.exp",
    "log": "tl.log",
    "sqrt": "tl.sqrt",
    "erf": "tl.erf",
    "floor": "tl.floor",
    "ceil": "tl.ceil",
    "sin": "tl.sin",
    "cos": "tl.cos",
    "round_even": "libdevice.rint",
    "bf16_to_f32": "_from_bf16",
}
LIBDEVICE = ("tanh", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "fmod", "rint")
LANES_MAX = 1024  # lanes per program of a loop-nest kernel
VECTOR_MAX = 256  # iterations of an inner loop run at once (a tile axis)
TILE_MAX = 4096  # elements of a lanes x vector tile
COMBINE = {"+": "_add_combine", "*": "_mul_combine", "max": "_max_combine", "min": "_min_combine"}
# the tree reductions: Triton's own combine functions where it has them (the interpreter runs those
# with NumPy, a custom one element by element); max and min ignore NaN there, so a NaN count puts it back
REDUCE = {
    "+": "tl.standard._sum_combine",
    "*": "_mul_combine",
    "max": "tl.standard._elementwise_max",
    "min": "tl.standard._elementwise_min",
}


class CannotRender(KilnError):
    """A kernel the gpu target has no rendering for (a kiln bug: lowering for this target should not
    produce it)."""


@dataclass
class Launch:
    """One kernel launch: ``function`` on ``grid`` with the buffers in ``slots`` (pointer-table
    slots) and its compile-time block sizes."""

    function: str
    kernel: str
    grid: tuple[int, ...]
    slots: tuple[int, ...]
    constants: dict[str, int]
    num_warps: int
    num_stages: int
    kind: str  # lanes | sequential | matmul | conv | attention
    signature: dict[str, str] = field(default_factory=dict)

    def as_tuple(self) -> tuple:
        return (
            self.function,
            self.kernel,
            self.grid,
            self.slots,
            self.constants,
            self.num_warps,
            self.num_stages,
            self.kind,
            self.signature,
        )

    @classmethod
    def of(cls, fields: Sequence) -> Launch:
        return cls(*fields)


def p2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# -- values ---------------------------------------------------------------------------------------------


@dataclass
class Val:
    text: str
    dtype: DType
    literal: bool = False  # a Python number (Triton types it from its partner operand)
    value: float | int | bool | None = None


def literal_text(value: float | int | bool, dtype: DType) -> str:
    if dtype is DType.BOOL:
        return "True" if value else "False"
    if dtype.is_float:
        value = float(value)
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return str(int(value))


def wrap(value: float | int | bool, dtype: DType) -> float | int | bool:
    """A Python number as ``dtype`` holds it (C conversions: truncation, two's complement)."""
    if dtype is DType.BOOL:
        return bool(value)
    if dtype.is_float:
        return float(np.asarray(value).astype(dtype.numpy if dtype is not DType.BFLOAT16 else np.float32))
    if isinstance(value, float):
        if not math.isfinite(value):
            return 0
        value = int(value)
    bits = dtype.numpy.itemsize * 8
    value = int(value) & ((1 << bits) - 1)
    signed = np.issubdtype(dtype.numpy, np.signedinteger)
    return value - (1 << bits) if signed and value >= 1 << (bits - 1) else value


class Context:
    """How one Triton function names things: buffers (pointer arguments), loop indices and scalars
    (Python names), the lane shape, loads replaced by a register value (an engine's tile)."""

    def __init__(self, shape: str, zero: str | None) -> None:
        self.shape = shape  # "[BLOCK]", "[BM, BN]", "[]"
        self.zero = zero  # an int64 zero tensor of the lane shape (None: scalar code)
        self.env: dict[str, str] = {}
        self.scalars: dict[str, DType] = {}
        self.pointers: dict[Buffer, str] = {}
        self.names: dict[str, str] = {}  # kernel-IR index and scalar names -> Python names
        self.override: list[tuple[Buffer, Expr, str]] = []
        self.intercept: dict[Buffer, str] = {}  # stores into this buffer assign this variable instead
        self.counter = 0
        self.lines: list[str] = []
        self.indent = "    "
        self.lanes = shape == "[BLOCK, 1]"  # lane values are columns: a vector loop adds a tile axis
        self.vector = False  # inside a vector loop
        self.widest = 0  # the widest vector loop rendered

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"_{stem}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)

    def pointer(self, buffer: Buffer) -> str:
        """The argument naming ``buffer`` (by position: kernels that differ only in their buffers
        have the same text, and the module keeps one of them)."""
        if buffer not in self.pointers:
            self.pointers[buffer] = f"p{len(self.pointers)}"
        return self.pointers[buffer]

    def index(self, name: str) -> str:
        """The variable of a loop index (named by order of appearance, for the same reason)."""
        if name not in self.names:
            self.names[name] = f"i{len(self.names)}"
        return self.names[name]

    def scalar(self, name: str) -> str:
        if name not in self.names:
            self.names[name] = f"s{len(self.names)}"
        return self.names[name]


def both(a: str, b: str) -> str:
    """The conjunction of two boolean tensors (a select: the interpreter's ``&`` of an int1 scalar
    and a tensor yields integers, which it then refuses as a mask)."""
    return f"tl.where({b}, {a}, False)"


def tensor(v: Val) -> str:
    """``v`` as a Triton tensor (a literal becomes a 0-d one of its type)."""
    return f"tl.full([], {v.text}, {TL_TYPES[v.dtype]})" if v.literal else v.text


def convert(v: Val, dtype: DType) -> Val:
    """``v`` converted to ``dtype`` as C converts."""
    if v.dtype is dtype:
        return v
    if v.literal:
        if dtype is DType.BFLOAT16:
            bits = int(np.asarray(float(v.value), np.float32).view(np.uint32))  # type: ignore[arg-type]
            if (bits & 0x7FFFFFFF) > 0x7F800000:
                out = (bits >> 16) | 0x40
            else:
                out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
            return Val(str(out), dtype, True, out)
        value = wrap(v.value, dtype)  # type: ignore[arg-type]
        return Val(literal_text(value, dtype), dtype, True, value)
    if dtype is DType.BOOL:
        return Val(f"({v.text} != 0)", dtype)
    if dtype is DType.BFLOAT16:
        return Val(f"_to_bf16({v.text})", dtype)
    return Val(f"({v.text}).to({TL_TYPES[dtype]})", dtype)


def _wider(a: DType, b: DType) -> DType:
    if a.is_float or b.is_float:
        return max([t for t in (a, b) if t.is_float], key=lambda t: t.numpy.itemsize)
    return max((a, b), key=lambda t: t.numpy.itemsize)


class Expressions:
    """Renders kernel-IR expressions into ``ctx`` (temporaries for shared subexpressions)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def value(self, root: Expr, guard: str | None) -> Val:
        self.types = dtypes_of(root)
        self.bound = shared_nodes(root)
        self.memo: dict[int, Val] = {}
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20000))
        try:
            return self.node(root, guard)
        finally:
            sys.setrecursionlimit(limit)

    def node(self, e: Expr, guard: str | None) -> Val:
        if id(e) in self.memo:
            return self.memo[id(e)]
        v = self._node(e, guard)
        if id(e) in self.bound and not v.literal:
            name = self.ctx.fresh("t")
            self.ctx.emit(f"{name} = {v.text}")
            v = Val(name, v.dtype)
            self.memo[id(e)] = v
        return v

    def _node(self, e: Expr, guard: str | None) -> Val:
        ctx = self.ctx
        dtype = self.types[id(e)]
        if isinstance(e, Const):
            value = wrap(e.value, e.dtype)
            return Val(literal_text(value, e.dtype), e.dtype, True, value)
        if isinstance(e, Index):
            if e.name not in ctx.env:
                raise CannotRender(f"loop index {e.name} used outside its loop")
            return Val(ctx.env[e.name], DType.INT64)
        if isinstance(e, Scalar):
            if e.name in ctx.env:  # a helper's parameter bound to a value of the engine
                return Val(ctx.env[e.name], e.dtype)
            return Val(ctx.scalar(e.name), e.dtype)
        if isinstance(e, Load):
            index = self.node(e.index, guard)
            for buffer, at, text in ctx.override:
                if buffer is e.buffer and at == e.index:
                    return Val(text, e.buffer.dtype)
            pointer = ctx.pointer(e.buffer)
            offset = convert(index, DType.INT64) if not index.literal else index
            address = f"{pointer} + ({offset.text} + {ctx.zero})" if ctx.zero else f"{pointer} + {offset.text}"
            if guard is None:
                return Val(f"tl.load({address})", e.buffer.dtype)
            return Val(f"tl.load({address}, mask={guard}, other=0)", e.buffer.dtype)
        if isinstance(e, Cast):
            return convert(self.node(e.a, guard), e.dtype)
        if isinstance(e, Select):
            cond = convert(self.node(e.cond, guard), DType.BOOL)
            a = self.node(e.a, self._and(guard, cond.text))
            b = self.node(e.b, self._and(guard, f"({cond.text} == 0)"))
            if cond.literal:
                return convert(a if cond.value else b, dtype)
            a, b = convert(a, dtype), convert(b, dtype)
            text = f"tl.where({cond.text}, {a.text}, {b.text})"
            if a.literal and b.literal:
                text = f"{text}.to({TL_TYPES[dtype]})"
            return Val(text, dtype)
        if isinstance(e, Unary):
            a = self.node(e.a, guard)
            if e.op == "-":
                if a.literal:
                    value = wrap(-a.value, dtype)  # type: ignore[operator]
                    return Val(literal_text(value, dtype), dtype, True, value)
                return Val(f"(-{a.text})", dtype)
            if e.op == "!":
                if a.literal:
                    return Val(literal_text(not a.value, DType.BOOL), DType.BOOL, True, not a.value)
                return Val(f"({a.text} == 0)", DType.BOOL)
            operand = tensor(convert(a, dtype) if e.op != "bf16_to_f32" else a)
            function = TL_FUNCTIONS.get(e.op) or (f"libdevice.{e.op}" if e.op in LIBDEVICE else None)
            if function is None:
                raise CannotRender(f"no Triton function for {e.op}")
            return Val(f"{function}({operand})", dtype)
        if isinstance(e, Binary):
            return self._binary(e, dtype, guard)
        raise CannotRender(f"no Triton for {e!r}")

    @staticmethod
    def _and(guard: str | None, cond: str) -> str:
        return cond if guard is None else both(guard, cond)

    def _binary(self, e: Binary, dtype: DType, guard: str | None) -> Val:
        a = self.node(e.a, guard)
        op = e.op
        if op in ("&&", "||"):
            right_guard = self._and(guard, a.text if op == "&&" else f"({a.text} == 0)") if not a.literal else guard
            b = self.node(e.b, right_guard)
            a, b = convert(a, DType.BOOL), convert(b, DType.BOOL)
            if a.literal and b.literal:
                value = (a.value and b.value) if op == "&&" else (a.value or b.value)
                return Val(literal_text(bool(value), DType.BOOL), DType.BOOL, True, bool(value))
            if a.literal:
                a, b = b, a
            return Val(both(a.text, b.text) if op == "&&" else f"tl.where({a.text}, True, {b.text})", DType.BOOL)
        b = self.node(e.b, guard)
        common = _wider(a.dtype, b.dtype) if op in COMPARISONS else dtype
        x, y = convert(a, common), convert(b, common)  # literals stay Python numbers: Triton types them
        if x.literal and y.literal:
            folded = self._fold(op, x.value, y.value, common, dtype)
            if folded is not None:
                return folded
            x = Val(tensor(x), common)
        if op in COMPARISONS:
            return Val(f"({x.text} {op} {y.text})", DType.BOOL)
        if op in ("/", "%") and not common.is_float and not (y.literal and y.value not in (0, -1)):
            # the kernel IR's total integer division (see kiln.lower.kir): by 0 -> 0, by -1 -> -x / 0
            safe = f"tl.where(({y.text}) == 0, 1, {y.text})"
            if op == "/":
                return Val(f"tl.where(({y.text}) == 0, 0, ({x.text}) // {safe})", dtype)
            minus_one = f" | (({y.text}) == -1)" if common.numpy.kind == "i" else ""
            return Val(f"tl.where((({y.text}) == 0){minus_one}, 0, ({x.text}) % {safe})", dtype)
        if op == "/":
            return Val(f"({x.text} {'/' if common.is_float else '//'} {y.text})", dtype)
        if (op == "%" and common.is_float) or op == "fmod":
            return Val(f"libdevice.fmod({tensor(x)}, {tensor(y)})", dtype)
        if op == "pow":
            return Val(f"libdevice.pow({tensor(x)}, {tensor(y)})", dtype)
        if op in ("max", "min"):  # np.maximum's rule: a NaN in either operand is the result
            pick = f"tl.{op}imum({tensor(x)}, {tensor(y)})"
            if not common.is_float:
                return Val(pick, dtype)
            return Val(f"tl.where(({x.text} != {x.text}) | ({y.text} != {y.text}), {x.text} + {y.text}, {pick})", dtype)
        return Val(f"({x.text} {op} {y.text})", dtype)

    @staticmethod
    def _fold(op: str, a, b, common: DType, dtype: DType) -> Val | None:  # type: ignore[no-untyped-def]
        if op in ("+", "-", "*"):
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
        elif op in COMPARISONS:
            value = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]
            return Val(literal_text(value, DType.BOOL), DType.BOOL, True, bool(value))
        elif op == "/" and not common.is_float and b != 0:
            value = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        elif op == "%" and not common.is_float and b != 0:
            value = a - b * (abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1))
        else:
            return None
        value = wrap(value, dtype)
        return Val(literal_text(value, dtype), dtype, True, value)


# -- statements -------------------------------------------------------------------------------------------


class Statements:
    """Kernel-IR statements as the body of a Triton function, predicated by masks."""

    def __init__(self, ctx: Context, enclosing: Sequence[str] = ()) -> None:
        self.ctx = ctx
        self.exprs = Expressions(ctx)
        self.enclosing = list(enclosing)  # indices of the loops around (lanes included)

    def block(self, body: Sequence[Stmt], pred: str | None, base: str | None) -> None:
        ctx = self.ctx
        start = len(ctx.lines)
        for stmt in body:
            self.statement(stmt, pred, base)
        if len(ctx.lines) == start:
            ctx.emit("pass")

    def broadcast(self, v: Val, dtype: DType) -> str:
        v = convert(v, dtype)
        if v.literal:
            return f"tl.full({self.ctx.shape}, {v.text}, {TL_TYPES[dtype]})"
        if self.ctx.shape == "[]":
            return f"({v.text}).to({TL_TYPES[dtype]})"
        return f"tl.broadcast_to(({v.text}).to({TL_TYPES[dtype]}), {self.ctx.shape})"

    def statement(self, stmt: Stmt, pred: str | None, base: str | None) -> None:
        ctx = self.ctx
        if isinstance(stmt, For) and not ctx.vector:
            reductions = vector_loop(stmt, frozenset(self.enclosing))
            if reductions is not None:
                self.vector_loop(stmt, reductions, pred)
                return
        if isinstance(stmt, For):
            bounds = []
            for bound in (stmt.start, stmt.extent):
                if isinstance(bound, int):
                    bounds.append((str(bound), True))
                else:
                    v = self.exprs.value(bound, pred)
                    bounds.append((v.text, v.literal))
            counter = ctx.fresh("i")
            if all(constant for _, constant in bounds):
                ctx.emit(f"for {counter} in range({bounds[0][0]}, {bounds[1][0]}):")
            else:
                ctx.emit(f"for {counter} in tl.range({bounds[0][0]}, {bounds[1][0]}):")
            outer = ctx.indent
            ctx.indent += "    "
            name = ctx.index(stmt.index.name)
            ctx.emit(f"{name} = {counter} + _zero")
            saved = ctx.env.get(stmt.index.name)
            ctx.env[stmt.index.name] = name
            self.enclosing.append(stmt.index.name)
            self.block(stmt.body, pred, base)
            self.enclosing.pop()
            ctx.indent = outer
            if saved is None:
                ctx.env.pop(stmt.index.name, None)
            else:
                ctx.env[stmt.index.name] = saved
        elif isinstance(stmt, If):
            cond = convert(self.exprs.value(stmt.cond, pred), DType.BOOL)
            if cond.literal:
                if cond.value:
                    self.block(stmt.body, pred, base)
                return
            name = ctx.fresh("p")
            ctx.emit(f"{name} = {cond.text}" if pred is None else f"{name} = {both(pred, cond.text)}")
            self.block(stmt.body, name, base)
        elif isinstance(stmt, Let):
            v = self.exprs.value(stmt.value, pred)
            ctx.scalars[stmt.scalar.name] = stmt.scalar.dtype
            ctx.emit(f"{ctx.scalar(stmt.scalar.name)} = {self.broadcast(v, stmt.scalar.dtype)}")
        elif isinstance(stmt, Assign):
            v = self.exprs.value(stmt.value, pred)
            name = ctx.scalar(stmt.scalar.name)
            if pred is None or pred == base:
                ctx.emit(f"{name} = {self.broadcast(v, stmt.scalar.dtype)}")
            else:
                ctx.emit(f"{name} = tl.where({pred}, {convert(v, stmt.scalar.dtype).text}, {name})")
        elif isinstance(stmt, Store):
            value = convert(self.exprs.value(stmt.value, pred), stmt.buffer.dtype)
            if stmt.buffer in ctx.intercept:
                ctx.emit(f"{ctx.intercept[stmt.buffer]} = {tensor(value)}")
                return
            index = self.exprs.value(stmt.index, pred)
            offset = index if index.literal else convert(index, DType.INT64)
            pointer = ctx.pointer(stmt.buffer)
            address = f"{pointer} + ({offset.text} + {ctx.zero})" if ctx.zero else f"{pointer} + {offset.text}"
            mask = "" if pred is None else f", mask={pred}"
            ctx.emit(f"tl.store({address}, {value.text}{mask})")
        else:
            raise CannotRender(
                f"the gpu target renders engine calls only at a kernel's top level, not {type(stmt).__name__}"
            )

    def vector_loop(self, loop: For, reductions: dict[str, str], pred: str | None) -> None:
        """A loop whose iterations are independent (``lanes.vector_loop``) as steps of a vector of
        up to VECTOR_MAX iterations: a tile axis beside the lanes; its folds into outside scalars
        become tree reductions (``tl.reduce``) of each step's vector."""
        ctx = self.ctx
        start, extent = int(loop.start), int(loop.extent)  # type: ignore[arg-type]
        width = min(VECTOR_MAX, p2(extent - start))
        ctx.widest = max(ctx.widest, width)
        counter = ctx.fresh("v")
        ctx.emit(f"for {counter} in range({start}, {extent}, {width}):")
        outer_indent, outer_shape, outer_zero = ctx.indent, ctx.shape, ctx.zero
        ctx.indent += "    "
        arange = f"tl.arange(0, {width}).to(tl.int64)"
        name = ctx.index(loop.index.name)
        ctx.emit(f"{name} = {counter} + _zero + {arange}{'[None, :]' if ctx.lanes else ''}")
        ctx.shape = f"[BLOCK, {width}]" if ctx.lanes else f"[{width}]"
        ctx.zero = ctx.fresh("zv")
        ctx.emit(f"{ctx.zero} = tl.full({ctx.shape}, 0, tl.int64)")
        inside = ctx.fresh("p")
        bound = f"({name} < {extent})"
        ctx.emit(f"{inside} = {bound}" if pred is None else f"{inside} = {both(pred, bound)}")
        saved = ctx.env.get(loop.index.name)
        ctx.env[loop.index.name] = name
        ctx.vector = True
        axis = 1 if ctx.lanes else 0
        for stmt in loop.body:
            if isinstance(stmt, Assign) and stmt.scalar.name in reductions:
                kind = reductions[stmt.scalar.name]
                dtype = stmt.scalar.dtype
                operand = _reduced_operand(stmt)
                v = convert(self.exprs.value(operand, inside), dtype)
                identity = _identity(kind, dtype)
                folded = ctx.fresh("r")
                values = ctx.fresh("x")
                ctx.emit(f"{values} = tl.where({inside}, {v.text}, {identity}).to({TL_TYPES[dtype]})")
                ctx.emit(f"{folded} = tl.reduce({values}, {axis}, {REDUCE[kind]})")
                if kind in ("max", "min") and dtype.is_float:
                    ctx.emit(
                        f"{folded} = tl.where(tl.reduce(({values} != {values}).to(tl.int32), {axis}, "
                        f'tl.standard._sum_combine) > 0, float("nan"), {folded})'
                    )
                target = ctx.scalar(stmt.scalar.name)
                ctx.emit(f"{target} = {COMBINE[kind]}({target}, {folded}{'[:, None]' if ctx.lanes else ''})")
            else:
                self.statement(stmt, inside, inside)
        ctx.vector = False
        ctx.indent, ctx.shape, ctx.zero = outer_indent, outer_shape, outer_zero
        if saved is None:
            ctx.env.pop(loop.index.name, None)
        else:
            ctx.env[loop.index.name] = saved


def _reduced_operand(stmt: Assign) -> Expr:
    """``e`` of a reduction ``s = s op e``."""
    value = stmt.value
    assert isinstance(value, Binary)
    return value.b if value.a == stmt.scalar else value.a


def _identity(kind: str, dtype: DType) -> str:
    if kind == "+":
        return literal_text(0, dtype)
    if kind == "*":
        return literal_text(1, dtype)
    if dtype.is_float:
        return 'float("-inf")' if kind == "max" else 'float("inf")'
    info = np.iinfo(dtype.numpy) if dtype is not DType.BOOL else None
    if info is None:
        return "False" if kind == "max" else "True"
    return str(info.min if kind == "max" else info.max)


# -- kernels ----------------------------------------------------------------------------------------------


def _signature(ctx: Context, constants: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    params = list(ctx.pointers.values())
    signature = {ctx.pointers[b]: POINTER_TYPES[b.dtype] for b in ctx.pointers}
    for name in constants:
        signature[name] = "constexpr"
    return params, signature


def function_text(name: str, ctx: Context, constants: Sequence[str], head: list[str]) -> tuple[str, dict[str, str]]:
    params, signature = _signature(ctx, constants)
    args = ", ".join([*params, *(f"{c}: tl.constexpr" for c in constants)])
    text = "\n".join(["", "", "@triton.jit", f"def {name}({args}):", *head, *ctx.lines])
    return text, signature


def _flags(table: dict[Buffer, int]) -> frozenset[Buffer]:
    return frozenset(b for b, slot in table.items() if slot == 0)


def render_nest(name: str, kernel: Kernel, stmt: For | list[Stmt], table: dict[Buffer, int]) -> tuple[str, Launch]:
    """A loop nest (or a kernel body of other statements: sequential) as one Triton function."""
    depth = lane_depth(stmt, _flags(table)) if isinstance(stmt, For) else 0
    if depth:
        assert isinstance(stmt, For)
        nest, _ = perfect_nest(stmt)
        lanes = nest[:depth]
        extents = [int(loop.extent) for loop in lanes]  # type: ignore[arg-type]
        total = int(np.prod(extents))
        ctx = Context("[BLOCK, 1]", "_z")
        head = [
            "    _zero = tl.full([], 0, tl.int64)",
            "    _lin = (tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64))[:, None]",
            f"    _lanes = _lin < {total}",
            "    _z = tl.full([BLOCK, 1], 0, tl.int64)",
        ]
        stride = total
        for position, (loop, extent) in enumerate(zip(lanes, extents)):
            stride //= extent
            text = "_lin" if stride == 1 else f"(_lin // {stride})"
            if position:
                text = f"{text} % {extent}"
            head.append(f"    {ctx.index(loop.index.name)} = {text}")
            ctx.env[loop.index.name] = ctx.index(loop.index.name)
        Statements(ctx, [loop.index.name for loop in lanes]).block(lanes[-1].body, "_lanes", "_lanes")
        # lanes per program: a tile of lanes x the widest vector loop stays within TILE_MAX elements
        block = min(LANES_MAX, p2(total), max(1, TILE_MAX // max(1, ctx.widest)))
        source, signature = function_text(name, ctx, ["BLOCK"], head)
        grid = (-(-total // block),)
        warps = 4 if block * max(1, ctx.widest) <= 512 else 8
        launch = Launch(name, kernel.name, grid, (), {"BLOCK": block}, warps, 1, "lanes", signature)
    else:
        ctx = Context("[]", None)
        head = ["    _zero = tl.full([], 0, tl.int64)"]
        Statements(ctx).block([stmt] if isinstance(stmt, For) else stmt, None, None)
        source, signature = function_text(name, ctx, ["BLOCK"], head)
        launch = Launch(name, kernel.name, (1,), (), {"BLOCK": 1}, 1, 1, "sequential", signature)
    launch.slots = tuple(table[b] for b in ctx.pointers)
    return source, launch
