"""Kernels whose sizes are run-time values of several dims: one library serves every image size.

A conv net's height and width neither chunk (a convolution mixes pixels) nor pad (the sequence
route's masks do not follow a strided window). Their sizes reach the kernels through the shapes
of every layer: a stride-2 convolution's output is ``(h + 2p - k) // 2 + 1``, a floor division,
no polynomial of ``h``. The graph's shape inference already names each of those sizes: every
symbolic dim of the graph (the inputs' ``h`` and ``w``, and each layer's fresh symbol) is one
entry of the *dims vector*, which the runtime computes for each new binding by specializing the
graph's shapes (milliseconds, remembered per binding), and passes to the kernels as one more
input (``kiln_dims``, int64).

``run_time_dims_kernels`` lowers the graph at four bindings of the ranged dims (the range's end
first, the capacity; the others odd and different per dim, so that no two of the graph's dims
agree by accident), walks the four kernel IRs in step (``kiln.driver.extents.Merge``: the same
program, schedules from the capacity), and writes each integer that differs as ``c0 + c * d_i``
or ``c0 + c * d_i * d_j`` over the dims vector (a product's rows are a layer's ``oh * ow``, its
strides ``channels * oh * ow``): the one such term that fits the four lowerings, checked at
further bindings where only the dims are computed, so two dims that agree at the lowered
bindings cannot be confused. A float that differs (a mean's divisor ``oh * ow``) is such a
product too. Each tensor is laid out densely at the call's sizes in the first part of its
capacity's place in the arena (whose layout is the capacity's); inputs are laid out so before
the call, outputs read back at their sizes.

Refused (``NotAffine``, said by ``kiln compile``; each new binding then compiles on first use as
before): a lowering whose structure changes with the sizes, an integer no such term fits or two
terms fit differently, a constant that is not the same prefix at every binding, a host
fallback, or a binding of the range whose shapes the model does not have (a kernel larger than
a small image). Winograd convolutions are not used on this route (their tiles and their choice
depend on the plane).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.driver import sized_terms
from kiln.driver.dims_program import DimsProgram, Step, expression_of
from kiln.driver.dims_vector import checks, dim_values, generic_samples, graph_symbols
from kiln.driver.extents import Merge, NotAffine, check_constants, found_sizes, kernels_of, told_where
from kiln.driver.pipeline import Compile, resolve_target, run_stages, start
from kiln.driver.sized_terms import ExprSize
from kiln.errors import KilnError
from kiln.ir import dims as size_exprs
from kiln.ir.graph import Graph, Value
from kiln.ir.sized import SizedInt
from kiln.ir.types import DType, TensorType
from kiln.lower import kir
from kiln.lower.kir import Binary, Cast, Const, Kernel, run_time_dim
from kiln.lower.kir_verify import verify_kernel
from kiln.passes.cache_in_place import cache_pairs
from kiln.passes.run_time_sizes import read_at_run_time
from kiln.passes.specialize import bind_type
from kiln.runtime.plan import Plan

log = logging.getLogger("kiln")
DIMS_INPUT = "kiln_dims"  # the dims vector's graph input (the last)
MAX_TERMS = 2  # a size is a constant plus a constant times a product of at most this many dims
# engine calls and operands whose integers the C renderer prints as expressions
_SIZED = (
    kir.GemmSpec,
    kir.MatrixOperand,
    kir.Im2colOperand,
    kir.DirectOperand,
    kir.AttentionSpec,
    kir.AttentionOperand,
    kir.WinogradInput,
    kir.WinogradOutput,
)


Factor = tuple[int, int, int]  # (i, a, s): floor((d_i + a) / s), a in [0, s): d_i itself when s is 1


def strides_of(graph: Graph) -> tuple[int, ...]:
    """The strides (above 1) of the graph's windows: a strided window's bounds are floor divisions
    of a layer's size by its stride, the divisors a term may have (only these: each one more is
    more terms that may fit the lowerings by accident)."""
    found = {int(s) for node in graph.nodes if node.op in _WINDOWS for s in node.attrs.get("strides") or () if s > 1}
    return tuple(sorted(found))


def divisors_of(graph: Graph, states: list[Compile]) -> tuple[int, ...]:
    """The strides and the divisors the lowerings said their sizes take (a loop over groups of
    pixels): the floor divisions a kernel's integer may be a term of."""
    said = {d for state in states if state.lowerer is not None for d in state.lowerer.divisors if d > 1}
    return tuple(sorted(set(strides_of(graph)) | said))


