"""Helpers passes use to build a new graph from an old one (graphs are immutable).

A pass walks ``graph.nodes`` and tells a ``Rewriter`` what to keep, what to add and which values
now stand for which (``replace(old, new)``); ``finish`` rebuilds nodes whose inputs changed, the
graph outputs, and subgraphs that read replaced values from the enclosing scope.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir.graph import Graph, Node, Value, constant_type, free_values, unique_name
from kiln.ir.types import DType, TensorType
from kiln.ops.inference import infer_node


class Rewriter:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.constants: dict[Value, np.ndarray] = dict(graph.constants)
        self.replacements: dict[Value, Value] = {}
        self.taken = {v.name for v in graph.values()}
        self.changed = False

    # -- values ------------------------------------------------------------------------------

    def resolve(self, value: Value | None) -> Value | None:
        """The value that now stands for ``value`` (following chains of replacements)."""
        while value is not None and value in self.replacements:
            value = self.replacements[value]
        return value

    def replace(self, old: Value, new: Value) -> None:
        if old is not new:
            self.replacements[old] = new
            self.changed = True

    def constant_value(self, value: Value | None) -> np.ndarray | None:
        value = self.resolve(value)
        return None if value is None else self.constants.get(value)

    def add_constant(self, array: np.ndarray, hint: str) -> Value:
        array = np.asarray(array)
        value = Value(unique_name(hint, self.taken), constant_type(array))
        self.constants[value] = array
        self.changed = True
        return value

    # -- nodes -------------------------------------------------------------------------------

    def resolved(self, node: Node) -> Node:
        """``node`` reading the values that now stand for its inputs."""
        inputs = [self.resolve(v) for v in node.inputs]
        if all(a is b for a, b in zip(inputs, node.inputs)):
            return node
        return Node(node.op, inputs, node.outputs, dict(node.attrs), name=node.name, domain=node.domain)

    def keep(self, node: Node) -> None:
        self.nodes.append(node)

    def drop(self, node: Node) -> None:
        self.changed = True

    def emit(
        self,
        op: str,
        inputs: list[Value | None],
        attrs: dict[str, Any] | None = None,
        hint: str = "",
        outputs: int = 1,
        name: str = "",
        domain: str = "",
    ) -> list[Value]:
        """A new node, its output types inferred by the registry."""
        inputs = [self.resolve(v) for v in inputs]
        placeholders = [Value(f"{hint or op}_{i}", TensorType(DType.FLOAT32, None)) for i in range(outputs)]
        draft = Node(op, inputs, placeholders, attrs or {}, name=name, domain=domain)
        known = [self.constant_value(v) for v in inputs]
        types, _ = infer_node(draft, [None if v is None else v.type for v in inputs], known, [None] * len(inputs))
        results = [Value(unique_name(hint or op.lower(), self.taken), t) for t in types]
        self.nodes.append(Node(op, inputs, results, attrs or {}, name=name, domain=domain))
        self.changed = True
        return results

    # -- result ------------------------------------------------------------------------------

    def finish(self) -> Graph:
        if not self.changed:
            return self.graph
        nodes = [self._rewire(node) for node in self.nodes]
        outputs = [self.resolve(v) for v in self.graph.outputs]
        used = {v for node in nodes for v in node.inputs if v is not None} | set(outputs)
        for node in nodes:
            for sub in node.subgraphs():
                used.update(free_values(sub))
        constants = {v: a for v, a in self.constants.items() if v in used}
        return self.graph.with_(nodes=nodes, outputs=outputs, constants=constants)

    def _rewire(self, node: Node) -> Node:
        inputs = [self.resolve(v) for v in node.inputs]
        attrs = dict(node.attrs)
        touched = any(a is not b for a, b in zip(inputs, node.inputs))
        for key, attr in node.attrs.items():
            if isinstance(attr, Graph) and any(v in self.replacements for v in free_values(attr)):
                attrs[key] = substitute_free(attr, self.resolve)
                touched = True
        if not touched:
            return node
        return Node(node.op, inputs, node.outputs, attrs, name=node.name, domain=node.domain)  # type: ignore[arg-type]


def substitute_free(graph: Graph, resolve: Any) -> Graph:
    """``graph`` with enclosing-scope values it reads mapped through ``resolve``."""
    nodes = []
    for node in graph.nodes:
        inputs = [v if v is None else resolve(v) for v in node.inputs]
        attrs = {k: substitute_free(a, resolve) if isinstance(a, Graph) else a for k, a in node.attrs.items()}
        nodes.append(Node(node.op, inputs, node.outputs, attrs, name=node.name, domain=node.domain))
    return graph.with_(nodes=nodes, outputs=[resolve(v) for v in graph.outputs])


def consumers_count(graph: Graph) -> dict[Value, int]:
    """How many times each value is read (node inputs, subgraph reads, graph outputs)."""
    counts: dict[Value, int] = {}
    for node in graph.nodes:
        for value in node.inputs:
            if value is not None:
                counts[value] = counts.get(value, 0) + 1
        for sub in node.subgraphs():
            for value in free_values(sub):
                counts[value] = counts.get(value, 0) + 1
    for value in graph.outputs:
        counts[value] = counts.get(value, 0) + 1
    return counts
