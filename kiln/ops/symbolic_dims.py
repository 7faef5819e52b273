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
    """The product of dims: an int, a symbol when it is one symbol times 1s, else a fresh symbol."""
    static = dim_product([d for d in dims if isinstance(d, int)])
    symbols = [d for d in dims if isinstance(d, str)]
    if not symbols:
        return int(static or 0) if static is not None else ctx.fresh()
    if len(symbols) == 1 and static == 1:
        return symbols[0]
    return 0 if static == 0 else ctx.fresh()


def quotient(ctx: Any, numerator: list[Dim], denominator: list[Dim]) -> Dim:
    """prod(numerator) / prod(denominator) with symbols cancelled where they match."""
    numerator, denominator = list(numerator), list(denominator)
    for dim in [d for d in denominator if isinstance(d, str)]:
        if dim in numerator:
            numerator.remove(dim)
            denominator.remove(dim)
    if any(isinstance(d, str) for d in denominator):
        return ctx.fresh()
    divisor = dim_product(denominator)
    static = dim_product([d for d in numerator if isinstance(d, int)])
    symbols = [d for d in numerator if isinstance(d, str)]
    if divisor == 0 and static == 0 and not symbols:
        # NumPy and onnxruntime refuse this too: any size fits
        raise ShapeInferenceError("-1 is ambiguous: the tensor has 0 elements and the other dims multiply to 0")
    if divisor == 0 and static and not symbols:
        raise ShapeInferenceError(f"cannot reshape {static} elements: the other dims multiply to 0")
    if divisor is None or divisor == 0 or static is None:
        return ctx.fresh()
    if static % divisor:
        if symbols:
            return ctx.fresh()
        raise ShapeInferenceError(f"cannot reshape: {static} elements into a multiple of {divisor}")
    rest = static // divisor
    if not symbols:
        return rest
    if len(symbols) == 1 and rest == 1:
        return symbols[0]
    return ctx.fresh()


@dataclass(frozen=True)
class Monomial:
    """A product of dims: an int coefficient times symbols (sorted, repeats kept). What a
    sample-parallel dim holds per sample when a reshape merges it with others ([batch, seq, 64]
    -> [batch*seq, 64]: seq indices per sample)."""

    coefficient: int = 1
    symbols: tuple[str, ...] = ()

    @staticmethod
    def of(dims: tuple | list) -> Monomial:
        ints = [d for d in dims if isinstance(d, int)]
        return Monomial(math.prod(ints), tuple(sorted(d for d in dims if isinstance(d, str))))

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