_WINDOWS = frozenset({"Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool", "ConvTranspose"})


def _factor_values(values: np.ndarray, factor: Factor) -> np.ndarray:
    index, add, divisor = factor
    return (values[..., index] + add) // divisor


@dataclass(frozen=True)
class DimSize:
    """An engine call's integer as ``c0 + c * f_1 * f_2...`` over the dims vector, each factor a
    dim or a floor division of one (printed as C; the numerators are never negative)."""

    c0: int
    c: int
    factors: tuple[Factor, ...]

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(index for index, _, _ in self.factors)

    def __str__(self) -> str:
        parts = [
            run_time_dim(i).name if s == 1 else f"(({run_time_dim(i).name} + {a}) / {s})" for i, a, s in self.factors
        ]
        return f"((int64_t){self.c0} + (int64_t){self.c} * {' * '.join(parts)})"

    def at(self, values: Any) -> int:
        vector = np.asarray(values, dtype=np.int64)
        return self.c0 + self.c * int(np.prod([_factor_values(vector, f) for f in self.factors]))


@dataclass(frozen=True)
class RunTimeDims:
    """Dims whose kernels take them at run time: ``names`` are every symbolic dim of the graph
    (the dims vector's order), ``ranged`` the dims of the route with their ranges, ``samples``
    their values at the bindings lowered (the capacity first)."""

    names: tuple[str, ...]
    ranged: tuple[tuple[str, int, int], ...]
    samples: tuple[tuple[int, ...], ...]
    program: DimsProgram | None = None  # the dims vector without specializing (None: specialized)
    copies: bool = True  # sizes read as data computed from the dims vector (``with_dims_input``)

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.ranged)

    def binding(self, sample: tuple[int, ...]) -> dict[str, int]:
        return dict(zip(self.symbols, sample))

    @property
    def capacity(self) -> dict[str, int]:
        return self.binding(self.samples[0])


def route_for(
    graph: Graph,
    ranges: dict[str, tuple[int, int]],
    dims: dict[str, int],
    inputs: set[str],
    others: Sequence[dict[str, int]] = (),
) -> RunTimeDims:
    """The route for ``ranges`` (``dims`` binds the graph's other input dims; ``others``: their
    further bindings, a chunked dim's other size classes): its samples and, where one fits, its
    dims program. Raises NotAffine when the ranges cannot be lowered apart."""
    every = graph_symbols(graph)
    chosen = generic_samples(graph, every, ranges, dims)
    if chosen is None:
        raise NotAffine(f"the ranges {ranges} are too short, or too small, to lower apart")
    route = RunTimeDims(every, tuple((name, *bounds) for name, bounds in ranges.items()), chosen)
    return with_program(graph, route, dims, inputs, others)


def with_program(
    graph: Graph, route: RunTimeDims, dims: dict[str, int], inputs: set[str], others: Sequence[dict[str, int]] = ()
) -> RunTimeDims:
    """``route`` with its dims program (``kiln.driver.dims_program``), fitted to the vectors of its
    samples and check bindings at ``dims`` (binding the dims outside the route) and at each of
    ``others`` (the variants' other bindings of them, in a canonical order), interleaved so both
    halves of the fit see every binding; else at ``dims`` only; unchanged where none fits."""
    ranges = {name: (low, high) for name, low, high in route.ranged}

    def vectors_at(binding: dict[str, int]) -> list[np.ndarray]:
        at = [dim_values(graph, route.names, {**binding, **route.binding(s)}) for s in route.samples]
        return at + checks(graph, route.names, ranges, binding)[1]

    first = vectors_at(dims)
    outside = {name for name in inputs if name not in ranges}
    program = None
    extra = sorted({tuple(sorted(o.items())) for o in others} - {tuple(sorted(dims.items()))})
    if extra:
        try:
            lists = [first, *(vectors_at(dict(binding)) for binding in extra)]
        except KilnError as err:  # (no shapes at another class's bindings: that class specializes)
            log.info("the dims program fits the first size class only: %s", err)
        else:
            mixed = [row[i] for i in range(max(map(len, lists))) for row in lists if i < len(row)]
            program = fit_program(
                route.names, inputs, np.stack(mixed), strides_of(graph), outside, [v[0] for v in lists[1:]]
            )
    if program is None:
        program = fit_program(route.names, inputs, np.stack(first), strides_of(graph), outside)
    return route if program is None else dataclasses.replace(route, program=program)


