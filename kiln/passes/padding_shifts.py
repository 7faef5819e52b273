"""The padding analysis' rules for positions shifted by a slice (``kiln.passes.padding``).

``x[:, :-1]`` and ``x[:, 1:]`` of a padded value are padded too, one position shorter: in a run at
length E >= L they hold, below L - 1, what the run at L holds. Such a value is
``Padded(short=1)``: its length is the run's length minus ``short``, valid below that. Copied back
into a full-length value at positions shifted by as much (an encoder-decoder's "shift tokens
right": ``out[:, 1:] = ids[:, :-1]`` and ``out[:, 0] = start``, a ScatterND of index tuples
``(b, j + 1)``), it is a plain padded value again. Differences of neighbours
(``x[:, 1:] - x[:, :-1]``) stay shifted.

Only the ops here read shifted values (``is_shifted``); everything else refuses the symbol,
since the other rules assume a value of the run's length (a mask at L, a slice to the length).
Shifted values never reach an output (cut back at L, they would be cut wrong): refused too.
Lengths of shape-only ops (an Expand to a shape read from a shifted value) are measured on the
graph's shapes at two lengths, as reshapes are.
"""

from __future__ import annotations

import dataclasses

from kiln.ir.graph import Node, Value
from kiln.ir.types import TensorType
from kiln.ops.registry import has_trait
from kiln.passes.batching import Refused, Sizes
from kiln.passes.padding_states import (
    PASSING,
    IndexTuple,
    Padded,
    ShiftedSizes,
    State,
    is_shifted,
    rank_of,
    where_mask,
)

_BIG = (1 << 31) - 1  # a slice end at least this: to the end


def plain(state: State) -> State:
    """``state`` as the other rules see it (the shift set aside, to be put back)."""
    return dataclasses.replace(state, short=0, offset=None) if isinstance(state, Padded) else state


