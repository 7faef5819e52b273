"""Per-(op, opset) converters from ONNX nodes to kiln's canonical ops, and the graph builder.

A converter is registered for the first opset whose form it handles; the importer picks the highest
one <= the model's opset. Ops with no entry convert one-to-one (``GraphBuilder.emit_proto``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from kiln.errors import InvalidModelError, ShapeInferenceError
from kiln.ir.graph import Node, Value, constant_type, unique_name
from kiln.ir.types import DType, SequenceType, TensorType, Type
from kiln.ops.inference import KNOWN_VALUE_LIMIT, UnsupportedConstruct, infer_node
from kiln.ops.registry import lookup, nondeterministic

Converter = Callable[[onnx.NodeProto, "GraphBuilder", str], None]
CONVERTERS: dict[tuple[str, str], list[tuple[int, Converter]]] = {}


def converter(op: str, since: int, domain: str = "") -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        entries = CONVERTERS.setdefault((domain, op), [])
        entries.append((since, fn))
        entries.sort(key=lambda e: e[0])
        return fn

    return register


def pick_converter(op: str, domain: str, opset: int) -> Converter | None:
    """The converter for the highest registered version <= ``opset`` (None: convert 1:1)."""
    chosen = None
    for since, fn in CONVERTERS.get((domain, op), []):
        if since <= opset:
            chosen = fn
    return chosen


_POISON = TensorType(DType.FLOAT32, None)


class GraphBuilder:
    """Emits kiln nodes for one graph, inferring types and tracking compile-time-known values."""

    def __init__(self, importer: Any, scope: Any, taken: set[str], constants: dict[Value, np.ndarray]) -> None:
        self.importer = importer
        self.scope = scope
        self.taken = taken
        self.constants = constants
        self.nodes: list[Node] = []
        self.poisoned: set[Value] = set()
        # ONNX names defined in this graph (not an enclosing one): a second producer is invalid
        self.own: set[str] = set()

    # -- values ------------------------------------------------------------------------------

    def input(self, proto: onnx.NodeProto, index: int) -> Value | None:
        if index >= len(proto.input) or not proto.input[index]:
            return None
        return self.scope.values[proto.input[index]]

    def inputs(self, proto: onnx.NodeProto) -> list[Value | None]:
        return [self.input(proto, i) for i in range(len(proto.input))]

    def const(self, array: Any, hint: str) -> Value:
        array = np.asarray(array)
        value = Value(unique_name(hint, self.taken), constant_type(array))
        self.constants[value] = array
        self.scope.known[value] = array
        return value

    def define(self, onnx_name: str, value: Value) -> None:
        self.scope.values[onnx_name] = value
        self.own.add(onnx_name)

    def attrs(self, proto: onnx.NodeProto, hints: list[Type] | None = None) -> dict[str, Any]:
        return {a.name: self.importer.attribute(a, self, hints) for a in proto.attribute}

    def poison(self, proto: onnx.NodeProto) -> None:
        """Define a failed node's outputs so later nodes can still be checked."""
        for name in proto.output:
            if name:
                value = Value(unique_name(name, self.taken), _POISON)
                self.poisoned.add(value)
                self.define(name, value)

    # -- nodes -------------------------------------------------------------------------------

    def emit_proto(self, proto: onnx.NodeProto, label: str, op: str | None = None, **overrides: Any) -> list[Value]:
        """Convert ``proto`` one-to-one (optionally as another op or with attributes replaced)."""
        inputs = self.inputs(proto)
        attrs = self.attrs(proto, self._subgraph_hints(proto, inputs))
        attrs.update(overrides)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        return self.emit(op or proto.op_type, inputs, attrs, list(proto.output), proto.name, proto.domain)

    def emit(
        self,
        op: str,
        inputs: list[Value | None],
        attrs: dict[str, Any],
        outputs: list[str] | int,
        name: str = "",
        domain: str = "",
    ) -> list[Value]:
        domain = "" if domain == "ai.onnx" else domain
        opdef = lookup(op, domain)
        if opdef is None:
            raise UnsupportedConstruct(f"unknown op {op}")
        unknown = sorted(set(attrs) - set(opdef.attrs))
        if unknown:
            raise UnsupportedConstruct(f"attribute(s) {', '.join(unknown)} not supported")
        missing = [k for k, spec in opdef.attrs.items() if spec.required and k not in attrs]
        if missing:
            raise InvalidModelError(f"missing required attribute(s) {', '.join(missing)}")
        while inputs and inputs[-1] is None:
            inputs = inputs[:-1]
        low, high = opdef.num_inputs
        if len(inputs) < low or (high >= 0 and len(inputs) > high):
            raise InvalidModelError(f"{len(inputs)} inputs, expected {low}..{'n' if high < 0 else high}")
        output_names = [f"{op}_out{i}" for i in range(outputs)] if isinstance(outputs, int) else outputs
        if any(v in self.poisoned for v in inputs if v is not None):
            raise PoisonedInputs()
        # the outputs' final names before inference: a fresh symbol is named after its value, so
        # two nodes' symbols (every Conv's output is ``Conv_out0`` before naming) never collide
        names = [unique_name(n or f"{op}_unused", self.taken) for n in output_names]
        placeholders = [Value(n, _POISON) for n in names]
        draft = Node(op, inputs, placeholders, attrs, name=name, domain=domain)
        input_types = [None if v is None else v.type for v in inputs]
        known = [None if v is None else self.scope.known.get(v) for v in inputs]
        symbolic = [None if v is None else self.scope.symbolic.get(v) for v in inputs]
        types, out_symbolic = infer_node(draft, input_types, known, symbolic)
        results = [Value(n, t) for n, t in zip(names, types)]
        node = Node(op, inputs, results, attrs, name=name, domain=domain)
        self.nodes.append(node)
        for onnx_name, value in zip(output_names, results):
            if onnx_name:
                self.define(onnx_name, value)
        for index, dims in out_symbolic.items():
            self.scope.symbolic[results[index]] = tuple(dims)
            if all(isinstance(d, int) for d in dims):
                self.scope.known[results[index]] = np.array(dims, dtype=np.int64)
        self._evaluate_if_known(node, known)
        return results

    def _evaluate_if_known(self, node: Node, known: list[np.ndarray | None]) -> None:
        """Compute outputs of small nodes whose inputs are all known (shape arithmetic)."""
        if nondeterministic(node) or any(True for _ in node.subgraphs()):
            return
        if any(v is not None and k is None for v, k in zip(node.inputs, known)):
            return
        if sum(k.size for k in known if k is not None) > KNOWN_VALUE_LIMIT:
            return
        if not all(isinstance(v.type, TensorType) and v.type.is_static for v in node.outputs):
            return
        from kiln.ops.interpreter import evaluate_node

        try:
            outputs = evaluate_node(node, list(known))
        except Exception:
            return
        for value, array in zip(node.outputs, outputs):
            if isinstance(array, np.ndarray) and array.size <= KNOWN_VALUE_LIMIT:
                self.scope.known[value] = array
                if array.ndim == 1 and array.dtype.kind == "i":
                    self.scope.symbolic[value] = tuple(int(x) for x in array)

    def _subgraph_hints(self, proto: onnx.NodeProto, inputs: list[Value | None]) -> list[Type] | None:
        """Types for body inputs that the model leaves undeclared (common in Loop/Scan bodies)."""
        types = [None if v is None else v.type for v in inputs]
        if proto.op_type == "Loop":
            return [TensorType(DType.INT64, ()), TensorType(DType.BOOL, ()), *types[2:]]  # type: ignore[list-item]
        if proto.op_type == "Scan":
            scan_count = next((a.i for a in proto.attribute if a.name == "num_scan_inputs"), 0)
            states = types[: len(types) - scan_count]
            scans = []
            for t in types[len(types) - scan_count :]:
                if isinstance(t, TensorType) and t.shape is not None:
                    scans.append(TensorType(t.dtype, t.shape[1:]))
                else:
                    scans.append(t)
            return [*states, *scans]  # type: ignore[list-item]
        if proto.op_type == "SequenceMap":
            return [t.elem if isinstance(t, SequenceType) else t for t in types]  # type: ignore[misc]
        return None


