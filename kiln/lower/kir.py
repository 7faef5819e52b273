"""Kernel IR: loop nests over flat buffers, with affine index expressions.

A ``Kernel`` is the algorithm: loops (``For``), conditionals (``If``), scalar locals (``Let``,
``Assign``) and stores into buffers. How loops run (parallel across cores, vectorized, unrolled)
is a ``Schedule`` kept beside it and applied by the code generator to loops by name, so a
schedule can change speed but never results.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / % max min < <= > >= == != && || pow
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Unary:
    op: str  # - ! and math functions: exp log sqrt tanh erf fabs floor ceil ...
    a: Expr


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
    index: Index
    extent: int
    body: list[Stmt]


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


Stmt = For | If | Let | Assign | Store


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

    parallel: str | None = None  # spread this loop across cores (OpenMP)
    vectorize: str | None = None  # SIMD across this loop's iterations
    unroll: dict[str, int] = field(default_factory=dict)


@dataclass
class Kernel:
    name: str
    kind: str  # pointwise | reduction | matmul | conv | pool | copy | normalize
    body: list[Stmt]
    reads: list[Buffer]
    writes: list[Buffer]
    sources: list[str]  # labels of the graph nodes it computes
    schedule: Schedule = field(default_factory=Schedule)


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
