"""Kernels whose extents are run-time values: one library serves every length of a padded dim.

A padded graph (``kiln.passes.padding``) computes, at any length E >= L, the model's values at
length L below L. Lowered at one length, its kernels hold that length in their integers: loop
extents, a product's rows, attention's queries and keys, strides of tensors laid out after the
length. ``compile_with_run_time_length`` lowers the graph at four lengths (the capacity C = the
range's end, the smallest S, two between) and walks the four kernel IRs in step: they must be the
same program, every integer that differs must be one integer polynomial of degree <= 2 of the
length (fitted on three lengths, checked on the fourth; squares are [length, length] masks), and
everything else must be equal (schedules and cache blocking are taken from C: they change speed,
never results). Those integers become expressions of ``kiln_len``
(the length the call runs at: the padded graph's valid-length input, at least S), so the code
computes the graph at length E with its tensors laid out densely at E, each in the first part of
its own place in an arena laid out for E (``kiln.lower.memory.GrowingLayout``: every buffer's
bytes a polynomial of the length, the offsets formulas of them, evaluated per length, so a short
run touches a short arena; the capacity's layout bounds every other). The C compiler runs
once; no length in the range compiles again. A value that would fold to a constant no shorter
length's dense layout can share with C's (a [length, length] causal mask) is kept computed
(``computed_at_run_time``): its kernels take the length like the others. The lengths other than C
are lowered for their sizes only (``Compile.sizes_only``).

Refused (the caller compiles padded lengths instead, each a compile): a lowering whose structure
changes with the length, an integer that is no such polynomial (buffer sizes are not fitted: they
stay C's, checked to be the largest), a constant whose data is not the same prefix at every
length (or, of one size at every length, not the same data), a host fallback (it would read
C-shaped arrays), or an im2col geometry that varies.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from kiln.driver.pipeline import Compile, run_stages, start
from kiln.ir import dims as size_exprs
from kiln.ir.sized import SizedInt
from kiln.ir.types import DType
from kiln.lower.kir import (
    LENGTH,
    AttentionOperand,
    AttentionSpec,
    Binary,
    Buffer,
    Const,
    For,
    Function,
    GemmSpec,
    If,
    Kernel,
    MatrixOperand,
    WinogradInput,
    WinogradOutput,
    buffers_in,
)
from kiln.lower.kir_verify import verify_kernel
from kiln.lower.memory import GrowingLayout, growing_layout, grows
from kiln.passes import specialize
from kiln.passes.fold_constants import UNFOLDED
from kiln.runtime.plan import Fallback, Plan

FLOOR = 16  # the smallest length lowered: shorter runs compute at it (masked), as a padded class did
# fields that say how code runs, never what it computes: the capacity's are kept
_SCHEDULE = {"schedule", "blocking", "threads", "flops", "tuning"}
# engine-call classes whose integer fields may be run-time sizes (their renderers print them)
_SIZED = (GemmSpec, MatrixOperand, AttentionSpec, AttentionOperand, WinogradInput, WinogradOutput)

log = logging.getLogger("kiln")


class NotAffine(Exception):
    """Why the kernels cannot take the length at run time."""


@dataclass(frozen=True)
class RunTimeLength:
    """A padded graph's dim whose kernels take it at run time: ``lengths`` are the lengths lowered
    (the capacity first), ``valid`` the graph's valid-length input the kernels read it from."""

    symbol: str
    lengths: tuple[int, ...]
    valid: str


@dataclass(frozen=True)
class RunTimeSize:
    """An engine call's integer as ``c0 + c1 * kiln_len + c2 * kiln_len^2`` (printed as C by
    the renderers; squares are the sizes of [length, length] masks and scores)."""

    c0: int
    c1: int
    c2: int = 0

    def __str__(self) -> str:
        square = f" + (int64_t){self.c2} * kiln_len * kiln_len" if self.c2 else ""
        return f"((int64_t){self.c0} + (int64_t){self.c1} * kiln_len{square})"

    def at(self, length: int) -> int:
        return self.c0 + self.c1 * length + self.c2 * length * length


