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

import itertools
from typing import Any

import numpy as np

from kiln.ir import dims as sizes


class SizedInt(int):
    """``int(self)`` at the binding; ``expr`` over the input dims at every binding."""

    expr: sizes.Expr
    at: dict[str, int] | None  # the symbols' values at this binding, where known (splits a product)

    def __new__(cls, value: int, expr: sizes.Expr, at: dict[str, int] | None = None) -> SizedInt:
        made = super().__new__(cls, int(value))
        made.expr, made.at = expr, at
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
        return SizedInt(-int(self), sizes.scale(self.expr, -1), self.at)

    def __pos__(self) -> Any:
        return self

    def __floordiv__(self, other: object) -> Any:
        if type(other) is int and other > 0:
            return SizedInt(int(self) // other, sizes.floordiv(self.expr, other), self.at)
        return int(self).__floordiv__(other)  # type: ignore[operator]

    def __mod__(self, other: object) -> Any:
        if type(other) is int and other > 0:
            return SizedInt(int(self) % other, sizes.mod(self.expr, other), self.at)
        return int(self).__mod__(other)  # type: ignore[operator]


def _combined(a: SizedInt, b: object, number: Any, expression: Any) -> Any:
    if isinstance(b, SizedInt):
        at = {**b.at, **a.at} if a.at and b.at else a.at or b.at
        return SizedInt(number(int(a), int(b)), expression(a.expr, b.expr), at)
    if type(b) is int or type(b) is bool:
        return SizedInt(number(int(a), int(b)), expression(a.expr, sizes.const(int(b))), a.at)
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
        return SizedInt(chosen, expr, next(v.at for v in values if isinstance(v, SizedInt)))  # type: ignore[arg-type]
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


def regrouped(source: tuple[Any, ...], target: list[Any]) -> list[Any]:
    """``target`` (a reshape's dims, numbers folded at this binding) with each dim that is a whole
    run of ``source``'s dims (their product equals it, run for run from the left) the product of
    that run, keeping its ``SizedInt`` expression: ``[8*4, 16, seq] -> [8, 4, 16, 64]`` gives the 64
    ``seq``. Where runs do not line up, ``target`` as it is (the run-time routes check each
    expression at every lowered binding, so a coincidence of numbers is caught, not trusted)."""
    if not any(isinstance(d, SizedInt) for d in source) or not all(isinstance(d, int) for d in (*source, *target)):
        return target
    if 0 in source or 0 in target:
        return target
    found, i, j = list(target), 0, 0
    while i < len(source) and j < len(target):
        run, group, have, want = [source[i]], [j], int(source[i]), int(target[j])
        i, j = i + 1, j + 1
        while have != want:
            if have < want and i < len(source):
                run.append(source[i])
                have, i = have * int(source[i]), i + 1
            elif want < have and j < len(target):
                group.append(j)
                want, j = want * int(target[j]), j + 1
            else:
                return target
        if any(isinstance(d, SizedInt) for d in run):
            _place(size_product(run), group, found)
    return found


def _place(whole: Any, group: list[int], found: list[Any]) -> None:
    """``found``'s dims ``group`` (numbers whose product is ``whole``) as the sizes they are:
    ``8*seq`` as ``[8, 64]`` (the 64 is ``8*seq`` over 8), ``batch*seq`` as ``[8, 64]`` (the
    symbols' values at this binding tell which is which)."""
    if len(group) == 1:
        found[group[0]] = whole
        return
    for j in group:
        others = int(np.prod([int(found[g]) for g in group if g != j]))
        quotient = sizes.divide(whole.expr, sizes.const(others))
        if quotient is not None and sizes.symbols(quotient):
            found[j] = SizedInt(int(found[j]), quotient, whole.at)
            return
    parts = _split(whole, [int(found[g]) for g in group])
    for g, part in zip(group, parts or ()):
        if sizes.symbols(part):
            found[g] = SizedInt(int(found[g]), part, whole.at)


def _split(whole: SizedInt, wanted: list[int]) -> list[sizes.Expr] | None:
    """``whole``'s one product of symbols (``64*batch*seq``) as factors, in order, whose values at
    the binding are ``wanted`` (``[batch, seq, 4, 16]``); None where none are."""
    expr, at = whole.expr, whole.at or {}
    if expr.constant or len(expr.terms) != 1:
        return None
    atoms, coefficient = expr.terms[0]
    if not all(isinstance(a, sizes.Sym) and a.name in at for a in atoms):
        return None
    left, parts = list(atoms), []
    for want in wanted:
        for chosen in _subsets(len(left)):
            value = int(np.prod([at[left[i].name] for i in chosen])) if chosen else 1
            if value and want % value == 0 and coefficient % (want // value) == 0:
                break
        else:
            return None
        factor = want // value
        part = sizes.const(factor)
        for i in chosen:
            part = sizes.mul(part, sizes.of_atom(left[i]))
        parts.append(part)
        coefficient //= factor
        left = [a for i, a in enumerate(left) if i not in chosen]
    return parts if not left and coefficient == 1 else None


def _subsets(n: int) -> list[tuple[int, ...]]:
    """Index subsets of ``n`` atoms, the largest first."""
    return [c for r in range(n, -1, -1) for c in itertools.combinations(range(n), r)]
