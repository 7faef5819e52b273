"""Pre-quantized ONNX models (QDQ and QOperator) onto kiln's int8 products.

Two rewrites, run before constant folding (so the weights' DequantizeLinear is still visible):

``decompose_qlinear``: QOperator ops become their QDQ meaning, in ops kiln lowers natively:
QLinearConv -> DequantizeLinear(x), Conv(x, W, bias), QuantizeLinear(y) and QLinearMatMul ->
DequantizeLinear(a), DequantizeLinear(b), MatMul, QuantizeLinear(y), the constant weights and
int32 bias dequantized here (bias scale = x scale x weight scale). A model of QLinear ops then runs
as the QDQ model its quantizer would have written.

``annotate_qdq``: a MatMul or Conv whose activations are DequantizeLinear's output with constant
per-tensor scale and zero point (8-bit), and whose weights are constant (or DequantizeLinear of
constant int8 with zero point 0), gets ``kiln_qdq`` = [scale, zero point as unsigned, signed] and,
when the model gave them, ``kiln_qdq_weight_scale`` (per output channel). The lowering then runs
it on the int8 path with exactly the model's quantization: the float activations it reads are
already on the model's grid, so quantizing them again with the same scale and zero point gives
back the model's integers, and the weights come back from the model's int8 values. Every other
node keeps its float meaning (QuantizeLinear / DequantizeLinear as elementwise kernels).
"""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import DType
from kiln.ops.registry import has_trait
from kiln.passes.rewrite import Rewriter

EIGHT_BIT = (DType.UINT8, DType.INT8)


def quantized_model(graph: Graph) -> Graph:
    """Both rewrites; the graph unchanged when it has no quantization ops."""
    if not any(n.op in ("QLinearConv", "QLinearMatMul", "DequantizeLinear") for n in graph.nodes):
        return graph
    return annotate_qdq(decompose_qlinear(graph))


def decompose_qlinear(graph: Graph) -> Graph:
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        node = rewriter.resolved(node)
        if node.domain or node.op not in ("QLinearConv", "QLinearMatMul"):
            rewriter.keep(node)
            continue
        done = _conv(rewriter, node) if node.op == "QLinearConv" else _matmul(rewriter, node)
        if done:
            rewriter.drop(node)
        else:
            rewriter.keep(node)
    return rewriter.finish()


def _dequantize(rewriter: Rewriter, value: Value, scale: Value, zero: Value | None, axis: int, hint: str) -> Value:
    inputs = [value, scale] + ([zero] if zero is not None else [])
    return rewriter.emit("DequantizeLinear", inputs, {"axis": axis}, hint=hint)[0]


def _conv(rewriter: Rewriter, node: Node) -> bool:
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero = node.inputs[:8]
    bias = node.inputs[8] if len(node.inputs) > 8 else None
    hint = node.outputs[0].name
    xf = _dequantize(rewriter, x, x_scale, x_zero, 1, f"{hint}_x")  # type: ignore[arg-type]
    wf = _dequantize(rewriter, w, w_scale, w_zero, 0, f"{hint}_w")  # type: ignore[arg-type]
    inputs: list[Value | None] = [xf, wf]
    if bias is not None:
        b, xs, ws = (rewriter.constant_value(v) for v in (bias, x_scale, w_scale))
        if b is None or xs is None or ws is None:
            return False  # a bias whose scale is not known here: the op stays as it is
        inputs.append(rewriter.add_constant((b.astype(np.float64) * xs * ws).astype(np.float32), f"{hint}_b"))
    attrs = {k: v for k, v in node.attrs.items()}
    yf = rewriter.emit("Conv", inputs, attrs, hint=f"{hint}_f", name=node.name)[0]
    y = rewriter.emit("QuantizeLinear", [yf, y_scale, y_zero], {}, hint=hint)[0]
    rewriter.replace(node.outputs[0], y)
    return True


