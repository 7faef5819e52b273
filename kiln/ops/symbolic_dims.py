"""Dims that are symbols: what kiln can say about products, quotients and slices of them.

A dim is an int or a symbol name (``kiln.ir.types``). Inference names a dim it computes when it can
(a product of one symbol and 1s is that symbol; ``[0:n]`` of a static dim of d elements is
``clamped(n, d)``, i.e. min(n, d)) and makes a fresh symbol otherwise; the analyses divide
products of dims by cancelling the symbols both sides hold. This is the first piece of issue 49's
symbolic sizes: names with a meaning instead of fresh symbols, where the meaning is provable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kiln.errors import ShapeInferenceError
from kiln.ir.types import Dim

CLAMPED = ".min"  # "seq.min512": min(seq, 512) (a symbol name: letters, digits, '_' and '.')


def clamped(symbol: str, dim: int) -> str:
    """The dim ``min(symbol, dim)``: a slice ``[0:symbol]`` of a static dim of ``dim`` elements.
    One name per pair, so two such slices have the same dim; broadcast against ``symbol`` itself
    it is ``symbol`` (``kiln.ops.registry``'s broadcast). Inference at a binding computes it."""
    return f"{symbol}{CLAMPED}{dim}"


SCALED = ".x"  # "batch.x4": 4 * batch (heads folded into the batch: [batch, 4, seq] -> [batch*4, seq])


def scaled(symbol: str, factor: int) -> Dim:
    """The dim ``factor * symbol``: one name per product, so every value holding that product has
    the same dim; specialize binds it with its symbol (``bound``)."""
    base, times = scaled_parts(symbol) or (symbol, 1)
    factor *= times
    return 0 if factor == 0 else base if factor == 1 else f"{base}{SCALED}{factor}"


def scaled_parts(name: str) -> tuple[str, int] | None:
    """``(s, k)`` of a ``scaled(s, k)`` name, else None."""
    base, found, factor = name.rpartition(SCALED)
    return (base, int(factor)) if found and base and factor.isdigit() and int(factor) > 1 else None


FLOORED = ".d"  # "pad_d1.d4": pad_d1 // 4 (a window count: a padded plane's height over the window)


def floored(symbol: str, divisor: int) -> str:
    """The dim ``symbol // divisor`` (a size divided by a number that may not divide it): one name
    per quotient, so two places that compute it (Swin's window partition and its reverse) agree."""
    return symbol if divisor == 1 else f"{symbol}{FLOORED}{divisor}"


def floored_parts(name: str) -> tuple[str, int] | None:
    """``(s, k)`` of a ``floored(s, k)`` name, else None."""
    base, found, divisor = name.rpartition(FLOORED)
    return (base, int(divisor)) if found and base and divisor.isdigit() and int(divisor) > 1 else None


def bound(name: str, dims: Any) -> Dim:
    """``name``'s value under a binding of symbols to ints (``dims``: a mapping), or ``name``."""
    if name in dims:
        return dims[name]
    parts = scaled_parts(name)
    if parts is None and (quotient := floored_parts(name)) is not None:
        base = bound(quotient[0], dims)
        return base // quotient[1] if isinstance(base, int) else name
    base = bound(parts[0], dims) if parts is not None else None
    return parts[1] * base if parts is not None and isinstance(base, int) else name


def named(ctx: Any, product: Monomial) -> Dim:
    """A product of dims as a dim: an int, one symbol scaled, else a fresh symbol."""
    if not product.symbols or product.coefficient == 0:
        return product.coefficient
    if len(product.symbols) == 1:
        return scaled(product.symbols[0], product.coefficient)
    return ctx.fresh()


def clamped_base(name: str) -> str | None:
    """``s`` of a ``clamped(s, d)`` name, else None."""
    base, found, bound = name.rpartition(CLAMPED)
    return base if found and base and bound.isdigit() else None


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
    return named(ctx, Monomial.of(dims))


def quotient(ctx: Any, numerator: list[Dim], denominator: list[Dim]) -> Dim:
    """prod(numerator) / prod(denominator) with symbols cancelled where they match (a scaled
    symbol counts as its factor times the symbol)."""
    top, bottom = Monomial.of(numerator), Monomial.of(denominator)
    cancelled = top.divided(Monomial(1, bottom.symbols))
    if cancelled is None:
        return ctx.fresh()
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
    if divisor == 0 or static % divisor:
        return ctx.fresh()
    return named(ctx, Monomial(static // divisor, cancelled.symbols))


@dataclass(frozen=True)
class Monomial:
    """A product of dims: an int coefficient times symbols (sorted, repeats kept). What a
    sample-parallel dim holds per sample when a reshape merges it with others ([batch, seq, 64]
    -> [batch*seq, 64]: seq indices per sample)."""

    coefficient: int = 1
    symbols: tuple[str, ...] = ()

    @staticmethod
    def of(dims: tuple | list) -> Monomial:
        coefficient, symbols = 1, []
        for dim in dims:
            parts = scaled_parts(dim) if isinstance(dim, str) else None
            if isinstance(dim, int):
                coefficient *= dim
            elif parts is not None:
                coefficient *= parts[1]
                symbols.append(parts[0])
            else:
                symbols.append(dim)
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