class ShiftRules:
    """Mixed into the analysis (``constant``, ``ints``, ``numeric``, ``folded``, ``low``,
    ``lengths``, ``aligned`` and ``padded_rule`` are the analysis')."""

    def shifted_slice(self, node: Node, data: Padded, read: list[State]) -> Padded | None:
        """A Slice of a one-axis padded value along its axis from a constant start ``a >= 0`` to the
        end or to ``-c`` (step 1): padded, ``a + c`` shorter, element i the data's ``a + i``; None
        when the slice is not one."""
        if len(data.axes) != 1:
            return None
        rank = rank_of(node.inputs[0])
        starts, ends = self.ints(node, 1), self.ints(node, 2)  # type: ignore[attr-defined]
        axes = self.ints(node, 3) if len(node.inputs) > 3 and node.inputs[3] is not None else None  # type: ignore[attr-defined]
        steps = self.ints(node, 4) if len(node.inputs) > 4 and node.inputs[4] is not None else None  # type: ignore[attr-defined]
        if starts is None or ends is None or rank < 0:
            return None
        axes = [a % rank for a in (axes if axes is not None else range(len(starts)))]
        if data.axes[0] not in axes:
            return data  # other dims cut: the positions as they were
        i = axes.index(data.axes[0])
        start, end, step = starts[i], ends[i], (steps[i] if steps else 1)
        if step != 1 or start < 0 or not (end >= _BIG or end < 0):
            return None
        cut = start + (0 if end >= _BIG else -end)
        if not cut:
            return data
        if data.short + cut > self.low:  # type: ignore[attr-defined]
            return None  # shorter lengths than the cut are empty there, not ``cut`` shorter
        offset = None
        if data.ident or data.offset is not None:
            offset = (data.offset or 0) + start  # element i is position a + i: i plus a
        return Padded(data.axes, short=data.short + cut, offset=offset, uniform=data.uniform)

    def shifted_rule(self, node: Node, read: list[State]) -> list[State]:
        op = node.op
        first = read[0]
        if op in PASSING and isinstance(first, Padded):
            return [first]
        if op == "Slice" and isinstance(first, Padded) and not any(is_shifted(s) for s in read[1:]):
            found = self.shifted_slice(node, first, read)
            if found is not None:
                return [found]
        if op in ("Transpose", "Unsqueeze", "Squeeze") and isinstance(first, Padded) and len(first.axes) == 1:
            (moved,) = self.padded_rule(node, [plain(first)])  # type: ignore[attr-defined]
            return [dataclasses.replace(moved, short=first.short, offset=first.offset, uniform=first.uniform)]
        if op == "Shape" and isinstance(first, Padded):
            (sizes,) = self.padded_rule(node, [plain(first)])  # type: ignore[attr-defined]
            return [ShiftedSizes(sizes.mask, first.short) if isinstance(sizes, Sizes) and sizes.mask else sizes]
        if op in ("Expand", "Reshape", "ConstantOfShape"):
            return [self.shaped(node, read)]
        if any(isinstance(s, ShiftedSizes) for s in read) and op != "ConstantOfShape":
            return [self.shifted_sizes(node, read)]
        if op == "Concat":
            return [self.joined(node, read)]
        if has_trait(op, "", "aligned"):
            return [self.aligned_shifted(node, read)]
        raise Refused(node.label, "reads positions shifted by a slice in a way kiln cannot follow")

    def aligned_shifted(self, node: Node, read: list[State]) -> Padded:
        """Elementwise ops of shifted values (of one length: inference checked the shapes)."""
        found = self.aligned(node, [plain(s) for s in read])  # type: ignore[attr-defined]
        shorts = {s.short for s in read if isinstance(s, Padded)}
        if len(found.axes) != 1 or any(isinstance(s, (IndexTuple, ShiftedSizes)) for s in read):
            raise Refused(node.label, "broadcasts shifted positions against other positions")
        return Padded(found.axes, short=max(shorts), uniform=found.uniform)

    def shifted_sizes(self, node: Node, read: list[State]) -> State:
        """Shape arithmetic on a shape read from a shifted value: the elements that are the
        shifted length (a Where between it and a constant, a Gather of it, a cast)."""
        op = node.op
        shifted = {s.short for s in read if isinstance(s, ShiftedSizes)}
        if any(isinstance(s, (Padded, IndexTuple)) for s in read) or len(shifted) != 1:
            raise Refused(node.label, "computes with the length and a shifted length")
        short = shifted.pop()
        first = read[0]
        if op in ("Cast", "Identity", "Squeeze", "Unsqueeze") and isinstance(first, ShiftedSizes):
            return first if rank_of(node.outputs[0]) <= 1 else Sizes(None)
        if op == "Where":
            union = where_mask(node, read, ShiftedSizes)
            if union is not None:
                return ShiftedSizes(union, short) if any(union) else None
        if op == "Concat" and all(rank_of(v) == 1 for v in node.inputs if v is not None):
            parts: list[bool] = []
            for value, state in zip(node.inputs, read):
                length = value.type.shape[0] if value is not None and isinstance(value.type, TensorType) else None
                if isinstance(state, ShiftedSizes):
                    parts.extend(state.mask)
                elif state is None and isinstance(length, int):
                    parts.extend([False] * length)
                else:  # the length beside a shifted length, or a part of unknown size
                    raise Refused(node.label, "a shape of the length and a shifted length")
            return ShiftedSizes(tuple(parts), short)
        if op == "Gather" and isinstance(first, ShiftedSizes):
            indices = self.ints(node, 1)  # type: ignore[attr-defined]
            if indices is not None and all(-len(first.mask) <= i < len(first.mask) for i in indices):
                chosen = tuple(first.mask[i] for i in indices)
                return ShiftedSizes(chosen, short) if any(chosen) else None
        if op in ("Shape", "Size"):
            return None  # a shape vector's own length: static
        if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or"):
            return Sizes(None)  # a condition on sizes: never a size itself
        raise Refused(node.label, "computes with a shifted length in a way kiln cannot follow")

    def measured(self, value: Value) -> list[tuple[int, tuple[int, ...]]] | None:
        """``value``'s shape at two or more lengths (the other symbols bound): from the graph's
        shapes, or, for a value computed from shapes alone (folded away there), from folding it."""
        found = self.numeric(value)  # type: ignore[attr-defined]
        if found is not None:
            return list(zip(self.lengths, (tuple(s) for s in found)))  # type: ignore[attr-defined]
        arrays = self.folded(value, others=3)  # type: ignore[attr-defined]
        return None if arrays is None else [(n, tuple(a.shape)) for n, a in zip(self.folds, arrays)]  # type: ignore[attr-defined]

    def shaped(self, node: Node, read: list[State]) -> Padded:
        """Expand, Reshape or ConstantOfShape whose output has one dim that follows the length,
        measured on the graph's shapes at two lengths: padded there, as short as it is; the data's
        positions, when it has them, must be that dim unchanged."""
        data = read[0]
        out = self.measured(node.outputs[0])
        if out is None:
            raise Refused(node.label, "a shape from a shifted length kiln cannot measure")
        moving = [i for i in range(len(out[0][1])) if len({shape[i] for _, shape in out}) > 1]
        shorts = {n - shape[moving[0]] for n, shape in out} if len(moving) == 1 else set()
        if len(moving) != 1 or len(shorts) != 1 or min(shorts) < 0:
            raise Refused(node.label, "a shape from a shifted length with several dims following the length")
        axis, short = moving[0], shorts.pop()
        if node.op == "ConstantOfShape" or data is None:
            if node.op == "Reshape" and data is None:
                raise Refused(node.label, "reshapes a value to a shape computed from a shifted length")
            return Padded((axis,), short=short, uniform=True)
        if not isinstance(data, Padded) or len(data.axes) != 1 or any(isinstance(s, Padded) for s in read[1:]):
            raise Refused(node.label, "shapes shifted positions by positions")
        before = self.measured(node.inputs[0])
        if before is None or data.short != short:
            raise Refused(node.label, "moves shifted positions to a dim of another length")
        if node.op == "Reshape" and dict(out).get(before[0][0]) != before[0][1]:
            raise Refused(node.label, "reshapes shifted positions")
        if node.op == "Expand" and rank_of(node.outputs[0]) - rank_of(node.inputs[0]) + data.axes[0] != axis:
            raise Refused(node.label, "expands shifted positions into another dim")
        return Padded((axis,), short=short, offset=data.offset, uniform=data.uniform)

    def joined(self, node: Node, read: list[State]) -> State:
        """A Concat of shifted values: index tuples along a last dim of 1s (each component a
        position plus an offset, or independent of the positions), or, along the padded dim,
        constant-width parts and then one shifted part (``cat([start, ids[:, :-1]], 1)``)."""
        rank = rank_of(node.outputs[0])
        axis = int(node.attrs.get("axis", 0)) % max(rank, 1)
        if any(isinstance(s, (IndexTuple, ShiftedSizes)) for s in read):
            raise Refused(node.label, "concatenates a shifted length or index tuples")
        padded = [s for s in read if isinstance(s, Padded)]
        if axis == rank - 1 and all(getattr(v.type, "shape", (None,))[-1] == 1 for v in node.inputs if v is not None):
            return self.tuples(node, read)
        if any(s.axes != (axis,) for s in padded):
            raise Refused(node.label, "concatenates shifted positions along another dim")
        width = 0
        for value, state in zip(node.inputs[:-1], read[:-1]):
            size = value.type.shape[axis] if value is not None and isinstance(value.type, TensorType) else None
            if state is not None and not (isinstance(state, Padded) and state.uniform and not state.short):
                raise Refused(node.label, "concatenates along the padded dim before a shifted part")
            if not isinstance(size, int):
                raise Refused(node.label, "concatenates a part of unknown width before a shifted part")
            width += size
        last = read[-1]
        if not isinstance(last, Padded) or last.short < width:
            raise Refused(node.label, "a concatenation longer than the length")
        return Padded((axis,), short=last.short - width)

    def tuples(self, node: Node, read: list[State]) -> IndexTuple:
        axes: set[int] = set()
        parts: list[int | None] = []
        offsets: list[int] = []
        for state in read:
            if isinstance(state, Padded) and (state.ident or state.offset is not None):
                parts.append(state.axes[0])
                offsets.append(state.offset or 0)
            elif state is None or (isinstance(state, Padded) and state.uniform):
                parts.append(None)
                offsets.append(0)
            else:
                raise Refused(node.label, "index tuples of values computed from positions")
            if isinstance(state, Padded):
                axes |= set(state.axes)
        shorts = {s.short for s in read if isinstance(s, Padded)}
        rank = rank_of(node.outputs[0])
        if len(axes) != 1 or rank - 1 in axes or len(shorts) != 1:
            raise Refused(node.label, "index tuples over several dims of positions")
        return IndexTuple(tuple(sorted(axes)), tuple(parts), tuple(offsets), shorts.pop())

    def scattered(self, node: Node, read: list[State]) -> State:
        """ScatterND into padded data: by index tuples independent of the positions that write
        only positions every length has (``out[:, 0] = start``), or by tuples whose one positional
        component is the position plus ``o`` writing updates at most ``o`` shorter to the end
        (``out[:, 1:] = ids[:, :-1]``): each valid position reads valid data or a valid update."""
        data, indices, updates = read[0], read[1], read[2]
        if node.attrs.get("reduction", "none") not in ("none", b"none"):
            raise Refused(node.label, "a ScatterND that reduces into positions")
        if not isinstance(data, Padded) or (data.short and indices is None):
            raise Refused(node.label, "scatters positions into a value without them")
        if indices is None:
            if updates is not None:
                raise Refused(node.label, "scatters positions by indices independent of them")
            self.written_below_low(node, data)
            return Padded(data.axes, short=data.short)
        if isinstance(indices, Padded) and (indices.ident or indices.offset is not None):
            shape = getattr(node.inputs[1].type, "shape", None)
            if not shape or shape[-1] != 1 or len(indices.axes) != 1 or indices.axes[0] == len(shape) - 1:
                raise Refused(node.label, "scatters by positions that are no index tuples")
            indices = IndexTuple(indices.axes, (indices.axes[0],), (indices.offset or 0,), indices.short)
        if not isinstance(indices, IndexTuple):
            raise Refused(node.label, "scatters by indices computed from positions")
        positional = [k for k, part in enumerate(indices.parts) if part is not None]
        offsets = indices.offsets or (0,) * len(indices.parts)
        if len(positional) != 1 or data.axes != (positional[0],):
            raise Refused(node.label, "scatters by index tuples that mix positions with other dims")
        offset = offsets[positional[0]]
        if not isinstance(updates, Padded) or updates.axes != indices.axes or updates.short > offset:
            raise Refused(node.label, "scatters updates whose positions are not the indices' own")
        if indices.short != offset:
            raise Refused(node.label, "scatters shifted positions that stop before the end")
        return Padded(data.axes, short=data.short)

    def written_below_low(self, node: Node, data: Padded) -> None:
        """Index tuples independent of the positions write only positions in ``[0, low)`` of
        the data's padded dims (folded with the other symbols bound, as the shapes are)."""
        found = (self.folded(node.inputs[1], others=2) or []) + (self.folded(node.inputs[1], others=3) or [])  # type: ignore[attr-defined]
        if not found:
            raise Refused(node.label, "scatters by indices kiln cannot read at compile time")
        for array in found:
            if array.ndim < 1:
                raise Refused(node.label, "scatters by indices that are no tuples")
            for axis in data.axes:
                if axis < array.shape[-1] and ((array[..., axis] < 0) | (array[..., axis] >= self.low)).any():  # type: ignore[attr-defined]
                    raise Refused(node.label, "scatters at positions not valid at every length")

    def scattered_elements(self, node: Node, read: list[State]) -> Padded:
        """ScatterElements into padded data by indices and updates independent of the positions
        (``out[:, 0] = start``): along the padded dim the indices must be positions every length
        has; along another, the indices' own extent there must be (coordinates below ``low``)."""
        data = read[0]
        assert isinstance(data, Padded)
        if node.attrs.get("reduction", "none") not in ("none", b"none") or data.short:
            raise Refused(node.label, "a ScatterElements that reduces into positions, or into shifted ones")
        rank = rank_of(node.inputs[0])
        axis = int(node.attrs.get("axis", 0)) % max(rank, 1)
        shape = getattr(node.inputs[1].type, "shape", None)
        for padded in data.axes:
            if padded == axis:
                found = (self.folded(node.inputs[1], others=2) or []) + (self.folded(node.inputs[1], others=3) or [])  # type: ignore[attr-defined]
                if not found or any(((a < 0) | (a >= self.low)).any() for a in found):  # type: ignore[attr-defined]
                    raise Refused(node.label, "scatters at positions not valid at every length")
            elif not shape or not isinstance(shape[padded], int) or shape[padded] > self.low:  # type: ignore[attr-defined]
                raise Refused(node.label, "scatters along another dim over positions")
        return Padded(data.axes)