def reads_sizes_as_data(graph: Graph, names: tuple[str, ...]) -> bool:
    """Whether ``with_dims_input`` copies any size computation (a kernel reads a size as data)."""
    given, vector = _with_vector(graph, names)
    return read_at_run_time(given, vector, names) is not given


def with_dims_input(graph: Graph, names: tuple[str, ...], copies: bool = True) -> Graph:
    """``graph`` with the dims vector as its last input, read by the kernels and (``copies``) by
    the copies of the size computations a kernel reads as data (``kiln.passes.run_time_sizes``)."""
    given, vector = _with_vector(graph, names)
    return read_at_run_time(given, vector, names) if copies else given


def _with_vector(graph: Graph, names: tuple[str, ...]) -> tuple[Graph, Value]:
    vector = Value(DIMS_INPUT, TensorType(DType.INT64, (len(names),)))
    return graph.with_(inputs=[*graph.inputs, vector]), vector


class Ambiguous(NotAffine):
    """Several terms fit the lowered bindings and differ at another binding, or a term fitted
    gives another integer than a lowering there: lowering at one more binding tells them apart."""

    def __init__(self, message: str, check: int) -> None:
        super().__init__(message)
        self.check = check


class TermFitter:
    """The terms ``c0 + c * product`` an integer may be (a product of at most MAX_TERMS dims, or
    one floor division of a dim), from the dims at the lowered bindings (``values``: [bindings,
    names]) and at the check bindings."""

    def __init__(self, values: np.ndarray, checked: np.ndarray, divisors: tuple[int, ...] = (2,)) -> None:
        both = np.concatenate([values, checked])
        usable = [i for i in range(both.shape[1]) if (both[:, i] > 0).all() and len(set(both[:, i])) > 1]
        groups: dict[bytes, Factor] = {}
        for i in usable:  # dims equal at every binding tried are one dim (the first named)
            groups.setdefault(both[:, i].tobytes(), (i, 0, 1))
        plain = sorted(groups.values())
        divided: dict[bytes, Factor] = {}
        for i, _, _ in plain:
            for divisor in divisors:
                for add in range(divisor):
                    column = _factor_values(both, (i, add, divisor))
                    if (column >= 0).all() and column.any() and column.tobytes() not in groups:
                        divided.setdefault(column.tobytes(), (i, add, divisor))
        terms: list[tuple[Factor, ...]] = [(f,) for f in plain] + [(f,) for f in divided.values()]
        terms += list(itertools.combinations_with_replacement(plain, MAX_TERMS))
        self.terms = terms
        self.at = self._columns(values)
        self.checked = self._columns(checked)
        self.memo: dict[tuple[int, ...], DimSize] = {}

    def _columns(self, values: np.ndarray) -> np.ndarray:
        columns = np.ones((len(self.terms), len(values)), dtype=np.int64)
        for row, term in enumerate(self.terms):
            for factor in term:
                columns[row] *= _factor_values(values, factor)
        return columns

    def fit(self, values: list[int], where: str) -> DimSize:
        key = tuple(values)
        if key not in self.memo:
            self.memo[key] = self._fit(np.array(values, dtype=np.int64), where)
        return self.memo[key]

    def _fit(self, v: np.ndarray, where: str) -> DimSize:
        m = self.at
        spread = m - m[:, :1]
        pick = np.abs(spread).argmax(axis=1)
        den = spread[np.arange(len(m)), pick]
        num = v[pick] - v[0]
        ok = den != 0
        safe = np.where(ok, den, 1)
        ok &= num % safe == 0
        c = num // safe
        c0 = v[0] - c * m[:, 0]
        ok &= ((c0[:, None] + c[:, None] * m) == v[None, :]).all(axis=1) & (c != 0)
        found = np.flatnonzero(ok)
        if not len(found):
            raise NotAffine(f"{where}: {v.tolist()} is no constant plus a multiple of a product of the model's dims")
        predicted = c0[found, None] + c[found, None] * self.checked[found]  # [terms that fit, checks]
        differ = np.flatnonzero((predicted != predicted[:1]).any(axis=0))
        if len(differ):
            raise Ambiguous(
                f"{where}: {v.tolist()} fits several products of dims that differ at other sizes", int(differ[0])
            )
        best = min(found, key=lambda i: (len(self.terms[i]), self.terms[i]))
        return DimSize(int(c0[best]), int(c[best]), tuple(self.terms[best]))


