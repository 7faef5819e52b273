"""Which symbolic dims are *sample-parallel*: every output index along the dim is computed from
the same index of the inputs alone, so a run at any size is the runs over its chunks, stacked.

A compile for a few sizes of such a dim (its size classes) then serves every size with no compile
at run time: the driver splits the inputs, runs each chunk on a compiled class and joins the
outputs. The analysis is a forward dataflow over the imported graph. Each value is, for a symbol:

* ``Batched(axis, per)``: it holds samples along ``axis``, ``per`` consecutive indices each (the
  symbol itself, or a dim a Reshape merged it into: [batch, 12, 197, 64] -> [batch*12, 197, 64]);
* ``Sizes(mask)``: a small int vector from shapes, ``mask[i]``: whether element ``i`` is the
  symbol's size (``Shape(x)[0]`` of a batched ``x``); only a Reshape/Expand/ConstantOfShape target;
* anything else (None): independent of the samples (weights, other inputs, their shapes' arithmetic).

An op may read samples only when a rule says how (the op categories ``aligned``, ``per_sample``,
``axis`` and ``reshape``, and the few ops with a rule of their own below); any other reader, and
any sample mixing (a reduction, softmax or concat over the dim, a product contracting it), makes
the symbol not sample-parallel, naming the node and the reason. Unknown ops are refused, never
guessed (a refusal costs only a compile per size).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kiln.ir.graph import Graph, Node, Value, free_values
from kiln.ir.types import TensorType
from kiln.ops.registry import has_trait
from kiln.ops.symbolic_dims import ONE, Monomial, dim_product
from kiln.passes.dce import dce
from kiln.passes.op_axes import ancestors, gathered_nd_axis, symbols, works_along
from kiln.passes.sample_index import (
    Index,
    SampleTuple,
    blocked,
    constant_ints,
    reads_own_block,
    rows_per_sample,
    scatters_own_tuples,
    scatters_within_samples,
)


@dataclass(frozen=True)
class Batched:
    axis: int
    # indices of ``axis`` per sample: a Reshape of [batch, 12, ...] to [batch*12, ...] makes 12,
    # of [batch, seq, 64] to [batch*seq, 64] makes seq
    per: Monomial = ONE


@dataclass(frozen=True)
class Sizes:
    mask: tuple[bool, ...] | None  # None: unknown which elements (or a scalar): all of it counts


State = Batched | Sizes | Index | SampleTuple | None


class Refused(Exception):
    """The symbol is not sample-parallel: ``node`` mixes (or may mix) samples."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"{node}: {reason}")
        self.node = node
        self.reason = reason


@dataclass(frozen=True)
class Parallel:
    """How a sample-parallel symbol appears at the graph's boundary: its axis in each input and
    output (None: the value does not carry it: an input every chunk shares, an output the first
    chunk gives)."""

    symbol: str
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    # expressions of the other input dims that must be 0 at a binding for its chunks to be its
    # samples' (``(h*w)%16``: a view whose rows per sample are whole only there); checked per run
    guards: tuple[str, ...] = ()


# ops computing on shape vectors: a result holding the count is only ever a target shape
SHAPE_ARITHMETIC = frozenset(
    "Add Sub Mul Div Mod Max Min Neg Abs Gather Slice Squeeze Unsqueeze Cast Reshape Flatten Concat Identity "
    "Equal Less Greater LessOrEqual GreaterOrEqual Not And Or Where ReduceProd ReduceSum ReduceMax ReduceMin".split()
)


def sample_parallel(graph: Graph) -> dict[str, Parallel | Refused]:
    """For each symbolic input dim: how it is sample-parallel, or why not (of the nodes the
    outputs read: a pooled output nobody returns does not count)."""
    live = dce(graph)
    return {symbol: _Analysis(live, symbol).run() for symbol in symbols(graph)}


def rank_of(value: Value | None) -> int:
    """A tensor value's rank (-1: unknown, or not a tensor)."""
    if value is None or not isinstance(value.type, TensorType) or value.type.shape is None:
        return -1
    return len(value.type.shape)


