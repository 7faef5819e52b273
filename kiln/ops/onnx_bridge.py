"""Runs a standard op through onnx's per-op reference code (``onnx.reference.ops``).

kiln nodes are turned back into ``NodeProto`` form (attributes by the kinds the registry records)
and handed to the onnx op class for the op's canonical version. Only single ops go through here:
graphs, subgraphs and control flow are kiln's own interpreter's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kiln.ir.graph import Node
from kiln.ir.types import OptionalType, SequenceType, TensorType, Type
from kiln.ops.registry import OpDef


def type_to_proto(value_type: Type) -> onnx.TypeProto:
    if isinstance(value_type, TensorType):
        shape = None if value_type.shape is None else list(value_type.shape)
        return helper.make_tensor_type_proto(value_type.dtype.onnx_code, shape)
    if isinstance(value_type, SequenceType):
        return helper.make_sequence_type_proto(type_to_proto(value_type.elem))
    if isinstance(value_type, OptionalType):
        return helper.make_optional_type_proto(type_to_proto(value_type.elem))
    raise TypeError(f"no ONNX type for {value_type}")


def array_to_proto(array: np.ndarray, name: str = "") -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name=name)


_ATTR_TYPES = {
    "float": onnx.AttributeProto.FLOAT,
    "int": onnx.AttributeProto.INT,
    "string": onnx.AttributeProto.STRING,
    "floats": onnx.AttributeProto.FLOATS,
    "ints": onnx.AttributeProto.INTS,
    "strings": onnx.AttributeProto.STRINGS,
}


def attr_to_proto(name: str, value: Any, kind: str | None) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, array_to_proto(value))
    if isinstance(value, Type.__args__):  # type: ignore[attr-defined]
        return helper.make_attribute(name, type_to_proto(value))
    if kind in _ATTR_TYPES:
        if kind == "float":
            value = float(value)
        elif kind == "floats":
            value = [float(v) for v in value]
        return helper.make_attribute(name, value, attr_type=_ATTR_TYPES[kind])
    if isinstance(value, tuple):
        value = list(value)
    return helper.make_attribute(name, value)


def node_to_proto(node: Node, opdef: OpDef) -> onnx.NodeProto:
    inputs = ["" if v is None else f"i{k}" for k, v in enumerate(node.inputs)]
    outputs = [f"o{k}" for k in range(len(node.outputs))]
    proto = helper.make_node(node.op, inputs, outputs, name=node.name, domain=node.domain)
    for key, value in node.attrs.items():
        spec = opdef.attrs.get(key)
        proto.attribute.append(attr_to_proto(key, value, spec.kind if spec else None))
    return proto


def make_onnx_op(node: Node, opdef: OpDef, input_types: Sequence[Type | None]) -> Callable[..., tuple]:
    """A callable running ``node`` with onnx's implementation of the op at ``opdef.version``."""
    from onnx.reference.op_run import RuntimeContextError

    proto = node_to_proto(node, opdef)
    domain = node.domain or ""
    if domain:
        op_class = _domain_loader(domain)(domain, node.op, opdef.version)
    else:
        from onnx.reference.ops import load_op

        try:
            op_class = load_op(domain, node.op, opdef.version, evaluator_cls=_evaluator_class())
        except RuntimeContextError:
            types = [None if t is None else type_to_proto(t) for t in input_types]
            op_class = load_op(
                domain, node.op, opdef.version, node=proto, input_types=types, evaluator_cls=_evaluator_class()
            )
    run_params = {
        "log": lambda pattern, *args: None,
        "opsets": {domain: opdef.version, "": opdef.version if not domain else 21},
        "verbose": 0,
        "new_ops": None,
        "existing_functions": {},
        "evaluator_cls": _evaluator_class(),
    }
    instance = op_class(proto, run_params)

    def run(*inputs: Any) -> tuple:
        return instance.run(*inputs)

    return run


def _evaluator_class() -> type:
    # onnx implements some ops (those defined as ONNX functions) by evaluating their function body.
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator


def _domain_loader(domain: str) -> Callable[..., Any]:
    if domain == "ai.onnx.ml":
        from onnx.reference.ops.aionnxml._op_list import load_op
    elif domain == "ai.onnx.preview.training":
        from onnx.reference.ops.aionnx_preview_training._op_list import load_op
    elif domain == "ai.onnx.preview":
        from onnx.reference.ops.aionnx_preview._op_list import load_op
    else:
        raise NotImplementedError(f"onnx has no reference implementations for domain {domain!r}")
    return load_op
