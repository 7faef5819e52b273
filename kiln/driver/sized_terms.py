"""A kernel's integers as the expressions the lowering computed them from (``kiln.ir.sized``).

The route whose kernels take the sizes at run time (``kiln.driver.spatial``) lowers its capacity
binding with each ranged dim a ``SizedInt``: every loop extent, stride, offset, product shape and
buffer length the lowering computes with Python's arithmetic from the shapes carries the
expression of the input dims it is (``(h+1)//2``, ``64*past+64``, ``min(seq,512)``). ``ExprSize``
is such an integer once checked: its expression gives the integer each other lowered binding
holds (the other bindings are lowered anyway, to prove the program's structure is the same at
every size). It prints as C over the dims vector's entries (``kiln_d<i>``) and as kernel IR.
An integer whose expression is lost (computed through numpy, a comparison, a table) or wrong at
a lowered binding is fitted from those bindings as before (``TermFitter``).

A floor division or remainder is printed with C's ``/`` and ``%``, which truncate: only where the
declared ranges bound its dividend at 0 or more (else the integer is fitted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import dims as sizes
from kiln.ir.sized import SizedInt
from kiln.ir.types import DType
from kiln.lower.kir import Binary, Const, run_time_dim


@dataclass(frozen=True)
class ExprSize:
    """An integer that is ``expr`` over the dims vector (``index``: each symbol's entry)."""

    expr: sizes.Expr
    index: tuple[tuple[str, int], ...]

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(sorted(i for _, i in self.index))

    def at(self, values: Any) -> int:
        vector = np.asarray(values, dtype=np.int64)
        found = sizes.substitute(self.expr, {name: int(vector[i]) for name, i in self.index})
        if not found.is_constant:
            raise ValueError(f"{sizes.text(self.expr)} holds a symbol the dims vector lacks")
        return found.constant

    def kir(self) -> Any:
        return _kir(self.expr, dict(self.index))

    def __str__(self) -> str:  # C (engine calls' fields print so)
        return _c(self.expr, dict(self.index))


def read(
    value: object, names: tuple[str, ...], ranges: dict[str, tuple[int, int]], vectors: np.ndarray, values: list[int]
) -> ExprSize | None:
    """``value``'s expression as an ``ExprSize`` when it gives ``values`` (the integer at each lowered
    binding, whose dims vectors are ``vectors``), None otherwise."""
    if not isinstance(value, SizedInt):
        return None
    position = {name: i for i, name in enumerate(names)}
    expr = sizes.simplified(value.expr, ranges)  # (min(2048, seq) is seq where seq <= 2048)
    symbols = sizes.symbols(expr)
    if not symbols or not symbols <= set(position) or not _printable(expr, ranges):
        return None
    size = ExprSize(expr, tuple(sorted((s, position[s]) for s in symbols)))
    try:
        if any(size.at(vector) != int(v) for vector, v in zip(vectors, values)):
            return None
    except ValueError:
        return None
    return size


def _printable(expr: sizes.Expr, ranges: dict[str, tuple[int, int]]) -> bool:
    """Every floor division and remainder's dividend is 0 or more at every size of the ranges."""
    for atoms, _ in expr.terms:
        for atom in atoms:
            if isinstance(atom, (sizes.Floor, sizes.Mod)):
                if sizes.bounds(atom.inner, ranges)[0] < 0 or not _printable(atom.inner, ranges):
                    return False
            elif isinstance(atom, sizes.Extreme) and not all(_printable(e, ranges) for e in atom.items):
                return False
    return True


def _kir(expr: sizes.Expr, index: dict[str, int]) -> Any:
    total: Any = None
    for atoms, coefficient in expr.terms:
        term: Any = None
        for atom in atoms:
            factor = _atom_kir(atom, index)
            term = factor if term is None else Binary("*", term, factor)
        if coefficient != 1:
            term = Binary("*", Const(coefficient, DType.INT64), term)
        total = term if total is None else Binary("+", total, term)
    if total is None:
        return Const(expr.constant, DType.INT64)
    return total if expr.constant == 0 else Binary("+", total, Const(expr.constant, DType.INT64))


def _atom_kir(atom: sizes.Atom, index: dict[str, int]) -> Any:
    if isinstance(atom, sizes.Sym):
        return run_time_dim(index[atom.name])
    if isinstance(atom, sizes.Floor):
        return Binary("/", _kir(atom.inner, index), Const(atom.k, DType.INT64))
    if isinstance(atom, sizes.Mod):
        return Binary("%", _kir(atom.inner, index), Const(atom.k, DType.INT64))
    found = _kir(atom.items[0], index)
    for item in atom.items[1:]:
        found = Binary("min" if atom.lowest else "max", found, _kir(item, index))
    return found


def _c(expr: sizes.Expr, index: dict[str, int]) -> str:
    parts = []
    for atoms, coefficient in expr.terms:
        parts.append(" * ".join([f"(int64_t){coefficient}", *(_atom_c(a, index) for a in atoms)]))
    if expr.constant or not parts:
        parts.append(f"(int64_t){expr.constant}")
    return "(" + " + ".join(parts) + ")"


def _atom_c(atom: sizes.Atom, index: dict[str, int]) -> str:
    if isinstance(atom, sizes.Sym):
        return run_time_dim(index[atom.name]).name
    if isinstance(atom, sizes.Floor):
        return f"({_c(atom.inner, index)} / {atom.k})"
    if isinstance(atom, sizes.Mod):
        return f"({_c(atom.inner, index)} % {atom.k})"
    found = _c(atom.items[0], index)
    for item in atom.items[1:]:
        other = _c(item, index)
        pick = "<" if atom.lowest else ">"
        found = f"({found} {pick} {other} ? {found} : {other})"
    return found
