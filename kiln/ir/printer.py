"""Text form of the graph IR. ``parse_graph(print_graph(g), tensor_data(g)) == g``.

    graph main(%x: f32[batch,4]) -> (%y) opsets {"": 17} {
      const %w: f32[4,4]                      # data by reference (tensor_data / parse's `data`)
      const %shape: i64[2] = [1, -1]          # small constants inline
      %h: f32[batch,4] = MatMul(%x, %w)
      %y: f32[batch,4] = Relu(%h) name="relu_1"
    }

Missing optional inputs print as ``_``; a non-default domain as ``ai.onnx.ml::LabelEncoder``;
attributes as ``{axis=1, pads=[0,0,1,1], mode="reflect", value=tensor<f32[]>[0.5], body=graph ...}``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from kiln.ir.graph import Graph, Node
from kiln.ir.types import DType, TensorType, Type

INLINE_LIMIT = 16  # tensors with at most this many elements are printed in the text


def print_graph(graph: Graph, indent: str = "") -> str:
    """The graph as text; large tensors appear by reference (see ``tensor_data``)."""
    return _Printer().graph(graph, indent)


def tensor_data(graph: Graph) -> dict[str, np.ndarray]:
    """The arrays that ``print_graph`` prints by reference, by the name it gives them."""
    data: dict[str, np.ndarray] = {}
    _collect(graph, data)
    return data


def _collect(graph: Graph, data: dict[str, np.ndarray]) -> None:
    for value, array in graph.constants.items():
        if not _inline(array):
            data[value.name] = array
    for node in graph.nodes:
        for key, attr in node.attrs.items():
            if isinstance(attr, np.ndarray) and not _inline(attr):
                data[_attr_ref(node, key)] = attr
        for sub in node.subgraphs():
            _collect(sub, data)


def _inline(array: np.ndarray) -> bool:
    if array.size > INLINE_LIMIT:
        return False
    kind = array.dtype.kind
    return kind in "biuf" or array.dtype == object or DType.from_numpy(array.dtype).is_float


def _attr_ref(node: Node, key: str) -> str:
    return f"{node.outputs[0].name}.{key}" if node.outputs else f"{node.name}.{key}"


def format_value_name(name: str) -> str:
    return "%" + (name if _plain(name) else json.dumps(name))


def _plain(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "_." for c in name)


def format_array(array: np.ndarray) -> str:
    flat = array.reshape(-1)
    if array.dtype == object:
        items = [json.dumps(x.decode() if isinstance(x, bytes) else str(x)) for x in flat]
    elif array.dtype == np.bool_:
        items = ["true" if x else "false" for x in flat]
    elif array.dtype.kind in "iu" or DType.from_numpy(array.dtype).is_integer:
        items = [str(int(x)) for x in flat]
    else:
        items = [_float(float(x)) for x in flat]
    return "[" + ", ".join(items) + "]"


def _float(x: float) -> str:
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return repr(x)


class _Printer:
    def graph(self, graph: Graph, indent: str) -> str:
        inputs = ", ".join(f"{format_value_name(v.name)}: {v.type}" for v in graph.inputs)
        outputs = ", ".join(format_value_name(v.name) for v in graph.outputs)
        opsets = json.dumps(dict(sorted(graph.opsets.items())))
        name = graph.name if _plain(graph.name) else json.dumps(graph.name)
        lines = [f"graph {name}({inputs}) -> ({outputs}) opsets {opsets} {{"]
        inner = indent + "  "
        for value, array in graph.constants.items():
            text = f"{inner}const {format_value_name(value.name)}: {value.type}"
            if _inline(array):
                text += f" = {format_array(array)}"
            lines.append(text)
        for node in graph.nodes:
            lines.append(inner + self.node(node, inner))
        lines.append(indent + "}")
        return "\n".join(lines)

    def node(self, node: Node, indent: str) -> str:
        outs = ", ".join(f"{format_value_name(v.name)}: {v.type}" for v in node.outputs)
        args = ", ".join("_" if v is None else format_value_name(v.name) for v in node.inputs)
        op = f"{node.domain}::{node.op}" if node.domain else node.op
        text = f"{outs} = {op}({args})" if node.outputs else f"{op}({args})"
        if node.attrs:
            attrs = ", ".join(f"{k}={self.attr(v, node, k, indent)}" for k, v in node.attrs.items())
            text += " {" + attrs + "}"
        if node.name:
            text += f" name={json.dumps(node.name)}"
        return text

    def attr(self, value: Any, node: Node, key: str, indent: str) -> str:
        if isinstance(value, Graph):
            return self.graph(value, indent)
        if isinstance(value, np.ndarray):
            head = f"tensor<{TensorType(DType.from_numpy(value.dtype), value.shape)}>"
            return head + (format_array(value) if _inline(value) else "@" + _attr_ref(node, key))
        if isinstance(value, tuple):
            return "[" + ", ".join(self.attr(v, node, key, indent) for v in value) + "]"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return _float(value) if not float(value).is_integer() else f"{value:.1f}"
        if isinstance(value, str):
            return json.dumps(value)
        if isinstance(value, bytes):
            return "b" + json.dumps(value.decode("latin-1"))
        if isinstance(value, (TensorType,)) or _is_type(value):
            return f"type<{value}>"
        return str(value)


def _is_type(value: Any) -> bool:
    return isinstance(value, Type.__args__)  # type: ignore[attr-defined]
