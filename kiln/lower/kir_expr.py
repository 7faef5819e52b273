"""The kernel IR's expressions: constants, loop indices, scalar locals, loads from flat buffers,
operators, selects and casts, and what passes and renderers ask of them (types, operands, shared
subexpressions, affine index arithmetic). Statements, engine calls and kernels: ``kiln.lower.kir``
(which re-exports everything here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.ir.sized import SizedInt
from kiln.ir.types import DType


@dataclass(frozen=True, eq=False)
class Buffer:
    """A flat array of ``size`` elements of ``dtype`` (identity is the buffer)."""

    name: str
    dtype: DType
    size: int

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.numpy.itemsize


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


def dtypes_of(root: Expr, order: list[Expr] | None = None) -> dict[int, DType]:
    """The type of every node of ``root`` (by id), in one iterative walk (C's usual arithmetic
    conversions: a float operand makes the result float, the wider float wins; comparisons and
    logic give booleans; ``order``: ``postorder(root)`` where the caller has it)."""
    known: dict[int, DType] = {}
    for node in order if order is not None else postorder(root):
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


def shared_nodes(root: Expr, order: list[Expr] | None = None) -> set[int]:
    """The nodes of ``root`` (by id) to compute once into a named temporary when it is written
    out: those used more than once and those nesting past MAX_NESTING (written as a tree, a DAG
    of n shared selects is 2^n long). Only nodes evaluated on every path qualify (a load under a
    select may be out of bounds on the path that does not take it), unless they hold no load and
    no division (safe to evaluate anywhere). ``order``: ``postorder(root)`` where the caller has it."""
    order = order if order is not None else postorder(root)
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
    return Const(value if isinstance(value, SizedInt) else int(value), DType.INT64)  # (a size keeps its expression)


def affine(terms: list[tuple[Expr, int]], offset: int = 0) -> Expr:
    """sum(index * stride) + offset."""
    expr: Expr = i64(offset)
    for index, stride in terms:
        if stride:
            expr = add(expr, mul(index, i64(stride)))
    return expr


# -- statements ---------------------------------------------------------------------------------------