class _DimsMerge(Merge):
    """``Merge`` whose integers are the lowering's own expressions over the dims vector where they
    hold at every lowered binding (``kiln.driver.sized_terms``), else terms fitted to them."""

    def __init__(self, fitter: TermFitter, count: int, read: Any) -> None:
        super().__init__(tuple(range(count)))
        self.fitter, self.read = fitter, read
        self.sizes: dict[str, tuple[str, Any]] = {}  # where -> (how the value is the term, the term)

    def fit(self, values: list[int], where: str) -> Any:
        size = self.read(values)
        self.counts["read" if size is not None else "fitted"] += 1
        if size is None:
            log.debug("run-time dims: %s fitted (no expression gives %s)", where, values)
            size = self.fitter.fit(values, where)
        self.sizes[where] = ("int", size)
        return size

    def expression(self, size: Any) -> Any:
        if isinstance(size, ExprSize):
            return size.kir()
        product: Any = None
        for i, add, divisor in size.factors:
            factor: Any = run_time_dim(i)
            if divisor != 1:
                factor = Binary("/", Binary("+", factor, Const(add, DType.INT64)), Const(divisor, DType.INT64))
            product = factor if product is None else Binary("*", product, factor)
        if product is None:
            return Const(size.c0, DType.INT64)
        term = product if size.c == 1 else Binary("*", Const(size.c, DType.INT64), product)
        return term if size.c0 == 0 else Binary("+", term, Const(size.c0, DType.INT64))

    def is_size(self, merged: Any) -> bool:
        return isinstance(merged, (DimSize, ExprSize))

    def sized_type(self, x: Any) -> bool:
        return isinstance(x, _SIZED)

    def constant(self, items: list[Any], where: str) -> Any:
        """A float that differs: a product of dims (a mean's divisor), or one over it."""
        x = items[0]
        values = [float(y.value) for y in items]
        if x.dtype.is_float and all(v == int(v) for v in values):
            self.used = True
            size = self.fit([int(v) for v in values], where)
            self.sizes[where] = ("float", size)
            return Cast(x.dtype, self.expression(size))
        if x.dtype.is_float and all(v and 1 / v == int(1 / v) for v in values):
            self.used = True
            size = self.fit([int(1 / v) for v in values], where)
            self.sizes[where] = ("reciprocal", size)
            return Binary("/", Const(1.0, x.dtype), Cast(x.dtype, self.expression(size)))
        raise NotAffine(f"{where}: a {x.dtype.name} constant differs with the sizes")


# algorithms whose structure depends on a plane's sizes (Winograd's choice and tiles, the direct
# window's border rows): the route lowers without them
UNUSED = frozenset({"winograd", "size-specific"})  # (the direct window tests its borders at run time)
EXTRA_SAMPLES = 4  # bindings lowered beyond the first four when terms are ambiguous