class _Analysis:
    def __init__(self, graph: Graph, symbol: str) -> None:
        self.graph = graph
        self.symbol = symbol
        self.constants = graph.constants
        self.state: dict[Value, State] = {}
        self._folded: dict[str, np.ndarray | None] = {}
        self._producers: dict[Value, Node] | None = None
        self.guards: list[str] = []

    def run(self) -> Parallel | Refused:
        try:
            inputs = []
            for value in self.graph.inputs:
                axis = self.axis_of(value)
                if axis is not None:
                    self.state[value] = Batched(axis)
                inputs.append(axis)
            for node in self.graph.nodes:
                self.visit(node)
            outputs = []
            for value in self.graph.outputs:
                result = self.state.get(value)
                if isinstance(result, (Sizes, Index, SampleTuple)):
                    raise Refused(value.name, "an output computed from the count of samples")
                outputs.append(result.axis if isinstance(result, Batched) else None)
            return Parallel(self.symbol, tuple(inputs), tuple(outputs), tuple(dict.fromkeys(self.guards)))
        except Refused as refusal:  # (kept by its callers: without the frames, which hold the graph's weights)
            return refusal.with_traceback(None)

    def axis_of(self, value: Value) -> int | None:
        """The axis of ``value``'s type that is the symbol (None if none); Refused if several are
        or the type has no known rank."""
        if not isinstance(value.type, TensorType):
            raise Refused(value.name, "a value that is not a tensor")
        if value.type.shape is None:
            raise Refused(value.name, "a tensor of unknown rank")
        axes = [i for i, d in enumerate(value.type.shape) if d == self.symbol]
        if len(axes) > 1:
            raise Refused(value.name, f"{self.symbol} is more than one of its dims {value.type.shape}")
        return axes[0] if axes else None

    def producers(self) -> dict[Value, Node]:
        if self._producers is None:
            self._producers = self.graph.producers()
        return self._producers

    def ancestors(self, value: Value) -> list[Node]:
        return ancestors(self.graph, self.producers(), value)

    def per_of(self, value: Value, axis: int) -> Monomial:
        """Indices per sample along ``axis`` as ``value``'s type names the dim: ``batch.x4`` (the
        count of a value whose samples span 4 indices each, [batch*4, ...]) is 4; 1 otherwise."""
        shape = value.type.shape if isinstance(value.type, TensorType) else None
        if not shape or not isinstance(shape[axis], str):
            return ONE
        per = Monomial.of([shape[axis]]).divided(Monomial(1, (self.symbol,)))
        return per if per is not None and per.coefficient else ONE

    def mask_of(self, value: Value | None, state: State) -> tuple[bool, ...] | None:
        """Which elements of a 1-D shape vector may be the count (None: unknown)."""
        if isinstance(state, Sizes):
            return state.mask
        if value is None or state is not None or rank_of(value) != 1:
            return None
        length = value.type.shape[0]  # type: ignore[union-attr,index]
        return (False,) * length if isinstance(length, int) else None

    def value_of(self, value: Value) -> np.ndarray | None:
        """A sample-independent value's contents: a constant, or what folding makes of it once
        the symbol is bound (any size: it does not depend on the count)."""
        if value in self.constants:
            return np.asarray(self.constants[value])
        if self.state.get(value) is not None:
            return None
        if value.name not in self._folded:
            from kiln.passes.specialize import specialize

            try:  # the nodes computing this value alone, bound and folded
                folded = specialize(self.graph.with_(outputs=(value,), nodes=self.ancestors(value)), {self.symbol: 1})
                found = next((a for v, a in folded.constants.items() if v.name == folded.outputs[0].name), None)
            except Exception:  # a value that does not fold (it reads an input's data): unknown
                found = None
            self._folded[value.name] = None if found is None else np.asarray(found)
        return self._folded[value.name]

    def ints(self, node: Node, index: int) -> list[int] | None:
        """Input ``index`` of ``node`` when it is a constant (axes, indices, pads...)."""
        return constant_ints(node.inputs[index], self.constants) if index < len(node.inputs) else None

    def visit(self, node: Node) -> None:
        read = [self.state.get(v) if v is not None else None for v in node.inputs]
        inner = [self.state.get(v) for g in node.subgraphs() for v in free_values(g)]
        if all(s is None for s in read + inner):
            return  # independent of the samples
        if list(node.subgraphs()):
            raise Refused(node.label, "control flow over samples")
        if node.domain:
            raise Refused(node.label, "an op kiln cannot tell the per-sample behaviour of")
        if any(isinstance(s, SampleTuple) for s in read):
            results = self.tuple_rule(node, read)
        elif any(isinstance(s, Index) for s in read):
            results = self.index_rule(node, read)
        elif not any(isinstance(s, Batched) for s in read):
            results = self.sizes_rule(node, read)
        else:
            results = self.batched_rule(node, read)
        for value, result in zip(node.outputs, results):
            if result is not None:
                self.state[value] = result

    # -- per-sample indices -----------------------------------------------------------------------
    def index_rule(self, node: Node, read: list[State]) -> list[State]:
        op = node.op
        state = next(s for s in read if isinstance(s, Index))
        others = [(v, s) for v, s in zip(node.inputs, read) if not isinstance(s, Index)]
        out = node.outputs[0]
        if op == "Shape" and isinstance(read[0], Index):  # the count among the indices' dims
            dims = node.inputs[0].type.shape or ()  # type: ignore[union-attr]
            start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
            return [Sizes(tuple(d == state.dim for d in list(dims)[slice(start, None if end is None else int(end))]))]
        shape = out.type.shape if isinstance(out.type, TensorType) and out.type.shape else ()
        if op == "Expand" and isinstance(read[0], Index):  # copies along other dims only
            position = len(shape) - rank_of(node.inputs[0]) + list(node.inputs[0].type.shape).index(state.dim)  # type: ignore[union-attr]
            target = self.mask_of(node.inputs[1], read[1])
            if (
                target is not None
                and len(target) == len(shape)
                and target[position]
                and isinstance(shape[position], str)
            ):
                return [replace(state, dim=shape[position])]
        if state.dim not in shape or list(shape).count(state.dim) != 1:
            raise Refused(node.label, "per-sample indices whose dim its output type loses")
        if op in ("Unsqueeze", "Squeeze", "Identity", "Expand") and isinstance(read[0], Index):
            return [state]  # (Expand: copies along other dims; the count's dim keeps its values)
        if op in ("Reshape", "Flatten") and isinstance(read[0], Index) and all(d == 1 for d in shape if d != state.dim):
            return [state]  # [batch] <-> [batch, 1]: the same values in the same order
        if op == "Slice" and isinstance(read[0], Index) and self.keeps_every_sample(node, read, state):
            return [state]  # arange(count)[:count] (dynamo's batch indices of a mask lookup)
        if op == "Max" and len(others) == 1 and others[0][1] is None:
            bound = self.value_of(others[0][0])  # type: ignore[arg-type]
            # identity when no value is below the bound; else the values differ by chunk: shape only
            exact = bound is not None and bound.size > 0 and int(bound.max()) <= state.low and state.exact
            return [replace(state, exact=exact and state.block is None)]
        if op == "Concat" and isinstance(read[0], Index) and self.sample_tuple(node, read, state):
            return [SampleTuple(state.dim)]
        if not state.exact:
            raise Refused(node.label, "uses per-sample indices whose values depend on the chunk")
        if op == "Cast" and out.type.dtype.numpy.kind in "iu":  # type: ignore[union-attr]
            return [state]
        if len(others) == 1 and isinstance(others[0][1], (type(None), Sizes)):
            found = blocked(node, state, others[0][0], self.producers(), self.constants)
            if found is not None:
                return [found]
        constant = [self.value_of(v) if v is not None and state.block is None else None for v, _ in others]
        if op in ("Mul", "Add") and len(others) == 1 and constant[0] is not None and others[0][1] is None:
            values = np.asarray(constant[0])
            if values.size and values.dtype.kind in "iu":
                low, high = int(values.min()), int(values.max())
                if op == "Add":
                    return [Index(state.dim, state.scale, state.low + low, state.high + high)]
                if values.size == 1 and low > 0:
                    return [Index(state.dim, state.scale * low, state.low * low, (state.high - 1) * low + 1)]
        if op == "Gather" and isinstance(read[1], Index) and isinstance(read[0], Batched):
            data = read[0]
            axis = int(node.attrs.get("axis", 0)) % max(rank_of(node.inputs[0]), 1)
            if axis == data.axis == 0 and (guards := reads_own_block(state, data.per)) is not None:
                self.guards += guards
                return [Batched(list(shape).index(state.dim))]  # each sample reads its own block
        if op in ("Add", "Sub", "Mul") and len(others) == 1 and others[0][1] is None:
            if self.value_of(others[0][0]) is None:  # type: ignore[arg-type]
                # values kiln cannot follow, a shape it can (TorchScript's index_put broadcasts its
                # index tensors by adding them, for the sum's shape alone): only that may be used
                return [replace(state, exact=False)]
        raise Refused(node.label, "computes with per-sample indices in a way kiln cannot follow")

    def keeps_every_sample(self, node: Node, read: list[State], state: Index) -> bool:
        """A Slice that keeps the indices' samples' dim whole: from 0, step 1, to past the count
        (a constant at least the indices' own upper bound) or to the count itself."""
        dims = list(node.inputs[0].type.shape or ())  # type: ignore[union-attr]
        starts, axes = self.ints(node, 1), self.ints(node, 3) if len(node.inputs) > 3 else None
        steps = self.ints(node, 4) if len(node.inputs) > 4 and node.inputs[4] is not None else None
        if (
            starts is None
            or state.dim not in dims
            or (len(node.inputs) > 3 and node.inputs[3] is not None and axes is None)
        ):
            return False
        axes = [a % len(dims) for a in (axes if axes is not None else range(len(starts)))]
        if dims.index(state.dim) not in axes:
            return True  # sliced along other dims only
        k = axes.index(dims.index(state.dim))
        ends, end_state = self.ints(node, 2), read[2]
        whole = (ends is not None and ends[k] >= 2**31 - 1) or (
            isinstance(end_state, Sizes)
            and end_state.mask is not None
            and len(end_state.mask) == len(axes)
            and end_state.mask[k]
        )
        return starts[k] == 0 and (steps is None or steps[k] == 1) and whole and state.block is None

    def sample_tuple(self, node: Node, read: list[State], state: Index) -> bool:
        """A Concat along the last dim of the sample numbers (Range(0, count), exactly) and other
        components: those hold samples in the same dim, or none."""
        rank, numbers = rank_of(node.outputs[0]), (state.scale, state.low, state.high)
        if int(node.attrs.get("axis", 0)) % max(rank, 1) != rank - 1 or numbers != (1, 0, 1):
            return False
        position = list(node.inputs[0].type.shape).index(state.dim)  # type: ignore[union-attr]
        return state.exact and all(
            s is None or (isinstance(s, Batched) and s.axis == position and s.per == ONE) for s in read[1:]
        )

    def tuple_rule(self, node: Node, read: list[State]) -> list[State]:
        """GatherND whose index tuples start with the sample's number: each sample reads its own
        slice of data that holds samples in its leading dim."""
        state = next(s for s in read if isinstance(s, SampleTuple))
        data = read[0]
        shape = node.outputs[0].type.shape if isinstance(node.outputs[0].type, TensorType) else None
        if (
            node.op == "GatherND"
            and isinstance(read[1], SampleTuple)
            and isinstance(data, Batched)
            and (data.axis, data.per) == (0, ONE)
            and int(node.attrs.get("batch_dims", 0)) == 0
            and shape
            and list(shape).count(state.dim) == 1
        ):
            return [Batched(list(shape).index(state.dim))]
        spans = [(s.axis, s.per) if isinstance(s, Batched) else None for s in read]
        if node.op == "ScatterND" and scatters_own_tuples(node, read[1], spans[0], (spans + [None] * 3)[2], state.dim):
            return [Batched(0)]
        raise Refused(node.label, "computes with per-sample index tuples in a way kiln cannot follow")

    # -- values computed from the count of samples ------------------------------------------------
    def sizes_rule(self, node: Node, read: list[State]) -> list[State]:
        op = node.op
        first = read[0]
        if op == "Range" and isinstance(read[1], Sizes) and read[0] is None and read[2] is None:
            start, delta = self.ints(node, 0), self.ints(node, 2)
            out_shape = node.outputs[0].type.shape if isinstance(node.outputs[0].type, TensorType) else None
            if start == [0] and delta == [1] and out_shape and isinstance(out_shape[0], str):
                return [Index(out_shape[0], 1, 0, 1)]  # 0..count-1: sample b holds b
        if (op in ("Reshape", "Expand") and first is None) or op == "ConstantOfShape":
            # a target shape holding the count: each chunk's is its own count
            axis = self.axis_of(node.outputs[0])
            target = read[0] if op == "ConstantOfShape" else read[1]
            shown = target.mask if isinstance(target, Sizes) else None
            if axis is None and shown is not None and sum(shown) == 1 and len(shown) == rank_of(node.outputs[0]):
                axis = shown.index(True)  # the target shape says which dim is the count
            if axis is None:
                raise Refused(node.label, "a shape from the count of samples that its output type does not show")
            if op == "Reshape" and first is not None:
                raise Refused(node.label, "reshapes a value computed from the count of samples")
            return [Batched(axis, self.per_of(node.outputs[0], axis))]
        if op == "Tile" and first is None and isinstance(read[1], Sizes) and read[1].mask is not None:
            # a value the same for every sample, tiled once per sample along one dim: each
            # sample's block is one copy ([4, 16, 16] tiled [batch, 1, 1]: 4 rows per sample)
            shape_in = node.inputs[0].type.shape  # type: ignore[union-attr]
            mask = read[1].mask
            if shape_in is not None and sum(mask) == 1 and len(mask) == len(shape_in):
                per = Monomial.of([shape_in[mask.index(True)]])
                if per.coefficient:
                    return [Batched(mask.index(True), per)]
        if not all(s is None or isinstance(s, Sizes) for s in read):
            raise Refused(node.label, "computes with the count of samples")
        mask = first.mask if isinstance(first, Sizes) else None
        if op in ("Shape", "Size") and dim_product(node.inputs[0].type.shape or ("?",)) is not None:  # type: ignore[union-attr]
            return [None]  # the shape of a shape vector: its length is static
        if op in ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten") and isinstance(first, Sizes):
            return [first if rank_of(node.outputs[0]) <= 1 else Sizes(None)]  # a vector stays itself
        if op == "Concat":
            parts: list[bool] = []
            for value, state in zip(node.inputs, read):
                length = value.type.shape[0] if isinstance(value.type, TensorType) and value.type.shape else None
                if isinstance(state, Sizes) and state.mask is not None:
                    parts.extend(state.mask)
                elif isinstance(length, int):
                    parts.extend([state is not None] * length)
                else:
                    return [Sizes(None)]
            return [Sizes(tuple(parts)) if any(parts) else None]
        if op == "Gather" and mask is not None and isinstance(first, Sizes):
            indices = self.ints(node, 1)
            if indices is not None and all(-len(mask) <= i < len(mask) for i in indices):
                chosen = tuple(mask[i] for i in indices)
                return [Sizes(chosen) if any(chosen) else None]
        if op == "Slice" and mask is not None and isinstance(first, Sizes):
            starts, ends, steps = self.ints(node, 1), self.ints(node, 2), self.ints(node, 4)
            if starts is not None and ends is not None and len(starts) == 1:
                chosen = tuple(mask[slice(starts[0], ends[0], (steps or [1])[0])])
                return [Sizes(chosen) if any(chosen) else None]
        if op == "Where" and isinstance(read[1], (Sizes, type(None))) and isinstance(read[2], (Sizes, type(None))):
            # element i is either branch's element i: it may be the count where either may
            masks = [self.mask_of(node.inputs[i], read[i]) for i in (1, 2)]
            if None not in masks and len(masks[0]) == len(masks[1]):  # type: ignore[arg-type]
                union = tuple(a or b for a, b in zip(masks[0], masks[1]))  # type: ignore[arg-type]
                return [Sizes(union) if any(union) else None]
        if op in SHAPE_ARITHMETIC:
            return [Sizes(None)]  # arithmetic on the count: still only fit for target shapes
        raise Refused(node.label, "computes with the count of samples")

    # -- values holding samples -------------------------------------------------------------------
    def batched_rule(self, node: Node, read: list[State]) -> list[State]:
        op = node.op
        batched = [(i, s.axis) for i, s in enumerate(read) if isinstance(s, Batched)]
        pers = {s.per for s in read if isinstance(s, Batched)}
        if len(pers) > 1:
            raise Refused(node.label, "operands whose samples span different numbers of indices")
        per = pers.pop()
        if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
            return [self.reshape(node, read[0])]
        # the samples' dim under the name(s) the inputs' types give it ("batch", or a name
        # inference made for a dim it computed: a merged batch*heads, a count from a Range)
        names = {node.inputs[i].type.shape[axis] for i, axis in batched}  # type: ignore[union-attr,index]
        outputs = [self.named_axis(node, v, names) for v in node.outputs]
        sizes = [i for i, s in enumerate(read) if isinstance(s, Sizes)]
        if sizes and not (op in ("Reshape", "Expand") and sizes == [1]) and not self.resized_to_the_count(node, read):
            raise Refused(node.label, "reads samples and a value computed from their count")
        if has_trait(op, "", "aligned"):
            outputs = [self.aligned(node, read)] * len(node.outputs)
        elif has_trait(op, "", "per_sample"):
            if batched != [(0, 0)] or outputs[0] != 0:
                raise Refused(node.label, "its samples are not its data's leading dim")
        elif op == "Expand":
            aligned = rank_of(node.outputs[0]) - rank_of(node.inputs[0]) + batched[0][1]
            target = self.mask_of(node.inputs[1], read[1])
            value = self.value_of(node.inputs[1]) if read[1] is None else None  # type: ignore[arg-type]
            keeps = (target is not None and len(target) > aligned and target[aligned]) or (
                value is not None and value.size > aligned and int(value.reshape(-1)[aligned]) == 1
            )
            if batched != [(0, batched[0][1])] or not keeps:
                raise Refused(node.label, "expands across the samples' dim")
            outputs = [aligned]  # the count (or 1) there: the samples stay in that dim
        elif op == "Transpose":
            rank = rank_of(node.inputs[0])
            perm = list(node.attrs.get("perm") or reversed(range(rank)))
            moved = perm.index(batched[0][1])
            if per == 1 and outputs[0] != moved:
                raise Refused(node.label, "a permutation its output type does not follow")
            outputs = [moved]
        elif op in ("MatMul", "Gemm"):
            outputs = [self.product(node, read)]
        elif op in ("Shape", "Size"):
            return [self.shape_sizes(node, read[0])]
        elif op in ("Resize", "Upsample"):
            if batched != [(0, 0)] or outputs[0] != 0:
                raise Refused(node.label, "resizes the samples' dim")
        elif op == "Gather" and batched == [(1, batched[0][1])]:
            pass  # indices hold samples (an embedding lookup): each sample gathers its own rows
        elif op == "GatherND" and batched == [(0, batched[0][1])] and gathered_nd_axis(node, batched[0][1]) is not None:
            outputs = [gathered_nd_axis(node, batched[0][1])]  # tuples index the dims before the samples
        elif op == "ScatterND" and scatters_within_samples(node, batched):
            outputs = [batched[0][1]]
        else:
            self.along_axes(node, read, batched)
            if outputs[0] is None and op in ("Pad", "Slice", "Tile"):  # (a name inference lost)
                outputs = [batched[0][1]]  # the data's dims in place, cut or grown along others only
        kept = 1 if op in ("LayerNormalization", "Dropout", "BatchNormalization") else len(node.outputs)
        if any(axis is None for axis in outputs[:kept]):
            raise Refused(node.label, "an output that loses the samples' dim (it mixes them)")
        return [Batched(axis, per) if axis is not None else None for axis in outputs]

    def resized_to_the_count(self, node: Node, read: list[State]) -> bool:
        """A Resize to sizes whose first element alone may be the count (``[batch, c, 2*h,
        2*w]`` read from the input's shape): each sample resized alone."""
        if node.op != "Resize" or [i for i, s in enumerate(read) if isinstance(s, Sizes)] != [3]:
            return False
        mask = self.mask_of(node.inputs[3], read[3])
        return mask is not None and len(mask) > 1 and mask[0] and not any(mask[1:])

    def named_axis(self, node: Node, value: Value, names: set) -> int | None:
        """The dim of ``value``'s type named as the inputs' samples' dims (None: none is)."""
        if not isinstance(value.type, TensorType) or value.type.shape is None:
            return None
        found = [i for i, d in enumerate(value.type.shape) if isinstance(d, str) and d in names]
        if len(found) > 1:
            raise Refused(node.label, f"the samples' dim is more than one of its output's dims {value.type.shape}")
        return found[0] if found else None

    def aligned(self, node: Node, read: list[State]) -> int:
        """Broadcasting ops: every operand holding samples holds them in the same dim counted
        from the right, which is the output's (the count broadcast with the count)."""
        out_rank = rank_of(node.outputs[0])
        positions = {out_rank - rank_of(v) + s.axis for v, s in zip(node.inputs, read) if isinstance(s, Batched)}
        if len(positions) != 1:
            raise Refused(node.label, "broadcasts the samples' dim against another dim")
        return positions.pop()

    def reshape(self, node: Node, state: State) -> Batched:
        """A reshape keeps samples apart when the dims before the samples' dim hold the same
        static number of elements in and out (each sample's block of memory is its own); the
        output's samples' dim is the first after that prefix, and it may merge each sample with
        the following dims (``per`` > 1) or be the symbol again."""
        if not isinstance(state, Batched):
            raise Refused(node.label, "a reshape whose samples are not its data")
        if node.op in ("Unsqueeze", "Squeeze"):  # dims of 1 come or go: elements stay in place
            moved = self.unsqueezed(node, state.axis)
            if moved is not None:
                return Batched(moved, state.per)
        shape_in = node.inputs[0].type.shape  # type: ignore[union-attr]
        shape_out = node.outputs[0].type.shape  # type: ignore[union-attr]
        prefix = dim_product(shape_in[: state.axis])
        if prefix is None:
            raise Refused(node.label, "a reshape around dims kiln cannot count")
        count, axis = 1, 0
        while axis < len(shape_out) and count < prefix and isinstance(shape_out[axis], int):
            count *= shape_out[axis]
            axis += 1
        if count != prefix or axis >= len(shape_out) or isinstance(shape_out[axis], int):
            raise Refused(node.label, "a reshape that moves elements across the samples' dim")
        # the count there (by name: the symbol, or the input's own name for the dim holding it)
        if shape_out[axis] == self.symbol or (state.per == ONE and shape_out[axis] == shape_in[state.axis]):
            return Batched(axis)  # (as many elements in as out: they multiply to the sample's block)
        # each sample's block (its indices times the elements of each, symbols and all) over the
        # elements per index after: [batch, 4, seq, 16] -> [batch*4, seq, 16] is 4 once seq cancels
        block = Monomial.of(shape_in[state.axis + 1 :]) * state.per
        per = block.divided(Monomial.of(shape_out[axis + 1 :]))
        if per is None or not per.coefficient:
            found = rows_per_sample(self.symbol, shape_in, shape_out, state.axis, axis)
            if found is None:
                raise Refused(node.label, "a reshape that moves elements across the samples' dim")
            per, guard = found
            if guard is not None:
                self.guards.append(guard)
        return Batched(axis, per)

    def unsqueezed(self, node: Node, axis: int) -> int | None:
        """Where dim ``axis`` lands through an Unsqueeze/Squeeze with constant axes (None:
        axes kiln cannot read, or the dim itself squeezed)."""
        rank_in, rank_out = rank_of(node.inputs[0]), rank_of(node.outputs[0])
        given = list(node.attrs["axes"]) if "axes" in node.attrs else self.ints(node, 1)
        if given is None or rank_in < 0 or rank_out < 0:
            return None
        if node.op == "Unsqueeze":
            inserted = {g % rank_out for g in given}
            return [i for i in range(rank_out) if i not in inserted][axis]
        removed = {g % rank_in for g in given}
        if not given or axis in removed:
            return None
        return axis - sum(1 for r in removed if r < axis)

    def product(self, node: Node, read: list[State]) -> int:
        """Samples may be rows of A, columns of B or a batch dim of either, never the contracted
        dim; when both operands hold samples they hold them in the same batch dim. Returns the
        output's samples' dim."""
        a, b = read[0], read[1]
        out_rank = rank_of(node.outputs[0])
        if node.op == "Gemm":
            if node.attrs.get("transA") or not isinstance(a, Batched) or b is not None or any(read[2:]):
                raise Refused(node.label, "a Gemm whose samples are not A's rows alone")
            return 0
        a_rank, b_rank = rank_of(node.inputs[0]), rank_of(node.inputs[1])
        if isinstance(a, Batched) and (a_rank == 1 or a.axis == a_rank - 1):
            raise Refused(node.label, "contracts over the samples' dim")
        if isinstance(b, Batched) and (b_rank == 1 or b.axis == b_rank - 2):
            raise Refused(node.label, "contracts over the samples' dim")
        if isinstance(a, Batched) and isinstance(b, Batched):
            if a.axis >= a_rank - 2 or b.axis >= b_rank - 2 or a.axis - a_rank != b.axis - b_rank:
                raise Refused(node.label, "a product whose operands hold samples in different dims")
        if isinstance(a, Batched):  # a batch dim (aligned from the right) or A's rows
            return out_rank - a_rank + a.axis if a.axis < a_rank - 2 else out_rank - 2
        assert isinstance(b, Batched)
        return out_rank - b_rank + b.axis if b.axis < b_rank - 2 else out_rank - 1

    def along_axes(self, node: Node, read: list[State], batched: list[tuple[int, int]]) -> None:
        """Ops along some dims (softmax, reductions, concat, gather, split, slice, pad, tile...):
        allowed when the samples' dim is not one of them."""
        known = has_trait(node.op, "", "axis") or node.op.startswith("Reduce")
        if not known and node.op not in ("CumSum", "TopK", "Slice", "Pad", "Tile"):
            raise Refused(node.label, "an op kiln cannot tell the per-sample behaviour of")
        data_axis = read[0].axis if isinstance(read[0], Batched) else None
        if data_axis is None:
            raise Refused(node.label, "samples in an operand other than the data")
        others = [axis for i, axis in batched if i > 0]
        # Concat joins, and GatherElements/ScatterElements index, each sample's own slices when every
        # operand holds the samples along the same dim, alike (RoBERTa's position ids: a per-sample
        # gather from its buffer expanded over the batch)
        alike = {s.per for s in read if isinstance(s, Batched)} == {read[0].per}  # type: ignore[union-attr]
        joins = node.op == "Concat" or (node.op in ("GatherElements", "ScatterElements") and alike)
        if others and (not joins or any(axis != data_axis for axis in others)):
            raise Refused(node.label, "samples in an operand other than the data")
        axes = works_along(node, rank_of(node.inputs[0]), self.ints, self.graph)
        if axes is None:
            raise Refused(node.label, "dims kiln cannot read at compile time")
        if data_axis in axes:
            raise Refused(node.label, "works along the samples' dim")

    def shape_sizes(self, node: Node, state: State) -> State:
        if node.op == "Size" or not isinstance(state, Batched):
            return Sizes(None)
        rank = rank_of(node.inputs[0])
        start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
        positions = list(range(rank))[slice(start, None if end is None else int(end))]
        mask = tuple(i == state.axis for i in positions)
        return Sizes(mask) if any(mask) else None  # other dims' sizes: the same in every chunk
