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

import numpy as np

from kiln.ir.graph import Graph, Node, Value, unique_name
from kiln.ir.types import DType, TensorType
from kiln.passes.batching import Refused
from kiln.passes.dce import dce
from kiln.passes.padding_analysis import Analysis
from kiln.passes.padding_states import (  # noqa: F401 - the analysis' states, re-exported
    VALID,
    FlatIndex,
    Mask,
    Merged,
    Padded,
    Padding,
    Stride,
)

I64, BOOL = DType.from_short("i64"), DType.from_short("bool")


def paddable(graph: Graph, symbol: str, low: int = 1, high: int | None = None) -> Padding | Refused:
    """Whether ``symbol`` may be padded (lengths ``>= low`` run: a constant index below ``low``
    along the dim is a valid position in every run; ``high``, when given, the longest length
    padded to: ``min(length, c)`` with ``c >= high`` is the length), and with which masks; or why not.
    Only the nodes the outputs read count (CLIP's pooled features, an ArgMax along the length,
    when only the hidden states are returned)."""
    return Analysis(dce(graph), symbol, max(int(low), 1), high).run()


class NotPerSample(ValueError):
    """A mask whose operand has no one dim that is the batch: lengths per sample cannot reach it."""


class _Writer:
    """Writes ``pad``'s nodes: one valid-position mask per (dim, rank), the guarded operands."""

    def __init__(self, graph: Graph, padding: Padding, per_sample: str | None = None) -> None:
        self.graph = graph
        self.taken = {v.name for v in graph.values()}
        self.constants = dict(graph.constants)
        self.nodes: list[Node] = []
        self.per_sample = per_sample  # the batch dim, where each sample has its own valid length
        self.valid = self.fresh(padding.valid_input, TensorType(I64, (per_sample,) if per_sample else ()))
        self.flags: dict[tuple, Value] = {}  # (dim name, axis from the end, batch axis from the end) -> bool mask
        self.placed: dict[int, Value] = {}  # per sample: the lengths shaped [batch, 1, ...] (trailing dims)

    def batch_axis(self, value: Value) -> int | None:
        """Per sample: ``value``'s one dim that is the batch (else ``NotPerSample``); None otherwise."""
        if self.per_sample is None:
            return None
        shape = value.type.shape  # type: ignore[union-attr]
        found = [i for i, d in enumerate(shape) if str(d) == self.per_sample]
        if len(found) != 1:
            raise NotPerSample(f"{value.name} {list(shape)} has no one dim {self.per_sample}")
        return found[0]

    def lengths_for(self, rank: int, axis: int | None) -> Value:
        """The valid length as it broadcasts against a value of ``rank`` whose batch is ``axis``."""
        if axis is None:
            return self.valid
        trailing = rank - axis - 1
        if trailing not in self.placed:
            placed = self.fresh("kiln_pad_lengths", TensorType(I64, (self.per_sample, *(1,) * trailing)))
            target = self.const("kiln_pad_target", np.array([-1, *(1,) * trailing], np.int64))
            self.nodes.append(Node("Reshape", (self.valid, target), (placed,)))
            self.placed[trailing] = placed
        return self.placed[trailing]

    def fresh(self, base: str, value_type: TensorType) -> Value:
        name = unique_name(base, self.taken)
        self.taken.add(name)
        return Value(name, value_type)

    def const(self, base: str, array: np.ndarray) -> Value:
        value = self.fresh(base, TensorType(DType.from_numpy(array.dtype), tuple(array.shape)))
        self.constants[value] = array
        return value

    def positions_of(self, value: Value, axis: int) -> Value:
        """A bool tensor, true at the valid positions of ``value``'s padded ``axis``, shaped to
        broadcast against it: Shape -> Gather -> Range -> Less(L) -> Reshape to [n, 1, ...]."""
        shape = value.type.shape  # type: ignore[union-attr]
        rank = len(shape)
        batch = self.batch_axis(value)
        key = (str(shape[axis]), rank - axis, None if batch is None else rank - batch)
        if key in self.flags:
            return self.flags[key]
        sizes = self.fresh("kiln_pad_shape", TensorType(I64, (rank,)))
        count = self.fresh("kiln_pad_count", TensorType(I64, ()))
        span = self.fresh("kiln_pad_positions", TensorType(I64, (shape[axis],)))
        trailing = (1,) * (rank - axis - 1)
        zero, one = (
            self.const("kiln_pad_zero", np.array(0, np.int64)),
            self.const("kiln_pad_one", np.array(1, np.int64)),
        )
        self.nodes += [
            Node("Shape", (value,), (sizes,)),
            Node("Gather", (sizes, self.const("kiln_pad_axis", np.array(axis, np.int64))), (count,), {"axis": 0}),
            Node("Range", (zero, count, one), (span,)),
        ]
        target = self.const("kiln_pad_target", np.array([-1, *trailing], np.int64))
        if batch is None:  # one length: compare, then place the flags along the axis
            flags = self.fresh("kiln_pad_valid", TensorType(BOOL, (shape[axis],)))
            placed = self.fresh("kiln_pad_mask", TensorType(BOOL, (shape[axis], *trailing)))
            self.nodes += [Node("Less", (span, self.valid), (flags,)), Node("Reshape", (flags, target), (placed,))]
        else:  # a length per sample: positions placed along the axis against the lengths along the batch
            positions = self.fresh("kiln_pad_positions", TensorType(I64, (shape[axis], *trailing)))
            mask_shape = tuple(shape[i] if i in (axis, batch) else 1 for i in range(min(axis, batch), rank))
            placed = self.fresh("kiln_pad_mask", TensorType(BOOL, mask_shape))
            lengths = self.lengths_for(rank, batch)
            self.nodes += [Node("Reshape", (span, target), (positions,)), Node("Less", (positions, lengths), (placed,))]
        self.flags[key] = placed
        return placed

    def guard(self, node: Node, masks: list[Mask]) -> None:
        """``node`` reading its masked operands (a ReduceMean: a sum divided by the valid count)."""
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
            fill = self.const("kiln_pad_fill", np.array(value, dtype=kind))
            guarded = self.fresh(f"{operand.name}_padded", operand.type)
            self.nodes.append(Node("Where", (self.positions_of(operand, m.axis), operand, fill), (guarded,)))
            inputs[m.index] = guarded
            divide = divide or m.divide
        if not divide:
            self.nodes.append(Node(node.op, tuple(inputs), node.outputs, dict(node.attrs), node.name, node.domain))
            return
        out = node.outputs[0]
        total = self.fresh(f"{out.name}_sum", out.type)  # type: ignore[arg-type]
        attrs = dict(node.attrs)
        if "axes" in attrs and self.graph.opset >= 13:  # ReduceSum takes its axes as an input since 13
            inputs[1:] = [self.const("kiln_pad_axes", np.array(attrs.pop("axes"), np.int64))]
        self.nodes.append(Node("ReduceSum", tuple(inputs), (total,), attrs, node.name, node.domain))
        batch = self.batch_axis(out)
        lengths = self.lengths_for(len(out.type.shape), batch)  # type: ignore[union-attr]
        count = self.fresh("kiln_pad_count", lengths.type)  # type: ignore[arg-type]
        scaled = self.fresh("kiln_pad_count_f", TensorType(out.type.dtype, lengths.type.shape))  # type: ignore[union-attr]
        self.nodes.append(Node("Mul", (lengths, self.const("kiln_pad_per", np.array(divide, np.int64))), (count,)))
        self.nodes.append(Node("Cast", (count,), (scaled,), {"to": out.type.dtype.onnx_code}))  # type: ignore[union-attr]
        self.nodes.append(Node("Div", (total, scaled), (out,)))


def pad(graph: Graph, padding: Padding, per_sample: str | None = None) -> Graph:
    """``graph`` with the valid length as a new last input and each mask of ``padding`` written
    as ``Where(position < L, x, fill)`` before the operand it guards. ``per_sample``: the batch
    dim, each sample with its own valid length (the input is then ``[batch]``: requests of
    different lengths run as one batch); ``NotPerSample`` where a masked operand has no one dim
    that is the batch (a batch folded with heads, ``[batch*heads, seq, seq]``)."""
    writer = _Writer(graph, padding, per_sample)
    by_output: dict[str, list[Mask]] = {}
    for m in padding.masks:
        by_output.setdefault(m.output, []).append(m)
    for node in graph.nodes:
        masks = by_output.get(node.outputs[0].name, [])
        if masks:
            writer.guard(node, masks)
        else:
            writer.nodes.append(node)
    return graph.with_(inputs=(*graph.inputs, writer.valid), nodes=tuple(writer.nodes), constants=writer.constants)
