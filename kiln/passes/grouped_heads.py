"""Grouped-query attention without the repeated heads: each K/V head read in place by its group.

Grouped-query (and multi-query) attention has fewer K/V heads than query heads; Hugging Face's
``repeat_kv`` and the exporters' SDPA spell it as copies: ``Reshape(Expand(Unsqueeze(K, 2), [b,
h, G, t, d]), [b, h G, t, d])``, so every step writes G copies of the whole KV cache and the
attention reads them back (at 576 cached tokens of a 1B Llama, more time than the attention
itself). This pass rewrites an attention whose K and V are such repeats (``attention_group``'s
pattern: Q K^T, an elementwise chain, Softmax, . V) into its 5-D form over [b, h, G]: Q reshaped
to [b, h, G, s, d] (a view), K and V the unrepeated [b, h, 1, t, d] (broadcast over G: the
attention driver reads them with stride 0, ``attention_view``), the chain's operands lifted to
rank 5 (a [b, 1, s, t] mask gains its G axis; scalars and rank <= 2 operands broadcast as they
are), and the output back to [b, h G, s, d] (or, read by its Transpose to [b, s, h G, d], transposed
in 5-D so the fusion still folds that Transpose into the driver's strides). The repeats are left
to dead-code elimination. The computation is the same: each query head h G + g meets K/V head h.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.passes.fuse import attention_group, consumer_map, transpose_perm
from kiln.passes.rewrite import Rewriter, consumers_count


def group_heads(graph: Graph) -> Graph:
    producer = {v: n for n in graph.nodes for v in n.outputs}
    readers = consumers_count(graph)
    outputs = set(graph.outputs)
    consumer_of = consumer_map(graph)  # (attention_group checks each link is read once)
    plans: dict[int, tuple[Any, ...]] = {}  # id(second MatMul) -> the rewrite
    for node in graph.nodes:
        if node.op == "MatMul" and not node.domain:
            found = _grouped(node, consumer_of, readers, outputs, producer)
            if found is not None:
                plans[id(found[0][-1])] = found
    if not plans:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        rw.keep(node)
        if id(node) in plans:
            _rewrite(rw, *plans[id(node)], consumer_of, readers, outputs)
    return rw.finish()


def _repeat(value: Value, producer: dict[Value, Node]) -> tuple[Value, int] | None:
    """(K, G) when ``value`` [b, h G, t, d] is ``Reshape(Expand(K, [b, h, G, t, d]))`` of K [b, h,
    1, t, d] (any producer of K), else None."""
    reshape = producer.get(value)
    if reshape is None or reshape.op != "Reshape" or reshape.domain:
        return None
    expand = producer.get(reshape.inputs[0])  # type: ignore[arg-type]
    if expand is None or expand.op != "Expand" or expand.domain:
        return None
    single, repeated = expand.inputs[0], expand.outputs[0]
    shapes = [getattr(v.type, "shape", None) for v in (single, repeated, value)]  # type: ignore[union-attr]
    if any(s is None for s in shapes):
        return None
    one, many, merged = (tuple(s) for s in shapes)  # type: ignore[arg-type]
    if len(one) != 5 or len(many) != 5 or len(merged) != 4 or one[2] != 1 or not isinstance(many[2], int):
        return None
    heads, group = one[1], many[2]
    if not isinstance(heads, int) or group < 2 or (one[0], *one[3:]) != (many[0], *many[3:]) or one[1] != many[1]:
        return None
    if merged != (one[0], heads * group, one[3], one[4]):
        return None
    return single, group  # type: ignore[return-value]


def _grouped(first: Node, consumer_of, readers, outputs, producer):  # type: ignore[no-untyped-def]
    """(the attention's nodes, K, V, V's padding Where or None, query heads, G) where ``first`` starts an attention over
    repeated K/V heads the 5-D form can express, else None."""
    nodes, _ = attention_group(first, consumer_of, readers, outputs)
    if nodes is None:
        return None
    q, kt, v = first.inputs[0], first.inputs[1], nodes[-1].inputs[1]
    transpose = producer.get(kt)
    if transpose is None or transpose.op != "Transpose" or transpose.domain:
        return None
    if transpose_perm(transpose) != (0, 1, 3, 2):
        return None
    keys, values, masked = _repeat(transpose.inputs[0], producer), _repeat(v, producer), None
    where = producer.get(v)
    if values is None and where is not None and where.op == "Where" and not where.domain:
        # a padded length's V: Where(valid, V repeated, 0) (kiln.passes.padding), lifted to rank 5 too
        values, masked = _repeat(where.inputs[1], producer), where  # type: ignore[arg-type]
        if any(_lifted_axes(x) is None for x in (where.inputs[0], where.inputs[2])):  # type: ignore[arg-type]
            return None
    if keys is None or values is None or keys[1] != values[1]:
        return None
    q_shape = tuple(getattr(q.type, "shape", None) or ())  # type: ignore[union-attr]
    if len(q_shape) != 4 or q_shape[1] != keys[0].type.shape[1] * keys[1]:  # type: ignore[union-attr, index]
        return None
    links = {n.outputs[0] for n in nodes}
    for node in nodes[1:-1]:  # the chain's other operands must lift to rank 5
        if node.op in ("Softmax", "SafeSoftmax"):
            continue
        if node.attrs and node.op != "Cast":
            return None
        if any(x is not None and x not in links and _lifted_axes(x) is None for x in node.inputs):
            return None
    return nodes, keys[0], values[0], masked, q_shape[1], keys[1]


def _lifted_axes(value: Value) -> list[int] | None:
    """Where a chain operand gains axes to broadcast against [b, h, G, s, t] as it did against [b,
    h G, s, t]: [] (rank <= 2, or rank 3 with a leading 1), [2] ([b, 1, s, t]), None (it varies over
    the query heads: not lifted)."""
    shape = tuple(getattr(value.type, "shape", None) or ())  # type: ignore[union-attr]
    if getattr(value.type, "shape", None) is None:
        return None
    if len(shape) <= 2 or (len(shape) == 3 and shape[0] == 1):
        return []
    if len(shape) == 4 and shape[1] == 1:
        return [2]
    return None


def _lifted(rw: Rewriter, value: Value) -> Value:
    """A chain operand at rank 5 (``_lifted_axes``)."""
    axes = _lifted_axes(value)
    if not axes:
        return value
    (value,) = rw.emit("Unsqueeze", [value, rw.add_constant(np.array(axes, np.int64), "axes")], hint="grouped_operand")
    return value


def _rewrite(rw: Rewriter, nodes, keys, values, masked, heads, group, consumer_of, readers, outputs) -> None:  # type: ignore[no-untyped-def]
    """The 5-D attention, emitted where its second MatMul was (every input is defined by then)."""
    first, second = nodes[0], nodes[-1]
    if masked is not None:
        condition, fill = (_lifted(rw, x) for x in (masked.inputs[0], masked.inputs[2]))
        (values,) = rw.emit("Where", [condition, values, fill], hint="grouped_values")
    kv_heads, depth = heads // group, keys.type.shape[-1]
    shape = rw.add_constant(np.array([0, kv_heads, group, -1, depth], np.int64), "grouped_shape")
    (running,) = rw.emit("Reshape", [first.inputs[0], shape], hint="grouped_q")
    (kt,) = rw.emit("Transpose", [keys], {"perm": [0, 1, 2, 4, 3]}, hint="grouped_kt")
    (running,) = rw.emit("MatMul", [running, kt], hint="grouped_scores")
    link = first.outputs[0]
    for node in nodes[1:-1]:
        inputs = []
        for x in node.inputs:
            inputs.append(running if x is link else None if x is None else _lifted(rw, x))
        attrs = {**node.attrs, "axis": -1} if node.op in ("Softmax", "SafeSoftmax") else dict(node.attrs)
        (running,) = rw.emit(node.op, inputs, attrs, hint=f"grouped_{node.op.lower()}", domain=node.domain)
        link = node.outputs[0]
    (out,) = rw.emit("MatMul", [running, values], hint="grouped_out")  # [b, h, G, s, d]
    result = second.outputs[0]
    after = consumer_of.get(result)
    if after is not None and after.op == "Transpose" and not after.domain and readers.get(result, 0) == 1:
        if result not in outputs and transpose_perm(after) == (0, 2, 1, 3):  # [b, s, h G, d] as 5-D
            (moved,) = rw.emit("Transpose", [out], {"perm": [0, 3, 1, 2, 4]}, hint="grouped_moved")
            merged = rw.add_constant(np.array([0, 0, heads, depth], np.int64), "merged_shape")
            (back,) = rw.emit("Reshape", [moved, merged], hint="grouped_merged")
            rw.replace(after.outputs[0], back)
            return
    merged = rw.add_constant(np.array([0, heads, -1, depth], np.int64), "merged_shape")
    (back,) = rw.emit("Reshape", [out, merged], hint="grouped_merged")
    rw.replace(result, back)