class PoisonedInputs(Exception):
    """A node reads the output of a node that already failed: skip it quietly (reported once)."""


# -- converters for older or non-canonical forms -----------------------------------------------------


@converter("Constant", 1)
def _constant(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    from kiln.ops.constant import constant_value

    try:
        array = constant_value(builder.attrs(proto))
    except ShapeInferenceError as err:
        raise InvalidModelError(str(err)) from None
    builder.define(proto.output[0], builder.const(array, proto.output[0]))


def _attr(proto: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for attribute in proto.attribute:
        if attribute.name == name:
            value = onnx.helper.get_attribute_value(attribute)
            return tuple(value) if isinstance(value, list) else value
    return default


def _without(proto: onnx.NodeProto, *names: str) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(proto)
    del copy.attribute[:]
    copy.attribute.extend(a for a in proto.attribute if a.name not in names)
    return copy


def _attr_to_inputs(
    proto: onnx.NodeProto, builder: GraphBuilder, label: str, op: str, moves: list[tuple[str, int, Any]]
) -> None:
    """Move attributes into (constant) inputs at given positions: (attr name, position, dtype)."""
    inputs = builder.inputs(proto)
    for attr_name, position, dtype in moves:
        value = _attr(proto, attr_name)
        while len(inputs) <= position:
            inputs.append(None)
        if value is not None:
            inputs[position] = builder.const(np.asarray(value, dtype=dtype), f"{proto.output[0]}_{attr_name}")
    stripped = _without(proto, *(m[0] for m in moves))
    attrs = builder.attrs(stripped)
    builder.emit(op, inputs, attrs, list(proto.output), proto.name, proto.domain)


def one_to_one(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    builder.emit_proto(proto, label)


def attributes_became_inputs(
    op: str, canonical_since: int, moves: list[tuple[str, int, Any]], strip: tuple[str, ...] = ()
) -> None:
    """Register converters for an op whose attributes turned into inputs at ``canonical_since``:
    older forms move each (attribute, input position, dtype) into a constant input; a dtype of
    None means "the dtype of input 0"."""

    def convert(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
        source = builder.input(proto, 0)
        dtype0 = source.type.dtype.numpy if source is not None and isinstance(source.type, TensorType) else np.float32
        resolved = [(name, position, dtype0 if dtype is None else dtype) for name, position, dtype in moves]
        _attr_to_inputs(_without(proto, *strip) if strip else proto, builder, label, op, resolved)

    converter(op, 1)(convert)
    converter(op, canonical_since)(one_to_one)


_AXES = [("axes", 1, np.int64)]
for _op in (
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
):
    attributes_became_inputs(_op, 18, _AXES)
attributes_became_inputs("ReduceSum", 13, _AXES)
attributes_became_inputs("Squeeze", 13, _AXES)
attributes_became_inputs("Unsqueeze", 13, _AXES)
attributes_became_inputs("Split", 13, [("split", 1, np.int64)])
attributes_became_inputs("Slice", 10, [("starts", 1, np.int64), ("ends", 2, np.int64), ("axes", 3, np.int64)])
attributes_became_inputs("Pad", 11, [("pads", 1, np.int64), ("value", 2, None)])
attributes_became_inputs("Clip", 11, [("min", 1, None), ("max", 2, None)])
attributes_became_inputs("TopK", 10, [("k", 1, np.int64)])
attributes_became_inputs("Dropout", 12, [("ratio", 1, np.float32)], strip=("is_test", "consumed_inputs"))
attributes_became_inputs("Upsample", 9, [("scales", 1, np.float32)])


@converter("Resize", 10)
def _resize_v10(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    inputs = builder.inputs(proto)
    attrs = builder.attrs(proto)
    mode = attrs.get("mode", "nearest")
    # Resize-10 sampled like Upsample: asymmetric coordinates, nearest rounds down.
    attrs.setdefault("coordinate_transformation_mode", "asymmetric")
    if mode == "nearest":
        attrs.setdefault("nearest_mode", "floor")
    builder.emit("Resize", [inputs[0], None, inputs[1]], attrs, list(proto.output), proto.name)


converter("Resize", 11)(one_to_one)


@converter("Scatter", 1)
def _scatter(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    # Scatter (deprecated in opset 11) is ScatterElements without a reduction.
    builder.emit_proto(proto, label, op="ScatterElements")


def _coerced_softmax(op: str) -> Converter:
    """Before opset 13 these ops flattened the input to 2-D at ``axis`` (default 1)."""

    def convert(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
        data = builder.input(proto, 0)
        assert data is not None
        rank = data.type.rank if isinstance(data.type, TensorType) else None
        axis = _attr(proto, "axis", 1)
        if rank is not None and axis in (-1, rank - 1):
            builder.emit(op, [data], {"axis": -1}, list(proto.output), proto.name)
            return
        out = proto.output[0]
        flat = builder.emit("Flatten", [data], {"axis": axis}, [f"{out}_flat"], proto.name)
        applied = builder.emit(op, flat, {"axis": -1}, [f"{out}_2d"], proto.name)
        shape = builder.emit("Shape", [data], {}, [f"{out}_shape"], proto.name)
        builder.emit("Reshape", [applied[0], shape[0]], {}, [out], proto.name)

    return convert


for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    converter(_op, 1)(_coerced_softmax(_op))
    converter(_op, 13)(one_to_one)


@converter("GridSample", 16)
def _grid_sample_v16(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    mode = _attr(proto, "mode", b"bilinear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    builder.emit_proto(proto, label, mode={"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode))


converter("GridSample", 20)(one_to_one)


@converter("DFT", 17)
def _dft_v17(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    inputs = builder.inputs(proto)
    while len(inputs) < 2:
        inputs.append(None)
    axis = _attr(proto, "axis", 1)
    inputs.append(builder.const(np.array(axis, dtype=np.int64), f"{proto.output[0]}_axis"))
    attrs = builder.attrs(_without(proto, "axis"))
    builder.emit("DFT", inputs, attrs, list(proto.output), proto.name)


converter("DFT", 20)(one_to_one)


@converter("BatchNormalization", 1)
def _batch_norm_old(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    if _attr(proto, "spatial", 1) != 1:
        raise UnsupportedConstruct("attribute spatial=0 not supported")
    builder.emit_proto(_without(proto, "spatial", "is_test", "consumed_inputs", "momentum"), label)


converter("BatchNormalization", 14)(one_to_one)


@converter("Scan", 8)
def _scan_v8(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    raise UnsupportedConstruct("Scan-8 (the batched form with sequence_lens) is not supported; export with opset >= 9")


converter("Scan", 9)(one_to_one)


def _align_for_legacy_broadcast(builder: GraphBuilder, value: Value, rank: int, axis: int, hint: str) -> Value:
    """Before opset 7, B broadcast against A starting at ``axis``: give B trailing 1-dims so that
    NumPy-style (suffix) broadcasting means the same thing."""
    value_rank = value.type.rank if isinstance(value.type, TensorType) else None
    if value_rank is None:
        raise UnsupportedConstruct("legacy broadcast with an input of unknown rank")
    trailing = rank - axis - value_rank
    if trailing <= 0:
        return value
    axes = builder.const(np.arange(value_rank, value_rank + trailing, dtype=np.int64), f"{hint}_axes")
    return builder.emit("Unsqueeze", [value, axes], {}, [f"{hint}_aligned"])[0]


def _legacy_binary(op: str) -> Converter:
    def convert(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
        a, b = builder.input(proto, 0), builder.input(proto, 1)
        assert a is not None and b is not None
        axis = _attr(proto, "axis")
        if _attr(proto, "broadcast", 0) and axis is not None:
            rank = a.type.rank if isinstance(a.type, TensorType) else None
            if rank is None:
                raise UnsupportedConstruct("legacy broadcast with an input of unknown rank")
            b = _align_for_legacy_broadcast(builder, b, rank, axis if axis >= 0 else axis + rank, proto.output[0])
        attrs = builder.attrs(_without(proto, "broadcast", "axis", "consumed_inputs"))
        builder.emit(op, [a, b], attrs, list(proto.output), proto.name)

    return convert


for _op in ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater"):
    converter(_op, 1)(_legacy_binary(_op))
    converter(_op, 7)(one_to_one)


@converter("Gemm", 1)
def _gemm_v6(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    # C's broadcast attribute became implicit (unidirectional broadcasting) in opset 7.
    builder.emit_proto(_without(proto, "broadcast"), label)


converter("Gemm", 7)(one_to_one)


@converter("PRelu", 1)
def _prelu_v6(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    # Before opset 7 a 1-D slope applied per channel (axis 1).
    x, slope = builder.input(proto, 0), builder.input(proto, 1)
    assert x is not None and slope is not None
    rank = x.type.rank if isinstance(x.type, TensorType) else None
    if rank is not None and rank > 2 and slope.type.rank == 1:  # type: ignore[union-attr]
        slope = _align_for_legacy_broadcast(builder, slope, rank, 1, proto.output[0])
    attrs = builder.attrs(_without(proto, "consumed_inputs"))
    builder.emit("PRelu", [x, slope], attrs, list(proto.output), proto.name)


converter("PRelu", 7)(one_to_one)
