"""Which loops of a loop nest may run as parallel GPU lanes.

A kernel-IR loop nest says what is computed, in order; its schedule says which loop a CPU spreads
over cores, but not which other loops are independent. The GPU renderer maps the outermost loops of
a nest to lanes (one lane per iteration, all at once) and runs the rest in order inside each lane.
That is only correct when no two iterations of the lane loops touch the same element of a buffer
the nest writes. ``lane_depth`` proves it from the index expressions: for every buffer written,
each access must be affine in the loop indices with the same lane coefficients, and the lane
coefficients must keep iterations' footprints apart (a mixed radix whose digits are wider than what
the inner loops reach). Anything it cannot prove (a data-dependent index, a scalar carried across
iterations, inner bounds that depend on a lane) gives fewer lanes, down to none: then the nest runs
in one sequential program, slow but right.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.lower.kir import (
    Assign,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    Index,
    Let,
    Load,
    Scalar,
    Stmt,
    Store,
    Unary,
    postorder,
    walk_statements,
)

Affine = tuple[dict[str, int], int]  # coefficient per loop index, constant


def affine(e: Expr) -> Affine | None:
    """``e`` as sum(coefficient * index) + constant, or None when it is not (a load, a scalar, a
    division)."""
    if isinstance(e, Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            return None
        return {}, int(e.value)
    if isinstance(e, Index):
        return {e.name: 1}, 0
    if isinstance(e, Cast) and not e.dtype.is_float:
        return affine(e.a)
    if isinstance(e, Unary) and e.op == "-":
        inner = affine(e.a)
        return None if inner is None else ({k: -v for k, v in inner[0].items()}, -inner[1])
    if isinstance(e, Binary) and e.op in ("+", "-", "*"):
        a, b = affine(e.a), affine(e.b)
        if a is None or b is None:
            return None
        if e.op == "*":
            if a[0] and b[0]:
                return None
            (terms, const), factor = (a, b[1]) if not b[0] else (b, a[1])
            return {k: v * factor for k, v in terms.items()}, const * factor
        sign = 1 if e.op == "+" else -1
        terms = dict(a[0])
        for k, v in b[0].items():
            terms[k] = terms.get(k, 0) + sign * v
        return terms, a[1] + sign * b[1]
    return None


@dataclass
class _Access:
    index: Expr
    inner: dict[str, tuple[int, int] | None]  # inner loop index -> its range (None: unknown)


def _collect(body: list[Stmt], ranges: dict[str, tuple[int, int] | None], found: dict, state: dict) -> None:
    """Every access to a buffer in ``body`` with the inner loops' ranges in scope; scalars
    defined and assigned; loop bounds (for the lane check)."""

    def visit(e: Expr) -> None:
        for node in postorder(e):
            if isinstance(node, Load):
                found.setdefault(node.buffer, {"loads": [], "stores": []})["loads"].append(
                    _Access(node.index, dict(ranges))
                )
            elif isinstance(node, Scalar):
                state["used"].add(node.name)

    for stmt in body:
        if isinstance(stmt, For):
            bounds = []
            for bound in (stmt.start, stmt.extent):
                if isinstance(bound, int):
                    bounds.append(bound)
                else:
                    visit(bound)
                    state["bounds"].append(bound)
                    folded = affine(bound)
                    bounds.append(folded[1] if folded is not None and not folded[0] else None)
            lo, hi = bounds
            inner = dict(ranges)
            inner[stmt.index.name] = None if lo is None or hi is None else (lo, max(lo, hi - 1))
            _collect(stmt.body, inner, found, state)
        elif isinstance(stmt, If):
            visit(stmt.cond)
            _collect(stmt.body, ranges, found, state)
        elif isinstance(stmt, Let):
            state["defined"].add(stmt.scalar.name)
            visit(stmt.value)
        elif isinstance(stmt, Assign):
            state["assigned"].add(stmt.scalar.name)
            visit(stmt.value)
        elif isinstance(stmt, Store):
            visit(stmt.index)
            visit(stmt.value)
            entry = found.setdefault(stmt.buffer, {"loads": [], "stores": []})
            entry["stores"].append(_Access(stmt.index, dict(ranges)))
            entry.setdefault("values", []).append(stmt.value)
        else:  # an engine call inside a loop nest: nothing is proven about it
            state["opaque"] = True


def perfect_nest(stmt: For) -> tuple[list[For], list[Stmt]]:
    """The loops of ``stmt``'s perfect nest (each loop's body exactly one loop) and the body inside."""
    nest = [stmt]
    while len(nest[-1].body) == 1 and isinstance(nest[-1].body[0], For):
        nest.append(nest[-1].body[0])  # type: ignore[arg-type]
    return nest, nest[-1].body


def lane_depth(stmt: For, flags: frozenset[Buffer] = frozenset()) -> int:
    """How many of the outermost loops of ``stmt``'s perfect nest may run as parallel lanes (0:
    none). ``flags``: buffers only ever set to constants (the status word: any lane may set it)."""
    nest, _ = perfect_nest(stmt)
    for depth in range(len(nest), 0, -1):
        if _independent(nest, depth, flags):
            return depth
    return 0


def _constant_extent(loop: For) -> int | None:
    if isinstance(loop.start, int) and isinstance(loop.extent, int) and loop.start == 0:
        return loop.extent
    return None


def _independent(nest: list[For], depth: int, flags: frozenset[Buffer]) -> bool:
    lanes = nest[:depth]
    extents = [_constant_extent(loop) for loop in lanes]
    if any(e is None for e in extents):
        return False
    names = [loop.index.name for loop in lanes]
    found: dict = {}
    state: dict = {"defined": set(), "assigned": set(), "used": set(), "bounds": [], "opaque": False}
    _collect(lanes[-1].body, {}, found, state)
    if state["opaque"]:
        return False
    if state["assigned"] - state["defined"]:
        return False  # a scalar carried from outside the nest across iterations
    for bound in state["bounds"]:  # inner loop bounds must be the same for every lane
        if any(isinstance(n, (Index, Scalar, Load)) and getattr(n, "name", None) in names for n in postorder(bound)):
            return False
        if any(isinstance(n, (Scalar, Load)) for n in postorder(bound)):
            return False
    for buffer, accesses in found.items():
        if not accesses["stores"]:
            continue
        if buffer in flags and not accesses["loads"] and all(isinstance(v, Const) for v in accesses["values"]):
            continue
        if not _disjoint(accesses["stores"] + accesses["loads"], names, extents):  # type: ignore[arg-type]
            return False
    return True


def _disjoint(
    accesses: list[_Access], names: list[str], extents: list[int], fixed: frozenset[str] = frozenset()
) -> bool:
    """Whether the lane iterations' footprints in one buffer are disjoint, every access through the
    same lane coefficients. ``fixed``: indices of enclosing loops (one value for all the accesses
    compared): every access must use them alike."""
    forms = []
    for access in accesses:
        found = affine(access.index)
        if found is None:
            return False
        terms, const = found
        for name in terms:
            if name not in names and name not in fixed and access.inner.get(name) is None:
                return False  # an index of no known range (or not a loop of this nest)
        forms.append((terms, const, access.inner))
    lanes = [{n: terms.get(n, 0) for n in names} for terms, _, _ in forms]
    outer = [{n: terms.get(n, 0) for n in fixed} for terms, _, _ in forms]
    if any(lane != lanes[0] for lane in lanes) or any(o != outer[0] for o in outer):
        return False
    return _injective(forms, names, extents, fixed) or _lanes_dominate(forms, names, extents, fixed)


def _digits_clear(digits: list[tuple[int, int]], reach: int) -> bool:
    """Whether sum(step * digit) over digits (step, extent) is one-to-one even when ``reach`` is
    added: each step, smallest first, clears everything the smaller ones can reach."""
    for step, extent in sorted(digits):
        if extent <= 1:
            continue
        if step <= reach:
            return False
        reach += step * (extent - 1)
    return True


def _injective(forms: list, names: list[str], extents: list[int], fixed: frozenset[str]) -> bool:
    """Every access has the same coefficients on every index (inner loops too): the map from
    (lanes, inner iterations, constant offset) to addresses is a mixed radix, so one-to-one."""
    terms0 = {k: v for k, v in forms[0][0].items() if v and k not in fixed}
    spans: dict[str, tuple[int, int]] = {}
    constants = []
    for terms, const, inner in forms:
        if {k: v for k, v in terms.items() if v and k not in fixed} != terms0:
            return False
        for name, coefficient in terms0.items():
            if name in names:
                continue
            lo, hi = inner[name]
            if name in spans and spans[name] != (lo, hi):
                return False
            spans[name] = (lo, hi)
            const += coefficient * lo
        constants.append(const)
    digits = [(abs(terms0.get(n, 0)), e) for n, e in zip(names, extents)]
    if any(step == 0 and e > 1 for step, e in digits):
        return False
    digits += [(abs(terms0[name]), hi - lo + 1) for name, (lo, hi) in spans.items()]
    if any(c < 0 for name, c in terms0.items() if name not in names):
        return False  # a descending inner digit: the constant offsets no longer bound the spread
    return _digits_clear(digits, max(constants) - min(constants))


def _lanes_dominate(forms: list, names: list[str], extents: list[int], fixed: frozenset[str]) -> bool:
    """The lane digits' steps clear everything the inner loops and offsets reach."""
    coefficients = {n: forms[0][0].get(n, 0) for n in names}
    lo, hi = None, None
    for terms, const, inner in forms:
        low = high = const
        for name, coefficient in terms.items():
            if name in names or name in fixed:
                continue
            span = inner[name]
            a, b = coefficient * span[0], coefficient * span[1]
            low, high = low + min(a, b), high + max(a, b)
        lo = low if lo is None else min(lo, low)
        hi = high if hi is None else max(hi, high)
    assert lo is not None and hi is not None
    if any(coefficients[n] == 0 and e > 1 for n, e in zip(names, extents)):
        return False
    return _digits_clear([(abs(coefficients[n]), e) for n, e in zip(names, extents)], hi - lo)