class _Check(Merge):
    """Walks the capacity's kernel and one lowered at a held-out binding in step: every fitted
    term must give that lowering's integer there, and nothing else may differ."""

    def __init__(self, sizes: dict[str, tuple[str, DimSize]], vector: np.ndarray) -> None:
        super().__init__((0, 1))
        self.sizes, self.vector = sizes, vector

    def merge(self, items: list[Any], where: str, sized: bool = False) -> Any:
        recorded = self.sizes.get(where)
        if recorded is None:
            return super().merge(items, where, sized)
        how, size = recorded
        value = size.at(self.vector)
        expected = {"int": value, "float": float(value), "reciprocal": 1 / value if value else None}[how]
        actual = items[1].value if isinstance(items[1], Const) else items[1]
        if expected != actual:
            raise Ambiguous(
                f"{where}: the term fitted gives {expected} at another binding, whose lowering has {actual}", -1
            )
        return items[0]

    def fit(self, values: list[int], where: str) -> Any:
        raise Ambiguous(f"{where}: {values} differ at another binding only", -1)

    def constant(self, items: list[Any], where: str) -> Any:
        raise Ambiguous(f"{where}: a constant differs at another binding only", -1)


def run_time_dims_kernels(
    graph: Graph, dims: dict[str, int], route: RunTimeDims, target: Any, options: Any, prebuilt: dict | None = None
) -> Compile:
    """The compile state at the capacity, through plan-memory, its kernels' sizes made terms
    over the dims vector (``graph`` has it as its last input; raises NotAffine saying why not).
    Where two terms fit the lowered bindings and differ at a check binding, that binding is
    lowered too (at most EXTRA_SAMPLES times)."""
    ranges = {name: (low, high) for name, low, high in route.ranged}
    options = options.with_(disabled=options.disabled | UNUSED)
    bindings = [{**dims, **route.binding(s)} for s in route.samples]
    try:
        values = [dim_values(graph, route.names, b) for b in bindings]
        extra, checked = checks(graph, route.names, ranges, dims)
    except KilnError as err:
        raise NotAffine(f"the model has no shapes at some sizes of the ranges {ranges}: {err}") from None
    layouts = cache_layouts(graph, route.names, values[0], bindings[0])
    # (the cpu target's: its runs are what kiln.driver.laid lays out; the gpu's copies to the device
    # are not checked with a cache laid out so, lent no device yet)
    if layouts and "cache-in-place" not in options.disabled and resolve_target(target).backend == "cpu":
        options = options.with_(cache_layouts=layouts)
    bindings[0] = _kept(bindings[0], ranges, route.names, values[0])
    states = [_lowered(graph, b, target, options, prebuilt, b is not bindings[0]) for b in bindings]
    held = _lowered(graph, extra[0], target, options, prebuilt, True)
    check_constants([*states, held])
    for _ in range(EXTRA_SAMPLES + 1):
        try:
            merged = _merged(states, np.stack(values), np.stack(checked[1:]), divisors_of(graph, states), route)
            _check(merged, held, checked[0])
            return _verified(_replace(states[0], merged), route, dims)
        except Ambiguous as err:
            if len(states) >= len(route.samples) + EXTRA_SAMPLES or len(extra) < 3:
                raise NotAffine(str(err)) from None
            if err.check >= 0:  # two terms differ at a check binding: it is lowered too
                states.append(_lowered(graph, extra.pop(err.check + 1), target, options, prebuilt, True))
                values.append(checked.pop(err.check + 1))
                continue
            # a term is wrong at the held-out binding: it joins the lowered ones, the next is held out
            states.append(held)
            values.append(checked.pop(0))
            extra.pop(0)
            held = _lowered(graph, extra[0], target, options, prebuilt, True)
            check_constants([*states, held])
    raise AssertionError("unreachable")


