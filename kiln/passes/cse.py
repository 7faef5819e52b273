"""Common-subexpression elimination: nodes with the same op, attributes and inputs compute the
same values, so later copies are replaced by the first. Equal constants are merged too.
Runs anywhere; most useful after fold_constants (which creates duplicate constants)."""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Graph, StructuralHasher, array_digest
from kiln.ops.registry import lookup, nondeterministic
from kiln.passes.rewrite import Rewriter


def cse(graph: Graph) -> Graph:
    rewriter = Rewriter(graph)
    # only constants of one type and the same sampled elements can be equal: hash the contents
    # of those (a model's hundred distinct weight matrices are never hashed)
    by_type: dict[tuple, list] = {}
    for value in graph.constants:
        by_type.setdefault((str(value.type), _sample(graph.constants[value])), []).append(value)
    by_content: dict[tuple, object] = {}
    for kind, values in by_type.items():
        if len(values) < 2:
            continue
        for value in values:
            key = (kind, array_digest(graph.constants[value]))
            first = by_content.setdefault(key, value)
            if first is not value:
                rewriter.replace(value, first)
    hasher = StructuralHasher()
    seen: dict[tuple, object] = {}
    for node in graph.nodes:
        inputs = tuple(id(rewriter.resolve(v)) if v is not None else None for v in node.inputs)
        if nondeterministic(node) or any(True for _ in node.subgraphs()) or lookup(node.op, node.domain) is None:
            rewriter.keep(node)
            continue
        key = (node.domain, node.op, hasher.attrs(node.attrs), inputs, len(node.outputs))
        first = seen.get(key)
        if first is None:
            seen[key] = node
            rewriter.keep(node)
            continue
        for old, new in zip(node.outputs, first.outputs):  # type: ignore[attr-defined]
            rewriter.replace(old, new)
        rewriter.drop(node)
    return rewriter.finish()


def _sample(array: np.ndarray) -> bytes:
    """Up to 64 elements spread over ``array`` (read through its flat iterator: a transposed view
    is not copied); equal arrays have equal samples."""
    array = np.asarray(array)
    if array.dtype == object or array.size == 0:
        return b""
    positions = np.linspace(0, array.size - 1, min(array.size, 64)).astype(np.int64)
    return array.flat[positions].tobytes()
