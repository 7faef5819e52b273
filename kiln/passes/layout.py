"""Layout assignment: which activations run channels last (NHWC), decided for the whole graph.

Convolutions whose channels-last kernels are faster, or whose neighbours already are channels
last, are rewritten into their channels-last form between two conversions:

    Conv(x, W, B), 1x1, stride 1, group 1  ->  T_nchw(MatMul(T_nhwc(x), W as [IC, OC]) + B)
    Conv(x, W, B), depthwise               ->  T_nchw(kiln::DepthwiseConv(T_nhwc(x), W, B))

and the conversions are then moved through every op that does not care about layout (unary
and binary elementwise ops, Clip, residual adds, channel scales, concatenation, reductions,
global pooling) until pairs meet and cancel (``simplify``). What is left are the conversions a
consumer needs: at the region's edges (a stem convolution that stays NCHW, the classifier).

The choice is a cost: the bytes the graph's layout conversions move (read and written), before
and after, against what the channels-last kernels save. A depthwise convolution on NCHW data runs
on rows (short ones on the small planes: a 7x7 plane fills half a 16-float vector) or interleaves
its channels into scratch and back (a conversion of its input and output it does itself); the
channels-last kernel vectorizes across channels, and the 1x1 products beside it then read their
activations in place and write whole rows (on NCHW data they pack them each call and write tiles
strided by the plane). So each depthwise convolution is priced as saving the conversion of its
input and output. Measured on whole models, not on layers alone (``python benchmarks/layouts.py
--models mobilenet_v2,resnet50``): MobileNetV2 6.9 -> 4.6 ms channels last on a 2-core Zen 4
(6.5 -> 4.7 on its AVX2 path), while its 3x3 layers alone measure within ~35% either way. 1x1
convolutions are priced as equal in both layouts: channels last only for them costs a ResNet
more than it saves (the conversions around every 3x3 convolution: resnet50 46 -> 57 ms). So the
graph goes channels last where that removes conversions it had (ConvNeXt's exporters permute to
channels last around every block's LayerNorm and linear layers) or adds fewer than its depthwise
convolutions save (MobileNet, EfficientNet), and stays as it was when it would only add some (a
ResNet's 3x3 convolutions). ``kiln explain`` prints the decision (``layout_decision``).

In an int8 or bf16 compile (``Narrow``), every other single-group convolution the reduced-
precision paths run as a direct convolution (``DIRECT_MIN_CHANNELS`` input channels or more, up
to ``DIRECT_MAX_TAPS`` taps, any stride, no dilation) has a channels-last form too:

    Conv(x, W, B)                          ->  T_nchw(kiln::ConvNHWC(T_nhwc(x), W) + B)

On NCHW data that kernel makes a channels-last copy of its input and transposes its output into
planes (and the 1x1 products beside it pack their activations), so it is priced as saving the
conversion of its input and output, as a depthwise one is: a ResNet then runs channels last from
its stem to its pooling, each product reading the bytes its producer stored (int8: quantized in the
producer's finish) in place. The products made here carry ``kiln_range_of``, the name of the
activations they read before the rewrite: the calibrated range of those activations is looked up
by it, so ranges measured on a graph of either layout apply to both.

Only a target whose kernels run channels last gets it (``Target.layouts``); others keep NCHW.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import DType, TensorType
from kiln.ops.registry import has_trait
from kiln.passes.cse import cse
from kiln.passes.dce import dce
from kiln.passes.fold_constants import fold_constants
from kiln.passes.rewrite import Rewriter
from kiln.passes.simplify import simplify

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
REDUCTIONS = (
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceSum",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
)
GLOBAL_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
MAX_ROUNDS = 16  # propagation rounds (each moves every conversion past at least one op, or stops)
DIRECT_MAX_TAPS = 64  # gemm_lowp.c keeps each tap's offset in a table of 64
DIRECT_MIN_CHANNELS = 32  # fewer input channels: most of a tap's padded k would be zeros (im2col instead)
RANGE_OF = "kiln_range_of"  # a product's annotation: the activations whose calibrated range it uses


@dataclass(frozen=True)
class Narrow:
    """A reduced-precision compile's say in the layout: its ``precision`` (int8, bf16), the
    activations it has a calibrated range for (int8: by name; None for bf16) and the nodes it keeps
    in fp32 (mixed precision): a convolution runs on the direct path only in that precision."""

    precision: str
    calibrated: frozenset[str] | None = None
    keep: frozenset[str] = frozenset()

    def takes(self, node: Node) -> bool:
        x = node.inputs[0]
        return node.name not in self.keep and (self.calibrated is None or (x is not None and x.name in self.calibrated))


def range_key(attrs: dict, value: Value) -> str:
    """The name a product's activations' calibrated range is found by (``kiln_range_of``)."""
    return str(attrs.get(RANGE_OF, value.name))


@dataclass(frozen=True)
class LayoutDecision:
    """What the pass found and chose (``kiln explain``'s "layout" lines)."""

    channels_last: bool
    pointwise: int  # 1x1 convolutions that would run as products on channels-last rows
    depthwise: int  # depthwise convolutions that would run channels last (and direct ones: int8, bf16)
    conversions_before: int  # bytes the graph's own layout conversions move
    conversions_after: int  # bytes the conversions left after propagation move
    saved: int  # bytes of conversion the depthwise convolutions' channels-last kernels save
    reason: str

    def text(self) -> str:
        verdict = "channels last (NHWC)" if self.channels_last else "NCHW kept"
        return (
            f"{verdict}: {self.pointwise} 1x1 and {self.depthwise} depthwise or direct (int8, bf16) convolutions; "
            f"conversions {_mb(self.conversions_before)} -> {_mb(self.conversions_after)} MB moved, their "
            f"channels-last kernels' {_mb(self.saved)} MB saved ({self.reason})"
        )


def _mb(count: int) -> str:
    return f"{count / 1e6:.2f}"


def assign_layouts(graph: Graph, target: Any = None, narrow: Narrow | None = None) -> Graph:
    """The graph with channels-last regions where they pay (``target`` None or without NHWC
    kernels: unchanged)."""
    return _decide(graph, target, narrow)[1]


def layout_decision(graph: Graph, target: Any = None, narrow: Narrow | None = None) -> LayoutDecision:
    return _decide(graph, target, narrow)[0]


def _decide(graph: Graph, target: Any, narrow: Narrow | None) -> tuple[LayoutDecision, Graph]:
    if target is None or "NHWC" not in getattr(target, "layouts", ()):
        return LayoutDecision(False, 0, 0, 0, 0, 0, f"target {getattr(target, 'name', None)} runs NCHW only"), graph
    found = [(node, kind) for node in graph.nodes if (kind := _candidate(graph, node, narrow))]
    pointwise = sum(1 for _, kind in found if kind == "pointwise")
    depthwise = [node for node, kind in found if kind in ("depthwise", "direct")]
    before = conversion_bytes(graph)
    if not found:
        return LayoutDecision(False, 0, 0, before, before, 0, "no convolution has a channels-last kernel"), graph
    trial = propagate(rewrite_channels_last(graph, {id(node): kind for node, kind in found}))
    after = conversion_bytes(trial)
    saved = sum(2 * (_bytes(node.inputs[0]) + _bytes(node.outputs[0])) for node in depthwise)
    chosen = pays(before, after, saved)
    reason = "the conversions cost less than the kernels save" if chosen else "the conversions would cost more"
    decision = LayoutDecision(chosen, pointwise, len(depthwise), before, after, saved, reason)
    return decision, (trial if chosen else graph)


def pays(before: int, after: int, saved: int) -> bool:
    """Whether channels last pays: the conversions it leaves, less what its depthwise kernels save,
    move fewer bytes than the graph's own (``benchmarks/layouts.py --models`` replaces it to force
    either layout)."""
    return after - saved < before


# -- which convolutions -------------------------------------------------------------------------------


def _static_f32(value: Value | None, rank: int) -> bool:
    return (
        value is not None
        and isinstance(value.type, TensorType)
        and value.type.is_static
        and value.type.dtype is DType.FLOAT32
        and value.type.rank == rank
    )


def _candidate(graph: Graph, node: Node, narrow: Narrow | None = None) -> str | None:
    """ "pointwise", "depthwise", "direct" (``narrow``'s direct convolutions) or None: whether
    ``node`` is a convolution with a channels-last form."""
    if node.op != "Conv" or node.domain or len(node.inputs) < 2:
        return None
    if any(key.startswith("kiln_") for key in node.attrs):
        return None  # marked by an earlier stage (a pre-quantized model's int8 product): kept as it is
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if not (_static_f32(x, 4) and _static_f32(out, 4)) or w not in graph.constants:
        return None
    if bias is not None and bias not in graph.constants:
        return None
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    weights = graph.constants[w]
    if weights.ndim != 4 or weights.dtype != np.float32:
        return None
    group = int(node.attrs.get("group", 1))
    strides = tuple(node.attrs.get("strides") or (1, 1))
    pads = _pads(node)
    channels = x.type.shape[1]  # type: ignore[union-attr]
    if group == 1 and weights.shape[2:] == (1, 1) and strides == (1, 1) and pads == (0, 0, 0, 0):
        return "pointwise"
    if group == channels and weights.shape[0] == channels and weights.shape[1] == 1:
        return "depthwise"
    dilations = tuple(node.attrs.get("dilations") or (1, 1))
    if (
        narrow is not None
        and narrow.takes(node)
        and group == 1
        and dilations == (1, 1)
        and channels >= DIRECT_MIN_CHANNELS
        and weights.shape[2] * weights.shape[3] <= DIRECT_MAX_TAPS
    ):
        return "direct"
    return None


def _pads(node: Node) -> tuple[int, ...]:
    if node.attrs.get("auto_pad", "NOTSET") == "VALID":
        return (0, 0, 0, 0)
    return tuple(int(p) for p in (node.attrs.get("pads") or (0, 0, 0, 0)))


def rewrite_channels_last(graph: Graph, kinds: dict[int, str]) -> Graph:
    """Each convolution of ``kinds`` (by node id: "pointwise", "depthwise" or "direct") in its
    channels-last form between two conversions."""
    rw = Rewriter(graph)
    for original in graph.nodes:
        kind = kinds.get(id(original))
        node = rw.resolved(original)
        if kind is None:
            rw.keep(node)
            continue
        x, w = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        hint = node.outputs[0].name
        rows = rw.emit("Transpose", [x], {"perm": TO_NHWC}, hint=f"{hint}_nhwc_in")[0]
        if kind == "pointwise":
            weights = rw.constant_value(w)
            assert weights is not None
            matrix = rw.add_constant(np.ascontiguousarray(weights.reshape(weights.shape[0], -1).T), f"{hint}_wt")
            marked = {RANGE_OF: original.inputs[0].name}  # type: ignore[union-attr]
            result = rw.emit("MatMul", [rows, matrix], marked, hint=f"{hint}_nhwc", name=node.name)[0]
            if bias is not None:
                result = rw.emit("Add", [result, bias], hint=f"{hint}_nhwc_b")[0]
        elif kind == "direct":
            attrs = {**_window(rw, node, w), RANGE_OF: original.inputs[0].name}  # type: ignore[union-attr]
            result = rw.emit("ConvNHWC", [rows, w], attrs, hint=f"{hint}_nhwc", name=node.name, domain="kiln")[0]
            if bias is not None:
                result = rw.emit("Add", [result, bias], hint=f"{hint}_nhwc_b")[0]
        else:
            inputs = [rows, w] + ([bias] if bias is not None else [])
            attrs = _window(rw, node, w)
            result = rw.emit("DepthwiseConv", inputs, attrs, hint=f"{hint}_nhwc", name=node.name, domain="kiln")[0]
        back = rw.emit("Transpose", [result], {"perm": TO_NCHW}, hint=hint)[0]
        rw.replace(node.outputs[0], back)
        rw.drop(node)
    return rw.finish()


def _window(rw: Rewriter, node: Node, w: Value) -> dict[str, Any]:
    return {
        "kernel_shape": tuple(int(k) for k in rw.constant_value(w).shape[2:]),  # type: ignore[union-attr]
        "strides": tuple(int(s) for s in (node.attrs.get("strides") or (1, 1))),
        "pads": _pads(node),
        "dilations": tuple(int(d) for d in (node.attrs.get("dilations") or (1, 1))),
    }


# -- moving conversions ------------------------------------------------------------------------------


def propagate(graph: Graph) -> Graph:
    """Move every Transpose below the layout-indifferent ops that read it until pairs cancel."""
    graph = dce(cse(simplify(fold_constants(graph))))
    for _ in range(MAX_ROUNDS):
        moved = _sink(graph)
        if moved is graph:  # nothing moved
            break
        graph = dce(cse(simplify(fold_constants(moved))))
    return graph


def _perm(node: Node | None) -> tuple[int, ...] | None:
    if node is None or node.op != "Transpose" or node.domain:
        return None
    perm = node.attrs.get("perm")
    rank = node.outputs[0].type.rank if isinstance(node.outputs[0].type, TensorType) else None
    if perm is None:
        return tuple(range(rank)[::-1]) if rank is not None else None
    return tuple(int(p) for p in perm)


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return tuple(inverse)


def _moves_data(shape: tuple, perm: tuple[int, ...]) -> bool:
    """Whether transposing ``shape`` by ``perm`` moves data (the dims above 1 change order);
    otherwise it is a reshape."""
    kept = [p for p in perm if shape[p] != 1]
    return kept != sorted(kept)


def _scalar(rw: Rewriter, value: Value | None) -> bool:
    array = rw.constant_value(value)
    return value is None or (array is not None and array.size == 1)


def _unit_dims_only(value: Value | None, rank: int | None) -> bool:
    """A static tensor of ``rank`` with at most one dim above 1 (any permutation is a reshape)."""
    if value is None or not isinstance(value.type, TensorType) or not value.type.is_static:
        return False
    shape = value.type.shape
    return shape is not None and len(shape) == rank and sum(1 for d in shape if d != 1) <= 1


def _sink(graph: Graph) -> Graph:
    """One sweep: each op reading a conversion computed on the conversion's input instead, the
    conversion moved to its output."""
    rw = Rewriter(graph)
    producers: dict[Value, Node] = {}
    for node in graph.nodes:
        node = rw.resolved(node)
        moved = None if node.domain or len(node.outputs) != 1 else _move(rw, node, producers)
        if moved is None:
            rw.keep(node)
            for out in node.outputs:
                producers[out] = node
            continue
        producers[moved] = rw.nodes[-1]
        rw.replace(node.outputs[0], moved)
        rw.drop(node)
    return rw.finish()


def _move(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> Value | None:
    first = node.inputs[0] if node.inputs else None
    source = producers.get(first) if first is not None else None
    perm = _perm(source)
    hint = node.outputs[0].name
    if node.op in GLOBAL_POOLS or node.op in REDUCTIONS:
        return _move_reduction(rw, node, source, perm, hint) if perm is not None else None
    if node.op == "Transpose":
        return _unit_transpose(rw, node, hint)
    if node.op == "Concat":
        return _move_concat(rw, node, producers, hint)
    if not has_trait(node.op, "", "elementwise") and not has_trait(node.op, "", "layout_free"):
        return None
    out_rank = node.outputs[0].type.rank if isinstance(node.outputs[0].type, TensorType) else None
    common: tuple[int, ...] | None = None
    inputs: list[Value | None] = []
    plan: list[tuple[str, Value | None]] = []
    for value in node.inputs:
        producer = producers.get(value) if value is not None else None
        p = _perm(producer)
        if p is not None and len(p) == out_rank:
            if common is not None and p != common:
                return None
            common = p
            plan.append(("moved", producer.inputs[0]))  # type: ignore[union-attr]
        elif _scalar(rw, value):
            plan.append(("as is", value))
        elif rw.constant_value(value) is not None:
            plan.append(("constant", value))
        elif _unit_dims_only(value, out_rank):
            plan.append(("reshaped", value))  # [N, C, 1, 1] (a squeeze-excite scale): a free reshape
        else:
            return None
    if common is None or (node.op == "Clip" and any(kind == "constant" for kind, _ in plan)):
        return None
    inverse = _inverse(common)
    for kind, value in plan:
        if kind == "reshaped":  # at most one dim above 1: transposed, it is reshaped
            shape = value.type.shape  # type: ignore[union-attr]
            target = rw.add_constant(np.array([shape[i] for i in inverse], dtype=np.int64), f"{hint}_shape")
            inputs.append(rw.emit("Reshape", [value, target], hint=f"{hint}_r")[0])
        elif kind == "constant":
            array = rw.constant_value(value)
            assert array is not None and out_rank is not None
            expanded = array.reshape((1,) * (out_rank - array.ndim) + array.shape)
            inputs.append(rw.add_constant(np.ascontiguousarray(np.transpose(expanded, inverse)), f"{hint}_c"))
        else:
            inputs.append(value)
    inner = rw.emit(node.op, inputs, dict(node.attrs), hint=f"{hint}_pre", name=node.name)[0]
    return rw.emit("Transpose", [inner], {"perm": common}, hint=hint)[0]


def _move_reduction(rw: Rewriter, node: Node, source: Node | None, perm: tuple[int, ...], hint: str) -> Value | None:
    assert source is not None
    rank = len(perm)
    if node.op in GLOBAL_POOLS:
        op, axes, keep = GLOBAL_POOLS[node.op], list(range(2, rank)), True
    else:
        op = node.op
        if len(node.inputs) < 2 or node.inputs[1] is None:
            return None
        given = rw.constant_value(node.inputs[1])
        if given is None or given.size == 0 or node.attrs.get("noop_with_empty_axes"):
            return None
        axes = [int(a) % rank for a in given.reshape(-1)]
        keep = bool(node.attrs.get("keepdims", 1))
    moved_axes = sorted(perm[a] for a in axes)
    attrs = {"keepdims": 1 if keep else 0}
    axes_value = rw.add_constant(np.array(moved_axes, dtype=np.int64), f"{hint}_axes")
    inner = rw.emit(op, [source.inputs[0], axes_value], attrs, hint=f"{hint}_pre", name=node.name)[0]
    if keep:
        order = perm
    else:
        kept = [perm[i] for i in range(rank) if i not in axes]  # the source's dims, in the output's order
        remaining = sorted(kept)
        order = tuple(remaining.index(d) for d in kept)
    if order == tuple(range(len(order))):
        return inner
    return rw.emit("Transpose", [inner], {"perm": order}, hint=hint)[0]


def _move_concat(rw: Rewriter, node: Node, producers: dict[Value, Node], hint: str) -> Value | None:
    perms = [_perm(producers.get(v)) if v is not None else None for v in node.inputs]
    if not perms or perms[0] is None or any(p != perms[0] for p in perms):
        return None
    perm = perms[0]
    axis = int(node.attrs.get("axis", 0)) % len(perm)
    sources = [producers[v].inputs[0] for v in node.inputs]  # type: ignore[index]
    inner = rw.emit("Concat", sources, {"axis": perm[axis]}, hint=f"{hint}_pre", name=node.name)[0]
    return rw.emit("Transpose", [inner], {"perm": perm}, hint=hint)[0]


def _unit_transpose(rw: Rewriter, node: Node, hint: str) -> Value | None:
    """A Transpose that only moves dims of size 1 is a Reshape (no data moves)."""
    source, out = node.inputs[0], node.outputs[0]
    perm = _perm(node)
    if source is None or perm is None or not isinstance(source.type, TensorType) or not source.type.is_static:
        return None
    if _moves_data(source.type.shape, perm):  # type: ignore[arg-type]
        return None
    target = rw.add_constant(np.array(out.type.shape, dtype=np.int64), f"{hint}_shape")  # type: ignore[union-attr]
    return rw.emit("Reshape", [source, target], hint=hint)[0]


# -- cost ------------------------------------------------------------------------------------------


def _bytes(value: Value | None) -> int:
    if value is None or not isinstance(value.type, TensorType) or not value.type.is_static:
        return 0
    return int(np.prod(value.type.shape)) * value.type.dtype.numpy.itemsize  # type: ignore[arg-type]


def conversion_bytes(graph: Graph) -> int:
    """Bytes the graph's layout conversions read and write (Transposes of non-constant rank-3+
    tensors that move data: a unit-dim transpose moves none)."""
    total = 0
    for node in graph.nodes:
        if node.op != "Transpose" or node.domain or node.inputs[0] in graph.constants:
            continue
        value = node.inputs[0]
        if not isinstance(value.type, TensorType) or value.type.rank is None or value.type.rank < 3:  # type: ignore[union-attr]
            continue
        if value.type.is_static and not _moves_data(value.type.shape, _perm(node) or ()):  # type: ignore[union-attr,arg-type]
            continue
        total += 2 * _bytes(value)
    return total
