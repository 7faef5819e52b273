"""Symbolic sizes as expressions: what a dim that is not a number means.

A dim of a tensor type is an int or a string; the string is the canonical text of an ``Expr``, a
quasi-affine integer expression over named sizes (``batch``, ``seq``, ``height``, or a fresh
symbol inference made): sums of products of atoms times integers, where an atom is a symbol, a
floor division or remainder of an expression by a positive integer, or the min/max of
expressions. Two values computed as the same size have the same dim, however and wherever it was
computed — Swin's window count ``(height//2+(4-height//2%4)%4)//4`` is one name whether the
partition or the reverse computed it — so analyses compare dims by name and cancel factors
(``4*batch*seq`` over ``seq``), and ``specialize`` evaluates any dim at a binding.

Canonical form: terms sorted by their atoms' texts, atoms of a product sorted, no zero
coefficients; ``e//k`` and ``e%k`` split off the multiples of ``k`` (``(4*a+b+5)//4`` is
``a+1+(b+1)//4``), and vanish where the bounds prove them (``h%4`` is ``h`` below 4); min/max
drop the operands the bounds order. Bounds come from declared ranges (a symbol with none is a size:
0 or more). Text (``str(expr)``; ``parse`` reads it back, and the suffix names older kiln wrote,
``batch.x4``, ``h.d4``, ``seq.min512``): ``4*batch*seq``, ``h//4``, ``(h+3)//4``, ``min(seq,512)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

Ranges = Mapping[str, tuple[int, int]]
NO_RANGES: dict[str, tuple[int, int]] = {}


@dataclass(frozen=True)
class Sym:
    name: str


@dataclass(frozen=True)
class Floor:
    """``inner // k`` (k > 1; rounds toward minus infinity, as a size computation does)."""

    inner: Expr
    k: int


@dataclass(frozen=True)
class Mod:
    """``inner % k`` (k > 1; 0..k-1)."""

    inner: Expr
    k: int


@dataclass(frozen=True)
class Extreme:
    """``min(items)`` (lowest) or ``max(items)``: two or more operands, sorted by text."""

    lowest: bool
    items: tuple[Expr, ...]


Atom = Sym | Floor | Mod | Extreme
Monomial = tuple[Atom, ...]  # sorted by text; repeats kept (batch*batch)


@dataclass(frozen=True)
class Expr:
    terms: tuple[tuple[Monomial, int], ...] = ()  # sorted by the monomial's text; no zero coefficient
    constant: int = 0

    def __str__(self) -> str:
        return text(self)

    @property
    def is_constant(self) -> bool:
        return not self.terms

    @property
    def symbol(self) -> str | None:
        """The symbol's name if this is one bare symbol."""
        if self.constant or len(self.terms) != 1:
            return None
        atoms, coefficient = self.terms[0]
        return atoms[0].name if coefficient == 1 and len(atoms) == 1 and isinstance(atoms[0], Sym) else None

    @property
    def monomial(self) -> tuple[int, Monomial] | None:
        """``(coefficient, atoms)`` if this is one product (a number is one with no atoms)."""
        if not self.terms:
            return self.constant, ()
        if self.constant or len(self.terms) != 1:
            return None
        atoms, coefficient = self.terms[0]
        return coefficient, atoms

    @property
    def atom(self) -> Atom | None:
        """The atom if this is exactly one (coefficient 1, nothing added)."""
        single = self.monomial
        return single[1][0] if single is not None and single[0] == 1 and len(single[1]) == 1 else None


# -- construction ----------------------------------------------------------------------------------


def const(value: int) -> Expr:
    return Expr((), int(value))


def sym(name: str) -> Expr:
    return Expr((((Sym(name),), 1),))


def of_atom(atom: Atom) -> Expr:
    return Expr((((atom,), 1),))


def _made(terms: dict[Monomial, int], constant: int) -> Expr:
    kept = sorted(((m, c) for m, c in terms.items() if c), key=lambda mc: _monomial_key(mc[0]))
    return Expr(tuple(kept), constant)


