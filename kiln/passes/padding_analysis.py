"""The padding analysis' dataflow (``kiln.passes.padding`` describes it): the run over the graph,
values computed from the length, flat indices into flattened rows, rows merged with other dims."""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Graph, Node, Value, free_values
from kiln.ir.types import TensorType
from kiln.ops.registry import has_trait
from kiln.passes.batching import SHAPE_ARITHMETIC, Refused, Sizes, ancestors, symbols
from kiln.passes.padding_positions import PositionRules
from kiln.passes.padding_shifts import ShiftRules
from kiln.passes.padding_states import (
    FlatIndex,
    IndexTuple,
    Mask,
    Merged,
    Padded,
    Padding,
    State,
    Stride,
    broadcast_dims,
    is_shifted,
    rank_of,
    where_mask,
)


class Analysis(ShiftRules, PositionRules):
    """The dataflow: states of values, the length's arithmetic, flat indices and merged rows
    (``PositionRules``: the ops on padded values)."""

    def __init__(self, graph: Graph, symbol: str, low: int, high: int | None = None) -> None:
        self.graph = graph
        self.symbol = symbol
        self.low = low
        self.high = high  # the longest padded length (None: unknown)
        self.state: dict[Value, State] = {}
        self.masks: list[Mask] = []
        self._producers: dict[Value, Node] | None = None
        self.lengths = (low + 4, low + 10)  # the two lengths shapes are measured at
        self.folds = (low, low + 3, low + 17)  # the three lengths values are folded at
        self._measured: list[dict[str, tuple]] | None = None

    def numeric(self, value: Value) -> tuple[tuple, tuple] | None:
        """``value``'s shape with every symbol bound (others to 3, this one to each of
        ``lengths``), or None when the graph does not specialize there."""
        if self._measured is None:
            from kiln.passes.specialize import specialize

            others = dict.fromkeys(symbols(self.graph), 3)
            self._measured = []
            for length in self.lengths:
                try:
                    bound = specialize(self.graph, {**others, self.symbol: length})
                except Exception:
                    self._measured = []
                    break
                self._measured.append(
                    {
                        v.name: v.type.shape
                        for v in bound.values()
                        if isinstance(v.type, TensorType) and v.type.is_static
                    }
                )
        found = [m.get(value.name) for m in self._measured]
        shape = getattr(value.type, "shape", None)
        if (
            (None in found or len(found) != 2)
            and shape is not None
            and all(isinstance(d, int) or d == self.symbol for d in shape)
        ):
            found = [tuple(n if d == self.symbol else d for d in shape) for n in self.lengths]
        if len(found) != 2 or found[0] is None or found[1] is None:
            arrays = self.folded(value, others=3, lengths=self.lengths)  # computed from shapes: folded away there
            found = [tuple(a.shape) for a in arrays] if arrays is not None else []
        if len(found) != 2 or found[0] is None or found[1] is None or len(found[0]) != len(found[1]):
            return None
        return found[0], found[1]  # type: ignore[return-value]

    def run(self) -> Padding | Refused:
        try:
            inputs: list[int | None] = []
            for value in self.graph.inputs:
                shape = getattr(value.type, "shape", None)
                if not isinstance(value.type, TensorType) or shape is None:
                    if self.symbol in str(value.type):
                        raise Refused(value.name, "a sequence or optional input holding the dim")
                    inputs.append(None)
                    continue
                axes = [i for i, d in enumerate(shape) if d == self.symbol]
                if len(axes) > 1:
                    raise Refused(value.name, f"{self.symbol} is more than one of its dims {shape}")
                if axes:
                    self.state[value] = Padded((axes[0],))
                inputs.append(axes[0] if axes else None)
            if not any(a is not None for a in inputs):
                raise Refused(self.symbol, "no input holds the dim")
            for node in self.graph.nodes:
                self.visit(node)
            outputs = []
            for value in self.graph.outputs:
                result = self.state.get(value)
                if isinstance(result, Sizes):
                    raise Refused(value.name, "an output computed from the length")
                if (result is not None and not isinstance(result, Padded)) or is_shifted(result):
                    # merged rows, flat indices, positions shifted (cut at the length, cut wrong)
                    raise Refused(value.name, "an output whose padded positions kiln cannot cut off")
                outputs.append(result.axes if isinstance(result, Padded) else ())
            return Padding(self.symbol, tuple(inputs), tuple(outputs), tuple(self.masks))
        except Refused as refusal:  # (kept by its callers: without the frames, which hold the graph's weights)
            return refusal.with_traceback(None)

    # -- helpers ----------------------------------------------------------------------------------
    def folded(
        self, value: Value, others: int | None = None, lengths: tuple[int, ...] | None = None
    ) -> list[np.ndarray] | None:
        """``value`` folded with the length bound to each of ``lengths`` (``folds`` unless
        given; and, with ``others``, every other symbol bound to it); None when it does not fold
        (it reads an input's data, or another symbol left unbound)."""
        from kiln.passes.specialize import specialize

        if self._producers is None:
            self._producers = self.graph.producers()
        alone = self.graph.with_(outputs=(value,), nodes=ancestors(self.graph, self._producers, value))
        bound = {d: others for d in symbols(self.graph)} if others is not None else {}
        found = []
        for length in lengths or self.folds:
            try:
                folded = specialize(alone, {**bound, self.symbol: length})
            except Exception:  # reads an input's data
                return None
            array = next((a for v, a in folded.constants.items() if v.name == folded.outputs[0].name), None)
            if array is None:
                return None
            found.append(np.asarray(array))
        return found

    def constant(self, value: Value | None) -> np.ndarray | None:
        """A value that does not depend on the length: a constant, or what folding gives for it
        at three lengths, when they agree (shape arithmetic such as ``s - s``)."""
        if value is None:
            return None
        if value in self.graph.constants:
            return np.asarray(self.graph.constants[value])
        if isinstance(self.state.get(value), Padded):
            return None
        found = self.folded(value)
        if found is None:  # other symbols it reads only through static dims (x.shape[-1] // 2 of [batch, seq, 16])?
            two, three = self.folded(value, others=2), self.folded(value, others=3)
            found = two + three if two is not None and three is not None else None
        if found is None or any(not np.array_equal(found[0], array) for array in found[1:]):
            return None
        return found[0]

    def ints(self, node: Node, index: int) -> list[int] | None:
        if index >= len(node.inputs) or node.inputs[index] is None:
            return None
        array = self.constant(node.inputs[index])
        if array is None or array.dtype.kind not in "iu":
            return None
        return [int(x) for x in array.reshape(-1)]

    def mask(self, node: Node, index: int, axis: int, fill: float, divide: int = 0) -> None:
        self.masks.append(Mask(node.outputs[0].name, index, axis, fill, divide))

    def visit(self, node: Node) -> None:
        read = [self.state.get(v) if v is not None else None for v in node.inputs]
        inner = [self.state.get(v) for g in node.subgraphs() for v in free_values(g)]
        if all(s is None for s in read + inner):
            return
        if list(node.subgraphs()):
            raise Refused(node.label, "control flow over the padded dim")
        if node.domain:
            raise Refused(node.label, "an op kiln cannot tell the positional behaviour of")
        if node.op == "ScatterND":
            results = [self.scattered(node, read)]
        elif node.op == "ScatterElements" and isinstance(read[0], Padded) and read[1] is None and read[2] is None:
            results = [self.scattered_elements(node, read)]
        elif any(is_shifted(s) for s in read):
            results = self.shifted_rule(node, read)
        elif any(isinstance(s, (Stride, FlatIndex, IndexTuple)) for s in read):
            results = [self.flat_rule(node, read)]
        elif any(isinstance(s, Merged) for s in read):
            results = self.merged_rule(node, read)
        elif any(isinstance(s, Padded) for s in read):
            results = self.padded_rule(node, read)
        else:
            results = self.sizes_rule(node, read)
        for value, result in zip(node.outputs, results):
            if result is not None:
                self.state[value] = result

    # -- values computed from the length ----------------------------------------------------------
    def sizes_rule(self, node: Node, read: list[State]) -> list[State]:
        op, first = node.op, read[0]
        out = node.outputs[0]
        if op == "Range" and isinstance(read[1], Sizes) and read[0] is None and read[2] is None:
            start = self.ints(node, 0)
            length = read[1].mask in ((True,), ()) or self.is_length(node.inputs[1])  # type: ignore[union-attr]
            if start is not None and self.ints(node, 2) == [1] and length:
                # start, start+1, ...: position i holds the same in any run
                return [Padded((0,), ident=start == [0])]
        if op == "ConstantOfShape" or (op in ("Expand", "Reshape") and first is None):
            target = read[0] if op == "ConstantOfShape" else read[1]
            mask = target.mask if isinstance(target, Sizes) else None
            if mask is None or len(mask) != rank_of(out):
                raise Refused(node.label, "a shape computed from the length that kiln cannot place")
            if op == "Reshape" and rank_of(node.inputs[0]) >= 0:
                raise Refused(node.label, "reshapes a value to a shape computed from the length")
            # (Expand: a copy along the new dims; its own dims there are 1, checked by inference)
            return [Padded(tuple(i for i, m in enumerate(mask) if m), uniform=True)]
        if op == "Slice" and first is None and not any(isinstance(s, Sizes) for s in read[1:2] + read[3:]):
            return [self.slice_to_length(node, read)]
        if not all(s is None or isinstance(s, Sizes) for s in read):
            raise Refused(node.label, "computes with the length")
        if op == "Mul" and len(read) == 2 and sum(isinstance(s, Sizes) for s in read) == 1:
            length = next(v for v, s in zip(node.inputs, read) if isinstance(s, Sizes))
            other = next(v for v, s in zip(node.inputs, read) if s is None)
            state = next(s for s in read if isinstance(s, Sizes))
            if (
                state.mask in ((True,), None)
                and rank_of(length) <= 1
                and isinstance(other.type, TensorType)  # type: ignore[union-attr]
                and other.type.dtype.numpy.kind in "iu"  # type: ignore[union-attr]
                and self.is_length(length)
            ):
                return [Stride()]
        if op in ("Min", "Max") and len(read) == 2:
            bounded = self.bounded_length(node, read)
            if bounded is not None:
                return [bounded]
        if op == "Sub" and all(isinstance(s, Sizes) and s.mask == (True,) for s in read):
            return [None]  # the length minus the length (key_length - query_length): 0 at every length
        mask = first.mask if isinstance(first, Sizes) else None
        if op == "Slice" and mask is not None and isinstance(first, Sizes):
            piece = self.sliced_sizes(node, mask)
            if piece is not False:
                return [piece]
        if op in ("Shape", "Size"):
            return [None]
        if op in ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten") and isinstance(first, Sizes):
            return [first if rank_of(out) <= 1 else Sizes(None)]
        if op == "Concat":
            parts: list[bool] = []
            for value, state in zip(node.inputs, read):
                length = value.type.shape[0] if isinstance(value.type, TensorType) and value.type.shape else None
                if isinstance(state, Sizes) and state.mask is not None:
                    parts.extend(state.mask)
                elif isinstance(length, int) and state is None:
                    parts.extend([False] * length)
                else:
                    return [Sizes(None)]
            return [Sizes(tuple(parts)) if any(parts) else None]
        if op == "Gather" and mask is not None and isinstance(first, Sizes):
            indices = self.ints(node, 1)
            if indices is not None and all(-len(mask) <= i < len(mask) for i in indices):
                chosen = tuple(mask[i] for i in indices)
                return [Sizes(chosen) if any(chosen) else None]
        if op == "Where":  # element i is either branch's element i (whichever the condition picks)
            union = where_mask(node, read, Sizes)
            if union is not None:
                return [Sizes(union) if any(union) else None]
        if op in SHAPE_ARITHMETIC:
            return [Sizes(None)]
        raise Refused(node.label, "computes with the length")

    def sliced_sizes(self, node: Node, mask: tuple[bool, ...]) -> Sizes | bool | None:
        """A piece of a shape vector (``Shape(k)[-2:-1]``, a length read from a key's shape): which
        of its elements are the length (None: none is); False when kiln cannot read the slice."""
        starts, ends, axes, steps = (self.ints(node, i) for i in (1, 2, 3, 4))
        if starts is None or ends is None or len(starts) != 1 or axes not in (None, [0], [-1]):
            return False
        chosen = tuple(mask[slice(starts[0], ends[0], (steps or [1])[0])])
        return Sizes(chosen) if any(chosen) else None

    def bounded_length(self, node: Node, read: list[State]) -> Sizes | None:
        """``min(length, c)`` with c at least the longest padded length (a window capped at a
        table's size: ``min(seq, 2048)``), or ``max(length, c)`` with c at most the shortest: the
        length itself at every length that runs; None for anything else."""
        sizes = [(i, s) for i, s in enumerate(read) if isinstance(s, Sizes)]
        if len(sizes) != 1 or sizes[0][1].mask is None:
            return None
        state, bound = sizes[0][1], self.ints(node, 1 - sizes[0][0])
        if bound is None or len(bound) not in (1, len(state.mask)):
            return None
        bound = bound * len(state.mask) if len(bound) == 1 else bound
        for is_length, c in zip(state.mask, bound):
            if is_length and not (
                (node.op == "Min" and self.high is not None and c >= self.high) or (node.op == "Max" and c <= self.low)
            ):
                return None
        return state

    def slice_to_length(self, node: Node, read: list[State]) -> State:
        """A Slice of a length-independent value whose ends are computed from the length (a
        causal mask cut from a constant table): padded along those dims, when each such end is
        the length itself and its start a constant."""
        rank = rank_of(node.inputs[0])
        ends_state = read[2]
        starts, steps = self.ints(node, 1), self.ints(node, 4)
        axes = self.ints(node, 3) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        if not isinstance(ends_state, Sizes) or ends_state.mask is None or starts is None or rank < 0:
            raise Refused(node.label, "slices to an end computed from the length kiln cannot follow")
        axes = axes if axes is not None else list(range(len(starts)))
        if steps not in (None, [1] * len(starts)) or len(axes) != len(ends_state.mask):
            raise Refused(node.label, "slices to an end computed from the length with steps")
        padded = []
        for axis, start, is_length in zip(axes, starts, ends_state.mask):
            if is_length:
                if start != 0:
                    raise Refused(node.label, "a slice ending at the length but not starting at 0")
                padded.append(axis % rank)
        return Padded(tuple(sorted(padded)))

    def is_length(self, value: Value) -> bool:
        """The value is the length itself (a Gather of a Shape at a padded dim, unsqueezed or
        cast): checked by folding it at three lengths, the other symbols bound to 2."""
        found = self.folded(value, others=2)
        return found is not None and all(a.size == 1 and int(a.reshape(-1)[0]) == n for a, n in zip(found, self.folds))

    # -- flattened rows ---------------------------------------------------------------------------
    def flat_rule(self, node: Node, read: list[State]) -> State:
        op = node.op
        if op == "Add" and len(read) == 2:
            kinds = {type(s) for s in read}
            if kinds == {Stride, Padded}:
                position = next(s for s in read if isinstance(s, Padded))
                value = next(v for v, s in zip(node.inputs, read) if isinstance(s, Padded))
                if position.ident:
                    return FlatIndex(tuple(sorted(broadcast_dims(rank_of(node.outputs[0]), value, position.axes))))
        if op in ("Unsqueeze", "Cast") and isinstance(read[0], (Stride, FlatIndex)):
            if op == "Cast" and node.outputs[0].type.dtype.numpy.kind not in "iu":  # type: ignore[union-attr]
                raise Refused(node.label, "casts flat indices to floats")
            if isinstance(read[0], Stride):
                return Stride()
            if op == "Unsqueeze":
                raise Refused(node.label, "moves flat indices' dims")
            return read[0]
        if (
            op == "Concat"
            and all(s is None or isinstance(s, (Stride, Sizes)) for s in read)
            and all(v is not None and rank_of(v) == 1 for v in node.inputs)
        ):
            return Sizes(None)  # a shape vector holding rows * length (a flatten's target): sizes only
        if op == "Shape" and isinstance(read[0], FlatIndex):
            rank = rank_of(node.inputs[0])
            start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
            positions = list(range(rank))[slice(start, None if end is None else int(end))]
            return Sizes(tuple(i in read[0].axes for i in positions))
        data = read[0]
        if op == "GatherND" and isinstance(data, Padded) and isinstance(read[1], IndexTuple):
            return self.gather_tuples(node, data, read[1])
        if op == "Gather" and isinstance(data, Merged) and isinstance(read[1], FlatIndex):
            if int(node.attrs.get("axis", 0)) % max(rank_of(node.inputs[0]), 1) == 0 == data.axis and data.inner == 1:
                return Padded(read[1].axes)  # each index reads its own row at its own position
        raise Refused(node.label, "computes with flattened positions in a way kiln cannot follow")

    def gather_tuples(self, node: Node, data: Padded, tuples: IndexTuple) -> State:
        """GatherND by tuples whose component for each padded dim of the data is the position
        itself, and for every other dim independent of the positions: each valid position reads
        the data at valid positions only (the dynamo exports' ``mask[b, j]`` lookups)."""
        if int(node.attrs.get("batch_dims", 0)) != 0:
            raise Refused(node.label, "a GatherND with batch dims over positions")
        width = len(tuples.parts)
        for k, part in enumerate(tuples.parts):
            if (k in data.axes) != (part is not None):
                raise Refused(node.label, "index tuples that mix positions with other dims")
        rest = [a for a in data.axes if a >= width]
        lead = rank_of(node.inputs[1]) - 1
        return Padded(tuple(sorted({*tuples.axes, *(lead + a - width for a in rest)})))

    def merged_rule(self, node: Node, read: list[State]) -> list[State]:
        op = node.op
        state = next(s for s in read if isinstance(s, Merged))
        out_rank = rank_of(node.outputs[0])
        if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze") and read[0] is state:
            if any(s is not None and not isinstance(s, Sizes) for s in read[1:]):
                raise Refused(node.label, "reshapes merged positions to a shape read from positions")
            return [self.split(node, state)]
        if any(isinstance(s, (Padded, Sizes)) for s in read):
            raise Refused(node.label, "merged and plain positions in one op")
        if has_trait(op, "", "aligned"):
            for value, s in zip(node.inputs, read):
                if value is None:
                    continue
                position = out_rank - rank_of(value) + (s.axis if isinstance(s, Merged) else 0)
                if isinstance(s, Merged):
                    if (s.outer, s.inner, position) != (
                        state.outer,
                        state.inner,
                        out_rank - rank_of(node.inputs[read.index(state)]) + state.axis,
                    ):
                        raise Refused(node.label, "merged positions broadcast against other merged positions")
                    continue
                axis = state.axis - (out_rank - rank_of(value))
                if 0 <= axis and value.type.shape[axis] != 1:  # type: ignore[union-attr,index]
                    raise Refused(node.label, "broadcasts merged positions against another dim")
                del position
            return [Merged(out_rank - rank_of(node.inputs[read.index(state)]) + state.axis, state.outer, state.inner)]
        if op in ("Gemm", "MatMul") and read[0] is state and not any(isinstance(s, Merged) for s in read[1:]):
            a_rank = rank_of(node.inputs[0])
            rows = 0 if op == "Gemm" else a_rank - 2
            if op == "Gemm" and node.attrs.get("transA"):
                raise Refused(node.label, "a Gemm contracting merged positions")
            if state.axis != rows and (op == "Gemm" or state.axis >= a_rank - 2):
                raise Refused(node.label, "a product contracting merged positions")
            if any(isinstance(s, Padded) for s in read[1:]):
                raise Refused(node.label, "a product of merged positions with positions")
            return [Merged(out_rank - a_rank + state.axis if op == "MatMul" else 0, state.outer, state.inner)]
        if op in ("Softmax", "LogSoftmax", "LayerNormalization", "Split") and read[0] is state:
            rank = rank_of(node.inputs[0])
            axis = int(node.attrs.get("axis", -1 if op != "Split" else 0)) % rank
            along = set(range(axis, rank)) if op == "LayerNormalization" else {axis}
            if state.axis in along or any(s is not None for s in read[1:] if op != "LayerNormalization"):
                raise Refused(node.label, "works along merged positions")
            kept = 1 if op == "LayerNormalization" else len(node.outputs)
            return [state] * kept
        raise Refused(node.label, "an op on merged positions kiln cannot follow")

    def split(self, node: Node, state: Merged) -> State:
        shapes = self.numeric(node.inputs[0]), self.numeric(node.outputs[0])
        if shapes[0] is None or shapes[1] is None:
            raise Refused(node.label, "a reshape kiln cannot measure")
        return self.placed(node, shapes, state.axis, state.outer, state.inner, state)

    # -- values holding positions -----------------------------------------------------------------