def cache_layouts(
    graph: Graph, names: tuple[str, ...], vector: np.ndarray, dims: dict[str, int]
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Each KV cache's past input (``kiln.passes.cache_in_place.cache_pairs``) with its present's
    shape at the capacity (``vector``, the capacity's dims vector): where the route lays it out."""
    sizes = {**dims, **dict(zip(names, (int(v) for v in vector)))}
    found = []
    for past, node in cache_pairs(graph):
        shape = bind_type(node.outputs[0].type, sizes).shape  # type: ignore[union-attr]
        if shape is not None and all(isinstance(d, int) and d >= 1 for d in shape):
            found.append((past.name, tuple(int(d) for d in shape)))
    return tuple(found)


def _kept(binding: dict[str, int], ranges: Any, names: tuple[str, ...], vector: np.ndarray) -> dict[str, int]:
    """The capacity's binding with each symbol a ``SizedInt`` that keeps its name: the ranged input
    dims, and the symbols inference made where no expression of them says a size (a layer's
    ``s77``: its size is the dims vector's entry, the expression its own name)."""
    at = {k: int(v) for k, v in binding.items()}  # (shared: a product's values split it)
    kept = {k: SizedInt(v, size_exprs.sym(k), at) if k in ranges else v for k, v in binding.items()}
    for i, name in enumerate(names):
        try:
            bare = size_exprs.parse(name).symbol == name
        except size_exprs.DimSyntaxError:
            continue
        if bare and name not in binding and int(vector[i]) >= 0:
            at[name] = int(vector[i])
            kept[name] = SizedInt(int(vector[i]), size_exprs.sym(name), at)
    return kept


def _lowered(graph: Graph, dims: dict[str, int], target: Any, options: Any, prebuilt: Any, sample: bool) -> Compile:
    state = start(graph, target, options, dims=dims, prebuilt=prebuilt or {}, sizes_only=sample)
    return run_stages(state, "specialize", "plan-memory")


def _merged(
    states: list[Compile], values: np.ndarray, checked: np.ndarray, divisors: tuple[int, ...], route: RunTimeDims
) -> list[tuple[Kernel, Kernel, Any]]:
    """Each capacity kernel (of the first state) with its merged form (the same object when no
    integer differs) and its run-time sizes, by where they are: the lowering's own expressions
    where they hold at every lowered binding, else terms fitted to those bindings."""
    kernels = [kernels_of(state) for state in states]
    if len({len(k) for k in kernels}) != 1:
        raise NotAffine("the number of kernels changes with the sizes")
    fitter = TermFitter(values, checked, divisors)
    ranges = {name: (low, high) for name, low, high in route.ranged}

    def read(found: list[int]) -> ExprSize | None:
        return sized_terms.read(found[0], route.names, ranges, values, found)

    result, counts = [], {"read": 0, "fitted": 0}
    for position, kernel in enumerate(kernels[0]):
        merge = _DimsMerge(fitter, len(states), read)
        merged = merge.merge([kernel, *(k[position] for k in kernels[1:])], kernel.name)
        result.append((kernel, merged, merge.sizes))
        counts = {k: counts[k] + merge.counts[k] for k in counts}
    log.debug("run-time sizes: %(read)d read from the lowering's expressions, %(fitted)d fitted", counts)
    found_sizes(counts)
    if all(kernel is merged for kernel, merged, _ in result):
        raise NotAffine("no kernel's sizes depend on the dims")
    return result


def _check(merged: list[tuple[Kernel, Kernel, Any]], held: Compile, vector: np.ndarray) -> None:
    """Every term fitted gives the held-out lowering's integers (raises Ambiguous where not)."""
    kernels = kernels_of(held)
    if len(kernels) != len(merged):
        raise Ambiguous("the number of kernels differs at another binding", -1)
    for (kernel, _, sizes), other in zip(merged, kernels):
        _Check(sizes, vector).merge([kernel, other], kernel.name)


def _replace(capacity: Compile, merged: list[tuple[Kernel, Kernel, Any]]) -> Compile:
    """The capacity's state with its kernels replaced by their merged forms, told where the dims
    vector is (epilogues are changed in place: only now, when every check passed)."""
    vector = next(capacity.roots[v] for v in capacity.graph.inputs if v.name == DIMS_INPUT)
    position = 0
    for segment in capacity.segments:
        for i in range(len(segment)):
            kernel, new, sizes = merged[position]
            if new is not kernel:
                read = tuple(sorted({index for _, size in sizes.values() for index in size.dims}))
                segment[i] = told_where(new, "dims", vector, (vector, read))
            position += 1
    return capacity


def _verified(capacity: Compile, route: RunTimeDims, fixed: dict[str, int]) -> Compile:
    """``capacity`` once every access of its kernels is inside its buffer at every size of the
    route's ranges (``kiln.lower.kir_verify`` with each dims vector entry's bounds: an entry that is
    an expression of the input dims is bounded by their ranges; others are not, and accesses that
    depend on them are left to the run-time checks). Raises NotAffine naming the first that is not."""
    known = {**{k: (v, v) for k, v in fixed.items()}, **{name: (low, high) for name, low, high in route.ranged}}
    scope: dict[str, tuple[int, int] | None] = {}
    for i, name in enumerate(route.names):
        try:
            expr = size_exprs.parse(name)
        except size_exprs.DimSyntaxError:
            continue
        low, high = size_exprs.bounds(expr, known) if size_exprs.symbols(expr) <= set(known) else (None, None)
        if low is not None and high is not None and low > -math.inf and high < math.inf:
            scope[run_time_dim(i).name] = (int(low), int(high))
    for kernel in kernels_of(capacity):
        problems = verify_kernel(kernel, scope)
        if problems:
            raise NotAffine(f"at some size of the ranges, {problems[0]}")
    return capacity


def compile_with_run_time_dims(
    graph: Graph, dims: dict[str, int], route: RunTimeDims, target: Any, options: Any, prebuilt: dict | None = None
) -> Plan:
    state = run_time_dims_kernels(graph, dims, route, target, options, prebuilt)
    return run_stages(state, "render", "build").plan()


def fit_program(
    names: tuple[str, ...],
    inputs: set[str],
    vectors: np.ndarray,
    divisors: tuple[int, ...],
    outside: set[str] = frozenset(),  # type: ignore[assignment]
    classes: Sequence[np.ndarray] = (),
) -> DimsProgram | None:
    """The program of ``vectors`` ([bindings, names], the capacity's first; the first half fits,
    the rest checks), or None where a dim fits no term, or two terms that tell apart. ``outside``:
    the input dims outside the route, bound per variant; ``classes``: the other variants'
    capacities (their bindings among ``vectors``)."""
    if len(vectors) < 6:
        return None
    fitting, checking = vectors[: (len(vectors) + 1) // 2], vectors[(len(vectors) + 1) // 2 :]
    bound = tuple(i for i, name in enumerate(names) if name in inputs)
    given = {names[i] for i in bound}
    named = tuple(i for i in range(len(names)) if i not in bound and expression_of(names[i], given))
    for index in named:  # the name is the program: checked at every binding specialized
        expr = size_exprs.parse(names[index])
        for row in vectors:
            value = size_exprs.substitute(expr, {names[i]: int(row[i]) for i in bound})
            if row[index] >= 0 and value != size_exprs.const(int(row[index])):
                return None
    steps: list[Step] = []
    for index in range(len(names)):
        if index in bound or index in named:
            continue
        column = vectors[:, index]
        if len(set(column.tolist())) == 1:
            steps.append((index, int(column[0]), 0, ()))
            continue
        fitter = TermFitter(fitting[:, :index], checking[:, :index], divisors)
        try:
            size = fitter.fit([int(v) for v in fitting[:, index]], names[index])
        except (Ambiguous, NotAffine):
            return None
        if any(size.at(row) != value for row, value in zip(checking, checking[:, index])):
            return None
        steps.append((index, size.c0, size.c, size.factors))
    groups: dict[bytes, list[int]] = {}
    for index in range(len(names)):
        if (vectors[:, index] >= 1).all():
            groups.setdefault(vectors[:, index].tobytes(), []).append(index)
    equal = tuple(tuple(g) for g in groups.values() if len(g) > 1)
    fixed = tuple(i for i in bound if names[i] in outside)
    others = tuple(tuple(int(v) for v in c) for c in classes)
    return DimsProgram(names, bound, tuple(steps), tuple(int(v) for v in vectors[0]), equal, named, fixed, others)
