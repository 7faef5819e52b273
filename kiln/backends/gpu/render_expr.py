"""Kernel IR expressions -> Triton text for the ``gpu`` target's renderer (``render.py``): the
types and functions Triton offers, values as text with their types (``Val``), the per-function
rendering context (``Context``) and ``Expressions``, which renders an expression under a lane mask
(a load under a false condition is masked off, never read)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from kiln.errors import KilnError
from kiln.ir.types import DType
from kiln.lower.kir import (
    COMPARISONS,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    Index,
    Load,
    Scalar,
    Select,
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
