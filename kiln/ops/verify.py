"""The IR verifier: checks a graph's invariants and reports every violation at once.

Checked: every value is defined once; every use is defined before it (so the node order is
topological and the graph acyclic); every graph output is defined; ops are known with valid arity
and attributes; and each node's recorded output types agree with what the registry infers now
(static dims and dtypes must match exactly; symbols must stay symbols of the same rank).
Subgraphs are checked recursively with the enclosing scope visible.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kiln.errors import KilnError, VerificationError
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import OptionalType, SequenceType, TensorType, Type
from kiln.ops.registry import InferContext, lookup


def verify(graph: Graph) -> Graph:
    """Return ``graph`` unchanged if it is well formed; raise VerificationError listing problems."""
    problems: list[str] = []
    _verify(graph, outer=set(), problems=problems)
    if problems:
        raise VerificationError(problems)
    return graph


def _verify(graph: Graph, outer: set[Value], problems: list[str]) -> None:
    defined: set[Value] = set()
    names: set[str] = set()

    def define(value: Value, where: str) -> None:
        if value in defined:
            problems.append(f"{where}: value %{value.name} is defined more than once")
        if value.name in names:
            problems.append(f"{where}: the name %{value.name} is used by two values")
        defined.add(value)
        names.add(value.name)

    for value in graph.inputs:
        define(value, f"graph {graph.name!r} input")
    for value, array in graph.constants.items():
        define(value, f"graph {graph.name!r} constant")
        if not isinstance(value.type, TensorType) or tuple(value.type.shape or ()) != tuple(array.shape):
            problems.append(
                f"constant %{value.name}: type {value.type} does not match data of shape {list(array.shape)}"
            )
    producers: dict[Value, Node] = {out: node for node in graph.nodes for out in node.outputs}
    for node in graph.nodes:
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if value not in defined and value not in outer:
                later = producers.get(value)
                reason = (
                    f"is produced later by {later.label} (cycle or misordered nodes)"
                    if later is not None
                    else "is never defined"
                )
                problems.append(f"node {node.label}: input {index} %{value.name} {reason}")
        for sub in node.subgraphs():
            _verify(sub, defined | outer, problems)
        _check_node(node, graph.constants, problems)
        for value in node.outputs:
            define(value, f"node {node.label}")
    for value in graph.outputs:
        if value not in defined and value not in outer:
            problems.append(f"graph {graph.name!r}: output %{value.name} is never defined")


def _check_node(node: Node, constants: Mapping[Value, np.ndarray], problems: list[str]) -> None:
    opdef = lookup(node.op, node.domain)
    if opdef is None:
        problems.append(f"node {node.label}: unknown op")
        return
    low, high = opdef.num_inputs
    count = len(node.inputs)
    if count < low or (high >= 0 and count > high):
        problems.append(f"node {node.label}: {count} inputs, expected {low}..{'n' if high < 0 else high}")
    # (kiln_* attributes are kiln's annotations of standard ops: kiln.passes.quantized; the ONNX
    # frontend refuses them in imported models)
    unknown = sorted(a for a in set(node.attrs) - set(opdef.attrs) if not a.startswith("kiln_"))
    if unknown:
        problems.append(f"node {node.label}: unknown attribute(s) {unknown}")
    try:
        types = [None if v is None else v.type for v in node.inputs]
        ctx = InferContext(node, opdef, types, [None if v is None else constants.get(v) for v in node.inputs])
        inferred = list(opdef.infer(ctx))
    except KilnError as err:
        problems.append(f"node {node.label}: type inference fails: {err}")
        return
    except Exception as err:
        problems.append(f"node {node.label}: type inference crashed: {type(err).__name__}: {err}")
        return
    for value, expected in zip(node.outputs, inferred):
        mismatch = _mismatch(value.type, expected)
        if mismatch:
            problems.append(
                f"node {node.label}: output %{value.name} is {value.type} but inference gives {expected} ({mismatch})"
            )


def _mismatch(recorded: Type, inferred: Type) -> str | None:
    """Why ``recorded`` contradicts ``inferred`` (None if compatible). Compile-time-known inputs
    may have made ``recorded`` more precise (a static dim where inference now has a symbol)."""
    if isinstance(recorded, (SequenceType, OptionalType)) or isinstance(inferred, (SequenceType, OptionalType)):
        if type(recorded) is not type(inferred):
            return "different kinds of type"
        return _mismatch(recorded.elem, inferred.elem)  # type: ignore[union-attr]
    assert isinstance(recorded, TensorType) and isinstance(inferred, TensorType)
    if recorded.dtype != inferred.dtype:
        return "dtype differs"
    if recorded.shape is None or inferred.shape is None:
        return None
    if len(recorded.shape) != len(inferred.shape):
        return "rank differs"
    for a, b in zip(recorded.shape, inferred.shape):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            return "static dims differ"
    return None
