"""Algebraic simplification: a table of (op, rule, rewrite), applied to every node in one walk.

A rewrite returns the values that replace the node's outputs (existing values, or new ones it
emitted), or None when the rule does not apply. Rules only fire when the result has exactly the
type of what it replaces, so broadcasting is never silently changed. Runs anywhere; best after
fold_constants, which turns exporters' shape arithmetic into constants the rules can read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import DType, TensorType
from kiln.ops.registry import ops_with
from kiln.passes.rewrite import Rewriter

Rewrite = Callable[[Rewriter, Node, dict[Value, Node]], list[Value] | None]


def _same_type(a: Value | None, b: Value) -> bool:
    """Whether ``a`` can stand for ``b``: equal types whose shapes are known (two unknown-rank
    tensors of one dtype print alike but may differ, e.g. across a broadcast)."""
    if a is None or a.type != b.type:
        return False
    return not isinstance(a.type, TensorType) or a.type.shape is not None


def _is_constant(rw: Rewriter, value: Value | None, scalar: float) -> bool:
    array = rw.constant_value(value)
    return array is not None and array.size > 0 and bool(np.all(array == scalar))


def _identity(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    source = node.inputs[0]
    return [source] if _same_type(source, node.outputs[0]) else None  # type: ignore[list-item]


def _dropout(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    if len(node.outputs) > 1 or (len(node.inputs) > 2 and not _is_constant(rw, node.inputs[2], 0)):
        return None  # the mask is read, or training mode might be on
    return _identity(rw, node, producers)


def _neutral(position: int, scalar: float) -> Rewrite:
    """x op c -> x when c is all ``scalar`` (the other operand at ``1 - position``)."""

    def rewrite(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
        if not _is_constant(rw, node.inputs[position], scalar):
            return None
        other = node.inputs[1 - position]
        return [other] if _same_type(other, node.outputs[0]) else None  # type: ignore[list-item]

    return rewrite


def _transpose_pair(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    inner = producers.get(node.inputs[0])  # type: ignore[arg-type]
    if inner is None or inner.op != "Transpose":
        return None
    rank = node.outputs[0].type.rank  # type: ignore[union-attr]
    if rank is None:
        return None
    first = list(inner.attrs.get("perm") or range(rank)[::-1])
    second = list(node.attrs.get("perm") or range(rank)[::-1])
    combined = [first[p] for p in second]
    source = inner.inputs[0]
    if combined == list(range(rank)):
        return [source] if _same_type(source, node.outputs[0]) else None  # type: ignore[list-item]
    return rw.emit("Transpose", [source], {"perm": tuple(combined)}, hint=node.outputs[0].name)


def _identity_perm(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    perm = node.attrs.get("perm")
    if perm is not None and list(perm) == list(range(len(perm))):
        return _identity(rw, node, producers)
    return None


def _reshape_chain(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    inner = producers.get(node.inputs[0])  # type: ignore[arg-type]
    out_type = node.outputs[0].type
    if not isinstance(out_type, TensorType) or not out_type.is_static:
        return None
    source = node.inputs[0] if inner is None or inner.op not in _RESHAPES else inner.inputs[0]
    if _same_type(source, node.outputs[0]):
        return [source]  # type: ignore[list-item]
    if source is node.inputs[0]:
        return None
    shape = rw.add_constant(np.array(out_type.shape, dtype=np.int64), f"{node.outputs[0].name}_shape")
    return rw.emit("Reshape", [source, shape], {}, hint=node.outputs[0].name)


def _noop_reshape(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    return _identity(rw, node, producers)


def _cast_noop(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    return _identity(rw, node, producers)


_LOSSLESS = {
    (DType.FLOAT16, DType.FLOAT32),
    (DType.BFLOAT16, DType.FLOAT32),
    (DType.FLOAT32, DType.FLOAT64),
    (DType.FLOAT16, DType.FLOAT64),
    (DType.INT32, DType.INT64),
    (DType.INT8, DType.INT32),
    (DType.INT16, DType.INT32),
    (DType.UINT8, DType.INT32),
    (DType.BOOL, DType.INT64),
    (DType.INT32, DType.FLOAT64),
}


def _cast_chain(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    inner = producers.get(node.inputs[0])  # type: ignore[arg-type]
    if inner is None or inner.op != "Cast" or inner.inputs[0] is None:
        return None
    source = inner.inputs[0]
    if (source.type.dtype, inner.outputs[0].type.dtype) not in _LOSSLESS:  # type: ignore[union-attr]
        return None
    if _same_type(source, node.outputs[0]):
        return [source]
    return rw.emit("Cast", [source], dict(node.attrs), hint=node.outputs[0].name)


def _single_concat(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    return _identity(rw, node, producers) if len(node.inputs) == 1 else None


def _where_constant(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    condition = rw.constant_value(node.inputs[0])
    if condition is None or condition.size == 0:
        return None
    if bool(np.all(condition)) and _same_type(node.inputs[1], node.outputs[0]):
        return [node.inputs[1]]  # type: ignore[list-item]
    if not bool(np.any(condition)) and _same_type(node.inputs[2], node.outputs[0]):
        return [node.inputs[2]]  # type: ignore[list-item]
    return None


def _nan_guarded_softmax(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    condition, zero, value = node.inputs
    check = producers.get(condition)  # type: ignore[arg-type]
    softmax = producers.get(value)  # type: ignore[arg-type]
    if check is None or softmax is None or check.op != "IsNaN" or softmax.op != "Softmax" or softmax.domain:
        return None
    if check.inputs[0] is not value or not _is_constant(rw, zero, 0) or rw.constant_value(zero).size != 1:  # type: ignore[union-attr]
        return None
    if not _same_type(value, node.outputs[0]):
        return None
    attrs = {"axis": int(softmax.attrs.get("axis", -1))}
    return rw.emit(
        "SafeSoftmax", [softmax.inputs[0]], attrs, hint=node.outputs[0].name, name=softmax.name, domain="kiln"
    )


def _small_power(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    """x ^ 2 -> x * x, x ^ 3 -> x * x * x for float x (a scalar constant exponent): products are
    exact to one rounding each, and a pow() call per element is the slowest op of tanh-GELU."""
    base, exponent = node.inputs
    array = rw.constant_value(exponent)
    if array is None or array.size != 1 or not _same_type(base, node.outputs[0]):
        return None
    if not base.type.dtype.is_float:  # type: ignore[union-attr]
        return None
    power = float(array.reshape(-1)[0])
    if power not in (2.0, 3.0):
        return None
    (square,) = rw.emit("Mul", [base, base], hint=node.outputs[0].name, name=node.name)
    if power == 2.0:
        return [square]
    return rw.emit("Mul", [square, base], hint=node.outputs[0].name, name=node.name)


_RESHAPES = ops_with("reshape")


def _static_shape(value: Value | None) -> tuple[int, ...] | None:
    if value is None or not isinstance(value.type, TensorType) or not value.type.is_static:
        return None
    return tuple(int(d) for d in value.type.shape)  # type: ignore[union-attr]


def _sink_reshape(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    """E(Reshape(x), ...) -> Reshape(E(x, ...)): elementwise work moves before the reshape (a free
    view), so a MatMul/Conv and the elementwise ops after a reshape of its result become
    neighbours that fuse. Other operands must mean the same in both shapes: size-1 operands,
    operands of the output's own shape (reshaped too, a view), and, when the two shapes differ
    only by leading 1s, anything that broadcasts. Only reshapes that add dims are sunk."""
    if len(node.outputs) != 1:
        return None
    out_shape = _static_shape(node.outputs[0])
    reshaped = [
        v
        for v in node.inputs
        if v is not None and v in producers and producers[v].op in _RESHAPES and not producers[v].domain
    ]
    if out_shape is None or not reshaped:
        return None
    sources = {id(v): producers[v].inputs[0] for v in reshaped}
    source_shapes = {_static_shape(src) for src in sources.values()}
    if len(source_shapes) != 1 or None in source_shapes:
        return None
    (shape,) = source_shapes
    assert shape is not None
    if any(_static_shape(v) != out_shape for v in reshaped):
        return None  # the reshaped operand is broadcast: not a pure relabelling
    if len(shape) >= len(out_shape):
        # only towards fewer dims (GPT-2's 2-D Gemm rows reshaped back to [1, T, C]); the view
        # reshapes this inserts go the other way, so the rule never undoes itself
        return None
    only_leading_ones = (
        out_shape[-len(shape) :] == shape and set(out_shape[: -len(shape)]) <= {1}
        if len(shape) <= len(out_shape)
        else False
    )
    inputs: list[Value | None] = []
    for value in node.inputs:
        if value is None or id(value) in sources:
            inputs.append(sources.get(id(value)) if value is not None else None)
            continue
        other = _static_shape(value)
        if other is None:
            return None
        if int(np.prod(other)) == 1 and len(other) <= len(shape):
            inputs.append(value)
        elif other == out_shape:
            (view,) = rw.emit("Reshape", [value, rw.add_constant(np.array(shape, np.int64), "shape")], hint=value.name)
            inputs.append(view)
        elif only_leading_ones and len(other) <= len(shape) and np.broadcast_shapes(other, shape) == shape:
            inputs.append(value)
        else:
            return None
    (inner,) = rw.emit(node.op, inputs, dict(node.attrs), hint=node.outputs[0].name, name=node.name)
    if _static_shape(inner) != shape:
        return None
    return rw.emit(
        "Reshape", [inner, rw.add_constant(np.array(out_shape, np.int64), "shape")], hint=node.outputs[0].name
    )


def _flattened_batch_matmul(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    """MatMul(Reshape(a), Reshape(b)) -> Reshape(MatMul(a, b)) when both reshapes only merge the
    same leading batch dims ([B, H, L, D] -> [B*H, L, D]: what torch's decompositions make of a
    4-D matmul, bmm between views). The product keeps the model's own dims, so attention and the
    reshapes around it are recognized as when an exporter writes the 4-D MatMul."""
    operands = []
    for value in node.inputs:
        producer = producers.get(value)  # type: ignore[arg-type]
        if producer is None or producer.op not in _RESHAPES or producer.domain:
            return None
        source, flat = _static_shape(producer.inputs[0]), _static_shape(value)
        if source is None or flat is None or len(source) < 3 or len(flat) != 3:
            return None
        if flat != (int(np.prod(source[:-2])), *source[-2:]):
            return None
        operands.append((producer.inputs[0], source))
    (a, a_shape), (b, b_shape) = operands
    if a_shape[:-2] != b_shape[:-2] or _static_shape(node.outputs[0]) is None:
        return None
    (product,) = rw.emit("MatMul", [a, b], {}, hint=node.outputs[0].name, name=node.name)
    flat_shape = rw.add_constant(np.array(_static_shape(node.outputs[0]), np.int64), "shape")
    return rw.emit("Reshape", [product, flat_shape], hint=node.outputs[0].name)


def _whole_window_pool(rw: Rewriter, node: Node, producers: dict[Value, Node]) -> list[Value] | None:
    """AveragePool/MaxPool whose one window covers the whole input -> GlobalAveragePool/GlobalMaxPool
    (transformers' EfficientNet pools 7x7 maps with kernel 2560 and ceil_mode: a window loop
    of 2560x2560 taps, nearly all outside). An average must not count padding for this to hold."""
    x, out = node.inputs[0], node.outputs[0]
    shape, out_shape = _static_shape(x), _static_shape(out)
    if shape is None or out_shape is None or len(shape) < 3 or any(d != 1 for d in out_shape[2:]):
        return None
    spatial = len(shape) - 2
    kernel = list(node.attrs.get("kernel_shape", ()))
    pads = list(node.attrs.get("pads", (0,) * (2 * spatial)))
    dilations = list(node.attrs.get("dilations", (1,) * spatial))
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET" or len(kernel) != spatial or any(d != 1 for d in dilations):
        return None
    if any(p != 0 for p in pads[:spatial]) or any(k < d for k, d in zip(kernel, shape[2:], strict=True)):
        return None
    if node.op == "AveragePool" and int(node.attrs.get("count_include_pad", 0)) and any(p != 0 for p in pads):
        return None
    if len(node.outputs) > 1:
        return None
    return rw.emit("Global" + node.op, [x], hint=out.name, name=node.name)


RULES: list[tuple[str, str, Rewrite]] = [
    ("AveragePool", "AveragePool(x) with one window over all of x -> GlobalAveragePool(x)", _whole_window_pool),
    ("MaxPool", "MaxPool(x) with one window over all of x -> GlobalMaxPool(x)", _whole_window_pool),
    *[
        (
            op,
            "E(Reshape(x), ..) -> Reshape(E(x, ..)) (elementwise E; operands mean the same in both shapes)",
            _sink_reshape,
        )
        for op in sorted(ops_with("elementwise"))
    ],
    ("Identity", "Identity(x) -> x", _identity),
    ("Dropout", "Dropout(x) -> x (inference, mask unread)", _dropout),
    ("Add", "x + 0 -> x", _neutral(1, 0)),
    ("Add", "0 + x -> x", _neutral(0, 0)),
    ("Sub", "x - 0 -> x", _neutral(1, 0)),
    ("Mul", "x * 1 -> x", _neutral(1, 1)),
    ("Mul", "1 * x -> x", _neutral(0, 1)),
    ("Div", "x / 1 -> x", _neutral(1, 1)),
    ("Pow", "x ^ 1 -> x", _neutral(1, 1)),
    ("Pow", "x ^ 2 -> x * x; x ^ 3 -> x * x * x (float x, scalar exponent)", _small_power),
    (
        "MatMul",
        "MatMul(Reshape(a), Reshape(b)) merging the same batch dims -> Reshape(MatMul(a, b))",
        _flattened_batch_matmul,
    ),
    ("Transpose", "Transpose(x, identity perm) -> x", _identity_perm),
    ("Transpose", "Transpose(Transpose(x, p), q) -> Transpose(x, p[q]) (or x)", _transpose_pair),
    ("Reshape", "Reshape(Reshape|Flatten|Squeeze|Unsqueeze(x)) -> Reshape(x) (or x)", _reshape_chain),
    ("Flatten", "Flatten(x) to x's own shape -> x", _noop_reshape),
    ("Squeeze", "Squeeze(x) to x's own shape -> x", _noop_reshape),
    ("Unsqueeze", "Unsqueeze(x) to x's own shape -> x", _noop_reshape),
    ("Expand", "Expand(x) to x's own shape -> x", _noop_reshape),
    ("Cast", "Cast(x) to x's dtype -> x", _cast_noop),
    ("Cast", "Cast(Cast(x, wider)) -> Cast(x) when the inner cast is lossless", _cast_chain),
    ("Concat", "Concat(x) -> x", _single_concat),
    ("Where", "Where(all true, x, y) -> x; Where(all false, x, y) -> y", _where_constant),
    # NaN appears in a softmax row all-or-nothing, so the exporters' guard is exactly "zeros where
    # softmax would give NaN": one kernel instead of three ops (deleting it would need a proof)
    ("Where", "Where(IsNaN(Softmax(x)), 0, Softmax(x)) -> kiln::SafeSoftmax(x)", _nan_guarded_softmax),
]


def simplify(graph: Graph) -> Graph:
    """Apply ``RULES`` to every node (first rule that fires wins)."""
    by_op: dict[str, list[Rewrite]] = {}
    for op, _, rewrite in RULES:
        by_op.setdefault(op, []).append(rewrite)
    rewriter = Rewriter(graph)
    producers: dict[Value, Node] = {}
    for node in graph.nodes:
        node = rewriter.resolved(node)
        replacement = None
        if not node.domain:
            for rewrite in by_op.get(node.op, ()):
                replacement = rewrite(rewriter, node, producers)
                if replacement is not None:
                    break
        if replacement is None:
            rewriter.keep(node)
            for out in node.outputs:
                producers[out] = node
            continue
        for old, new in zip(node.outputs, replacement):
            rewriter.replace(old, new)
        rewriter.drop(node)
        for new in replacement:
            if new not in producers and rewriter.nodes and new in rewriter.nodes[-1].outputs:
                producers[new] = rewriter.nodes[-1]
    return rewriter.finish()