def vector_loop(loop: For, fixed: frozenset[str]) -> dict[str, str] | None:
    """Whether a sequential loop's iterations may run at once as one vector (a tile axis): its body
    only defines its own scalars, stores to places no other iteration touches, and folds values into
    scalars from outside only by an associative update (``reductions``: scalar -> its operator, one
    of ``REDUCTIONS``). None when not; ``fixed``: the indices of the loops around it."""
    if not isinstance(loop.start, int) or not isinstance(loop.extent, int) or loop.extent - loop.start < 2:
        return None
    name = loop.index.name
    reductions: dict[str, str] = {}
    defined: set[str] = set()
    found: dict = {}
    state: dict = {"defined": set(), "assigned": set(), "used": set(), "bounds": [], "opaque": False}

    def nested(body: list[Stmt]) -> bool:
        return any(isinstance(s, For) or (isinstance(s, If) and nested(s.body)) for s in body)

    if nested(loop.body):
        return None
    for stmt in loop.body:
        if isinstance(stmt, Let):
            defined.add(stmt.scalar.name)
        elif isinstance(stmt, Assign) and stmt.scalar.name not in defined:
            kind = reduction_of(stmt)
            if kind is None or stmt.scalar.name in reductions:
                return None
            reductions[stmt.scalar.name] = kind
    _collect(loop.body, {name: (loop.start, loop.extent - 1)}, found, state)
    if state["opaque"] or state["bounds"]:
        return None
    if (state["assigned"] - state["defined"]) - set(reductions):
        return None  # an outside scalar assigned otherwise (under a condition, say)
    for scalar in reductions:  # read only by its own update
        uses = sum(1 for n in _scalar_reads(loop.body) if n == scalar)
        if uses != 1:
            return None
    for accesses in found.values():
        if accesses["stores"] and not _disjoint(
            accesses["stores"] + accesses["loads"], [name], [loop.extent - loop.start], fixed
        ):
            return None
    return reductions


