"""The fixed-point design of a plan: a format for every tensor, local, accumulator and expression.

``design(segments, facts, bits)`` decides, kernel by kernel in plan order:

- each float tensor buffer's ``ap_fixed<bits, I>``: I from its calibrated range (``facts.ranges``,
  the fp32 model run on calibration data), from its values (weights), else from the range its
  producing kernel is proved to store;
- each kernel's *locals*: the buffers it reads back while writing them (a product's running sums,
  a softmax's exponentials) get a kernel-local copy in an exact format wide enough to never
  overflow, proved by abstract interpretation of the loop nest (``_Walk``): an accumulation over
  a loop of n trips grows by n times its term's range; the copy is rounded into the tensor's
  format once, when the kernel ends (never a partial sum);
- every float expression node's format (``kiln.backends.fpga.fixed``'s rules), and a ROM
  (``tables.Table``) for each function the node computes.

A loop's extent must be static (the FPGA is built for one size); anything the design cannot type
(pow, a float converted to an integer) is a ``DesignError`` naming the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.backends.fpga.fixed import MAX_WIDTH, Format, Interval, exact, quantize, sized, to_float, with_infinities
from kiln.backends.fpga.tables import Table, build, function_name
from kiln.backends.registry import PlanFacts
from kiln.errors import KilnError
from kiln.ir.types import DType
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
    Kernel,
    Let,
    Load,
    Scalar,
    Select,
    Stmt,
    Store,
    Unary,
    dtypes_of,
    postorder,
)

CONST_WIDTH = 24  # bits of a constant folded into an expression
EXACT_OPS = ("+", "-", "*", "max", "min")
WIDENINGS = 6
SQRT_FRACTION = 20  # fraction bits a square root keeps at least
# a quotient whose divisor's proved range reaches 0 (a softmax's sum of exponentials) saturates here
QUOTIENT_LIMIT = 2.0**11  # rounds of widening a loop's invariant before giving up


class DesignError(KilnError):
    """The plan cannot be made a fixed-point FPGA design (it names the kernel and the reason)."""


@dataclass
class KernelDesign:
    kernel: Kernel
    nodes: dict[int, Format] = field(default_factory=dict)  # id(float expression) -> its format
    scalars: dict[str, Format] = field(default_factory=dict)
    local: dict[Buffer, Format] = field(default_factory=dict)
    copy_in: set[Buffer] = field(default_factory=set)  # locals that start as the tensor's values
    tables: dict[int, Table] = field(default_factory=dict)  # id(Unary) -> its ROM
    trips: dict[str, int] = field(default_factory=dict)  # loop index -> trip count
    below_zero: set[int] = field(default_factory=set)  # ids of x - max(x) nodes (at most 0)


@dataclass
class Design:
    formats: dict[Buffer, Format]
    kernels: list[KernelDesign]
    bits: int
    streams: dict = field(default_factory=dict)  # Buffer -> streams.Channel (the backend fills it in)


def is_float(buffer: Buffer) -> bool:
    return buffer.dtype.is_float


def constant_format(value: float) -> Format:
    """A constant in an expression: ``CONST_WIDTH`` bits, integer bits for its magnitude."""
    if value == 0 or not math.isfinite(value):
        return Format(1, 1, True) if value == 0 else Format(CONST_WIDTH, CONST_WIDTH // 2)
    return sized(Interval(min(value, 0.0), max(value, 0.0)), CONST_WIDTH, signed=value < 0)


def design(
    segments: Sequence[Sequence[Kernel]], facts: PlanFacts, bits: int, widths: dict[str, int] | None = None
) -> Design:
    """The fixed-point design of a plan: every tensor ``bits`` wide, or as ``widths`` gives by
    tensor name (the per-layer budget)."""
    widths = widths or {}
    formats: dict[Buffer, Format] = {}
    for buffer, values in facts.constants.items():
        if is_float(buffer) and values.size:
            finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
            lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
            if values.dtype.kind == "f" and not np.isfinite(values).all():  # a mask's -inf: a stand-in
                signs = {-1} if np.isneginf(values).any() else set()
                lo, hi = with_infinities(lo, hi, signs | ({1} if np.isposinf(values).any() else set()))
            formats[buffer] = sized(Interval(min(lo, 0.0), max(hi, 0.0)), bits)
    for buffer, (lo, hi) in facts.ranges.items():
        if is_float(buffer) and buffer not in formats:
            width = widths.get(facts.names.get(buffer, buffer.name), bits)
            formats[buffer] = sized(Interval(min(lo, 0.0), max(hi, 0.0)), width)
    kernels = []
    produced = set(facts.inputs) | set(facts.constants)
    for segment in segments:
        writes = {b for k in segment for b in k.writes}
        produced |= {b for k in segment for b in k.reads if b not in writes}  # from the host, before it
        for kernel in segment:
            for buffer in kernel.reads:
                if is_float(buffer) and buffer not in formats and buffer not in kernel.writes:
                    raise DesignError(f"kernel {kernel.name} reads {buffer.name}, whose range nothing gives")
            kernels.append(_kernel_design(kernel, formats, bits, produced))
            produced |= set(kernel.writes)
    return Design(formats, kernels, bits)


def _kernel_design(kernel: Kernel, formats: dict[Buffer, Format], bits: int, produced: set[Buffer]) -> KernelDesign:
    result = KernelDesign(kernel)
    written = [b for b in kernel.writes if is_float(b)]
    loaded = loaded_buffers(kernel.body)
    local = [b for b in written if b in loaded]
    result.copy_in = {b for b in local if b in produced}
    walk = _Walk(kernel, formats, {b: formats[b] for b in result.copy_in})
    walk.below_zero = result.below_zero = shifted_by_maximum(kernel.body)
    walk.local = set(local)
    walk.block(kernel.body)
    for buffer in written:
        if buffer not in formats:  # no calibrated range: what the kernel is proved to store
            reach = walk.seen.get(buffer) or walk.stored.get(buffer) or (Interval(0.0, 0.0), 0)
            formats[buffer] = sized(reach[0] | Interval(0.0, 0.0), bits)
    result.local = {b: _var_format(walk.seen[b]) for b in local if b in walk.seen}
    result.scalars = {name: _var_format(reach) for name, reach in walk.seen.items() if isinstance(name, str)}
    result.trips = walk.trips
    _type_nodes(kernel, result, formats)
    return result


def _var_format(reach: tuple[Interval, int]) -> Format:
    interval, fraction = reach
    return exact(interval, fraction)


class _Walk:
    """Abstract interpretation of a kernel: each float local's (interval, fraction bits) at
    every point, joined over everything ever assigned (``seen``)."""

    def __init__(self, kernel: Kernel, formats: dict[Buffer, Format], start: dict[Buffer, Format]) -> None:
        self.kernel = kernel
        self.formats = formats
        self.local: set[Buffer] = set()
        self.env: dict[object, tuple[Interval, int]] = {b: (f.interval, f.fraction) for b, f in start.items()}
        self.seen: dict[object, tuple[Interval, int]] = dict(self.env)
        self.stored: dict[Buffer, tuple[Interval, int]] = {}
        self.indices: dict[str, Interval] = {}
        self.trips: dict[str, int] = {}
        self.below_zero: set[int] = set()

    def fail(self, why: str) -> DesignError:
        return DesignError(f"kernel {self.kernel.name} ({self.kernel.kind}): {why}")

    def block(self, body: Sequence[Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (Let, Assign)):
                if stmt.scalar.dtype.is_float:
                    self.assign(stmt.scalar.name, self.value(stmt.value))
            elif isinstance(stmt, Store):
                if is_float(stmt.buffer):
                    reach = self.value(stmt.value)
                    if stmt.buffer in self.local:
                        self.assign(stmt.buffer, reach)
                    else:
                        old = self.stored.get(stmt.buffer)
                        self.stored[stmt.buffer] = reach if old is None else _join(old, reach)
            elif isinstance(stmt, If):
                before = dict(self.env)
                self.block(stmt.body)
                self.env = _join_env(before, self.env)
            elif isinstance(stmt, For):
                self.loop(stmt)
            else:
                raise self.fail(f"{type(stmt).__name__} has no fixed-point form (engine calls are not FPGA kernels)")

    def assign(self, var: object, reach: tuple[Interval, int]) -> None:
        self.env[var] = reach
        old = self.seen.get(var)
        self.seen[var] = reach if old is None else _join(old, reach)

    def loop(self, loop: For) -> None:
        if not isinstance(loop.extent, int) or not isinstance(loop.start, int):
            raise self.fail(f"loop {loop.index.name} has a run-time bound; an FPGA design needs static loops")
        trips = loop.extent - loop.start
        self.trips[loop.index.name] = max(self.trips.get(loop.index.name, 0), trips)
        if trips <= 0:
            return
        self.indices[loop.index.name] = Interval(loop.start, loop.extent - 1)
        before = dict(self.env)
        self.block(loop.body)
        distinct = _distinct_stores(loop)
        changed = [v for v in self.env if v in before and self.env[v] != before[v] and v not in distinct]
        settled = {v: (after if v not in before else _join(before[v], after)) for v, after in self.env.items()}
        if not changed:
            self.env = settled
            return
        self.env = dict(settled)  # running maxima, masks: one more iteration stays inside the join
        self.block(loop.body)
        if all(_inside(self.env[v], settled[v]) for v in changed):
            self.env = settled
            return
        # each changing variable grows by at most its first iteration's growth d per iteration
        # (sums, running maxima): at the head of the last iteration it lies in before + (n-1)d;
        # one iteration from there must stay within before + n*d, which proves the bound
        growth = {v: _growth(before[v], self.env[v]) for v in changed}
        head = {**settled, **{v: _grown(before[v], growth[v], trips - 1) for v in changed}}
        final = {**settled, **{v: _grown(before[v], growth[v], trips) for v in changed}}
        self.env = dict(head)
        self.block(loop.body)
        if all(_inside(self.env[v], final[v]) for v in changed):
            self.env = final
            return
        self.invariant(loop, before, final, changed)

    def invariant(self, loop: For, before: dict, guess: dict, changed: list) -> None:
        """Widening until one more iteration stays inside the guess (an inductive invariant)."""
        for _ in range(WIDENINGS):
            self.env = dict(guess)
            self.block(loop.body)
            escaped = [v for v in changed if not _inside(self.env[v], guess[v])]
            if not escaped:
                self.env = guess
                return
            for var in escaped:
                (g, fg), (a, fa) = guess[var], self.env[var]
                span = max(g.hi - g.lo, 1.0)
                grown = Interval(min(g.lo, a.lo) - span, max(g.hi, a.hi) + span)
                guess[var] = (grown, max(fg, fa) if fa <= fg else MAX_WIDTH)
        raise self.fail(f"cannot bound {changed[0]} over loop {loop.index.name}")

    def value(self, e: Expr) -> tuple[Interval, int]:
        """(interval, fraction bits) of a float-valued expression."""
        types = dtypes_of(e)
        reach: dict[int, tuple[Interval, int]] = {}
        for node in postorder(e):
            reach[id(node)] = self.node(node, types, reach)
        return reach[id(e)]

    def node(self, node: Expr, types: dict[int, DType], reach: dict[int, tuple[Interval, int]]) -> tuple[Interval, int]:
        if not types[id(node)].is_float:
            return self.integer(node, types, reach), 0
        if isinstance(node, Const):
            fmt = constant_format(float(node.value))
            return Interval(
                to_float(quantize(float(node.value), fmt), fmt), to_float(quantize(float(node.value), fmt), fmt)
            ), fmt.fraction
        if isinstance(node, Load):
            if node.buffer in self.local:
                if node.buffer not in self.env:
                    raise self.fail(f"{node.buffer.name} is read before the kernel writes it")
                return self.env[node.buffer]
            fmt = self.formats.get(node.buffer)
            if fmt is None:
                raise self.fail(f"reads {node.buffer.name} before anything gives its range")
            return fmt.interval, fmt.fraction
        if isinstance(node, Scalar):
            if node.name not in self.env:
                raise self.fail(f"scalar {node.name} is read before it is set")
            return self.env[node.name]
        return combine(node, [reach[id(o)] for o in float_operands(node)], self.fail, id(node) in self.below_zero)

    def integer(self, node: Expr, types: dict[int, DType], reach: dict[int, tuple[Interval, int]]) -> Interval:
        """A rough range of an integer expression (an index converted to a float)."""
        if isinstance(node, Const):
            return Interval(float(node.value), float(node.value))
        if isinstance(node, Index):
            return self.indices.get(node.name, Interval(-(2.0**31), 2.0**31))
        if isinstance(node, Binary) and node.op in ("+", "-", "*"):
            a, b = reach[id(node.a)][0], reach[id(node.b)][0]
            return a + b if node.op == "+" else (a - b if node.op == "-" else a * b)
        info = np.iinfo(types[id(node)].numpy) if types[id(node)].numpy.kind in "iu" else None
        return Interval(0.0, 1.0) if info is None else Interval(max(info.min, -(2.0**31)), min(info.max, 2.0**31))


def float_operands(node: Expr) -> list[Expr]:
    """The operands a node's value is computed from (a select's condition is not one)."""
    if isinstance(node, Binary):
        return [node.a, node.b]
    if isinstance(node, Select):
        return [node.a, node.b]
    if isinstance(node, (Unary, Cast)):
        return [node.a]
    return []


def combine(node: Expr, args: list[tuple[Interval, int]], fail, below_zero: bool = False) -> tuple[Interval, int]:
    """The (interval, fraction) of a float node from its float operands' (``below_zero``: the
    node is known to be at most 0)."""
    function = function_name(node)
    if function is not None:  # a ROM over the first operand's range
        (a, fa) = args[0]
        table = build(function, exact(a, fa), a)
        return table.out.interval, table.out.fraction
    if isinstance(node, Binary):
        (a, fa), (b, fb) = args
        if node.op in ("+", "-"):
            found = a + b if node.op == "+" else a - b
            if below_zero:
                found = Interval(min(found.lo, 0.0), min(found.hi, 0.0))
            return found, max(fa, fb)
        if node.op == "*":
            return a * b, fa + fb
        if node.op in ("max", "min"):
            pick = max if node.op == "max" else min
            return Interval(pick(a.lo, b.lo), pick(a.hi, b.hi)), max(fa, fb)
        if node.op == "/":
            return _quotient(a, b), MAX_WIDTH
        raise fail(f"'{node.op}' has no fixed-point form on the fpga target")
    if isinstance(node, Select):
        (a, fa), (b, fb) = args
        return a | b, max(fa, fb)
    if isinstance(node, Cast):
        return args[0]
    assert isinstance(node, Unary)
    (a, fa) = args[0]
    if node.op == "-":
        return -a, fa
    if node.op == "abs":
        return Interval(0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi)), a.magnitude), fa
    if node.op in ("floor", "ceil", "round_even"):
        return Interval(math.floor(a.lo), math.ceil(a.hi)), 0
    if node.op == "sqrt":  # digit by digit (no table): a negative input gives 0
        return Interval(math.sqrt(max(a.lo, 0.0)), math.sqrt(max(a.hi, 0.0))), sqrt_fraction(fa)
    raise fail(f"'{node.op}' has no fixed-point form on the fpga target")


def sqrt_fraction(source: int) -> int:
    """Fraction bits of a square root of a value with ``source`` of them."""
    return max((source + 1) // 2, SQRT_FRACTION)


def _quotient(a: Interval, b: Interval) -> Interval:
    """a / b for b in its interval; where b's range reaches 0 the quotient saturates at
    +-QUOTIENT_LIMIT (fixed point has no infinity)."""
    if b.lo > 0 or b.hi < 0:
        found = a * Interval(1.0 / b.hi, 1.0 / b.lo)
        return Interval(max(found.lo, -(2.0**40)), min(found.hi, 2.0**40))
    return Interval(-QUOTIENT_LIMIT, QUOTIENT_LIMIT)


def _growth(before: tuple[Interval, int], after: tuple[Interval, int]) -> tuple[float, float, int]:
    (b, fb), (a, fa) = before, after
    return min(0.0, a.lo - b.lo), max(0.0, a.hi - b.hi), max(fa, fb)


def _grown(before: tuple[Interval, int], growth: tuple[float, float, int], times: int) -> tuple[Interval, int]:
    (b, fb), (down, up, fraction) = before, growth
    return Interval(b.lo + times * down, b.hi + times * up), max(fb, fraction)


def _join(x: tuple[Interval, int], y: tuple[Interval, int]) -> tuple[Interval, int]:
    return x[0] | y[0], max(x[1], y[1])


def _inside(x: tuple[Interval, int], y: tuple[Interval, int]) -> bool:
    return x[0].within(y[0]) and x[1] <= y[1]


def _join_env(a: dict, b: dict) -> dict:
    return {k: (_join(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k))) for k in {*a, *b}}


def shifted_by_maximum(body: Sequence[Stmt]) -> set[int]:
    """Nodes ``x[i] - m`` where ``m`` is a running maximum of ``x[i]`` over the same index
    expression (softmax's shift): such a difference is at most 0. ``m`` qualifies when it starts
    at -inf (or a constant) and is only ever ``max(m, x[i])``."""
    starts: dict[str, bool] = {}
    updates: dict[str, list] = {}
    differences: list[Binary] = []

    def scan_expr(e: Expr) -> None:
        differences.extend(
            n for n in postorder(e)
            if isinstance(n, Binary) and n.op == "-" and isinstance(n.a, Load) and isinstance(n.b, Scalar)
        )  # fmt: skip

    def visit(stmts: Sequence[Stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, Let):
                starts[stmt.scalar.name] = isinstance(stmt.value, Const)
                scan_expr(stmt.value)
            elif isinstance(stmt, Assign):
                updates.setdefault(stmt.scalar.name, []).append(stmt.value)
                scan_expr(stmt.value)
            elif isinstance(stmt, Store):
                scan_expr(stmt.value)
            elif isinstance(stmt, (For, If)):
                visit(stmt.body)

    visit(body)
    maxima: dict[str, Load] = {}
    for name, values in updates.items():
        loads = [_maximum_of(v, name) for v in values]
        if starts.get(name) and all(load is not None and load == loads[0] for load in loads):
            maxima[name] = loads[0]  # type: ignore[assignment]
    return {id(d) for d in differences if d.b.name in maxima and d.a == maxima[d.b.name]}  # type: ignore[union-attr]


def _maximum_of(value: Expr, name: str) -> Load | None:
    if isinstance(value, Binary) and value.op == "max":
        for mine, other in ((value.a, value.b), (value.b, value.a)):
            if isinstance(mine, Scalar) and mine.name == name and isinstance(other, Load):
                return other
    return None


def loaded_buffers(body: Sequence[Stmt]) -> set[Buffer]:
    found: set[Buffer] = set()

    def expression(e: Expr) -> None:
        found.update(n.buffer for n in postorder(e) if isinstance(n, Load))

    def visit(stmts: Sequence[Stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, (Let, Assign)):
                expression(stmt.value)
            elif isinstance(stmt, Store):
                expression(stmt.value)
                expression(stmt.index)
            elif isinstance(stmt, If):
                expression(stmt.cond)
                visit(stmt.body)
            elif isinstance(stmt, For):
                visit(stmt.body)

    visit(body)
    return found


def _distinct_stores(loop: For) -> set[Buffer]:
    """Buffers every store of which, in the loop, writes an element that depends on the loop's
    index: each iteration updates its own elements (no growth across iterations)."""
    mentions: dict[Buffer, bool] = {}

    def visit(body: Sequence[Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, Store):
                uses = any(isinstance(n, Index) and n.name == loop.index.name for n in postorder(stmt.index))
                mentions[stmt.buffer] = mentions.get(stmt.buffer, True) and uses
            elif isinstance(stmt, (For, If)):
                visit(stmt.body)

    visit(loop.body)
    return {b for b, always in mentions.items() if always}


def _type_nodes(kernel: Kernel, result: KernelDesign, formats: dict[Buffer, Format]) -> None:
    """Every float node's format, bottom-up from the locals' and tensors' final formats."""

    def expression(e: Expr) -> None:
        types = dtypes_of(e)
        reach: dict[int, tuple[Interval, int]] = {}
        for node in postorder(e):
            if not types[id(node)].is_float:
                reach[id(node)] = (Interval(-(2.0**31), 2.0**31), 0)
                continue
            if isinstance(node, Const):
                fmt = constant_format(float(node.value))
            elif isinstance(node, (Load, Scalar)):
                fmt = result.local.get(node.buffer) if isinstance(node, Load) else None
                fmt = fmt or (formats[node.buffer] if isinstance(node, Load) else result.scalars[node.name])
            else:
                args = [reach[id(o)] for o in float_operands(node)]
                function = function_name(node)
                if function is not None:
                    source = result.nodes[id(node.a)]  # type: ignore[attr-defined]
                    result.tables[id(node)] = table = build(function, source, args[0][0])
                    fmt = table.out
                else:
                    fail = lambda why: DesignError(f"kernel {kernel.name}: {why}")  # noqa: E731
                    interval, fraction = combine(node, args, fail, id(node) in result.below_zero)
                    fmt = exact(interval, fraction)
                    # the proved interval, tighter than the format's (a table's domain reads it)
                    result.nodes[id(node)] = fmt
                    reach[id(node)] = (interval, fmt.fraction)
                    continue
            result.nodes[id(node)] = fmt
            reach[id(node)] = (fmt.interval, fmt.fraction)

    def visit(body: Sequence[Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (Let, Assign, Store)):
                expression(stmt.value)
                if isinstance(stmt, Store):
                    expression(stmt.index)
            elif isinstance(stmt, If):
                expression(stmt.cond)
                visit(stmt.body)
            elif isinstance(stmt, For):
                visit(stmt.body)

    visit(kernel.body)
