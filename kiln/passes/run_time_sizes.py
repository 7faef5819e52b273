"""Sizes a model computes with as data, read at run time from the dims vector.

An exported decoder gathers its position embedding at the cache's length (``Shape -> Gather ->
Add -> Unsqueeze -> Gather(wpe)``), offsets flattened mask indices by a size, compares positions
against the length for its causal mask. Bound to one size, all of that folds to constants, and a
constant that differs per size (a float row of a table, indices) cannot be held by one library
whose kernels take the sizes at run time (``kiln.driver.spatial``). ``read_at_run_time`` gives
such a graph a copy of each size computation whose result a kernel reads as *data* (a gather's
indices or table rows, an operand of arithmetic, a comparison or a selection), computed from the
dims vector input instead of folded; the computations that give the graph its *structure* (a
Reshape's target, a Range's bounds, a Slice's starts, an Unsqueeze's axes) keep folding at each
binding, where the route fits the integers the kernels hold. The copies start at ``Shape`` and
``Size``: each symbolic dim is the dims vector's entries of the graph inputs' symbols, combined by
the dim's expression (sums of products; a dim with a floor division, a remainder or min/max is
not copied: that computation keeps folding, and the route refuses as before).

Only what feeds data is copied: a size computation that only shapes the graph stays as it was, so
a graph with none is returned unchanged (the same object).
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from kiln.ir import dims as sizes
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import DType, TensorType
from kiln.ops.registry import has_trait

# the inputs an op reads as data (the others are structure: axes, targets, bounds, counts)
DATA_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Gather": (0, 1),
    "GatherElements": (0, 1),
    "GatherND": (0, 1),
    "Unsqueeze": (0,),
    "Squeeze": (0,),
    "Reshape": (0,),
    "Flatten": (0,),
    "Expand": (0,),
    "Slice": (0,),
    "Transpose": (0,),
    "Tile": (0,),
    "Concat": None,  # every input
}
SUFFIX = "__rt"


def data_inputs(node: Node) -> tuple[int, ...]:
    """The positions of ``node``'s inputs it reads as data (none for an op kiln does not list)."""
    if node.domain:
        return ()
    if node.op in DATA_INPUTS:
        listed = DATA_INPUTS[node.op]
        return tuple(range(len(node.inputs))) if listed is None else listed
    return tuple(range(len(node.inputs))) if has_trait(node.op, "", "aligned") else ()


def read_at_run_time(graph: Graph, dims_input: Value, names: tuple[str, ...]) -> Graph:
    """``graph`` (whose inputs include ``dims_input``, the vector of ``names``' sizes) with every
    size computation a kernel reads as data computed from ``dims_input``."""
    symbols = {d for v in graph.inputs for d in getattr(v.type, "shape", None) or () if isinstance(d, str)}
    index = {name: i for i, name in enumerate(names) if name in symbols}
    sized = _sized(graph)
    if not sized:
        return graph
    producers = graph.producers()
    copier = _Copier(dims_input, index, producers, sized, {v.name for v in graph.values()})
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        if node.outputs and all(out in sized for out in node.outputs):
            nodes.append(node)
            continue
        inputs = list(node.inputs)
        for position in data_inputs(node):
            value = inputs[position] if position < len(inputs) else None
            if value is not None and value in sized:
                copied = copier.copy(value)
                if copied is not value:
                    inputs[position], changed = copied, True
        nodes.extend(copier.take())
        nodes.append(node if inputs == list(node.inputs) else _with_inputs(node, inputs))
    if not changed:
        return graph
    return graph.with_(nodes=nodes, constants={**graph.constants, **copier.constants})


def _sized(graph: Graph) -> set[Value]:
    """The values computed from constants and the symbolic sizes of values (``Shape``/``Size``
    of a value with a symbolic dim, and what only such values and constants compute)."""
    known = set(graph.constants)
    sized: set[Value] = set()
    for node in graph.nodes:
        if any(True for _ in node.subgraphs()) or node.domain:
            continue
        if node.op in ("Shape", "Size") and node.inputs and node.inputs[0] is not None:
            shape = getattr(node.inputs[0].type, "shape", None)
            if shape is not None and any(isinstance(d, str) for d in shape):
                sized.update(node.outputs)
            continue
        read = [v for v in node.inputs if v is not None]
        if read and all(v in known or v in sized for v in read) and any(v in sized for v in read):
            sized.update(node.outputs)
    return sized


def _with_inputs(node: Node, inputs: list[Value | None]) -> Node:
    return Node(node.op, tuple(inputs), node.outputs, dict(node.attrs), node.name, node.domain)