def samples(low: int, high: int) -> tuple[int, ...] | None:
    """The lengths lowered (capacity first), or None when the range is too short to tell: three
    determine a polynomial of degree two, the fourth checks it."""
    floor = max(low, min(FLOOR, high))
    chosen = (high, ((floor + high) // 2) | 1, floor, ((3 * floor + high) // 4) | 1)
    return chosen if floor >= 2 and len(set(chosen)) == 4 else None


def _fit(values: list[int], lengths: tuple[int, ...], where: str) -> RunTimeSize:
    """The integer polynomial of degree <= 2 through the first three points, checked on the rest."""
    (x0, x1, x2), (y0, y1, y2) = lengths[:3], values[:3]
    d01, d12 = Fraction(y1 - y0, x1 - x0), Fraction(y2 - y1, x2 - x1)
    c2 = (d12 - d01) / (x2 - x0)
    c1 = d01 - c2 * (x0 + x1)
    c0 = y0 - c1 * x0 - c2 * x0 * x0
    if any(c.denominator != 1 for c in (c0, c1, c2)):
        raise NotAffine(f"{where}: {values} at lengths {list(lengths)} is no integer polynomial of the length")
    size = RunTimeSize(int(c0), int(c1), int(c2))
    if any(size.at(n) != v for n, v in zip(lengths, values)):
        raise NotAffine(f"{where}: {values} at lengths {list(lengths)} is no polynomial of degree <= 2 of the length")
    return size


def _read(values: list[int], lengths: tuple[int, ...]) -> RunTimeSize | None:
    """The capacity's integer's own expression (``kiln.ir.sized``: the capacity is lowered with
    the length a ``SizedInt``) as the polynomial it is, where it is one of degree <= 2 of the
    length and gives every lowered length's integer; None where not (the integer is fitted)."""
    found = values[0]
    if not isinstance(found, SizedInt) or len(size_exprs.symbols(found.expr)) != 1:
        return None
    # the lowered lengths bound the symbol (shorter runs compute at the floor): min(2048, seq) is seq
    (symbol,) = size_exprs.symbols(found.expr)
    expr = size_exprs.simplified(found.expr, {symbol: (min(lengths), max(lengths))})
    coefficients = [expr.constant, 0, 0]
    for atoms, coefficient in expr.terms:
        if len(atoms) > 2 or not all(isinstance(a, size_exprs.Sym) for a in atoms):
            return None
        coefficients[len(atoms)] += coefficient
    size = RunTimeSize(*coefficients)
    return size if all(size.at(n) == int(v) for n, v in zip(lengths, values)) else None


def _expression(size: RunTimeSize) -> Any:
    term = Binary("*", Const(size.c1, DType.INT64), LENGTH)
    if size.c2:
        term = Binary("+", term, Binary("*", Binary("*", Const(size.c2, DType.INT64), LENGTH), LENGTH))
    return Binary("+", term, Const(size.c0, DType.INT64))


_SIZES = {"read": 0, "fitted": 0}  # this process's run-time sizes, by how they were found


def sizes_found() -> dict[str, int]:
    """How many kernel integers this process's run-time compiles (lengths and dims) read from the
    lowering's own size expressions and how many they fitted to the lowered bindings."""
    return dict(_SIZES)


def found_sizes(counts: dict[str, int]) -> None:
    for key, count in counts.items():
        _SIZES[key] += count


class Merge:
    """Walks the capacity's kernel IR and the other lengths' in step (see the module's text)."""

    def __init__(self, lengths: tuple[int, ...]) -> None:
        self.lengths = lengths
        self.memo: dict[int, Any] = {}
        self.used = False
        self.counts = {"read": 0, "fitted": 0}

    # how an integer that differs between the lowerings becomes a run-time size (``kiln.driver.
    # spatial`` fits several dims instead of one length)
    def fit(self, values: list[int], where: str) -> Any:
        read = _read(values, self.lengths)
        self.counts["read" if read is not None else "fitted"] += 1
        if read is None:
            log.debug("run-time length: %s fitted (no expression gives %s)", where, values)
        return read or _fit(values, self.lengths, where)

    def expression(self, size: Any) -> Any:
        return _expression(size)

    def sized_type(self, x: Any) -> bool:
        """Whether ``x``'s integer fields may be run-time sizes (its renderer prints them)."""
        return isinstance(x, _SIZED)

    def is_size(self, merged: Any) -> bool:
        return isinstance(merged, RunTimeSize)

    def constant(self, items: list[Any], where: str) -> Any:
        """A non-integer constant that differs (the sequence route refuses it)."""
        raise NotAffine(f"{where}: a {items[0].dtype.name} constant differs with the length")

    def merge(self, items: list[Any], where: str, sized: bool = False) -> Any:
        x = items[0]
        if isinstance(x, (bool, str, float, type(None))) or isinstance(x, DType):
            if any(y != x for y in items[1:]):
                raise NotAffine(f"{where}: {items} differ with the length")
            return x
        if isinstance(x, int):
            if all(y == x for y in items[1:]):
                return x
            if not sized:
                raise NotAffine(f"{where}: {items} differ with the length")
            self.used = True
            return self.fit(items, where)
        if any(type(y) is not type(x) for y in items[1:]):
            raise NotAffine(f"{where}: the lowering's structure differs with the length")
        if isinstance(x, Buffer):
            if any(y.name != x.name or y.dtype != x.dtype or y.size > x.size for y in items[1:]):
                raise NotAffine(f"{where}: buffer {x.name} differs, or grows as the length shrinks")
            return x
        key = id(x)
        if key in self.memo:
            return self.memo[key]
        result = self._compound(items, where, sized)
        self.memo[key] = result
        return result

    def _compound(self, items: list[Any], where: str, sized: bool) -> Any:
        x = items[0]
        if isinstance(x, (list, tuple)):
            if any(len(y) != len(x) for y in items[1:]):
                raise NotAffine(f"{where}: the lowering's structure differs with the length")
            merged = [self.merge([y[i] for y in items], f"{where}[{i}]", sized) for i in range(len(x))]
            same = all(m is o for m, o in zip(merged, x))
            return x if same else type(x)(merged)
        if isinstance(x, dict):
            if any(y != x for y in items[1:]):
                raise NotAffine(f"{where}: {x} differ with the length")
            return x
        if isinstance(x, Const):
            if all(y.value == x.value for y in items[1:]):
                return x
            if x.dtype is not DType.INT64 or isinstance(x.value, (bool, float)):
                return self.constant(items, where)
            self.used = True
            return self.expression(self.fit([y.value for y in items], where))
        if not dataclasses.is_dataclass(x):
            raise NotAffine(f"{where}: {type(x).__name__} kiln cannot compare")
        changes = {}
        for f in dataclasses.fields(x):
            value = getattr(x, f.name)
            if f.name in _SCHEDULE:
                continue
            bound = isinstance(x, For) and f.name in ("extent", "start")
            sized = self.sized_type(x) or bound
            merged = self.merge([getattr(y, f.name) for y in items], f"{where}.{f.name}", sized)
            if bound and self.is_size(merged):
                merged = self.expression(merged)  # a loop bound is a kernel-IR expression
            if merged is not value:
                changes[f.name] = merged
        return dataclasses.replace(x, **changes) if changes else x


def kernels_of(state: Compile) -> list[Kernel]:
    fallback = next((step for step in state.steps if isinstance(step, Fallback)), None)
    if fallback is not None:
        raise NotAffine(f"a host fallback ({fallback.reason}) would read arrays laid out at the capacity")
    return [k for segment in state.segments for k in segment]


RUN_TIME_CONSTANT_LIMIT = 4096  # elements: a larger constant whose values follow the length is refused


def check_constants(states: list[Compile], lengths: tuple[int, ...] | None = None) -> tuple[tuple[Buffer, tuple], ...]:
    """A constant whose size depends on the length (a folded Range of positions) must hold, at
    every length, the first part of the capacity's data (what the dense layout at E reads). One
    whose size does not holds the same values at every length (the library keeps the capacity's),
    or, given the ``lengths`` the states were lowered at, small integers each a polynomial of the
    length (arange(batch) * seq, a TorchScript export's flat-index offsets): those are returned,
    (the capacity's buffer, each element's (c0, c1, c2)), for the runtime to write at the length it
    runs at (``GrowingLayout.constants``)."""
    capacity = {b.name: (b, a) for b, a in states[0].constants.items()}
    # (a shape vector only inference read is no kernel's)
    read = {b.name for k in kernels_of(states[0]) for b in [*k.reads, *buffers_in(k.body)]}
    varying: set[str] = set()
    for state in states[1:]:
        packed = state.lowerer.packed if state.lowerer is not None else {}
        for buffer, array in state.constants.items():
            full = capacity.get(buffer.name, (None, None))[1]
            if (
                full is None
                or full is array
                or (buffer in packed and full.size == array.size)
                or buffer.name not in read
            ):
                continue  # (a weight packed for the engine: the same graph constant at every length)
            same_size = full.size == array.size
            if same_size and np.array_equal(full.reshape(-1), array.reshape(-1)):
                continue
            if same_size and lengths is not None and full.dtype.kind in "iu" and full.size <= RUN_TIME_CONSTANT_LIMIT:
                varying.add(buffer.name)
                continue
            if full.size < array.size or not np.array_equal(full.reshape(-1)[: array.size], array.reshape(-1)):
                raise NotAffine(f"constant {buffer.name} is not the same prefix at every length")
    found = []
    by_name = [{b.name: a for b, a in state.constants.items()} for state in states] if varying else []
    for name in sorted(varying):
        assert lengths is not None
        arrays = [held.get(name) for held in by_name]
        if any(a is None or a.size != capacity[name][1].size for a in arrays):
            raise NotAffine(f"constant {name} is not the same prefix at every length")
        values = np.stack([np.asarray(a).reshape(-1).astype(np.int64) for a in arrays])  # [lengths, elements]
        fits = [_fit([int(v) for v in values[:, i]], lengths, f"constant {name}") for i in range(values.shape[1])]
        found.append((capacity[name][0], tuple((f.c0, f.c1, f.c2) for f in fits)))
    return tuple(found)


def computed_at_run_time(graph: Any, dims: dict[str, int], symbol: str, lengths: tuple[int, ...]) -> frozenset[str]:
    """The values that would fold to constants no dense layout at a shorter length can share
    with the capacity's (a [1, 1, seq, seq] causal mask from Range, Unsqueeze and LessOrEqual):
    kept computed, by kernels that take the length. Measured, not guessed from names: the part
    of the graph that folds (from constants and input shapes) is specialized at two lengths
    with every value kept, and a value whose shape changes in more than one dim, or in one dim
    after a dim that is not 1, is named."""
    known = set(graph.constants)
    nodes = []
    for node in graph.nodes:
        reads_known = node.op in ("Shape", "Size") or all(v is None or v in known for v in node.inputs)
        if reads_known and not any(True for _ in node.subgraphs()):
            nodes.append(node)
            known.update(node.outputs)
    outputs = [v for node in nodes for v in node.outputs]
    if not outputs or len(lengths) < 2:
        return frozenset()
    part = graph.with_(outputs=outputs, nodes=nodes)
    try:
        shapes = [
            [getattr(v.type, "shape", None) for v in specialize(part, {**dims, symbol: n}).outputs] for n in lengths
        ]
    except Exception:  # the part does not fold there: the compile will say why
        return frozenset()
    kept = set()
    for value, one, other in zip(outputs, *shapes):
        if one is None or other is None or len(one) != len(other):
            continue
        changed = [i for i, (a, b) in enumerate(zip(one, other)) if a != b]
        if len(changed) > 1 or (changed and any(d != 1 for d in one[: changed[0]])):
            kept.add(value.name)
    return frozenset(kept)


def run_time_kernels(
    graph: Any, dims: dict[str, int], length: RunTimeLength, target: Any, options: Any, prebuilt: dict | None = None
) -> Compile:
    """The compile state at the capacity, through plan-memory, its kernels' sizes made
    expressions of the run-time length (raises NotAffine saying why they cannot be)."""
    symbol, lengths = length.symbol, length.lengths
    states = []
    token = UNFOLDED.set(computed_at_run_time(graph, dims, symbol, lengths[:2]))
    try:
        for n in lengths:
            sample = n != lengths[0]  # the capacity's state is the one built; the others are read for sizes
            at = (
                n if sample else SizedInt(n, size_exprs.sym(symbol), {symbol: n})
            )  # the capacity keeps its sizes' expressions
            state = start(graph, target, options, dims={**dims, symbol: at}, prebuilt=prebuilt or {}, sizes_only=sample)
            states.append(run_stages(state, "specialize", "plan-memory"))
    finally:
        UNFOLDED.reset(token)
    constants = check_constants(states, lengths)
    kernels = [kernels_of(state) for state in states]
    if len({len(k) for k in kernels}) != 1:
        raise NotAffine("the number of kernels changes with the length")
    capacity = states[0]
    merge = Merge(lengths)
    valid_buffer = next(capacity.roots[v] for v in capacity.graph.inputs if v.name == length.valid)
    position = 0
    for segment in capacity.segments:
        for i, kernel in enumerate(segment):
            merged = merge.merge([kernel, *(k[position] for k in kernels[1:])], kernel.name)
            position += 1
            if merged is not kernel:
                segment[i] = told_where(merged, "length", valid_buffer, (valid_buffer, min(lengths)))
    if not merge.used:
        raise NotAffine("no kernel's sizes depend on the length")
    found_sizes(merge.counts)
    for kernel in kernels_of(capacity):  # every access inside its buffer at every length it runs at
        problems = verify_kernel(kernel, {LENGTH.name: (min(lengths), lengths[0])})
        if problems:
            raise NotAffine(f"at some length of the range, {problems[0]}")
    assert capacity.memory is not None
    capacity.memory.growing = dataclasses.replace(_growing(states, lengths, valid_buffer), constants=constants)
    return capacity


def _growing(states: list[Compile], lengths: tuple[int, ...], valid: Buffer) -> GrowingLayout:
    """The capacity's arena as formulas of the length: each buffer's bytes fitted like the
    kernels' integers (one that fits no polynomial, or one that would not grow with the length,
    keeps its capacity size: an upper bound at every length)."""
    memory = states[0].memory
    assert memory is not None
    floor, capacity = min(lengths), lengths[0]
    sampled = [{b.name: b.nbytes for b in state.memory.offsets} for state in states[1:]]  # type: ignore[union-attr]
    sizes = {}
    for buffer in memory.offsets:
        values = [buffer.nbytes, *(sizes_at.get(buffer.name, buffer.nbytes) for sizes_at in sampled)]
        if len(set(values)) == 1:
            continue
        try:
            size = _fit(values, lengths, buffer.name)
        except NotAffine:
            continue
        coefficients = (size.c0, size.c1, size.c2)
        if grows(*coefficients, floor, capacity):
            sizes[buffer] = coefficients
    return growing_layout(memory, sizes, valid, floor, capacity)


def compile_with_run_time_length(
    graph: Any, dims: dict[str, int], length: RunTimeLength, target: Any, options: Any, prebuilt: dict | None = None
) -> Plan:
    """The plan of ``graph`` at ``dims`` with the length at its capacity, whose kernels take the
    length at run time from its valid-length input (at least the smallest length lowered)."""
    state = run_time_kernels(graph, dims, length, target, options, prebuilt)
    return run_stages(state, "render", "build").plan()


def told_where(kernel: Kernel, field: str, buffer: Buffer, source: Any) -> Kernel:
    """The kernel (and its epilogues) told where its run-time sizes come from: ``field`` is
    ``length`` (``kiln_len``: ``(valid buffer, floor)``) or ``dims`` (``kiln_d<i>``: ``(dims vector,
    indices read)``, ``kiln.driver.spatial``); ``buffer`` is read by it."""
    reads = kernel.reads if buffer in kernel.reads else [*kernel.reads, buffer]

    def helpers(stmts: list) -> None:
        for stmt in stmts:
            epilogue = getattr(stmt, "epilogue", None)
            if isinstance(epilogue, Function) and getattr(epilogue, field) is None:
                setattr(epilogue, field, source)
                if buffer not in epilogue.buffers:
                    epilogue.buffers.append(buffer)
            if isinstance(stmt, (For, If)):
                helpers(stmt.body)

    helpers(kernel.body)
    return dataclasses.replace(kernel, reads=reads, **{field: source})


def lay_out(array: Any, shape: tuple[int, ...]) -> Any:
    """An input at its sizes laid out densely in the first elements of its capacity ``shape`` (what
    kernels that take sizes at run time read), the rest zero."""
    array = np.asarray(array)
    if array.shape == tuple(shape):
        return array
    out = np.zeros(shape, array.dtype)
    out.reshape(-1)[: array.size] = array.reshape(-1)
    return out


def read_back(array: Any, shape: tuple[int, ...]) -> Any:
    """An output computed at these sizes (the first elements of its capacity array) in ``shape``."""
    array = np.asarray(array)
    if array.shape == tuple(shape):
        return array
    return array.reshape(-1)[: int(np.prod(shape))].reshape(shape)


def compact(array: Any, axis: int | None, capacity: int) -> Any:
    """An input at length E laid out densely in the first elements of its capacity shape."""
    if axis is None:
        return np.asarray(array)
    shape = list(np.shape(array))
    shape[axis] = capacity
    return lay_out(array, tuple(shape))


def expand(array: Any, axes: tuple[int, ...], length: int) -> Any:
    """An output computed at length E (the first elements of its capacity shape) as its E shape."""
    if not axes:
        return array
    shape = list(np.shape(array))
    for axis in axes:
        shape[axis] = length
    return read_back(array, tuple(shape))
