"""The padding analysis' rules for ops reading padded values (``kiln.passes.padding``): which
positions their outputs hold, and where a mask must keep padded positions out of valid ones."""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import TensorType
from kiln.ops.registry import has_trait
from kiln.passes.batching import Refused, Sizes
from kiln.passes.op_axes import gathered_nd_axis
from kiln.passes.padding_states import PASSING, ZERO_SUMS, IndexTuple, Merged, Padded, State, broadcast_dims, rank_of


class PositionRules:
    """Rules for values holding positions; ``Analysis`` gives the graph, the length's low end,
    constants, measured shapes and the masks list."""

    graph: Graph
    low: int
    lengths: tuple[int, int]

    def constant(self, value: Value | None) -> np.ndarray | None:  # pragma: no cover - Analysis's
        raise NotImplementedError

    def ints(self, node: Node, index: int) -> list[int] | None:  # pragma: no cover - Analysis's
        raise NotImplementedError

    def numeric(self, value: Value) -> tuple[tuple, tuple] | None:  # pragma: no cover - Analysis's
        raise NotImplementedError

    def mask(self, node: Node, index: int, axis: int, fill: float, divide: int = 0) -> None:  # pragma: no cover
        raise NotImplementedError

    def shifted_slice(self, node: Node, data: Padded, read: list[State]) -> Padded | None:  # pragma: no cover
        raise NotImplementedError  # ShiftRules'

    def folded(  # pragma: no cover
        self, value: Value, others: int | None = None, lengths: tuple[int, ...] | None = None
    ) -> list[np.ndarray] | None:
        raise NotImplementedError

    def ones_in(self, shape: Value) -> set[int]:
        """The entries of a shape vector computed from sizes that are 1 at every length and any
        other symbols' sizes (an Expand's "keep this dim": ``expand(batch, -1, seq, seq)``)."""
        found = (self.folded(shape, others=2) or []) + (self.folded(shape, others=3) or [])
        if not found or any(a.ndim != 1 or a.shape != found[0].shape for a in found):
            return set()
        return {i for i in range(found[0].size) if all(int(a[i]) == 1 for a in found)}

    def padded_rule(self, node: Node, read: list[State]) -> list[State]:
        op = node.op
        if any(isinstance(s, Sizes) for s in read) and op not in ("Reshape", "Expand", "Slice"):
            raise Refused(node.label, "reads positions and a value computed from the length")
        first = read[0]
        if has_trait(op, "", "aligned"):
            return [self.aligned(node, read)] * len(node.outputs)
        if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
            return [self.reshape(node, read)]
        if op == "Transpose" and isinstance(first, Padded):
            rank = rank_of(node.inputs[0])
            perm = [int(p) % rank for p in (node.attrs.get("perm") or reversed(range(rank)))]
            return [
                Padded(tuple(sorted(perm.index(a) for a in first.axes)), frozenset(perm.index(a) for a in first.zero))
            ]
        if op == "Expand":
            return [self.expand(node, read)]
        if op in ("MatMul", "Gemm"):
            return [self.product(node, read)]
        if op in ("Softmax", "LogSoftmax"):
            return [self.softmax(node, first)]
        if op.startswith("Reduce"):
            return [self.reduce(node, read)]
        if op == "Gather":
            return [self.gather(node, read)]
        if op == "Slice":
            return [self.slice(node, read)]
        if op == "GatherElements" and read[0] is None and isinstance(read[1], Padded):
            return [Padded(read[1].axes)]  # out[i] = data[... index[i] ...]: position-wise on the indices
        if op == "GatherElements" and isinstance(first, Padded) and isinstance(read[1], (Padded, type(None))):
            # along a dim that is not padded (DeBERTa's relative positions: scores gathered along
            # their table of 2 * span by position differences): each valid position reads its own row
            axis = int(node.attrs.get("axis", 0)) % rank_of(node.inputs[0])
            if axis in first.axes:
                raise Refused(node.label, "gathers along the padded dim by indices kiln cannot bound")
            return [Padded(tuple(sorted(set(first.axes) | set(read[1].axes if read[1] else ()))))]
        if op == "GatherND" and isinstance(first, Padded) and read[1] is None:
            moved = [gathered_nd_axis(node, a) for a in first.axes]  # index tuples of the dims before
            if any(m is None for m in moved):
                raise Refused(node.label, "gathers along the padded dim by index tuples")
            return [Padded(tuple(moved), uniform=first.uniform)]  # type: ignore[arg-type]
        if op == "Tile" and isinstance(first, Padded) and read[1] is None:
            repeats = self.ints(node, 1)  # copies along the other dims only (GPT-J's positions per rotary pair)
            if repeats is None or any(repeats[a] != 1 for a in first.axes if a < len(repeats)):
                raise Refused(node.label, "tiles along the padded dim")
            return [Padded(first.axes, ident=first.ident, uniform=first.uniform)]
        if op == "Trilu" and isinstance(first, Padded) and not any(read[1:]):
            return [Padded(first.axes)]  # kept or zeroed by (row, column): position-wise
        if op == "CumSum" and isinstance(first, Padded) and not any(read[1:]):
            if node.attrs.get("reverse"):
                axis = self.ints(node, 1)
                rank = rank_of(node.inputs[0])
                if axis is None or axis[0] % rank in first.axes:
                    raise Refused(node.label, "a reversed CumSum along the padded dim")
            return [Padded(first.axes)]  # a prefix sum: position i reads positions <= i
        if op in ("Shape", "Size"):
            if op == "Size" or not isinstance(first, Padded):
                return [Sizes(None)]
            rank = rank_of(node.inputs[0])
            start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
            positions = list(range(rank))[slice(start, None if end is None else int(end))]
            mask = tuple(i in first.axes for i in positions)
            return [Sizes(mask) if any(mask) else None]  # the other dims' sizes do not depend on it
        tuples = self.index_tuple(node, read)
        if tuples is not None:
            return [tuples]
        if op in ("LayerNormalization", "Split", "Concat", "Softplus") or has_trait(op, "", "axis"):
            return self.along_other_axes(node, read)
        raise Refused(node.label, "an op kiln cannot tell the positional behaviour of")

    def aligned(self, node: Node, read: list[State]) -> Padded:
        """Broadcasting ops: every operand's dim at a padded output position is padded or 1."""
        out_rank = rank_of(node.outputs[0])
        positions: set[int] = set()
        zero_all: set[int] | None = None
        for value, state in zip(node.inputs, read):
            if isinstance(state, Padded):
                positions |= broadcast_dims(out_rank, value, state.axes)
        for value, state in zip(node.inputs, read):
            if value is None:
                continue
            rank = rank_of(value)
            offset = out_rank - rank
            own = broadcast_dims(out_rank, value, state.axes) if isinstance(state, Padded) else set()
            for p in positions - own:
                if p - offset >= 0 and value.type.shape[p - offset] != 1:  # type: ignore[union-attr,index]
                    raise Refused(node.label, "broadcasts the padded dim against another dim")
            if isinstance(state, Padded):
                zeros = {offset + a for a in state.zero}
                zero_all = zeros if zero_all is None else zero_all & zeros
        # one operand, 0 -> 0 (a Mul loses it: 0 * inf is NaN); a Where of zeros and zeros
        keeps_zero = node.op in PASSING or node.op in ("Relu", "Abs", "Neg")
        if node.op == "Where" and len(node.inputs) == 3:
            zeros = []
            for value, state in zip(node.inputs[1:], read[1:]):
                if isinstance(state, Padded):
                    zeros.append({out_rank - rank_of(value) + a for a in state.zero})
                else:
                    constant = self.constant(value) if state is None else None
                    if constant is None or constant.size == 0 or np.any(constant != 0):
                        zeros.append(set())
            zero_all = set.intersection(*zeros) if zeros else set()
            keeps_zero = True
        # values computed from values that do not vary along the positions do not either
        uniform = all(s is None or (isinstance(s, Padded) and s.uniform) for s in read)
        return Padded(
            tuple(sorted(positions)),
            frozenset(zero_all or ()) if keeps_zero else frozenset(),
            self.keeps_ident(node, read),
            uniform,
        )

    def keeps_ident(self, node: Node, read: list[State]) -> bool:
        """Positions stay themselves through an integer copy, and an Add or Sub of zeros (the
        past length, 0, that exports add to an arange)."""
        first = read[0]
        if not isinstance(first, Padded) or not first.ident:
            return False
        integer = isinstance(node.outputs[0].type, TensorType) and node.outputs[0].type.dtype.numpy.kind in "iu"
        if node.op in PASSING:
            return integer
        if node.op in ("Add", "Sub") and len(read) == 2 and read[1] is None and integer:
            offset = self.constant(node.inputs[1])
            return offset is not None and offset.size > 0 and not np.any(offset != 0)
        return False

    def expand(self, node: Node, read: list[State]) -> Padded:
        data, target = read[0], read[1]
        out_rank = rank_of(node.outputs[0])
        if isinstance(target, Padded) or not isinstance(data, Padded):
            raise Refused(node.label, "expands to a shape read from positions")
        positions = broadcast_dims(out_rank, node.inputs[0], data.axes)
        mask = target.mask if isinstance(target, Sizes) else None
        value = self.constant(node.inputs[1]) if target is None else None
        kept: set[int] | None = None  # of a target computed from sizes: the entries 1 whatever the sizes
        for p in positions:
            if (mask is not None and len(mask) > p and mask[p]) or (
                value is not None and value.size > p and int(value.reshape(-1)[p]) == 1
            ):
                continue
            if kept is None:
                kept = self.ones_in(node.inputs[1]) if value is None else set()
            if p not in kept:
                raise Refused(node.label, "expands across the padded dim")
        # a dim of 1 expanded to the length (a key mask over the queries: [b,1,1,s] -> [b,1,s,s]):
        # padded there too, each position a copy
        grown = set()
        if mask is not None and len(mask) == out_rank:
            offset = out_rank - rank_of(node.inputs[0])
            shape = node.inputs[0].type.shape or ()  # type: ignore[union-attr]
            grown = {
                p for p in range(out_rank) if mask[p] and p not in positions and (p < offset or shape[p - offset] == 1)
            }
        if grown:
            return Padded(tuple(sorted(positions | grown)), uniform=data.uniform)
        return Padded(tuple(sorted(positions)), ident=data.ident, uniform=data.uniform)

    def reshape(self, node: Node, read: list[State]) -> State:
        """A reshape moves the padded dims by where their elements sit in memory. Measured on the
        graph's shapes at two lengths (names inference gave to computed dims need not agree):
        each padded dim must come out as a dim of exactly the length with the same elements
        before and after it; one padded dim may instead merge with whole blocks around it
        (``Merged``: rows of a Linear over [batch*seq, 768], a mask flattened for flat indices)."""
        data = read[0]
        if not isinstance(data, Padded):
            raise Refused(node.label, "a reshape whose positions are not its data")
        if node.op in ("Unsqueeze", "Squeeze"):
            return self.unsqueeze(node, data)
        shapes = self.numeric(node.inputs[0]), self.numeric(node.outputs[0])
        if shapes[0] is None or shapes[1] is None:
            raise Refused(node.label, "a reshape kiln cannot measure")
        if len(data.axes) == 1:
            return self.placed(node, shapes, data.axes[0], 1, 1, data)
        axes, zero = [], set()
        for axis in data.axes:
            found = self.placed(node, shapes, axis, 1, 1, data)
            if not isinstance(found, Padded):
                raise Refused(node.label, "a reshape that merges a padded dim with another")
            axes.extend(found.axes)
            zero |= set(found.zero)
        return Padded(tuple(sorted(axes)), frozenset(zero))

    def unsqueeze(self, node: Node, data: Padded) -> Padded:
        rank_in, rank_out = rank_of(node.inputs[0]), rank_of(node.outputs[0])
        given = list(node.attrs["axes"]) if "axes" in node.attrs else self.ints(node, 1)
        if node.op == "Unsqueeze":
            if given is None:
                raise Refused(node.label, "an Unsqueeze of axes kiln cannot read")
            inserted = {g % rank_out for g in given}
            kept = [i for i in range(rank_out) if i not in inserted]
        else:
            shape = node.inputs[0].type.shape  # type: ignore[union-attr]
            removed = {g % rank_in for g in given} if given else {i for i, d in enumerate(shape) if d == 1}
            if removed & set(data.axes):
                raise Refused(node.label, "squeezes the padded dim")
            kept = [None] * rank_in  # type: ignore[list-item]
            out = 0
            for i in range(rank_in):
                if i not in removed:
                    kept[i] = out
                    out += 1
            mapping = {i: kept[i] for i in range(rank_in)}
            return Padded(
                tuple(mapping[a] for a in data.axes),
                frozenset(mapping[a] for a in data.zero),  # type: ignore[misc]
                data.ident,
                data.uniform,
            )
        mapping = dict(enumerate(kept))
        return Padded(
            tuple(mapping[a] for a in data.axes), frozenset(mapping[a] for a in data.zero), data.ident, data.uniform
        )

    def placed(self, node: Node, shapes: tuple, axis: int, outer: int, inner: int, data: State) -> State:
        """Where the padded dim at ``axis`` of the input (merged with ``outer`` whole indices
        before it and ``inner`` after) lands in the output."""
        (in1, in2), (out1, out2) = shapes
        lengths = self.lengths
        before = [int(np.prod(shape[:axis], dtype=np.int64)) * outer for shape in (in1, in2)]
        after = [int(np.prod(shape[axis + 1 :], dtype=np.int64)) * inner for shape in (in1, in2)]
        for position in range(len(out1)):
            lead = [int(np.prod(shape[:position], dtype=np.int64)) for shape in (out1, out2)]
            tail = [int(np.prod(shape[position + 1 :], dtype=np.int64)) for shape in (out1, out2)]
            if any(b % lead_ or a % tail_ for b, lead_, a, tail_ in zip(before, lead, after, tail) if lead_ and tail_):
                continue
            if not all(lead) or not all(tail):
                continue
            outers = {b // lead_ for b, lead_ in zip(before, lead)}
            inners = {a // tail_ for a, tail_ in zip(after, tail)}
            if len(outers) != 1 or len(inners) != 1:
                continue
            o, i = outers.pop(), inners.pop()
            if all(shape[position] == o * n * i for shape, n in zip((out1, out2), lengths)):
                if o == i == 1:
                    zero = frozenset({position}) if isinstance(data, Padded) and axis in data.zero else frozenset()
                    return Padded((position,), zero, isinstance(data, Padded) and data.ident)
                return Merged(position, o, i)
        raise Refused(node.label, "a reshape that moves elements across the padded dim")

    def product(self, node: Node, read: list[State]) -> Padded:
        """Rows of A, columns of B and batch dims stay positions; a contraction over the padded
        dim reads both operands masked to 0."""
        a, b = read[0], read[1]
        out_rank = rank_of(node.outputs[0])
        a_rank, b_rank = rank_of(node.inputs[0]), rank_of(node.inputs[1])
        if node.op == "Gemm":
            ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
            a_k, b_k = (0 if ta else 1), (1 if tb else 0)
            rows = {0} if isinstance(a, Padded) and (1 - a_k) in a.axes else set()
            cols = {1} if isinstance(b, Padded) and (1 - b_k) in b.axes else set()
            self.contract(node, read, a_k, b_k)
            if len(read) > 2 and isinstance(read[2], Padded):
                rows |= broadcast_dims(2, node.inputs[2], read[2].axes)  # type: ignore[arg-type]
            return Padded(tuple(sorted(rows | cols)))
        if a_rank < 2 or b_rank < 2:
            raise Refused(node.label, "a vector product over the padded dim")
        self.contract(node, read, a_rank - 1, b_rank - 2)
        positions: set[int] = set()
        for value, state, rank, kept in (
            (node.inputs[0], a, a_rank, a_rank - 2),
            (node.inputs[1], b, b_rank, b_rank - 1),
        ):
            if not isinstance(state, Padded):
                continue
            for axis in state.axes:
                if axis == kept:  # A's rows / B's columns
                    positions.add(out_rank - 2 if rank == a_rank and value is node.inputs[0] else out_rank - 1)
                elif axis < rank - 2:
                    positions.add(out_rank - rank + axis)
        return Padded(tuple(sorted(positions)))

    def contract(self, node: Node, read: list[State], a_k: int, b_k: int) -> None:
        padded = [isinstance(read[i], Padded) and k in read[i].axes for i, k in ((0, a_k), (1, b_k))]  # type: ignore[union-attr]
        if not any(padded):
            return
        if not all(padded):
            raise Refused(node.label, "contracts the padded dim against a dim that is not")
        for i, k in ((0, a_k), (1, b_k)):
            if k not in read[i].zero:  # type: ignore[union-attr]
                self.mask(node, i, k, 0.0)

    def softmax(self, node: Node, data: State) -> Padded:
        if not isinstance(data, Padded):
            raise Refused(node.label, "positions in an operand other than the data")
        rank = rank_of(node.inputs[0])
        if self.graph.opset < 13:  # over the dims from ``axis`` (default 1) on, flattened
            along = set(range(int(node.attrs.get("axis", 1)) % rank, rank))
            if along & set(data.axes) and along != {rank - 1}:
                raise Refused(node.label, "a Softmax over several dims, one of them padded")
            axis = rank - 1 if along & set(data.axes) else -1
        else:
            axis = int(node.attrs.get("axis", -1)) % rank
        if axis not in data.axes:
            return Padded(data.axes)
        self.mask(node, 0, axis, float("-inf"))  # padded scores: probability exactly 0
        return Padded(data.axes, frozenset({axis}) if node.op == "Softmax" else frozenset())

    def reduce(self, node: Node, read: list[State]) -> State:
        data = read[0]
        if not isinstance(data, Padded) or any(isinstance(s, Padded) for s in read[1:]):
            raise Refused(node.label, "positions in an operand other than the data")
        rank = rank_of(node.inputs[0])
        given = list(node.attrs["axes"]) if "axes" in node.attrs else self.ints(node, 1)
        if given is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            raise Refused(node.label, "reduces dims kiln cannot read at compile time")
        if not given:
            axes = set() if node.attrs.get("noop_with_empty_axes") else set(range(rank))
        else:
            axes = {g % rank for g in given}
        keep = int(node.attrs.get("keepdims", 1))
        across = axes & set(data.axes)
        if across:
            if len(across) > 1:
                raise Refused(node.label, "reduces several padded dims")
            axis = across.pop()
            if node.op in ZERO_SUMS:
                self.mask(node, 0, axis, 0.0)
            elif node.op == "ReduceMax":
                self.mask(node, 0, axis, float("-inf"))
            elif node.op == "ReduceMin":
                self.mask(node, 0, axis, float("inf"))
            elif node.op == "ReduceMean":
                shape = node.inputs[0].type.shape  # type: ignore[union-attr]
                others = [shape[a] for a in axes if a != axis]  # type: ignore[index]
                if not all(isinstance(d, int) for d in others):
                    raise Refused(node.label, "a mean over the padded dim and a symbolic dim")
                self.mask(node, 0, axis, 0.0, divide=int(np.prod(others, dtype=np.int64)))
            else:
                raise Refused(node.label, f"{node.op} over the padded dim")
        remaining = [a for a in data.axes if a not in axes]
        if keep:
            return Padded(tuple(remaining)) if remaining else None
        moved = tuple(a - sum(1 for r in axes if r < a) for a in remaining)
        return Padded(moved) if moved else None

    def gather(self, node: Node, read: list[State]) -> State:
        data, indices = read[0], read[1]
        rank = rank_of(node.inputs[0])
        axis = int(node.attrs.get("axis", 0)) % max(rank, 1)
        index_rank = rank_of(node.inputs[1])
        if isinstance(indices, Padded) and data is None:  # a lookup at padded positions
            return Padded(tuple(axis + a for a in indices.axes))
        if isinstance(data, Padded) and indices is None:
            if axis in data.axes:
                chosen = self.ints(node, 1)
                if chosen is None or not all(0 <= i < self.low for i in chosen):
                    raise Refused(node.label, "gathers along the padded dim at positions not valid at every length")
            moved = [a if a < axis else a + index_rank - 1 for a in data.axes if a != axis]
            return Padded(tuple(moved)) if moved else None
        raise Refused(node.label, "gathers positions with positions")

    def slice(self, node: Node, read: list[State]) -> State:
        data = read[0]
        if not isinstance(data, Padded) or any(isinstance(s, Padded) for s in read[1:]):
            raise Refused(node.label, "slices with positions")
        rank = rank_of(node.inputs[0])
        starts, ends = self.ints(node, 1), self.ints(node, 2)
        axes = self.ints(node, 3) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        steps = self.ints(node, 4) if len(node.inputs) > 4 and node.inputs[4] is not None else None
        ends_state = read[2]
        if starts is None or (ends is None and not isinstance(ends_state, Sizes)):
            raise Refused(node.label, "a slice kiln cannot read at compile time")
        axes = [a % rank for a in (axes if axes is not None else range(len(starts)))]
        kept = list(data.axes)
        for i, axis in enumerate(axes):
            if axis not in data.axes:
                continue
            step = steps[i] if steps else 1
            to_length = (isinstance(ends_state, Sizes) and ends_state.mask is not None and ends_state.mask[i]) or (
                ends is not None and ends[i] >= (1 << 31) - 1
            )
            if starts[i] == 0 and step == 1 and to_length:
                continue  # all of it
            if 0 <= starts[i] and step == 1 and ends is not None and 0 <= ends[i] <= self.low:
                kept.remove(axis)  # a prefix every length has (a negative end counts from the length)
                continue
            shifted = self.shifted_slice(node, data, read)  # x[:, 1:], x[:, :-1]: shorter, still padded
            if shifted is not None:
                return shifted
            raise Refused(node.label, "slices the padded dim at positions not valid at every length")
        if isinstance(ends_state, Sizes):
            for i, axis in enumerate(axes):
                if axis in data.axes or not (ends_state.mask is None or ends_state.mask[i]):
                    continue
                if ends_state.mask is None or starts[i] != 0 or (steps and steps[i] != 1):
                    raise Refused(node.label, "slices another dim to the length")
                kept.append(axis)  # [0:length] of a dim of the padded value's own: positions too (a causal table)
        if tuple(sorted(kept)) == data.axes:
            return data  # the padded dims whole: positions, zeros and uniform values as they were
        return Padded(tuple(sorted(kept))) if kept else None

    def index_tuple(self, node: Node, read: list[State]) -> IndexTuple | None:
        """A Concat along a last dim of 1s of positions and values independent of them: index
        tuples (for a GatherND); None when it is not one."""
        rank = rank_of(node.outputs[0])
        if node.op != "Concat" or int(node.attrs.get("axis", 0)) % max(rank, 1) != rank - 1:
            return None
        axes: set[int] = set()
        parts: list[int | None] = []
        for value, state in zip(node.inputs, read):
            shape = getattr(value.type, "shape", None) if value is not None else None
            if not shape or shape[-1] != 1 or (state is not None and not isinstance(state, Padded)):
                return None
            if isinstance(state, Padded):
                axes |= set(state.axes)
            if isinstance(state, Padded) and state.ident:
                parts.append(state.axes[0])
            elif state is None or state.uniform:
                parts.append(None)
            else:
                return None
        return IndexTuple(tuple(sorted(axes)), tuple(parts)) if rank - 1 not in axes else None

    def along_other_axes(self, node: Node, read: list[State]) -> list[State]:
        data = read[0]
        if not isinstance(data, Padded):
            raise Refused(node.label, "positions in an operand other than the data")
        rank = rank_of(node.inputs[0])
        if node.op == "LayerNormalization":
            along = set(range(int(node.attrs.get("axis", -1)) % rank, rank))
        elif "axis" in node.attrs or node.op in ("Concat", "Split", "Gather"):
            along = {int(node.attrs.get("axis", 0)) % rank}
        else:
            raise Refused(node.label, "an op kiln cannot tell the positional behaviour of")
        if along & set(data.axes) and node.op != "Concat":
            raise Refused(node.label, "works along the padded dim")
        others = [s for s in read[1:] if isinstance(s, Padded)]
        if node.op == "Concat" and along & set(data.axes):
            rest = [v for v in node.inputs[1:] if v is not None]
            if all(
                isinstance(v.type, TensorType)
                and v.type.shape
                and v.type.shape[int(node.attrs.get("axis", 0)) % rank] == 0
                for v in rest
            ):
                return [data]  # one operand (an empty cache before it): a copy
            raise Refused(node.label, "concatenates along the padded dim")
        if node.op == "Concat":
            if any(s.axes != data.axes for s in others) or len(others) != sum(
                1 for v in node.inputs[1:] if v is not None
            ):
                raise Refused(node.label, "concatenates values with and without the padded dim")
        elif others and node.op != "LayerNormalization":
            raise Refused(node.label, "positions in an operand other than the data")
        elif node.op == "LayerNormalization" and others:
            raise Refused(node.label, "a scale or bias over positions")
        return [Padded(data.axes)] * (len(node.outputs) if node.op == "Split" else 1)
