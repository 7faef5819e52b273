"""Dims that are symbols: what kiln can say about sums, products, quotients and slices of them.

A dim is an int or the canonical text of a size expression (``kiln.ir.dims``): inference names a
dim it computes (a product of one symbol and 1s is that symbol; ``[0:n]`` of a static dim of d
elements is ``min(n,d)``; ``batch*4*seq`` merged by a Reshape is ``4*batch*seq``; a window count
``(h+3)//4``) and makes a fresh symbol only where no expression says it; the analyses divide
products of dims by cancelling the factors both sides hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import ShapeInferenceError
from kiln.ir import dims as sizes
from kiln.ir.sized import SizedInt, expr_of, size_product
from kiln.ir.types import Dim


def as_expr(dim: Dim | sizes.Expr) -> sizes.Expr:
    """A dim (or a shape vector's element) as an expression."""
    if isinstance(dim, sizes.Expr):
        return dim
    return sizes.const(int(dim)) if not isinstance(dim, str) else sizes.parse(dim)


def dim_of(expr: sizes.Expr) -> Dim:
    """An expression as a dim: its number, or its canonical text."""
    return expr.constant if expr.is_constant else sizes.text(expr)


def clamped(symbol: str, dim: int) -> Dim:
    """The dim ``min(symbol, dim)``: a slice ``[0:symbol]`` of a static dim of ``dim`` elements.
    One name per pair, so two such slices have the same dim; broadcast against ``symbol`` itself
    it is ``symbol`` (``kiln.ops.registry``'s broadcast). Inference at a binding computes it."""
    return dim_of(sizes.extreme(True, as_expr(symbol), sizes.const(dim)))


def scaled(symbol: str, factor: int) -> Dim:
    """The dim ``factor * symbol`` (heads folded into the batch: [batch, 4, seq] -> [4*batch,
    seq]); specialize binds it with its symbol (``bound``)."""
    return dim_of(sizes.scale(as_expr(symbol), factor))


def floored(symbol: str, divisor: int) -> Dim:
    """The dim ``symbol // divisor`` (a size divided by a number that may not divide it): one name
    per quotient, so two places that compute it (Swin's window partition and its reverse) agree."""
    return dim_of(sizes.floordiv(as_expr(symbol), divisor))


def bound(name: str, dims: Any) -> Dim:
    """``name``'s value under a binding of symbols to ints (``dims``: a mapping), or the dim of
    what is left where some symbols are not bound."""
    if name in dims:
        return dims[name]
    expr = sizes.parse(name)
    found = dim_of(sizes.substitute(expr, dims))
    kept = [dims[s] for s in sizes.symbols(expr) if isinstance(dims.get(s), SizedInt)]
    if isinstance(found, int) and kept:
        # the size at the binding that keeps what it is: the kept sizes' symbols (a dim bound to a
        # plain number, the batch class of a length route, is that number in it)
        fixed = {s: int(dims[s]) for s in sizes.symbols(expr) if s in dims and not isinstance(dims[s], SizedInt)}
        at = {s: int(dims[s]) for s in sizes.symbols(expr) if s in dims}
        return SizedInt(found, sizes.substitute(expr, fixed), {**(kept[0].at or {}), **at})
    return found


def product_name(product: Monomial) -> Dim:
    """A product of dims by its canonical text (``4*batch*seq``)."""
    expr = sizes.const(product.coefficient)
    for factor in product.symbols:
        expr = sizes.mul(expr, sizes.parse(factor))
    return dim_of(expr)


def clamped_base(name: str) -> str | None:
    """``s`` of a ``min(s, d)`` dim (s a symbol, d a number >= 1), else None."""
    atom = sizes.parse(name).atom
    if not isinstance(atom, sizes.Extreme) or not atom.lowest or len(atom.items) != 2:
        return None
    numbers = [i.constant for i in atom.items if i.is_constant]
    names = [i.symbol for i in atom.items if i.symbol is not None]
    return names[0] if len(numbers) == 1 and numbers[0] >= 1 and len(names) == 1 else None


SMALL_CONTENTS = 64  # elements: a shape-like tensor up to this size keeps its contents through moves


def carry_contents(ctx: Any, shape: tuple, transform) -> None:
    """Shape tensors reshaped (any static shape: the contents are row-major) keep their contents."""
    if not all(isinstance(d, int) for d in shape) or math.prod(shape) > SMALL_CONTENTS:
        return
    contents = ctx.integers_value(0)
    if contents is not None and len(contents) == math.prod(shape):
        ctx.out_symbolic[0] = transform(contents)


def arranged(ctx: Any, move) -> None:
    """The contents of a small static integer tensor moved by ``move`` (a function of a NumPy
    object array of the contents in their shape): a transpose or a slice of a pads matrix
    (TorchScript's pads: pairs reversed and transposed) keeps them."""
    shape = ctx.shape(0)
    if shape is None or not all(isinstance(d, int) for d in shape) or math.prod(shape) > SMALL_CONTENTS:
        return  # (before reading the contents: a 2048x2048 mask table is no shape arithmetic)
    contents = ctx.integers_value(0)
    if contents is None or len(contents) != math.prod(shape):
        return
    grid = np.empty(len(contents), dtype=object)
    grid[:] = list(contents)
    ctx.out_symbolic[0] = tuple(move(grid.reshape(shape)).reshape(-1).tolist())


def dim_product(dims: Any) -> int | None:
    """The product of dims when every one is an int, else None."""
    dims = list(dims)
    return math.prod(dims) if all(isinstance(d, int) for d in dims) else None


def sliced_to_sizes(ctx: Any, dims: list[Dim], starts: list, ends: tuple, axes: list, steps: list) -> tuple[Dim, ...]:
    """A Slice's dims when its ends were computed from shapes (``ends``: symbolic contents): [0:n]
    of a dim of n is n, of a static dim d is clamped(n, d); anything else a fresh symbol."""
    dims = list(dims)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = dims[axis]
        if isinstance(end, int) and isinstance(dim, int):
            dims[axis] = len(range(*slice(start, end, step).indices(dim)))
        elif start == 0 and step == 1 and isinstance(end, str) and dim == end:
            pass
        elif start == 0 and step == 1 and isinstance(end, str) and isinstance(dim, int) and dim > 0:
            dims[axis] = clamped(end, dim)  # min(end, dim): ONNX clamps the end
        else:
            dims[axis] = ctx.fresh()
    return tuple(dims)


def symbolic_product(ctx: Any, dims: tuple[Dim, ...] | list[Dim]) -> Dim:
    """The product of dims: an int, one symbol (scaled by the ints), else a fresh symbol."""
    if _all_sized(dims):
        return size_product(dims)  # (numbers at a binding that keep their expressions)
    return product_name(Monomial.of(dims))


def _all_sized(dims: Any) -> bool:
    """Every dim a number and one at least a ``SizedInt`` (a lowering's binding)."""
    return all(isinstance(d, int) for d in dims) and any(isinstance(d, SizedInt) for d in dims)


def quotient(ctx: Any, numerator: list[Dim], denominator: list[Dim]) -> Dim:
    """prod(numerator) / prod(denominator) with symbols cancelled where they match (a scaled
    symbol counts as its factor times the symbol)."""
    if _all_sized([*numerator, *denominator]):
        top_size, bottom_size = size_product(numerator), size_product(denominator)
        if bottom_size and top_size % bottom_size == 0:
            exact = sizes.divide(expr_of(top_size), expr_of(bottom_size))  # type: ignore[arg-type]
            whole = int(top_size) // int(bottom_size)
            return SizedInt(whole, exact, getattr(top_size, "at", None)) if exact is not None else whole
    top, bottom = Monomial.of(numerator), Monomial.of(denominator)
    cancelled = top.divided(Monomial(1, bottom.symbols))
    if cancelled is None:  # factors that are sums: divide the expressions (a window's rows*cols)
        exact = sizes.divide(_product_expr(numerator), _product_expr(denominator))
        fits = exact is not None and sizes.bounds(exact)[0] >= 0 and sizes.nameable(exact)
        return dim_of(exact) if fits else ctx.fresh()  # type: ignore[arg-type]
    static, divisor = cancelled.coefficient, bottom.coefficient
    if not cancelled.symbols:
        if divisor == 0 and static == 0:
            # NumPy and onnxruntime refuse this too: any size fits
            raise ShapeInferenceError("-1 is ambiguous: the tensor has 0 elements and the other dims multiply to 0")
        if divisor == 0:
            raise ShapeInferenceError(f"cannot reshape {static} elements: the other dims multiply to 0")
        if static % divisor:
            raise ShapeInferenceError(f"cannot reshape: {static} elements into a multiple of {divisor}")
        return static // divisor
    if divisor == 0:
        return ctx.fresh()
    if static % divisor:  # the reshape runs only where the count divides: then it is this quotient
        floor = sizes.floordiv(sizes.mul(sizes.const(static), _product_expr(list(cancelled.symbols))), divisor)
        return dim_of(floor) if sizes.nameable(floor) else ctx.fresh()
    return product_name(Monomial(static // divisor, cancelled.symbols))


def _product_expr(dims: list[Dim]) -> sizes.Expr:
    result = sizes.const(1)
    for dim in dims:
        result = sizes.mul(result, as_expr(dim))
    return result


@dataclass(frozen=True)
class Monomial:
    """A product of dims: an int coefficient times symbols (sorted, repeats kept). What a
    sample-parallel dim holds per sample when a reshape merges it with others ([batch, seq, 64]
    -> [batch*seq, 64]: seq indices per sample)."""

    coefficient: int = 1
    symbols: tuple[str, ...] = ()

    @staticmethod
    def of(dims: tuple | list) -> Monomial:
        """The product of dims: numbers into the coefficient, each dim that is a product of
        atoms its atoms (by their texts), any other dim (a sum) one factor."""
        coefficient, symbols = 1, []
        for dim in dims:
            if isinstance(dim, int):
                coefficient *= dim
                continue
            expr = as_expr(dim)
            single = expr.monomial
            if single is None:
                symbols.append(sizes.text(expr))
                continue
            coefficient *= single[0]
            symbols.extend(sizes.atom_text(atom) for atom in single[1])
        return Monomial(coefficient, tuple(sorted(symbols)))

    def __mul__(self, other: Monomial) -> Monomial:
        return Monomial(self.coefficient * other.coefficient, tuple(sorted(self.symbols + other.symbols)))

    def divided(self, other: Monomial) -> Monomial | None:
        """self / other when other's symbols cancel and its coefficient divides, else None."""
        symbols = list(self.symbols)
        for symbol in other.symbols:
            if symbol not in symbols:
                return None
            symbols.remove(symbol)
        if not other.coefficient or self.coefficient % other.coefficient:
            return None
        return Monomial(self.coefficient // other.coefficient, tuple(symbols))

    def __str__(self) -> str:
        return "*".join([str(self.coefficient)] * (self.coefficient != 1 or not self.symbols) + list(self.symbols))


ONE = Monomial()


def from_sympy(expr: Any) -> sizes.Expr | None:
    """A sympy expression torch traced a size as, as kiln's expression (None: one it has no form
    for: a fraction, a power, a function kiln does not know)."""
    args = getattr(expr, "args", ())
    if getattr(expr, "is_Integer", False):
        return sizes.const(int(expr))
    if getattr(expr, "is_Symbol", False):
        return sizes.sym(str(expr)) if str(expr).isidentifier() else None
    parts = [from_sympy(a) for a in args]
    if None in parts or not parts:
        return None
    kind = type(expr).__name__
    if getattr(expr, "is_Add", False) or getattr(expr, "is_Mul", False):
        result = parts[0]
        for part in parts[1:]:
            result = sizes.add(result, part) if expr.is_Add else sizes.mul(result, part)  # type: ignore[arg-type]
        return result
    if kind in ("FloorDiv", "Mod", "PythonMod") and len(parts) == 2 and parts[1].is_constant:  # type: ignore[union-attr]
        k = parts[1].constant  # type: ignore[union-attr]
        if k <= 0:
            return None
        return sizes.floordiv(parts[0], k) if kind == "FloorDiv" else sizes.mod(parts[0], k)  # type: ignore[arg-type]
    if kind in ("Max", "Min"):
        result = parts[0]
        for part in parts[1:]:
            result = sizes.extreme(kind == "Min", result, part)  # type: ignore[arg-type]
        return result
    return None
