"""Which symbolic dims may be *padded*: a run at length ``L`` computes, on inputs padded to a
compiled length ``C >= L``, the same values at every position below ``L`` (the rest is cut off),
once kiln masks the few places where padded positions would reach valid ones.

A sequence length is not sample-parallel (attention mixes positions), so the batch's chunking
(``kiln.passes.batching``) cannot serve it; padding can. The analysis is a forward dataflow over
the imported graph; each value is, for the symbol:

* ``Padded(axes, zero)``: its dims ``axes`` hold the symbol's positions, padded: at positions
  ``>= L`` along any of them it holds anything (garbage, NaN included) unless the dim is in
  ``zero``, where those positions hold exactly 0 (after a mask, or a Softmax over masked scores);
* ``Sizes(mask)``: a shape vector computed from the symbol's size (in the padded run: ``C``): fit
  only to be a target shape (Reshape, Expand, ConstantOfShape), a Range's count or a Slice's end;
* anything else (None): independent of the positions.

Rules: aligned ops (elementwise, comparisons, Where, casts) keep positions apart; reshapes and
transposes move the dims; a product contracting the padded dim reads both operands masked to 0
(``0 * garbage`` could be NaN: the mask is a select, not a multiplication); Softmax over it reads
its scores masked to ``-inf`` (padded keys get probability exactly 0); ReduceSum/Max/Min read a
mask of their identity, ReduceMean becomes a sum divided by ``L``; CumSum and Trilu/Range
positions look only at earlier positions. Anything else that reads along the padded dim (a
LayerNormalization over it, a Concat along it, an index counted from its end) refuses the symbol,
naming the node: the dim then compiles per size, as without this analysis.

``pad(graph, padding)`` writes the masks: a new scalar int64 input, the valid length, and one
``Where(position < L, x, fill)`` per masked operand. Everything else is unchanged, so the padded
graph compiles at each class size like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln.ir.graph import Graph, Node, Value, free_values, unique_name
from kiln.ir.types import DType, TensorType
from kiln.ops.registry import has_trait
from kiln.passes.batching import SHAPE_ARITHMETIC, Refused, Sizes, _rank

VALID = "kiln_valid_"  # the padded graph's extra input: VALID + symbol, the run's true length
PASSING = frozenset({"Identity", "Cast", "CastLike", "Dropout"})  # copy values: zeros stay zeros
ZERO_SUMS = frozenset({"ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare"})  # a 0 adds nothing


@dataclass(frozen=True)
class Padded:
    axes: tuple[int, ...]
    zero: frozenset[int] = frozenset()
    ident: bool = False  # one axis, and each element is its own position (a Range(0, length))


@dataclass(frozen=True)
class Merged:
    """Positions merged with the dims around them into dim ``axis`` (a Linear on [batch*seq,
    768] rows): index ``(o * length + position) * inner + i``; only row-wise ops may read it, a
    Reshape splits it again."""

    axis: int
    outer: int  # whole indices of the dims before merged into it
    inner: int  # elements of the dims after merged into it


@dataclass(frozen=True)
class Stride:
    """An integer tensor independent of the positions times the length (``row * length``: the
    start of each row of a flattened [rows, length] tensor)."""


@dataclass(frozen=True)
class FlatIndex:
    """``row * length + position``: indices into a flattened [rows, length] tensor, each
    pointing at its own row's element at the position (``axes``: where positions vary)."""

    axes: tuple[int, ...]


State = Padded | Merged | Sizes | Stride | FlatIndex | None


@dataclass(frozen=True)
class Mask:
    """Operand ``index`` of the node computing ``output`` read as ``Where(valid along axis, x,
    fill)``; ``divide``: the node (a ReduceMean) becomes a ReduceSum divided by L times the
    static count of its other reduced elements."""

    output: str
    index: int
    axis: int
    fill: float
    divide: int = 0


