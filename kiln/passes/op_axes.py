"""Which dims an op works along (reduces, normalizes, scans, slices, pads or tiles), read from its
attributes or constant inputs: what the batching analysis asks before letting an op
read a dim that holds samples."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.ops.registry import has_trait

FOLDS = (5, 7, 12)  # the sizes every symbol is bound to when a Pad's amounts are folded


def symbols(graph: Graph) -> list[str]:
    """The symbolic dims of the graph's inputs, in order of first appearance."""
    seen: list[str] = []
    for value in graph.inputs:
        for dim in getattr(value.type, "shape", None) or ():
            if isinstance(dim, str) and dim not in seen:
                seen.append(dim)
    return seen


def ancestors(graph: Graph, producers: dict[Value, Node], value: Value) -> list[Node]:
    """The nodes ``value`` depends on, in graph order (``producers``: ``graph.producers()``)."""
    needed: set[int] = set()
    stack = [value]
    while stack:
        node = producers.get(stack.pop())
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            stack.extend(v for v in node.inputs if v is not None)
    return [n for n in graph.nodes if id(n) in needed]


def folded_amounts(graph: Graph, value: Value) -> list[list[int]] | None:
    """A Pad's amounts computed from shapes (Swin pads each window's plane up to a multiple of the
    window), folded with every symbol bound to each of ``FOLDS``; None when they do not fold (they
    read an input's data)."""
    from kiln.passes.specialize import specialize

    alone = graph.with_(outputs=(value,), nodes=ancestors(graph, graph.producers(), value))
    found = []
    for size in FOLDS:
        try:
            folded = specialize(alone, dict.fromkeys(symbols(graph), size))
        except Exception:  # reads an input's data
            return None
        array = next((a for v, a in folded.constants.items() if v.name == folded.outputs[0].name), None)
        if array is None or np.asarray(array).dtype.kind not in "iu":
            return None
        found.append([int(x) for x in np.asarray(array).reshape(-1)])
    return found if len({len(f) for f in found}) == 1 else None


def works_along(
    node: Node, rank: int, ints: Callable[[Node, int], list[int] | None], graph: Graph | None = None
) -> set[int] | None:
    """The dims ``node`` works along, from its attributes or constant inputs (``ints(node, i)``: input
    i's contents when kiln can read them at compile time; a Pad's amounts computed from shapes are
    folded in ``graph`` at several sizes, a dim padded at any of them counted); None: unknown."""
    op, attrs = node.op, node.attrs
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return {int(attrs.get("axis", -1)) % rank}
    if op == "LayerNormalization":
        return set(range(int(attrs.get("axis", -1)) % rank, rank))
    if op == "Flatten":
        axis = int(attrs.get("axis", 1)) % (rank + 1)
        return set(range(rank)) if axis == 0 else set(range(axis - 1, rank))
    if op == "TopK":
        return {int(attrs.get("axis", -1)) % rank}
    if op == "CumSum":
        given = ints(node, 1)
        return None if given is None else {g % rank for g in given}
    if op.startswith("Reduce"):
        given = list(attrs["axes"]) if "axes" in attrs else ints(node, 1)
        if given is None:
            return None if len(node.inputs) > 1 and node.inputs[1] is not None else set(range(rank))
        if not given:
            return set() if attrs.get("noop_with_empty_axes") else set(range(rank))
        return {g % rank for g in given}
    if op == "Slice":
        given = ints(node, 3)
        starts, ends = ints(node, 1), ints(node, 2)
        steps = ints(node, 4) if len(node.inputs) > 4 and node.inputs[4] is not None else None
        if given is None:
            if len(node.inputs) > 3 and node.inputs[3] is not None:
                return None
            given = list(range(len(starts))) if starts is not None else list(range(rank))
        if starts is None or ends is None or len(starts) != len(given) or len(ends) != len(given):
            return {g % rank for g in given}
        # [0:past the end:1] along a dim keeps it whole: only the other axes are cut
        return {
            g % rank
            for i, g in enumerate(given)
            if not (starts[i] == 0 and ends[i] >= 2**31 - 1 and (steps is None or steps[i] == 1))
        }
    if op in ("Pad", "Tile"):
        amounts = ints(node, 1)
        if amounts is None and op == "Pad" and graph is not None and node.inputs[1] is not None:
            every = folded_amounts(graph, node.inputs[1])
            amounts = [max(abs(a) for a in column) for column in zip(*every)] if every else None
        if amounts is None:
            return None
        if op == "Tile":
            return {i for i, r in enumerate(amounts) if r != 1}
        pad_axes = ints(node, 3) if len(node.inputs) > 3 and node.inputs[3] is not None else list(range(rank))
        if pad_axes is None:
            return None
        n = len(pad_axes)
        return {pad_axes[i] % rank for i in range(n) if amounts[i] or amounts[i + n]}
    if has_trait(op, "", "axis") and "axis" in attrs:
        return {int(attrs["axis"]) % rank}
    if has_trait(op, "", "axis"):
        return None
    return None


def gathered_nd_axis(node: Node, axis: int) -> int | None:
    """Where a GatherND with index tuples of static width ``k`` and no batch dims moves its data's
    dim ``axis`` (Falcon's key head picked by ``[[-2]]`` from the heads in front): the output is
    ``indices.shape[:-1] + data.shape[k:]``, so a dim past the tuples' is ``axis - k`` after the
    indices' leading dims; None when the tuples index it (or their width is unknown)."""
    if node.op != "GatherND" or int(node.attrs.get("batch_dims", 0)) != 0:
        return None
    shape = getattr(node.inputs[1].type, "shape", None) if node.inputs[1] is not None else None
    if not shape or not isinstance(shape[-1], int) or axis < shape[-1]:
        return None
    return len(shape) - 1 + axis - shape[-1]