class _Copier:
    """Copies of size computations reading the dims vector, made on demand (inputs first)."""

    def __init__(
        self,
        vector: Value,
        index: dict[str, int],
        producers: dict[Value, Node],
        sized: set[Value],
        taken: set[str],
    ) -> None:
        self.vector, self.index, self.producers, self.sized, self.taken = vector, index, producers, sized, taken
        self.copies: dict[Value, Value] = {}
        self.pending: list[Node] = []
        self.constants: dict[Value, np.ndarray] = {}

    def take(self) -> list[Node]:
        made, self.pending = self.pending, []
        return made

    def copy(self, value: Value) -> Value:
        """The copy of ``value`` computed at run time (``value`` itself where it cannot be made,
        or where nothing it reads as data depends on a size: a Range over folded bounds)."""
        if value not in self.sized:
            return value
        if value not in self.copies:
            node = self.producers[value]
            made = self._sizes(node) if node.op in ("Shape", "Size") else self._node(node)
            for original, copied in zip(node.outputs, made or node.outputs):
                self.copies[original] = copied
        return self.copies[value]

    def _node(self, node: Node) -> tuple[Value, ...] | None:
        positions = data_inputs(node)
        inputs = [self.copy(v) if i in positions and v is not None else v for i, v in enumerate(node.inputs)]
        if all(a is b for a, b in zip(inputs, node.inputs)):
            return None
        outputs = tuple(Value(self._name(out.name), out.type) for out in node.outputs)
        self.pending.append(Node(node.op, tuple(inputs), outputs, dict(node.attrs), node.name + SUFFIX, node.domain))
        return outputs

    def _sizes(self, node: Node) -> tuple[Value, ...] | None:
        source = node.inputs[0]
        assert source is not None
        shape = list(source.type.shape)  # type: ignore[union-attr]
        if node.op == "Shape":
            rank = len(shape)
            start, end = node.attrs.get("start", 0), node.attrs.get("end", rank)
            start = max(0, min(rank, start + rank if start < 0 else start))
            end = max(0, min(rank, end + rank if end < 0 else end))
            parts = [self._dim(_expr(d)) for d in shape[start:end]]
        else:
            parts = [self._dim(reduce(sizes.mul, (_expr(d) for d in shape), sizes.const(1)))]
        if any(p is None for p in parts):
            return None
        out = node.outputs[0]
        if node.op == "Size" or len(parts) == 1:
            joined = parts[0]
        else:
            joined = self._emit("Concat", parts, {"axis": 0}, TensorType(DType.INT64, (len(parts),)), out.name)
        if node.op == "Size":
            joined = self._emit("Reshape", [joined, self._constant(np.zeros(0, np.int64))], {}, out.type, out.name)
        return (joined,)

    def _dim(self, expr: sizes.Expr) -> Value | None:
        """A [1] int64 vector: the size ``expr`` computed from the dims vector's entries of input symbols."""
        one = TensorType(DType.INT64, (1,))
        total = self._constant(np.array([expr.constant], np.int64)) if expr.constant or not expr.terms else None
        for atoms, coefficient in expr.terms:
            if not all(isinstance(a, sizes.Sym) and a.name in self.index for a in atoms):
                return None  # (a floor division, a remainder, min/max, a symbol no input has)
            term = None
            for atom in atoms:
                entry = self._emit(
                    "Gather", [self.vector, self._constant(np.array([self.index[atom.name]], np.int64))], {}, one, "dim"
                )
                term = entry if term is None else self._emit("Mul", [term, entry], {}, one, "dim")
            assert term is not None
            if coefficient != 1:
                term = self._emit("Mul", [term, self._constant(np.array([coefficient], np.int64))], {}, one, "dim")
            total = term if total is None else self._emit("Add", [total, term], {}, one, "dim")
        return total

    def _emit(self, op: str, inputs: list, attrs: dict, type_: TensorType, hint: str) -> Value:
        out = Value(self._name(hint), type_)
        self.pending.append(Node(op, tuple(inputs), (out,), attrs, out.name))
        return out

    def _constant(self, array: np.ndarray) -> Value:
        value = Value(self._name("size_constant"), TensorType(DType.INT64, tuple(array.shape)))
        self.constants[value] = array
        return value

    def _name(self, hint: str) -> str:
        name, n = hint + SUFFIX, 1
        while name in self.taken:
            n += 1
            name = f"{hint}{SUFFIX}{n}"
        self.taken.add(name)
        return name


def _expr(dim: int | str) -> sizes.Expr:
    return sizes.const(dim) if isinstance(dim, int) else sizes.parse(dim)