@dataclass(frozen=True)
class Padding:
    """How a paddable symbol sits at the graph's boundary (each input's padded dim, or None;
    each output's padded dims, cut back to the valid length after a run) and the masks ``pad``
    writes."""

    symbol: str
    inputs: tuple[int | None, ...]
    outputs: tuple[tuple[int, ...], ...]
    masks: tuple[Mask, ...] = field(default=())

    @property
    def valid_input(self) -> str:
        return VALID + self.symbol


def paddable(graph: Graph, symbol: str, low: int = 1) -> Padding | Refused:
    """Whether ``symbol`` may be padded (lengths ``>= low`` run: a constant index below ``low``
    along the dim is a valid position in every run), and with which masks; or why not."""
    return _Analysis(graph, symbol, max(int(low), 1)).run()


def _positions(out_rank: int, value: Value, axes: tuple[int, ...]) -> set[int]:
    return {out_rank - _rank(value) + a for a in axes}


class _Analysis:
    def __init__(self, graph: Graph, symbol: str, low: int) -> None:
        self.graph = graph
        self.symbol = symbol
        self.low = low
        self.state: dict[Value, State] = {}
        self.masks: list[Mask] = []
        self._producers: dict[Value, Node] | None = None
        self.lengths = (low + 4, low + 10)  # the two lengths shapes are measured at
        self._measured: list[dict[str, tuple]] | None = None

    def numeric(self, value: Value) -> tuple[tuple, tuple] | None:
        """``value``'s shape with every symbol bound (others to 3, this one to each of
        ``lengths``), or None when the graph does not specialize there."""
        if self._measured is None:
            from kiln.passes.specialize import specialize

            others = {
                d: 3 for v in self.graph.inputs for d in getattr(v.type, "shape", None) or () if isinstance(d, str)
            }
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
                outputs.append(result.axes if isinstance(result, Padded) else ())
            return Padding(self.symbol, tuple(inputs), tuple(outputs), tuple(self.masks))
        except Refused as refusal:
            return refusal

    # -- helpers ----------------------------------------------------------------------------------
    def constant(self, value: Value | None) -> np.ndarray | None:
        """A value that does not depend on the length: a constant, or what folding gives for it
        at three lengths, when they agree (shape arithmetic such as ``s - s``)."""
        if value is None:
            return None
        if value in self.graph.constants:
            return np.asarray(self.graph.constants[value])
        if isinstance(self.state.get(value), Padded):
            return None
        from kiln.passes.specialize import specialize

        if self._producers is None:
            self._producers = self.graph.producers()
        needed: set[int] = set()
        stack = [value]
        while stack:
            node = self._producers.get(stack.pop())
            if node is not None and id(node) not in needed:
                needed.add(id(node))
                stack.extend(v for v in node.inputs if v is not None)
        nodes = [n for n in self.graph.nodes if id(n) in needed]
        found = []
        for length in (self.low, self.low + 3, self.low + 17):
            try:
                folded = specialize(self.graph.with_(outputs=(value,), nodes=nodes), {self.symbol: length})
                array = next((a for v, a in folded.constants.items() if v.name == folded.outputs[0].name), None)
            except Exception:  # reads an input's data: not a constant
                return None
            if array is None or (found and not np.array_equal(found[0], array)):
                return None
            found.append(np.asarray(array))
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
        if any(isinstance(s, (Stride, FlatIndex)) for s in read):
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
            if start is not None and self.ints(node, 2) == [1]:
                # start, start+1, ...: position i holds the same in any run
                return [Padded((0,), ident=start == [0])]
        if op == "ConstantOfShape" or (op in ("Expand", "Reshape") and first is None):
            target = read[0] if op == "ConstantOfShape" else read[1]
            mask = target.mask if isinstance(target, Sizes) else None
            if mask is None or len(mask) != _rank(out):
                raise Refused(node.label, "a shape computed from the length that kiln cannot place")
            if op == "Reshape" and _rank(node.inputs[0]) >= 0:
                raise Refused(node.label, "reshapes a value to a shape computed from the length")
            # (Expand: a copy along the new dims; its own dims there are 1, checked by inference)
            return [Padded(tuple(i for i, m in enumerate(mask) if m))]
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
                and _rank(length) <= 1
                and isinstance(other.type, TensorType)  # type: ignore[union-attr]
                and other.type.dtype.numpy.kind in "iu"  # type: ignore[union-attr]
                and self.is_length(length)
            ):
                return [Stride()]
        mask = first.mask if isinstance(first, Sizes) else None
        if op in ("Shape", "Size"):
            return [None]
        if op in ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten") and isinstance(first, Sizes):
            return [first if _rank(out) <= 1 else Sizes(None)]
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
            masks = []
            for i in (1, 2):
                state = read[i]
                length = _rank(node.inputs[i]) == 1 and node.inputs[i].type.shape[0]  # type: ignore[union-attr]
                if isinstance(state, Sizes) and state.mask is not None:
                    masks.append(state.mask)
                elif state is None and isinstance(length, int):
                    masks.append((False,) * length)
            if len(masks) == 2 and len(masks[0]) == len(masks[1]):
                union = tuple(a or b for a, b in zip(*masks))
                return [Sizes(union) if any(union) else None]
        if op in SHAPE_ARITHMETIC:
            return [Sizes(None)]
        raise Refused(node.label, "computes with the length")

    def slice_to_length(self, node: Node, read: list[State]) -> State:
        """A Slice of a length-independent value whose ends are computed from the length (a
        causal mask cut from a constant table): padded along those dims, when each such end is
        the length itself and its start a constant."""
        rank = _rank(node.inputs[0])
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
        cast): checked by folding it at three lengths."""
        if self._producers is None:
            self._producers = self.graph.producers()
        from kiln.passes.specialize import specialize

        nodes = []
        stack, seen = [value], set()
        while stack:
            node = self._producers.get(stack.pop())
            if node is not None and id(node) not in seen:
                seen.add(id(node))
                nodes.append(node)
                stack.extend(v for v in node.inputs if v is not None)
        order = [n for n in self.graph.nodes if id(n) in seen]
        for length in (self.low, self.low + 3, self.low + 17):
            try:
                bound = {
                    d: 2 for v in self.graph.inputs for d in getattr(v.type, "shape", None) or () if isinstance(d, str)
                }
                folded = specialize(self.graph.with_(outputs=(value,), nodes=order), {**bound, self.symbol: length})
                array = next((a for v, a in folded.constants.items() if v.name == folded.outputs[0].name), None)
            except Exception:
                return False
            if array is None or np.asarray(array).size != 1 or int(np.asarray(array).reshape(-1)[0]) != length:
                return False
        return True

    # -- flattened rows ---------------------------------------------------------------------------
    def flat_rule(self, node: Node, read: list[State]) -> State:
        op = node.op
        if op == "Add" and len(read) == 2:
            kinds = {type(s) for s in read}
            if kinds == {Stride, Padded}:
                position = next(s for s in read if isinstance(s, Padded))
                value = next(v for v, s in zip(node.inputs, read) if isinstance(s, Padded))
                if position.ident:
                    return FlatIndex(tuple(sorted(_positions(_rank(node.outputs[0]), value, position.axes))))
        if op in ("Unsqueeze", "Cast") and isinstance(read[0], (Stride, FlatIndex)):
            if op == "Cast" and node.outputs[0].type.dtype.numpy.kind not in "iu":  # type: ignore[union-attr]
                raise Refused(node.label, "casts flat indices to floats")
            if isinstance(read[0], Stride):
                return Stride()
            if op == "Unsqueeze":
                raise Refused(node.label, "moves flat indices' dims")
            return read[0]
        if op == "Shape" and isinstance(read[0], FlatIndex):
            rank = _rank(node.inputs[0])
            start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
            positions = list(range(rank))[slice(start, None if end is None else int(end))]
            return Sizes(tuple(i in read[0].axes for i in positions))
        data = read[0]
        if op == "Gather" and isinstance(data, Merged) and isinstance(read[1], FlatIndex):
            if int(node.attrs.get("axis", 0)) % max(_rank(node.inputs[0]), 1) == 0 == data.axis and data.inner == 1:
                return Padded(read[1].axes)  # each index reads its own row at its own position
        raise Refused(node.label, "computes with flattened positions in a way kiln cannot follow")

    def merged_rule(self, node: Node, read: list[State]) -> list[State]:
        op = node.op
        state = next(s for s in read if isinstance(s, Merged))
        out_rank = _rank(node.outputs[0])
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
                position = out_rank - _rank(value) + (s.axis if isinstance(s, Merged) else 0)
                if isinstance(s, Merged):
                    if (s.outer, s.inner, position) != (
                        state.outer,
                        state.inner,
                        out_rank - _rank(node.inputs[read.index(state)]) + state.axis,
                    ):
                        raise Refused(node.label, "merged positions broadcast against other merged positions")
                    continue
                axis = state.axis - (out_rank - _rank(value))
                if 0 <= axis and value.type.shape[axis] != 1:  # type: ignore[union-attr,index]
                    raise Refused(node.label, "broadcasts merged positions against another dim")
                del position
            return [Merged(out_rank - _rank(node.inputs[read.index(state)]) + state.axis, state.outer, state.inner)]
        if op in ("Gemm", "MatMul") and read[0] is state and not any(isinstance(s, Merged) for s in read[1:]):
            a_rank = _rank(node.inputs[0])
            rows = 0 if op == "Gemm" else a_rank - 2
            if op == "Gemm" and node.attrs.get("transA"):
                raise Refused(node.label, "a Gemm contracting merged positions")
            if state.axis != rows and (op == "Gemm" or state.axis >= a_rank - 2):
                raise Refused(node.label, "a product contracting merged positions")
            if any(isinstance(s, Padded) for s in read[1:]):
                raise Refused(node.label, "a product of merged positions with positions")
            return [Merged(out_rank - a_rank + state.axis if op == "MatMul" else 0, state.outer, state.inner)]
        if op in ("Softmax", "LogSoftmax", "LayerNormalization", "Split") and read[0] is state:
            rank = _rank(node.inputs[0])
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
            rank = _rank(node.inputs[0])
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
        if op == "Trilu" and isinstance(first, Padded) and not any(read[1:]):
            return [Padded(first.axes)]  # kept or zeroed by (row, column): position-wise
        if op == "CumSum" and isinstance(first, Padded) and not any(read[1:]):
            if node.attrs.get("reverse"):
                axis = self.ints(node, 1)
                rank = _rank(node.inputs[0])
                if axis is None or axis[0] % rank in first.axes:
                    raise Refused(node.label, "a reversed CumSum along the padded dim")
            return [Padded(first.axes)]  # a prefix sum: position i reads positions <= i
        if op in ("Shape", "Size"):
            if op == "Size" or not isinstance(first, Padded):
                return [Sizes(None)]
            rank = _rank(node.inputs[0])
            start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
            positions = list(range(rank))[slice(start, None if end is None else int(end))]
            return [Sizes(tuple(i in first.axes for i in positions))]
        if op in ("LayerNormalization", "Split", "Concat", "Softplus") or has_trait(op, "", "axis"):
            return self.along_other_axes(node, read)
        raise Refused(node.label, "an op kiln cannot tell the positional behaviour of")

    def aligned(self, node: Node, read: list[State]) -> Padded:
        """Broadcasting ops: every operand's dim at a padded output position is padded or 1."""
        out_rank = _rank(node.outputs[0])
        positions: set[int] = set()
        zero_all: set[int] | None = None
        for value, state in zip(node.inputs, read):
            if isinstance(state, Padded):
                positions |= _positions(out_rank, value, state.axes)
        for value, state in zip(node.inputs, read):
            if value is None:
                continue
            rank = _rank(value)
            offset = out_rank - rank
            own = _positions(out_rank, value, state.axes) if isinstance(state, Padded) else set()
            for p in positions - own:
                if p - offset >= 0 and value.type.shape[p - offset] != 1:  # type: ignore[union-attr,index]
                    raise Refused(node.label, "broadcasts the padded dim against another dim")
            if isinstance(state, Padded):
                zeros = {offset + a for a in state.zero}
                zero_all = zeros if zero_all is None else zero_all & zeros
        # one operand, 0 -> 0 (a Mul loses it: 0 * inf is NaN)
        keeps_zero = node.op in PASSING or node.op in ("Relu", "Abs", "Neg")
        return Padded(tuple(sorted(positions)), frozenset(zero_all or ()) if keeps_zero else frozenset())

    def expand(self, node: Node, read: list[State]) -> Padded:
        data, target = read[0], read[1]
        out_rank = _rank(node.outputs[0])
        if isinstance(target, Padded) or not isinstance(data, Padded):
            raise Refused(node.label, "expands to a shape read from positions")
        positions = _positions(out_rank, node.inputs[0], data.axes)
        mask = target.mask if isinstance(target, Sizes) else None
        value = self.constant(node.inputs[1]) if target is None else None
        for p in positions:
            if not (
                (mask is not None and len(mask) > p and mask[p])
                or (value is not None and value.size > p and int(value.reshape(-1)[p]) == 1)
            ):
                raise Refused(node.label, "expands across the padded dim")
        return Padded(tuple(sorted(positions)))

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
        rank_in, rank_out = _rank(node.inputs[0]), _rank(node.outputs[0])
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
                frozenset(mapping[a] for a in data.zero),
                data.ident,  # type: ignore[misc]
            )
        mapping = dict(enumerate(kept))
        return Padded(tuple(mapping[a] for a in data.axes), frozenset(mapping[a] for a in data.zero), data.ident)

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
        out_rank = _rank(node.outputs[0])
        a_rank, b_rank = _rank(node.inputs[0]), _rank(node.inputs[1])
        if node.op == "Gemm":
            ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
            a_k, b_k = (0 if ta else 1), (1 if tb else 0)
            rows = {0} if isinstance(a, Padded) and (1 - a_k) in a.axes else set()
            cols = {1} if isinstance(b, Padded) and (1 - b_k) in b.axes else set()
            self.contract(node, read, a_k, b_k)
            if len(read) > 2 and isinstance(read[2], Padded):
                rows |= _positions(2, node.inputs[2], read[2].axes)  # type: ignore[arg-type]
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
        rank = _rank(node.inputs[0])
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
        rank = _rank(node.inputs[0])
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
        rank = _rank(node.inputs[0])
        axis = int(node.attrs.get("axis", 0)) % max(rank, 1)
        index_rank = _rank(node.inputs[1])
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
        rank = _rank(node.inputs[0])
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
            if 0 <= starts[i] and step == 1 and ends is not None and ends[i] <= self.low:
                kept.remove(axis)  # a prefix every length has
                continue
            raise Refused(node.label, "slices the padded dim at positions not valid at every length")
        if isinstance(ends_state, Sizes) and any(
            m for m, axis in zip(ends_state.mask or (True,), axes) if axis not in data.axes
        ):
            raise Refused(node.label, "slices another dim to the length")
        return Padded(tuple(kept)) if kept else None

    def along_other_axes(self, node: Node, read: list[State]) -> list[State]:
        data = read[0]
        if not isinstance(data, Padded):
            raise Refused(node.label, "positions in an operand other than the data")
        rank = _rank(node.inputs[0])
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


