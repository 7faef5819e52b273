"""The graph IR: immutable values, nodes and graphs with structural equality and hashing.

Values compare by identity (a value is defined once); graphs compare structurally: two graphs are
equal when they compute the same dataflow from inputs of the same types, whatever their value and
node names. ``Graph.digest`` is that structure as a SHA-256 hex string, usable as a cache key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from kiln.integrity import content_digest
from kiln.ir.types import TensorType, Type

DEFAULT_OPSET = 21


@dataclass(frozen=True, eq=False)
class Value:
    """A named SSA value. Identity is the value: two Value objects are never the same value."""

    name: str
    type: Type

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(frozen=True, eq=False)
class Node:
    """One operation. ``inputs`` may hold None for an omitted optional input."""

    op: str
    inputs: tuple[Value | None, ...]
    outputs: tuple[Value, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "attrs", MappingProxyType(dict(sorted(self.attrs.items()))))

    def __reduce__(self) -> tuple[Any, ...]:  # pickled into the plan cache
        return (Node, (self.op, self.inputs, self.outputs, dict(self.attrs), self.name, self.domain))

    @property
    def label(self) -> str:
        """How errors name this node: ``'Conv_12' (Conv)``."""
        op = f"{self.domain}::{self.op}" if self.domain else self.op
        return f"{self.name!r} ({op})" if self.name else f"<unnamed {op} -> {self.outputs[0].name}>"

    def subgraphs(self) -> Iterator[Graph]:
        for value in self.attrs.values():
            if isinstance(value, Graph):
                yield value
            elif isinstance(value, tuple) and value and isinstance(value[0], Graph):
                yield from value

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.name!r})"


@dataclass(frozen=True, eq=False)
class Graph:
    """A typed DAG: ``nodes`` in topological order; ``constants`` are the weights (initializers).

    ``opsets`` maps domain ("" is ONNX's default domain) to the opset the graph was written for.
    Subgraphs (If/Loop/Scan bodies) may use values of enclosing graphs directly.
    """

    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    constants: Mapping[Value, np.ndarray] = field(default_factory=dict)
    name: str = "main"
    opsets: Mapping[str, int] = field(default_factory=lambda: {"": DEFAULT_OPSET})
    # constants a caller may override by name (ONNX initializers also listed as graph inputs:
    # defaults, not frozen weights); compiled as constants unless a run gives them
    defaults: tuple[Value, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", tuple(self.defaults))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "constants", MappingProxyType(dict(self.constants)))
        object.__setattr__(self, "opsets", MappingProxyType(dict(self.opsets)))

    def __reduce__(self) -> tuple[Any, ...]:  # pickled into the plan cache
        return (
            Graph,
            (self.inputs, self.outputs, self.nodes, dict(self.constants), self.name, dict(self.opsets), self.defaults),
        )

    @property
    def opset(self) -> int:
        return self.opsets.get("", DEFAULT_OPSET)

    def producers(self) -> dict[Value, Node]:
        return {out: node for node in self.nodes for out in node.outputs}

    def consumers(self) -> dict[Value, list[Node]]:
        users: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                if value is not None:
                    users.setdefault(value, []).append(node)
        return users

    def values(self) -> Iterator[Value]:
        """Every value defined in this graph (not in subgraphs): inputs, constants, node outputs."""
        yield from self.inputs
        yield from self.constants
        for node in self.nodes:
            yield from node.outputs

    def find_value(self, name: str) -> Value:
        for value in self.values():
            if value.name == name:
                return value
        raise KeyError(f"graph {self.name!r} has no value named {name!r}")

    def constant_bytes(self) -> int:
        """Bytes of the graph's constants (its weights; not its subgraphs')."""
        return sum(a.nbytes for a in self.constants.values())

    def signature(self) -> Graph:
        """The graph's inputs, outputs and overridable defaults, without its nodes or weights."""
        return Graph(self.inputs, self.outputs, (), {}, self.name, self.opsets, self.defaults)

    def with_(self, **changes: Any) -> Graph:
        """A copy with some fields replaced (graphs are immutable)."""
        fields = {
            "inputs": self.inputs,
            "outputs": self.outputs,
            "nodes": self.nodes,
            "constants": self.constants,
            "name": self.name,
            "opsets": self.opsets,
        }
        fields.update(changes)
        if "defaults" not in changes:  # the defaults that are still constants
            fields["defaults"] = tuple(v for v in self.defaults if v in fields["constants"])
        return Graph(**fields)

    # -- structural identity -------------------------------------------------------------------

    @property
    def digest(self) -> str:
        cached = self.__dict__.get("_digest")
        if cached is None:
            cached = StructuralHasher().graph(self)
            object.__setattr__(self, "_digest", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return self is other or self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:  # the text form is kiln.ir.printer.print_graph's (the printer sits above)
        return f"<Graph {self.name!r}: {len(self.nodes)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs>"


def array_digest(array: np.ndarray) -> str:
    """A digest of an array's dtype, shape and values. A view whose axes, reordered, are
    contiguous (a weight's transpose) is hashed in that order, with the order in the digest: no
    copy of a 400 MB classifier's transpose."""
    array = np.asarray(array)
    order = _contiguous_order(array)
    header = f"{array.dtype.str}{array.shape}{order or ''}".encode()
    if array.dtype == object:
        return hashlib.sha256(header + repr(array.tolist()).encode()).hexdigest()
    data = array.transpose(order) if order else np.ascontiguousarray(array)
    return content_digest(header, memoryview(data.reshape(-1).view(np.uint8)))


def _contiguous_order(array: np.ndarray) -> tuple[int, ...] | None:
    """The axis order in which a non-contiguous array's memory is contiguous (None when it is
    C-contiguous already, or no order is)."""
    if array.flags.c_contiguous or array.ndim < 2 or array.size == 0:
        return None
    order = tuple(sorted(range(array.ndim), key=lambda axis: -array.strides[axis]))
    return order if array.transpose(order).flags.c_contiguous else None


class StructuralHasher:
    """Hashes values by how they are computed, so names never matter."""

    def __init__(self) -> None:
        self.keys: dict[Value, str] = {}

    def graph(self, graph: Graph) -> str:
        for index, value in enumerate(graph.inputs):
            self.keys[value] = _sha(f"input{index}:{value.type}")
        defaults = set(graph.defaults)
        for value, array in graph.constants.items():
            overridable = "default:" if value in defaults else ""
            self.keys[value] = _sha(f"const:{overridable}{value.type}:{array_digest(array)}")
        node_keys = []
        for node in graph.nodes:
            node_key = _sha(
                "|".join([node.domain, node.op, self.attrs(node.attrs)] + [self.value(v) for v in node.inputs])
            )
            node_keys.append(node_key)
            for index, out in enumerate(node.outputs):
                self.keys[out] = _sha(f"{node_key}:{index}:{out.type}")
        outputs = [self.value(v) for v in graph.outputs]
        opsets = sorted(graph.opsets.items())
        return _sha(f"{opsets}|{outputs}|{sorted(node_keys)}")

    def value(self, value: Value | None) -> str:
        if value is None:
            return "none"
        # A value from an enclosing scope, seen while hashing a subgraph on its own.
        return self.keys.get(value) or _sha(f"outer:{value.name}:{value.type}")

    def attrs(self, attrs: Mapping[str, Any]) -> str:
        return ";".join(f"{k}={self.attr(v)}" for k, v in attrs.items())

    def attr(self, value: Any) -> str:
        if isinstance(value, Graph):
            # Subgraphs see the enclosing scope through our keys.
            inner = StructuralHasher()
            inner.keys = dict(self.keys)
            return inner.graph(value)
        if isinstance(value, np.ndarray):
            return array_digest(value)
        if isinstance(value, tuple):
            return "(" + ",".join(self.attr(v) for v in value) + ")"
        if isinstance(value, float):
            return repr(float(value))
        return repr(value)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def iter_all_nodes(graph: Graph) -> Iterator[Node]:
    """Every node of ``graph`` and, recursively, of its subgraphs."""
    for node in graph.nodes:
        yield node
        for sub in node.subgraphs():
            yield from iter_all_nodes(sub)


def constant_type(array: np.ndarray) -> TensorType:
    from kiln.ir.types import DType

    return TensorType(DType.from_numpy(array.dtype), tuple(int(d) for d in array.shape))


def unique_name(base: str, taken: set[str]) -> str:
    """``base`` if free, else ``base_1``, ``base_2``...; the result is added to ``taken``."""
    name, counter = base, 0
    while name in taken:
        counter += 1
        name = f"{base}_{counter}"
    taken.add(name)
    return name


def topological_order(nodes: Iterable[Node]) -> list[Node]:
    """Nodes ordered so every producer comes before its consumers; raises ValueError on a cycle."""
    nodes = list(nodes)
    producer = {out: node for node in nodes for out in node.outputs}
    state: dict[int, int] = {}
    order: list[Node] = []
    for root in nodes:
        if state.get(id(root)) == 2:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, index = stack.pop()
            if index == 0:
                if state.get(id(node)) == 2:
                    continue
                state[id(node)] = 1
            deps = [producer[v] for v in _node_reads(node) if v in producer]
            if index < len(deps):
                stack.append((node, index + 1))
                dep = deps[index]
                mark = state.get(id(dep))
                if mark == 1:
                    raise ValueError(f"cycle through node {dep.label}")
                if mark is None:
                    stack.append((dep, 0))
            else:
                state[id(node)] = 2
                order.append(node)
    return order


def _node_reads(node: Node) -> list[Value]:
    """Inputs plus outer-scope values read by the node's subgraphs."""
    reads = [v for v in node.inputs if v is not None]
    for sub in node.subgraphs():
        reads.extend(free_values(sub))
    return reads


def free_values(graph: Graph) -> list[Value]:
    """Values a (sub)graph reads from enclosing scopes."""
    defined = set(graph.values())
    free: list[Value] = []
    for node in graph.nodes:
        for value in _node_reads(node):
            if value not in defined and value not in free:
                free.append(value)
    for value in graph.outputs:
        if value not in defined and value not in free:
            free.append(value)
    return free


def rename_symbols(graph: Graph, names: Mapping[str, str]) -> Graph:
    """``graph`` with the symbolic dims in ``names`` renamed throughout (its subgraphs too)."""
    from kiln.ir.types import OptionalType, SequenceType

    mapping: dict[Value, Value] = {}

    def renamed_type(value_type: Type) -> Type:
        if isinstance(value_type, TensorType) and value_type.shape is not None:
            return TensorType(
                value_type.dtype, tuple(names.get(d, d) if isinstance(d, str) else d for d in value_type.shape)
            )
        if isinstance(value_type, (SequenceType, OptionalType)):
            return type(value_type)(renamed_type(value_type.elem))
        return value_type

    def rename(value: Value | None) -> Value | None:
        if value is None:
            return None
        if value not in mapping:
            new_type = renamed_type(value.type)
            mapping[value] = value if new_type == value.type else Value(value.name, new_type)
        return mapping[value]

    def rebuild(sub: Graph) -> Graph:
        nodes = [
            Node(
                node.op,
                [rename(v) for v in node.inputs],
                [rename(v) for v in node.outputs],  # type: ignore[misc]
                {k: rebuild(a) if isinstance(a, Graph) else a for k, a in node.attrs.items()},
                name=node.name,
                domain=node.domain,
            )
            for node in sub.nodes
        ]
        return sub.with_(
            inputs=[rename(v) for v in sub.inputs],
            outputs=[rename(v) for v in sub.outputs],
            nodes=nodes,
            constants={rename(v): a for v, a in sub.constants.items()},
            defaults=[rename(v) for v in sub.defaults],
        )

    return rebuild(graph) if names else graph
