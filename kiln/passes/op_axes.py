"""Which dims an op works along (reduces, normalizes, scans, slices, pads or tiles), read from its
attributes or constant inputs: what the batching analysis asks before letting an op
read a dim that holds samples."""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.graph import Node
from kiln.ops.registry import has_trait


def works_along(node: Node, rank: int, ints: Callable[[Node, int], list[int] | None]) -> set[int] | None:
    """The dims ``node`` works along, from its attributes or constant inputs (``ints(node, i)``: input
    i's contents when kiln can read them at compile time); None: unknown."""
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