def pad(graph: Graph, padding: Padding) -> Graph:
    """``graph`` with the valid length as a new last input and each mask of ``padding`` written
    as ``Where(position < L, x, fill)`` before the operand it guards."""
    taken = {v.name for v in graph.values()}
    i64, boolean = DType.from_short("i64"), DType.from_short("bool")
    valid = Value(unique_name(padding.valid_input, taken), TensorType(i64, ()))
    taken.add(valid.name)
    constants = dict(graph.constants)

    def fresh(base: str, value_type: TensorType) -> Value:
        name = unique_name(base, taken)
        taken.add(name)
        return Value(name, value_type)

    def const(base: str, array: np.ndarray) -> Value:
        value = fresh(base, TensorType(DType.from_numpy(array.dtype), tuple(array.shape)))
        constants[value] = array
        return value

    by_output: dict[str, list[Mask]] = {}
    for m in padding.masks:
        by_output.setdefault(m.output, []).append(m)
    nodes: list[Node] = []
    positions: dict[tuple[str, int, int], Value] = {}  # (dim name, axis from the end) -> bool mask

    def valid_mask(value: Value, axis: int) -> Value:
        shape = value.type.shape  # type: ignore[union-attr]
        rank = len(shape)
        key = (str(shape[axis]), rank - axis)
        if key not in positions:
            sizes = fresh("kiln_pad_shape", TensorType(i64, (rank,)))
            count = fresh("kiln_pad_count", TensorType(i64, ()))
            span = fresh("kiln_pad_positions", TensorType(i64, (shape[axis],)))
            flags = fresh("kiln_pad_valid", TensorType(boolean, (shape[axis],)))
            trailing = (1,) * (rank - axis - 1)
            placed = fresh("kiln_pad_mask", TensorType(boolean, (shape[axis], *trailing)))
            nodes.extend(
                [
                    Node("Shape", (value,), (sizes,)),
                    Node("Gather", (sizes, const("kiln_pad_axis", np.array(axis, np.int64))), (count,), {"axis": 0}),
                    Node(
                        "Range",
                        (
                            const("kiln_pad_zero", np.array(0, np.int64)),
                            count,
                            const("kiln_pad_one", np.array(1, np.int64)),
                        ),
                        (span,),
                    ),
                    Node("Less", (span, valid), (flags,)),
                    Node(
                        "Reshape",
                        (flags, const("kiln_pad_target", np.array([-1, *trailing], np.int64))),
                        (placed,),
                    ),
                ]
            )
            positions[key] = placed
        return positions[key]

    for node in graph.nodes:
        masks = by_output.get(node.outputs[0].name, [])
        if not masks:
            nodes.append(node)
            continue
        inputs = list(node.inputs)
        divide = 0
        for m in masks:
            operand = inputs[m.index]
            assert operand is not None and isinstance(operand.type, TensorType)
            kind = operand.type.dtype.numpy
            value = m.fill
            if np.dtype(kind).kind in "iu" and not np.isfinite(value):
                info = np.iinfo(kind)
                value = info.max if value > 0 else info.min
            fill = const("kiln_pad_fill", np.array(value, dtype=kind))
            guarded = fresh(f"{operand.name}_padded", operand.type)
            nodes.append(Node("Where", (valid_mask(operand, m.axis), operand, fill), (guarded,)))
            inputs[m.index] = guarded
            divide = divide or m.divide
        if not divide:
            nodes.append(Node(node.op, tuple(inputs), node.outputs, dict(node.attrs), node.name, node.domain))
            continue
        out = node.outputs[0]
        total = fresh(f"{out.name}_sum", out.type)  # type: ignore[arg-type]
        attrs = dict(node.attrs)
        if "axes" in attrs and graph.opset >= 13:  # ReduceSum takes its axes as an input since 13
            inputs[1:] = [const("kiln_pad_axes", np.array(attrs.pop("axes"), np.int64))]
        nodes.append(Node("ReduceSum", tuple(inputs), (total,), attrs, node.name, node.domain))
        count = fresh("kiln_pad_count", TensorType(i64, ()))
        scaled = fresh("kiln_pad_count_f", TensorType(out.type.dtype, ()))  # type: ignore[union-attr]
        nodes.append(Node("Mul", (valid, const("kiln_pad_per", np.array(divide, np.int64))), (count,)))
        nodes.append(Node("Cast", (count,), (scaled,), {"to": out.type.dtype.onnx_code}))  # type: ignore[union-attr]
        nodes.append(Node("Div", (total, scaled), (out,)))
    return graph.with_(inputs=(*graph.inputs, valid), nodes=tuple(nodes), constants=constants)