def _matmul(rewriter: Rewriter, node: Node) -> bool:
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = node.inputs[:8]
    hint = node.outputs[0].name
    # per-row scales of a (1-D [M]) run along axis -2, per-column scales of b along -1
    af = _dequantize(rewriter, a, a_scale, a_zero, -2, f"{hint}_a")  # type: ignore[arg-type]
    bf = _dequantize(rewriter, b, b_scale, b_zero, -1, f"{hint}_b")  # type: ignore[arg-type]
    yf = rewriter.emit("MatMul", [af, bf], {}, hint=f"{hint}_f", name=node.name)[0]
    y = rewriter.emit("QuantizeLinear", [yf, y_scale, y_zero], {}, hint=hint)[0]
    rewriter.replace(node.outputs[0], y)
    return True


def annotate_qdq(graph: Graph) -> Graph:
    producers = {v: n for n in graph.nodes for v in n.outputs}
    constants = graph.constants
    changed = False
    nodes = []
    for node in graph.nodes:
        annotation = (
            _annotation(node, producers, constants) if not node.domain and has_trait(node.op, "", "anchor") else None
        )
        if annotation is None:
            nodes.append(node)
            continue
        attrs = dict(node.attrs)
        attrs.update(annotation)
        nodes.append(Node(node.op, node.inputs, node.outputs, attrs, name=node.name, domain=node.domain))
        changed = True
    return graph.with_(nodes=nodes) if changed else graph


def _scalar(value: Value | None, constants) -> np.ndarray | None:  # type: ignore[no-untyped-def]
    if value is None or value not in constants:
        return None
    array = np.asarray(constants[value])
    return array if array.size == 1 else None


def _annotation(node: Node, producers, constants) -> dict | None:  # type: ignore[no-untyped-def]
    x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if x is None or w is None or (node.op == "Conv" and int(node.attrs.get("group", 1)) != 1):
        return None
    source = producers.get(x)
    if source is None or source.op != "DequantizeLinear" or source.domain:
        return None
    scale = _scalar(source.inputs[1], constants)
    zero_value = source.inputs[2] if len(source.inputs) > 2 else None
    quantized = source.inputs[0]
    dtype = zero_value.type.dtype if zero_value is not None else getattr(quantized.type, "dtype", None)  # type: ignore[union-attr]
    if scale is None or dtype not in EIGHT_BIT or float(scale.reshape(-1)[0]) <= 0:
        return None
    zero = int(_scalar(zero_value, constants).reshape(-1)[0]) if zero_value is not None else 0  # type: ignore[union-attr]
    if zero_value is not None and _scalar(zero_value, constants) is None:
        return None
    signed = dtype is DType.INT8
    annotation: dict = {"kiln_qdq": [float(scale.reshape(-1)[0]), zero + 128 if signed else zero, int(signed)]}
    weights = producers.get(w)
    if w in constants:
        return annotation
    if weights is None or weights.op != "DequantizeLinear" or weights.inputs[0] not in constants:
        return None
    q = np.asarray(constants[weights.inputs[0]])
    w_zero = weights.inputs[2] if len(weights.inputs) > 2 else None
    w_scale = constants.get(weights.inputs[1]) if weights.inputs[1] is not None else None
    if q.dtype != np.int8 or w_scale is None or (w_zero is not None and np.any(np.asarray(constants.get(w_zero, 1)))):
        return None
    w_scale = np.asarray(w_scale, np.float32).reshape(-1)
    channels = q.shape[0] if node.op == "Conv" else q.shape[-1]
    axis = int(weights.attrs.get("axis", 1))
    expected_axis = 0 if node.op == "Conv" else q.ndim - 1
    if w_scale.size == 1:
        w_scale = np.full(channels, w_scale[0], np.float32)
    elif w_scale.size != channels or (axis % q.ndim) != expected_axis:
        return None  # (blocked or other-axis weight scales: kiln quantizes those weights itself)
    annotation["kiln_qdq_weight_scale"] = [float(s) for s in w_scale]
    return annotation
