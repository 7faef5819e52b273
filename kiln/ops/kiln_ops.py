"""Ops kiln introduces itself (domain ``kiln``). Each has its own inference and reference."""

from __future__ import annotations

from typing import Any

from kiln.ir.graph import Graph
from kiln.ir.types import Type
from kiln.ops.interpreter import Interpreter
from kiln.ops.registry import REQUIRED, Attr, InferContext, RunContext, register

_BODIES: dict[int, Any] = {}


def _fused_infer(ctx: InferContext) -> list[Type]:
    body: Graph = ctx.attr("body")
    if len(body.inputs) != ctx.num_inputs:
        from kiln.errors import ShapeInferenceError

        raise ShapeInferenceError(f"Fused body takes {len(body.inputs)} inputs, node has {ctx.num_inputs}")
    return [v.type for v in body.outputs]


def _fused_reference(ctx: RunContext, inputs: list) -> list:
    """A fused group computes exactly what its body computes."""
    body: Graph = ctx.attr("body")
    interpreter = _BODIES.get(id(body))
    if interpreter is None or interpreter.graph is not body:
        interpreter = _BODIES[id(body)] = Interpreter(body)
    return interpreter.run(list(inputs))


register(
    "Fused",
    _fused_infer,
    domain="kiln",
    attrs={"body": Attr("graph", REQUIRED), "kind": Attr("string", "pointwise")},
    inputs=(0, -1),
    outputs=(1, -1),
    reference=_fused_reference,
    doc="A group of nodes compiled into one kernel (see kiln.passes.fuse).",
)


def _safe_softmax_reference(ctx: RunContext, inputs: list) -> list:
    """Softmax along ``axis`` with NaN results replaced by 0: exactly what exporters' pattern
    Where(IsNaN(Softmax(x)), 0, Softmax(x)) computes (NaN rows come from NaN or all -inf rows)."""
    import numpy as np

    x = inputs[0]
    axis = int(ctx.attr("axis"))
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        values = np.exp(shifted)
        values = values / np.sum(values, axis=axis, keepdims=True)
    return [np.where(np.isnan(values), np.zeros((), dtype=x.dtype), values).astype(x.dtype)]


register(
    "SafeSoftmax",
    lambda ctx: [ctx.input_types[0]],  # type: ignore[list-item]
    domain="kiln",
    attrs={"axis": Attr("int", -1)},
    inputs=1,
    outputs=1,
    reference=_safe_softmax_reference,
    doc="Softmax whose NaN outputs are 0 (the exporters' IsNaN+Where guard, as one op).",
)
