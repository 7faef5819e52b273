"""Specialization: bind symbolic dims (``batch``, ``seq``) to numbers throughout the graph.

Every type is rewritten with the binding, then fold_constants collapses the shape arithmetic that
depended on the symbols. The compiled code of a specialized graph has static shapes; kiln
compiles one specialization per distinct binding of the model's input dims.
"""

from __future__ import annotations

from collections.abc import Mapping

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import OptionalType, SequenceType, TensorType, Type
from kiln.ops.symbolic_dims import bound


def bind_type(value_type: Type, dims: Mapping[str, int]) -> Type:
    if isinstance(value_type, TensorType):
        if value_type.shape is None:
            return value_type
        return TensorType(
            value_type.dtype, tuple(bound(d, dims) if isinstance(d, str) else d for d in value_type.shape)
        )
    if isinstance(value_type, (SequenceType, OptionalType)):
        return type(value_type)(bind_type(value_type.elem, dims))
    return value_type


def specialize(graph: Graph, dims: Mapping[str, int]) -> Graph:
    """``graph`` with every symbol in ``dims`` replaced by its value, then constant-folded."""
    from kiln.passes.fold_constants import fold_constants

    if not dims:
        return graph
    mapping: dict[Value, Value] = {}

    def rebind(value: Value | None) -> Value | None:
        if value is None:
            return None
        if value not in mapping:
            new_type = bind_type(value.type, dims)
            mapping[value] = value if new_type == value.type else Value(value.name, new_type)
        return mapping[value]

    def rebuild(sub: Graph) -> Graph:
        inputs = [rebind(v) for v in sub.inputs]
        constants = {rebind(v): a for v, a in sub.constants.items()}
        nodes = []
        for node in sub.nodes:
            attrs = {k: rebuild(a) if isinstance(a, Graph) else a for k, a in node.attrs.items()}
            nodes.append(
                Node(
                    node.op,
                    [rebind(v) for v in node.inputs],
                    [rebind(v) for v in node.outputs],
                    attrs,
                    name=node.name,
                    domain=node.domain,
                )
            )  # type: ignore[misc]
        return sub.with_(inputs=inputs, outputs=[rebind(v) for v in sub.outputs], nodes=nodes, constants=constants)

    return fold_constants(rebuild(graph))


def input_dims(graph: Graph, feeds: Mapping[str, object]) -> dict[str, int]:
    """The binding of the symbolic input dims that ``feeds`` (name -> array) implies."""
    dims: dict[str, int] = {}
    for value in graph.inputs:
        array = feeds.get(value.name)
        if isinstance(value.type, TensorType) and value.type.shape is not None and hasattr(array, "shape"):
            for dim, size in zip(value.type.shape, array.shape):  # type: ignore[attr-defined]
                if isinstance(dim, str):
                    dims[dim] = int(size)
    return dims
