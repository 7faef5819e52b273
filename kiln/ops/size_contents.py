"""Contents of shape-like tensors through arithmetic: what a Shape's elements become when an
exporter computes sizes from them (``batch * heads``, Swin's window count ``(h+3)//4``,
MobileViT's ``int(ceil(h / 2.0) * 2.0)``). Integer elements are ``kiln.ir.dims`` expressions —
a dim where the expression is a size (0 or more), the expression itself where it may be
negative; float elements are ``Ratio``s, exact quotients of expressions by numbers, which only a
rounding (Ceil, Floor, a Cast to an integer) turns back into expressions. A float32 holds every
integer below 2**24 exactly and rounds a quotient of such integers to the float nearest it, which
Ceil and Floor then round the right way: the ratios assume the sizes they divide stay below 2**24
(16M elements along one dim)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import dims as sizes
from kiln.ir.types import DType
from kiln.ops.registry import InferContext
from kiln.ops.symbolic_dims import as_expr, dim_of

FLOAT_EXACT = 1 << 24


@dataclass(frozen=True)
class Ratio:
    """A float element computed from sizes: exactly ``numerator / denominator``."""

    numerator: sizes.Expr
    denominator: int = 1


def _ratio(numerator: sizes.Expr, denominator: int) -> Ratio:
    common = sizes.common_factor(numerator, denominator)
    return Ratio(sizes.divided_exactly(numerator, common), denominator // common)


def shape_vectors(ctx: InferContext, indices: list[int], integers: bool = False) -> list[tuple] | None:
    """The contents of 1-D (or scalar) shape vectors ``indices`` (integers or a condition),
    broadcast to one length; None for anything else (float data is never a shape). With
    ``integers``, elements that are expressions but not sizes too (``InferContext.integers_value``)."""
    if any(ctx.shape(i) is None or len(ctx.shape(i)) > 1 for i in indices):  # type: ignore[arg-type]
        return None
    if any(ctx.dtype(i).numpy.kind not in "iub" for i in indices):
        return None
    return _broadcast([ctx.integers_value(i) if integers else ctx.dims_value(i) for i in indices])


def _broadcast(vectors: list[tuple | None]) -> list[tuple] | None:
    """Contents vectors broadcast to one length (a vector of one element repeated); None where
    one is unknown or the lengths do not broadcast."""
    if any(v is None for v in vectors):
        return None
    length = max(len(v) for v in vectors)  # type: ignore[arg-type]
    if any(len(v) not in (1, length) for v in vectors):  # type: ignore[arg-type]
        return None
    return [tuple(v) * length if len(v) == 1 else tuple(v) for v in vectors]  # type: ignore[arg-type]


def size_contents(ctx: InferContext, element: Callable[[InferContext, Any, Any], Any]) -> None:
    """Arithmetic on shape vectors keeps their contents, element by element, as expressions
    (``element`` returns None where it cannot say: then the vector has no contents). An element
    that is a size (0 or more) is a dim; one that may be negative stays an expression, which a
    shape never takes as a dim (``InferContext.dims_value``) but later arithmetic may."""
    vectors = shape_vectors(ctx, [0, 1], integers=True)
    if vectors is None or ctx.dtype(0).numpy.kind not in "iu":
        return
    result = [element(ctx, a, b) for a, b in zip(*vectors)]
    if None not in result:
        found = [_element(r, ctx) for r in result]
        if None not in found:
            ctx.out_symbolic[0] = tuple(found)


LARGEST = 48  # terms: an expression growing past this (products of sums, multiplied again) is a fresh size


def _element(expr: sizes.Expr, ctx: InferContext) -> Any:
    """A computed element of a shape vector: a number, a size's dim, or the expression itself
    (None: a large expression that may be negative, which kiln does not follow)."""
    if expr.is_constant:
        return expr.constant
    size = sizes.bounds(expr)[0] >= 0
    if len(expr.terms) > LARGEST or not sizes.nameable(expr):
        return ctx.fresh() if size else None
    return dim_of(expr) if size else expr


def _size_arithmetic(ctx: InferContext, a: Any, b: Any) -> sizes.Expr | None:
    """Sums, differences, products, quotients, remainders, minima and maxima of shape elements
    are expressions (``batch*heads``, ``(h+3)//4``, ``min(seq,512)``), so two computations of one
    size give one dim; integer division only where the dividend is 0 or more (ONNX truncates,
    the expression floors) and the divisor a positive number or a factor of it; where no
    expression says it, a quotient of sizes is a fresh size."""
    op = ctx.node.op
    x, y = as_expr(a), as_expr(b)
    if op in ("Add", "Sub", "Mul"):
        return sizes.add(x, y) if op == "Add" else sizes.sub(x, y) if op == "Sub" else sizes.mul(x, y)
    if op in ("Min", "Max"):
        return sizes.extreme(op == "Min", x, y)
    if y.is_constant:
        truncates = op == "Div" or ctx.attr("fmod")  # (C's sign rules: the same for a dividend >= 0)
        if y.constant <= 0 or (truncates and sizes.bounds(x)[0] < 0):
            return None
        return sizes.floordiv(x, y.constant) if op == "Div" else sizes.mod(x, y.constant)
    if op == "Div" and sizes.bounds(x)[0] >= 0 and sizes.bounds(y)[0] >= 1:
        exact = sizes.divide(x, y)
        return exact if exact is not None else sizes.sym(ctx.fresh())
    return None


SIZE_RULES: dict[str, Callable[[InferContext, Any, Any], sizes.Expr | None]] = {
    op: _size_arithmetic for op in ("Add", "Sub", "Mul", "Div", "Mod", "Min", "Max")
}


def _float_vector(ctx: InferContext, index: int) -> tuple | None:
    """The contents of a float shape-like input as ratios (known values only where every one is
    an integer a float holds exactly)."""
    shape = ctx.shape(index)
    if shape is None or len(shape) > 1:
        return None
    array = ctx.value(index)
    if array is not None:
        flat = np.asarray(array, dtype=np.float64).reshape(-1)
        if flat.size > 64 or not np.all(np.isfinite(flat)) or np.any(flat != np.round(flat)):
            return None
        if np.any(np.abs(flat) >= FLOAT_EXACT):
            return None
        return tuple(Ratio(sizes.const(int(v))) for v in flat)
    found = ctx.integers_value(index)
    return tuple(found) if found is not None and all(isinstance(x, Ratio) for x in found) else None


def _ratio_arithmetic(ctx: InferContext, a: Ratio, b: Ratio) -> Ratio | None:
    op = ctx.node.op
    if op in ("Add", "Sub"):
        left, right = sizes.scale(a.numerator, b.denominator), sizes.scale(b.numerator, a.denominator)
        return _ratio(sizes.add(left, right) if op == "Add" else sizes.sub(left, right), a.denominator * b.denominator)
    if op == "Mul":
        return _ratio(sizes.mul(a.numerator, b.numerator), a.denominator * b.denominator)
    if op == "Div" and b.numerator.is_constant and b.numerator.constant > 0:
        return _ratio(sizes.scale(a.numerator, b.denominator), a.denominator * b.numerator.constant)
    return None


def float_contents(ctx: InferContext) -> None:
    """Float arithmetic on sizes (``h / 2.0``): ratios, element by element."""
    vectors = _broadcast([_float_vector(ctx, i) for i in (0, 1)])
    if vectors is None:
        return
    result = [_ratio_arithmetic(ctx, x, y) for x, y in zip(*vectors)]
    if None not in result and any(not r.numerator.is_constant for r in result):  # type: ignore[union-attr]
        ctx.out_symbolic[0] = tuple(result)


def rounded_contents(ctx: InferContext) -> None:
    """Ceil and Floor of ratios: the expressions ``(n+d-1)//d`` and ``n//d``."""
    found = _float_vector(ctx, 0)
    if found is None or ctx.value(0) is not None:  # (known values fold)
        return
    up = ctx.node.op == "Ceil"
    ctx.out_symbolic[0] = tuple(
        Ratio(
            sizes.floordiv(sizes.add(r.numerator, sizes.const(r.denominator - 1)) if up else r.numerator, r.denominator)
        )
        for r in found
    )


def cast_contents(ctx: InferContext, dtype: DType) -> None:
    """A Cast keeps contents: sizes cast to an integer type wide enough stay themselves; to
    float32/float64 they become ratios; ratios cast to an integer are truncated (a floor
    division where the ratio is 0 or more)."""
    shape = ctx.shape(0)
    if shape is None or ctx.value(0) is not None:  # (known values fold; a float one may be no integer)
        return
    found = ctx.integers_value(0)
    if found is None:
        return
    if dtype in (DType.INT64, DType.INT32):
        out = []
        for element in found:
            if isinstance(element, Ratio):
                if element.denominator != 1 and sizes.bounds(element.numerator)[0] < 0:
                    return
                element = _element(sizes.floordiv(element.numerator, element.denominator), ctx)
                if element is None:
                    return
            out.append(element)
        ctx.out_symbolic[0] = tuple(out)
    elif dtype in (DType.FLOAT32, DType.FLOAT64) and ctx.dtype(0).numpy.kind in "iu":
        ctx.out_symbolic[0] = tuple(Ratio(as_expr(e)) for e in found)