REDUCTIONS = ("+", "*", "max", "min")


def accesses(body: list[Stmt]) -> tuple[set[Buffer], set[Buffer]]:
    """(the buffers ``body`` loads, the buffers it stores), nested statements included."""
    loads: set[Buffer] = set()
    stores: set[Buffer] = set()

    def visit(e: Expr) -> None:
        loads.update(n.buffer for n in postorder(e) if isinstance(n, Load))

    walk_statements(body, visit, lambda store: stores.add(store.buffer))
    return loads, stores


def reduction_of(stmt: Assign) -> str | None:
    """The associative operator of ``s = s op e`` (or ``e op s``): +, *, max or min; None for
    anything else."""
    scalar = stmt.scalar
    value = stmt.value
    if isinstance(value, Binary) and value.op in ("+", "*", "max", "min"):
        for mine, other in ((value.a, value.b), (value.b, value.a)):
            if mine == scalar and scalar not in postorder(other):
                return value.op
    return None


def _scalar_reads(body: list[Stmt]) -> list[str]:
    names: list[str] = []

    def visit(e: Expr) -> None:
        names.extend(n.name for n in postorder(e) if isinstance(n, Scalar))

    def walk(stmts: list[Stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, If):
                visit(stmt.cond)
                walk(stmt.body)
            elif isinstance(stmt, (Let, Assign)):
                if isinstance(stmt, Assign) and reduction_of(stmt) is not None:
                    names.append(stmt.scalar.name)  # its update reads it once
                    continue
                visit(stmt.value)
            elif isinstance(stmt, Store):
                visit(stmt.index)
                visit(stmt.value)

    walk(body)
    return names