def expanded(expr: Expr) -> Expr:
    """``expr`` with each ``c*(e//k)`` where ``k`` divides ``c`` written ``(c/k)*(e-e%k)``: the
    form ``divide`` compares in (``4*(hp//4)`` is ``hp`` where ``hp%4`` is 0). Not the canonical
    form: a remainder sees multiples of its divisor in ``4*(h//4)``, not in ``h-h%4``."""
    result = const(expr.constant)
    for atoms, coefficient in expr.terms:
        at = next((i for i, a in enumerate(atoms) if isinstance(a, Floor) and coefficient % a.k == 0), None)
        if at is None:
            result = add(result, Expr(((atoms, coefficient),)))
            continue
        floor = atoms[at]
        assert isinstance(floor, Floor)
        rounded = sub(floor.inner, mod(floor.inner, floor.k))
        rest = Expr((((*atoms[:at], *atoms[at + 1 :]), coefficient // floor.k),)) if len(atoms) > 1 else None
        result = add(
            result, expanded(mul(rounded, rest) if rest is not None else scale(rounded, coefficient // floor.k))
        )
    return result


def add(*exprs: Expr) -> Expr:
    terms: dict[Monomial, int] = {}
    constant = 0
    for expr in exprs:
        constant += expr.constant
        for atoms, coefficient in expr.terms:
            terms[atoms] = terms.get(atoms, 0) + coefficient
    return _made(terms, constant)


def scale(expr: Expr, factor: int) -> Expr:
    if factor == 0:
        return const(0)
    return Expr(tuple((m, c * factor) for m, c in expr.terms), expr.constant * factor)


def sub(a: Expr, b: Expr) -> Expr:
    return add(a, scale(b, -1))


def mul(a: Expr, b: Expr) -> Expr:
    terms: dict[Monomial, int] = {}
    left = [*a.terms, ((), a.constant)]
    right = [*b.terms, ((), b.constant)]
    for atoms_a, ca in left:
        for atoms_b, cb in right:
            if ca and cb:
                atoms = tuple(sorted(atoms_a + atoms_b, key=atom_text))
                terms[atoms] = terms.get(atoms, 0) + ca * cb
    constant = terms.pop((), 0)
    return _made(terms, constant)


def floordiv(expr: Expr, k: int, ranges: Ranges = NO_RANGES) -> Expr:
    """``expr // k`` for k > 0, its multiples of k split off (exact where they are all of it)."""
    if k <= 0:
        raise ValueError(f"a floor division of a size by {k}: kiln divides sizes by positive numbers only")
    if k == 1:
        return expr
    common = common_factor(expr, k)
    if common > 1:  # (g*x) // (g*m) == x // m
        return floordiv(divided_exactly(expr, common), k // common, ranges)
    whole = {m: c // k for m, c in expr.terms if c % k == 0}
    rest = _made({m: c for m, c in expr.terms if c % k}, expr.constant % k)
    quotient = _made(whole, expr.constant // k)
    if rest.is_constant:
        return add(quotient, const(rest.constant // k))
    low, high = bounds(rest, ranges)
    if math.isfinite(low) and math.isfinite(high) and low // k == high // k:  # one quotient in the ranges
        return add(quotient, const(int(low // k)))
    nested = rest.atom
    if isinstance(nested, Floor):  # (e // j) // k == e // (j*k)
        return add(quotient, of_atom(Floor(nested.inner, nested.k * k)))
    return add(quotient, of_atom(Floor(rest, k)))


def mod(expr: Expr, k: int, ranges: Ranges = NO_RANGES) -> Expr:
    """``expr % k`` for k > 0 (0..k-1): multiples of k dropped; the rest itself where its bounds
    are already 0..k-1."""
    if k <= 0:
        raise ValueError(f"a remainder of a size by {k}: kiln divides sizes by positive numbers only")
    if k == 1:
        return const(0)
    common = common_factor(expr, k)
    if common > 1:  # (g*x) % (g*m) == g * (x % m)
        return scale(mod(divided_exactly(expr, common), k // common, ranges), common)
    expr = _reduced(expr, k)
    rest = _made({m: c % k for m, c in expr.terms}, expr.constant % k)
    if rest.is_constant:
        return const(rest.constant % k)
    low, high = bounds(rest, ranges)
    if math.isfinite(low) and math.isfinite(high) and low // k == high // k:  # one quotient in the ranges
        return add(rest, const(-k * int(low // k)))
    nested = rest.atom
    if isinstance(nested, Mod) and nested.k % k == 0:  # (e % jk) % k == e % k
        return mod(nested.inner, k, ranges)
    return of_atom(Mod(rest, k))


def common_factor(expr: Expr, k: int) -> int:
    """The greatest common divisor of ``k`` and every integer of ``expr``."""
    return math.gcd(k, expr.constant, *(c for _, c in expr.terms))


def divided_exactly(expr: Expr, factor: int) -> Expr:
    """``expr / factor`` where ``factor`` divides every integer of it (``common_factor``)."""
    return Expr(tuple((m, c // factor) for m, c in expr.terms), expr.constant // factor)


def _reduced(expr: Expr, k: int) -> Expr:
    """``expr`` with each remainder by a multiple of ``k`` replaced by what it divides (the same
    value modulo ``k``: ``(h%8)%4`` is ``h%4``, ``(h+(3*(h%4))%4)%4`` is ``(4*h)%4``, 0)."""
    changed = False
    result = const(expr.constant)
    for atoms, coefficient in expr.terms:
        term = const(coefficient)
        for atom in atoms:
            if isinstance(atom, Mod) and atom.k % k == 0:
                term, changed = mul(term, _reduced(atom.inner, k)), True
            else:
                term = mul(term, of_atom(atom))
        result = add(result, term)
    return result if changed else expr


def divide(top: Expr, bottom: Expr) -> Expr | None:
    """``top / bottom`` where it is exact for every value of the symbols: a quotient that is one
    product (``16*batch*hp*wp`` over ``16*hp*wp``, whatever sums those are), else None."""
    if bottom.is_constant:
        k = bottom.constant
        return divided_exactly(top, k) if k and common_factor(top, k) == abs(k) else None
    whole = expanded(top)
    for numerator, denominator in ((top, bottom), (whole, expanded(bottom))):
        if denominator.is_constant:
            return divide(numerator, denominator)
        anchor_atoms, anchor = denominator.terms[0]
        for atoms, coefficient in numerator.terms:
            left = list(atoms)
            if coefficient % anchor or any(a not in left or left.remove(a) for a in anchor_atoms):  # type: ignore[func-returns-value]
                continue
            candidate = Expr(((tuple(left), coefficient // anchor),)) if left else const(coefficient // anchor)
            if expanded(mul(bottom, candidate)) == whole:
                return candidate
    return None


def extreme(lowest: bool, a: Expr, b: Expr, ranges: Ranges = NO_RANGES) -> Expr:
    """``min(a, b)`` (lowest) or ``max(a, b)``; one operand where the bounds order them."""
    items: list[Expr] = []
    for expr in (a, b):
        nested = expr.atom
        items.extend(nested.items if isinstance(nested, Extreme) and nested.lowest == lowest else [expr])
    kept: list[Expr] = []
    for item in sorted(set(items), key=text):
        if not any(_ordered(other, item, lowest, ranges) for other in kept):
            kept = [other for other in kept if not _ordered(item, other, lowest, ranges)] + [item]
    if len(kept) == 1:
        return kept[0]
    return of_atom(Extreme(lowest, tuple(sorted(kept, key=text))))


def _ordered(first: Expr, second: Expr, lowest: bool, ranges: Ranges) -> bool:
    """Whether ``first`` makes ``second`` redundant: first <= second for a min, >= for a max."""
    low, high = bounds(sub(second, first), ranges)
    return low >= 0 if lowest else high <= 0


# -- bounds and values -------------------------------------------------------------------------------


def bounds(expr: Expr, ranges: Ranges = NO_RANGES) -> tuple[float, float]:
    """The interval ``expr`` lies in when every symbol lies in its range (a symbol with none: a
    size, 0 or more); infinite ends as ``math.inf``."""
    low = high = float(expr.constant)
    for atoms, coefficient in expr.terms:
        lo, hi = 1.0, 1.0
        for atom in atoms:
            lo, hi = _times((lo, hi), _atom_bounds(atom, ranges))
        lo, hi = _times((lo, hi), (coefficient, coefficient))
        low, high = low + lo, high + hi
    return low, high


def _times(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    products = [_product(x, y) for x in a for y in b]
    return min(products), max(products)


def _product(x: float, y: float) -> float:
    return 0.0 if x == 0 or y == 0 else x * y  # (0 times an unbounded end is 0 here)


def _atom_bounds(atom: Atom, ranges: Ranges) -> tuple[float, float]:
    if isinstance(atom, Sym):
        low, high = ranges.get(atom.name, (0, math.inf))
        return float(low), float(high)
    if isinstance(atom, Floor):
        low, high = bounds(atom.inner, ranges)
        return (math.floor(low / atom.k) if low > -math.inf else low), (
            math.floor(high / atom.k) if high < math.inf else high
        )
    if isinstance(atom, Mod):
        return 0.0, float(atom.k - 1)
    found = [bounds(item, ranges) for item in atom.items]
    pick = min if atom.lowest else max
    return pick(lo for lo, _ in found), pick(hi for _, hi in found)


def substitute(expr: Expr, values: Mapping[str, int | Expr], ranges: Ranges = NO_RANGES) -> Expr:
    """``expr`` with symbols replaced (by numbers or expressions), simplified again (with ``ranges``:
    a min/max the ranges order, a floor division or remainder they bound, reduced)."""
    result = const(expr.constant)
    for atoms, coefficient in expr.terms:
        term = const(coefficient)
        for atom in atoms:
            term = mul(term, _substitute_atom(atom, values, ranges))
        result = add(result, term)
    return result


def simplified(expr: Expr, ranges: Ranges) -> Expr:
    """``expr`` reduced where ``ranges`` decide it: ``min(2048, seq)`` is ``seq`` for seq in 1..64."""
    return substitute(expr, {}, ranges)


def _substitute_atom(atom: Atom, values: Mapping[str, int | Expr], ranges: Ranges) -> Expr:
    if isinstance(atom, Sym):
        value = values.get(atom.name)
        return of_atom(atom) if value is None else value if isinstance(value, Expr) else const(int(value))
    if isinstance(atom, Floor):
        return floordiv(substitute(atom.inner, values, ranges), atom.k, ranges)
    if isinstance(atom, Mod):
        return mod(substitute(atom.inner, values, ranges), atom.k, ranges)
    first, *rest = (substitute(item, values, ranges) for item in atom.items)
    for item in rest:
        first = extreme(atom.lowest, first, item, ranges)
    return first


def symbols(expr: Expr) -> set[str]:
    """The symbols ``expr`` reads."""
    found: set[str] = set()
    for atoms, _ in expr.terms:
        for atom in atoms:
            if isinstance(atom, Sym):
                found.add(atom.name)
            elif isinstance(atom, (Floor, Mod)):
                found |= symbols(atom.inner)
            else:
                for item in atom.items:
                    found |= symbols(item)
    return found


# -- text ------------------------------------------------------------------------------------------


@lru_cache(maxsize=65536)
def atom_text(atom: Atom) -> str:
    if isinstance(atom, Sym):
        return atom.name
    if isinstance(atom, (Floor, Mod)):
        inner = text(atom.inner)
        operand = inner if atom.inner.symbol is not None else f"({inner})"
        return f"{operand}{'//' if isinstance(atom, Floor) else '%'}{atom.k}"
    return f"{'min' if atom.lowest else 'max'}({','.join(text(item) for item in atom.items)})"


def _monomial_key(atoms: Monomial) -> tuple[str, ...]:
    return tuple(atom_text(a) for a in atoms)


def _term_text(atoms: Monomial, coefficient: int) -> str:
    alone = len(atoms) == 1 and coefficient == 1
    parts = [atom_text(a) if alone or isinstance(a, (Sym, Extreme)) else f"({atom_text(a)})" for a in atoms]
    sign = "-" if coefficient < 0 else ""
    number = [] if abs(coefficient) == 1 else [str(abs(coefficient))]
    return sign + "*".join(number + parts)


@lru_cache(maxsize=65536)
def text(expr: Expr) -> str:
    """The canonical text (``parse`` reads it back to the same expression)."""
    pieces = [_term_text(atoms, c) for atoms, c in expr.terms]
    if expr.constant or not pieces:
        pieces.append(str(expr.constant))
    out = pieces[0]
    for piece in pieces[1:]:
        out += piece if piece.startswith("-") else "+" + piece
    return out


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)|(//|[-+*%(),]))")
_SUFFIX = re.compile(r"\.(x|d|min)(\d+)")


class DimSyntaxError(ValueError):
    """Text that is not a dim expression."""


LONGEST = 4096  # characters of a dim's text (kiln names none longer than NAMEABLE: a longer one is no dim)
NAMEABLE = 512  # characters: an expression with a longer text names no dim (inference makes a fresh symbol)


def nameable(expr: Expr) -> bool:
    """Whether ``expr`` may name a dim: short enough to read back (a long chain of strided windows
    or a product of sums multiplied again starts over from a fresh symbol instead)."""
    return len(text(expr)) <= NAMEABLE


@lru_cache(maxsize=65536)
def parse(source: str) -> Expr:
    """The expression a dim's text names (canonical or not; DimSyntaxError if it names none)."""
    if len(source) > LONGEST or source.count("(") > LONGEST // 8:
        raise DimSyntaxError(
            f"a dim of {len(source)} characters, {source.count('(')} parentheses: too deep to be a size"
        )
    try:
        return _parsed(source)
    except RecursionError:
        raise DimSyntaxError(f"{source[:60]!r}...: too deep to be a size") from None


def _parsed(source: str) -> Expr:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(source):
        match = _TOKEN.match(source, position)
        if match is None or match.end() == position:
            if source[position:].strip() == "":
                break
            raise DimSyntaxError(f"{source!r} is not a dim: unexpected {source[position]!r}")
        number, name, op = match.groups()
        tokens.append(("n", number) if number else ("s", name) if name else ("o", op))
        position = match.end()
    reader = _Reader(source, tokens)
    expr = reader.sum()
    if reader.index != len(tokens):
        raise DimSyntaxError(f"{source!r} is not a dim: unexpected {tokens[reader.index][1]!r}")
    return expr


class _Reader:
    def __init__(self, source: str, tokens: list[tuple[str, str]]) -> None:
        self.source, self.tokens, self.index = source, tokens, 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.index] if self.index < len(self.tokens) else ("", "")

    def take(self, kind: str, value: str | None = None) -> str:
        got_kind, got = self.peek()
        if got_kind != kind or (value is not None and got != value):
            raise DimSyntaxError(f"{self.source!r} is not a dim: expected {value or kind!r}, got {got or 'the end'!r}")
        self.index += 1
        return got

    def sum(self) -> Expr:
        negative = self.peek() == ("o", "-")
        if negative:
            self.index += 1
        total = self.product()
        total = scale(total, -1) if negative else total
        while self.peek() in (("o", "+"), ("o", "-")):
            op = self.take("o")
            term = self.product()
            total = add(total, term) if op == "+" else sub(total, term)
        return total

    def product(self) -> Expr:
        result = self.primary()
        while self.peek() in (("o", "*"), ("o", "//"), ("o", "%")):
            op = self.take("o")
            if op == "*":
                result = mul(result, self.primary())
            else:
                k = int(self.take("n"))
                if k <= 0:
                    raise DimSyntaxError(f"{self.source!r} is not a dim: division by {k}")
                result = floordiv(result, k) if op == "//" else mod(result, k)
        return result

    def primary(self) -> Expr:
        kind, value = self.peek()
        if kind == "n":
            self.index += 1
            return const(int(value))
        if kind == "o" and value == "-":  # (a negative factor: ``4 + -1*x``)
            self.index += 1
            return scale(self.primary(), -1)
        if kind == "o" and value == "(":
            self.index += 1
            inner = self.sum()
            self.take("o", ")")
            return inner
        if kind == "s" and value in ("min", "max") and self.tokens[self.index + 1 : self.index + 2] == [("o", "(")]:
            self.index += 2
            result = self.sum()
            while self.peek() == ("o", ","):
                self.index += 1
                result = extreme(value == "min", result, self.sum())
            self.take("o", ")")
            return result
        if kind == "s":
            self.index += 1
            return _legacy(value)
        raise DimSyntaxError(f"{self.source!r} is not a dim: unexpected {value or 'end'!r}")


def _legacy(name: str) -> Expr:
    """A symbol, or a name with the suffixes older kiln wrote: ``s.x4`` 4*s, ``s.d4`` s//4,
    ``s.min512`` min(s, 512), applied left to right."""
    base, _, rest = name.partition(".")
    expr = sym(base)
    if not rest:
        return expr
    suffixes = "." + rest
    position = 0
    for match in _SUFFIX.finditer(suffixes):
        if match.start() != position:
            break
        op, k = match.group(1), int(match.group(2))
        if op == "x":
            expr = scale(expr, k)
        elif op == "d" and k > 0:
            expr = floordiv(expr, k)
        elif op == "min":
            expr = extreme(True, expr, const(k))
        else:
            break
        position = match.end()
    if position != len(suffixes):
        return sym(name)  # (no meaning kiln knows: one symbol)
    return expr


def canonical(source: str) -> str | int:
    """A dim's canonical text (an int where it is a number)."""
    expr = parse(source)
    return expr.constant if expr.is_constant else text(expr)


def is_dim_text(source: str) -> bool:
    try:
        parse(source)
    except (DimSyntaxError, RecursionError):
        return False
    return True
