"""Sizes that remember what they are: an int at one binding that keeps its expression.

A compile whose kernels take sizes at run time lowers the graph at a binding of its dims (the
capacity) and must know, for every integer the lowering wrote (a loop's extent, a product's
rows, a stride, a buffer's length), which expression of the input dims it is. ``SizedInt`` is
that integer: its value at the binding (every computation that branches on it, or hands it to
numpy, sees a plain number) and ``expr``, the ``kiln.ir.dims`` expression over the input dims'
symbols it equals wherever the same lowering runs. Arithmetic between sizes and numbers keeps
the expression (sums, products, differences, floor divisions and remainders by positive
numbers, ``min``/``max`` through ``smallest``/``largest``); anything else is a plain int again,
which the run-time route then fits from the lowerings at other bindings as before.

Specialization makes them (``kiln.passes.specialize`` with ``keep_symbols``); the lowering keeps
them where it computes with Python's operators; ``kiln.driver.spatial`` reads them, checked
against the other bindings' lowerings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir import dims as sizes


class SizedInt(int):
    """``int(self)`` at the binding; ``expr`` over the input dims at every binding."""

    expr: sizes.Expr

    def __new__(cls, value: int, expr: sizes.Expr) -> SizedInt:
        made = super().__new__(cls, int(value))
        made.expr = expr
        return made

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (the plan cache) as what it holds
        return (SizedInt, (int(self), self.expr))

    def __add__(self, other: object) -> Any:
        return _combined(self, other, int.__add__, sizes.add)

    __radd__ = __add__

    def __sub__(self, other: object) -> Any:
        return _combined(self, other, int.__sub__, sizes.sub)

    def __rsub__(self, other: object) -> Any:
        return _combined(self, other, lambda a, b: int.__sub__(b, a), lambda a, b: sizes.sub(b, a))

    def __mul__(self, other: object) -> Any:
        return _combined(self, other, int.__mul__, sizes.mul)

    __rmul__ = __mul__

    def __neg__(self) -> Any:
        return SizedInt(-int(self), sizes.scale(self.expr, -1))

    def __pos__(self) -> Any:
        return self

    def __floordiv__(self, other: object) -> Any:
        if type(other) is int and other > 0:
            return SizedInt(int(self) // other, sizes.floordiv(self.expr, other))
        return int(self).__floordiv__(other)  # type: ignore[operator]

    def __mod__(self, other: object) -> Any:
        if type(other) is int and other > 0:
            return SizedInt(int(self) % other, sizes.mod(self.expr, other))
        return int(self).__mod__(other)  # type: ignore[operator]


def _combined(a: SizedInt, b: object, number: Any, expression: Any) -> Any:
    if isinstance(b, SizedInt):
        return SizedInt(number(int(a), int(b)), expression(a.expr, b.expr))
    if type(b) is int or type(b) is bool:
        return SizedInt(number(int(a), int(b)), expression(a.expr, sizes.const(int(b))))
    return number(int(a), b) if isinstance(b, int) else NotImplemented


def expr_of(value: object) -> sizes.Expr | None:
    """The expression of a size (a number's is itself), None for anything else."""
    if isinstance(value, SizedInt):
        return value.expr
    if type(value) is int:
        return sizes.const(value)
    return None


def smallest(*values: int) -> int:
    """``min`` that keeps the expression (min of the operands' expressions)."""
    return _extreme(True, values)


def largest(*values: int) -> int:
    """``max`` that keeps the expression."""
    return _extreme(False, values)


def _extreme(lowest: bool, values: tuple[int, ...]) -> int:
    chosen = min(values) if lowest else max(values)
    found = [expr_of(v) for v in values]
    if any(isinstance(v, SizedInt) for v in values) and all(e is not None for e in found):
        expr = found[0]
        for other in found[1:]:
            expr = sizes.extreme(lowest, expr, other)  # type: ignore[arg-type]
        return SizedInt(chosen, expr)  # type: ignore[arg-type]
    return chosen


def size_product(dims: Any) -> int:
    """The product of sizes (1 for none), a ``SizedInt`` where a factor is one."""
    found = list(dims)
    if any(isinstance(d, SizedInt) for d in found):
        product: int = 1
        for d in found:
            product = d * product if isinstance(d, SizedInt) else product * int(d)
        return product
    return int(np.prod(found)) if found else 1
