"""Control flow (If, Loop, Scan, SequenceMap), sequences and optionals.

The control-flow references run their bodies through kiln's own interpreter (``ctx.interpreter``),
so a body sees enclosing-scope values exactly as the main graph does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import ShapeInferenceError
from kiln.ir.graph import Graph
from kiln.ir.types import Dim, DType, OptionalType, SequenceType, TensorType, Type
from kiln.ops.registry import InferContext, RunContext, normalize_axis, register


def merge_types(ctx: InferContext, first: Type, second: Type) -> Type:
    """The most precise type that covers both (dims that differ become fresh symbols)."""
    if first == second:
        return first
    if isinstance(first, TensorType) and isinstance(second, TensorType):
        if first.dtype != second.dtype:
            raise ShapeInferenceError(f"types disagree: {first} vs {second}")
        if first.shape is None or second.shape is None or len(first.shape) != len(second.shape):
            return TensorType(first.dtype, None)
        dims: list[Dim] = [a if a == b else ctx.fresh() for a, b in zip(first.shape, second.shape)]
        return TensorType(first.dtype, tuple(dims))
    if isinstance(first, OptionalType) != isinstance(second, OptionalType):
        # A value that may be absent on one path: optional of whatever the other path has.
        inner_first = first.elem if isinstance(first, OptionalType) else first
        inner_second = second.elem if isinstance(second, OptionalType) else second
        return OptionalType(merge_types(ctx, inner_first, inner_second))
    if isinstance(first, SequenceType) and isinstance(second, SequenceType):
        return SequenceType(_merge_elements(ctx, first.elem, second.elem))
    if type(first) is type(second) and isinstance(first, OptionalType):
        return type(first)(merge_types(ctx, first.elem, second.elem))  # type: ignore[arg-type, attr-defined]
    raise ShapeInferenceError(f"types disagree: {first} vs {second}")


def _merge_elements(ctx: InferContext, first: Type, second: Type) -> Type:
    # An element of unknown rank (e.g. from SequenceEmpty) merges with any element of its dtype.
    for unknown, other in ((first, second), (second, first)):
        if isinstance(unknown, TensorType) and unknown.shape is None and isinstance(other, TensorType):
            if unknown.dtype == other.dtype:
                return unknown
    return merge_types(ctx, first, second)


# -- If / Loop / Scan ---------------------------------------------------------------------------


def _if_infer(ctx: InferContext) -> list[Type]:
    then_branch: Graph = ctx.attr("then_branch")
    else_branch: Graph = ctx.attr("else_branch")
    if len(then_branch.outputs) != len(else_branch.outputs):
        raise ShapeInferenceError("then_branch and else_branch have different numbers of outputs")
    return [merge_types(ctx, a.type, b.type) for a, b in zip(then_branch.outputs, else_branch.outputs)]


def _if_reference(ctx: RunContext, inputs: list) -> list:
    branch = ctx.attr("then_branch") if bool(np.asarray(inputs[0]).reshape(-1)[0]) else ctx.attr("else_branch")
    return ctx.interpreter.run_subgraph(branch, [])


def _loop_infer(ctx: InferContext) -> list[Type]:
    body: Graph = ctx.attr("body")
    carried = ctx.num_inputs - 2
    types: list[Type] = []
    for index in range(carried):
        initial = ctx.input_types[2 + index]
        updated = body.outputs[1 + index].type
        types.append(merge_types(ctx, initial, updated) if initial is not None else updated)
    for value in body.outputs[1 + carried :]:
        elem = value.type
        if isinstance(elem, TensorType):
            shape = None if elem.shape is None else (ctx.fresh("iter"), *elem.shape)
            types.append(TensorType(elem.dtype, shape))
        else:
            types.append(elem)
    return types


def _loop_reference(ctx: RunContext, inputs: list) -> list:
    body: Graph = ctx.attr("body")
    trip_count = None if inputs[0] is None else int(np.asarray(inputs[0]).reshape(-1)[0])
    condition = None if len(inputs) < 2 or inputs[1] is None else bool(np.asarray(inputs[1]).reshape(-1)[0])
    carried = list(inputs[2:])
    scans: list[list[Any]] = [[] for _ in body.outputs[1 + len(carried) :]]
    iteration = 0
    while (trip_count is None or iteration < trip_count) and (condition is None or condition):
        feeds = [np.array(iteration, dtype=np.int64), np.array(True if condition is None else condition)]
        outputs = ctx.interpreter.run_subgraph(body, feeds + carried)
        condition = bool(np.asarray(outputs[0]).reshape(-1)[0]) if condition is not None or body.outputs[0] else None
        carried = list(outputs[1 : 1 + len(carried)])
        for slot, value in zip(scans, outputs[1 + len(carried) :]):
            slot.append(value)
        iteration += 1
    results = carried
    for slot, value in zip(scans, body.outputs[1 + len(carried) :]):
        if slot:
            results.append(np.stack(slot))
        else:
            elem = value.type
            dtype = elem.dtype.numpy if isinstance(elem, TensorType) else np.float32
            shape = [d if isinstance(d, int) else 0 for d in (elem.shape or ())] if isinstance(elem, TensorType) else []
            results.append(np.zeros([0, *shape], dtype=dtype))
    return results


def _scan_infer(ctx: InferContext) -> list[Type]:
    body: Graph = ctx.attr("body")
    scan_inputs = ctx.attr("num_scan_inputs")
    states = ctx.num_inputs - scan_inputs
    input_axes = ctx.attr("scan_input_axes") or (0,) * scan_inputs
    output_axes = ctx.attr("scan_output_axes") or (0,) * (len(body.outputs) - states)
    first_scan = ctx.tensor(states)
    length: Dim = ctx.fresh("seq")
    if first_scan.shape is not None:
        length = first_scan.shape[normalize_axis(input_axes[0], len(first_scan.shape))]
    types: list[Type] = [
        merge_types(ctx, ctx.input_types[i], body.outputs[i].type)
        for i in range(states)  # type: ignore[arg-type]
    ]
    for index, value in enumerate(body.outputs[states:]):
        elem = value.type
        if not isinstance(elem, TensorType) or elem.shape is None:
            types.append(TensorType(elem.dtype if isinstance(elem, TensorType) else DType.FLOAT32, None))
            continue
        axis = normalize_axis(output_axes[index], len(elem.shape) + 1)
        dims = list(elem.shape)
        dims.insert(axis, length)
        types.append(TensorType(elem.dtype, tuple(dims)))
    return types


def _scan_reference(ctx: RunContext, inputs: list) -> list:
    body: Graph = ctx.attr("body")
    scan_count = ctx.attr("num_scan_inputs")
    states = list(inputs[: len(inputs) - scan_count])
    sequences = inputs[len(inputs) - scan_count :]
    input_axes = ctx.attr("scan_input_axes") or (0,) * scan_count
    input_dirs = ctx.attr("scan_input_directions") or (0,) * scan_count
    output_count = len(body.outputs) - len(states)
    output_axes = ctx.attr("scan_output_axes") or (0,) * output_count
    output_dirs = ctx.attr("scan_output_directions") or (0,) * output_count
    sequences = [np.moveaxis(seq, normalize_axis(axis, seq.ndim), 0) for seq, axis in zip(sequences, input_axes)]
    length = sequences[0].shape[0] if sequences else 0
    collected: list[list[np.ndarray]] = [[] for _ in range(output_count)]
    for step in range(length):
        slices = [seq[length - 1 - step] if direction else seq[step] for seq, direction in zip(sequences, input_dirs)]
        outputs = ctx.interpreter.run_subgraph(body, states + slices)
        states = list(outputs[: len(states)])
        for slot, value in zip(collected, outputs[len(states) :]):
            slot.append(value)
    results = states
    for slot, axis, direction, value in zip(collected, output_axes, output_dirs, body.outputs[len(states) :]):
        if direction:
            slot = slot[::-1]
        if slot:
            stacked = np.stack(slot)
        else:
            elem = value.type
            shape = [d if isinstance(d, int) else 0 for d in (elem.shape or ())] if isinstance(elem, TensorType) else []
            stacked = np.zeros([0, *shape], dtype=elem.dtype.numpy if isinstance(elem, TensorType) else np.float32)
        results.append(np.moveaxis(stacked, 0, normalize_axis(axis, stacked.ndim)))
    return results


def _sequence_map_infer(ctx: InferContext) -> list[Type]:
    body: Graph = ctx.attr("body")
    return [SequenceType(value.type) for value in body.outputs]


def _sequence_map_reference(ctx: RunContext, inputs: list) -> list:
    body: Graph = ctx.attr("body")
    sequence = inputs[0]
    results: list[list[Any]] = [[] for _ in body.outputs]
    for index in range(len(sequence)):
        feeds = [sequence[index]] + [x[index] if isinstance(x, list) else x for x in inputs[1:]]
        for slot, value in zip(results, ctx.interpreter.run_subgraph(body, feeds)):
            slot.append(value)
    return results


# -- sequences and optionals --------------------------------------------------------------------


def _sequence(ctx: InferContext, index: int) -> SequenceType:
    value_type = ctx.input_types[index]
    if not isinstance(value_type, SequenceType):
        raise ShapeInferenceError(f"input {index} must be a sequence, got {value_type}")
    return value_type


def _sequence_empty(ctx: InferContext) -> list[Type]:
    dtype = ctx.attr("dtype")
    return [SequenceType(TensorType(DType.from_onnx(int(dtype)) if dtype else DType.FLOAT32, None))]


def _sequence_construct(ctx: InferContext) -> list[Type]:
    elem: Type = ctx.tensor(0)
    for index in range(1, ctx.num_inputs):
        elem = merge_types(ctx, elem, ctx.tensor(index))
    return [SequenceType(elem)]


def _sequence_insert(ctx: InferContext) -> list[Type]:
    sequence = _sequence(ctx, 0)
    elem = sequence.elem
    tensor = ctx.tensor(1)
    if isinstance(elem, TensorType) and elem.shape is None and elem.dtype == tensor.dtype:
        return [sequence]
    return [SequenceType(merge_types(ctx, elem, tensor))]


def _split_to_sequence(ctx: InferContext) -> list[Type]:
    return [SequenceType(TensorType(ctx.dtype(0), None))]


def _concat_from_sequence(ctx: InferContext) -> list[Type]:
    elem = _sequence(ctx, 0).elem
    if not isinstance(elem, TensorType):
        raise ShapeInferenceError("ConcatFromSequence needs a sequence of tensors")
    if elem.shape is None:
        return [TensorType(elem.dtype, None)]
    return [TensorType(elem.dtype, ctx.fresh_shape(len(elem.shape) + (1 if ctx.attr("new_axis") else 0)))]


def _optional(ctx: InferContext) -> list[Type]:
    if ctx.has(0):
        return [OptionalType(ctx.input_types[0])]  # type: ignore[arg-type]
    declared = ctx.attr("type")
    if declared is None:
        raise ShapeInferenceError("Optional without an input needs the 'type' attribute")
    return [OptionalType(declared)]


def _optional_get(ctx: InferContext) -> list[Type]:
    value_type = ctx.input_types[0]
    return [value_type.elem if isinstance(value_type, OptionalType) else value_type]  # type: ignore[list-item]


def _optional_get_reference(ctx: RunContext, inputs: list) -> list:
    if inputs[0] is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return [inputs[0]]


def _register() -> None:
    register("If", _if_infer, reference=_if_reference)
    register("Loop", _loop_infer, reference=_loop_reference)
    register("Scan", _scan_infer, reference=_scan_reference)
    register("SequenceMap", _sequence_map_infer, reference=_sequence_map_reference)
    register("SequenceEmpty", _sequence_empty)
    register("SequenceConstruct", _sequence_construct)
    register("SequenceInsert", _sequence_insert)
    register("SequenceAt", lambda ctx: [_sequence(ctx, 0).elem])
    register("SequenceErase", lambda ctx: [_sequence(ctx, 0)])
    register("SequenceLength", lambda ctx: [TensorType(DType.INT64, ())])
    register("SplitToSequence", _split_to_sequence)
    register("ConcatFromSequence", _concat_from_sequence)
    # kiln's own references: onnx's Optional wraps a sequence input in an extra list.
    register("Optional", _optional, reference=lambda ctx, inputs: [inputs[0] if inputs else None])
    register(
        "OptionalHasElement",
        lambda ctx: [TensorType(DType.BOOL, ())],
        reference=lambda ctx, inputs: [np.array(bool(inputs) and inputs[0] is not None)],
    )
    register("OptionalGetElement", _optional_get, reference=_optional_get_reference)


_register()
