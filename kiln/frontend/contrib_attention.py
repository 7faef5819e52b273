"""ONNX Runtime's ``GroupQueryAttention`` (domain ``com.microsoft``) as the standard ops it computes
(``kiln.frontend.contrib`` says what its GenAI builder's other ops become and which forms are refused).

Per batch row b and new token t (of S), the token's position is p = seqlens_k[b] + 1 - S + t. Q
[B, S, heads x D] and the new K, V [B, S, kv_heads x D] (or one packed QKV) go to [B, heads, S, D];
with ``do_rotary`` both Q and K are rotated by the cos/sin caches' rows at p (the first 2 x the
caches' width of each head: halves, or even/odd pairs when ``rotary_interleaved``); the present K/V
are the past ones followed by the new; scores Q K^T x scale (softcap: c x tanh(s / c)) where key j
<= p (and j > p - local_window_size), -inf elsewhere; Softmax; . V; back to [B, S, heads x D]. Each
K/V head serves heads / kv_heads query heads (repeated by Expand/Reshape, which kiln's passes then
read in place).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from kiln.frontend.contrib import DOMAIN, Steps, attribute, float_input
from kiln.frontend.converters import GraphBuilder, converter
from kiln.ir.graph import Value
from kiln.ir.types import TensorType
from kiln.ops.inference import UnsupportedConstruct

REFUSED_INPUTS = {9: "position_ids", 10: "attention_bias", 11: "head_sink"}


def _shape(value: Value | None) -> tuple:
    return tuple(value.type.shape) if value is not None and isinstance(value.type, TensorType) and value.type.shape is not None else ()  # fmt: skip


def _slice(step: Steps, x: Value, start: int, end: int, axis: int = -1, every: int = 1) -> Value:
    consts = [step.const(np.array([v], np.int64), name) for v, name in ((start, "start"), (end, "end"), (axis, "axis"), (every, "step"))]  # fmt: skip
    return step("Slice", [x, *consts])


def _heads(step: Steps, x: Value, heads: int, depth: int) -> Value:
    """[B, S, heads x D] -> [B, heads, S, D]."""
    split = step("Reshape", [x, step.const(np.array([0, 0, heads, depth], np.int64), "heads")])
    return step("Transpose", [split], {"perm": [0, 2, 1, 3]})


def _rotated(step: Steps, x: Value, cos: Value, sin: Value, width: int, depth: int, interleaved: bool) -> Value:
    """x [B, H, S, D] with its first 2 x ``width`` features rotated (cos, sin: [B, 1, S, width])."""
    rot = x if 2 * width == depth else _slice(step, x, 0, 2 * width)
    if interleaved:
        first, second = _slice(step, rot, 0, 2 * width, every=2), _slice(step, rot, 1, 2 * width, every=2)
    else:
        first, second = _slice(step, rot, 0, width), _slice(step, rot, width, 2 * width)
    a = step("Sub", [step("Mul", [first, cos]), step("Mul", [second, sin])])
    b = step("Add", [step("Mul", [second, cos]), step("Mul", [first, sin])])
    if interleaved:
        axis = step.const(np.array([-1], np.int64), "last")
        pairs = step("Concat", [step("Unsqueeze", [a, axis]), step("Unsqueeze", [b, axis])], {"axis": -1})
        rotated = step("Reshape", [pairs, step.const(np.array([0, 0, 0, 2 * width], np.int64), "pairs")])
    else:
        rotated = step("Concat", [a, b], {"axis": -1})
    if 2 * width == depth:
        return rotated
    return step("Concat", [rotated, _slice(step, x, 2 * width, depth)], {"axis": -1})


def _positions(step: Steps, builder: GraphBuilder, proto: onnx.NodeProto, q: Value) -> Value:
    """[B, S] int64: seqlens_k[b] + 1 - S + t (``q``: [B, heads, S, D])."""
    last = builder.input(proto, 5)
    if last is None:
        raise UnsupportedConstruct("GroupQueryAttention without seqlens_k")
    count = step("Gather", [step("Shape", [q]), step.const(np.array(2, np.int64), "sequence_axis")], {"axis": 0})
    steps = step("Range", [step.const(np.array(0, np.int64), "zero"), count, step.const(np.array(1, np.int64), "unit")])
    first = step("Sub", [step("Add", [step("Cast", [last], {"to": onnx.TensorProto.INT64}), step.const(np.array(1, np.int64), "plus")]), count])  # fmt: skip
    return step("Add", [step("Unsqueeze", [first, step.const(np.array([1], np.int64), "col")]), steps])


def _present(step: Steps, past: Value | None, new: Value, name: str) -> Value:
    if past is None:
        return step("Identity", [new], out=name)
    return step("Concat", [past, new], {"axis": 2}, out=name)


def _repeat(step: Steps, x: Value, group: int, heads: int, depth: int) -> Value:
    if group == 1:
        return x
    wide = step("Unsqueeze", [x, step.const(np.array([2], np.int64), "group_axis")])
    many = step("Expand", [wide, step.const(np.array([1, 1, group, 1, 1], np.int64), "group")])
    return step("Reshape", [many, step.const(np.array([0, heads, -1, depth], np.int64), "merged")])


def _check(proto: onnx.NodeProto, builder: GraphBuilder, heads: int, kv_heads: int) -> None:
    for index, name in REFUSED_INPUTS.items():
        if builder.input(proto, index) is not None:
            raise UnsupportedConstruct(f"GroupQueryAttention with {name}")
    if int(attribute(proto, "smooth_softmax", 0)) or (len(proto.output) > 3 and proto.output[3]):
        raise UnsupportedConstruct("GroupQueryAttention with smooth_softmax or its QK output")
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise UnsupportedConstruct(f"GroupQueryAttention with num_heads {heads}, kv_num_heads {kv_heads}")


@converter("GroupQueryAttention", 1, DOMAIN)
def _group_query_attention(proto: onnx.NodeProto, builder: GraphBuilder, label: str) -> None:
    heads, kv_heads = int(attribute(proto, "num_heads", 0)), int(attribute(proto, "kv_num_heads", 0))
    _check(proto, builder, heads, kv_heads)
    step = Steps(builder, proto)
    q, k, v = (float_input(builder, proto, i) for i in range(3))
    width = _shape(q)[-1] if len(_shape(q)) == 3 else None
    if not isinstance(width, int):
        raise UnsupportedConstruct(
            "GroupQueryAttention's query is not [batch, sequence, hidden] with a known hidden size"
        )
    if k is None:  # packed [Q | K | V]
        depth = width // (heads + 2 * kv_heads)
        q, k, v = (_slice(step, q, a * depth, b * depth) for a, b in ((0, heads), (heads, heads + kv_heads), (heads + kv_heads, heads + 2 * kv_heads)))  # type: ignore[arg-type]  # fmt: skip
    else:
        depth = width // heads
    q, k, v = _heads(step, q, heads, depth), _heads(step, k, kv_heads, depth), _heads(step, v, kv_heads, depth)  # type: ignore[arg-type]
    positions = _positions(step, builder, proto, q)
    if int(attribute(proto, "do_rotary", 0)):
        caches = [builder.input(proto, 7), builder.input(proto, 8)]
        half = _shape(caches[0])[-1] if caches[0] is not None else None
        if any(c is None for c in caches) or not isinstance(half, int) or 2 * half > depth:
            raise UnsupportedConstruct("GroupQueryAttention's rotary caches are missing or wider than a head")
        axis = step.const(np.array([1], np.int64), "head_axis")
        cos, sin = (step("Unsqueeze", [step("Gather", [c, positions], {"axis": 0}), axis]) for c in caches)
        interleaved = bool(attribute(proto, "rotary_interleaved", 0))
        q, k = (_rotated(step, x, cos, sin, half, depth, interleaved) for x in (q, k))
    present_k = _present(step, builder.input(proto, 3), k, proto.output[1] if len(proto.output) > 1 else "")
    present_v = _present(step, builder.input(proto, 4), v, proto.output[2] if len(proto.output) > 2 else "")
    group = heads // kv_heads
    keys, values = _repeat(step, present_k, group, heads, depth), _repeat(step, present_v, group, heads, depth)
    scale = float(attribute(proto, "scale", 0.0)) or 1 / math.sqrt(depth)
    scores = step("Mul", [step("MatMul", [q, step("Transpose", [keys], {"perm": [0, 1, 3, 2]})]), step.const(np.array(scale, np.float32), "scale")])  # fmt: skip
    cap = float(attribute(proto, "softcap", 0.0))
    if cap > 0:
        capped = step("Tanh", [step("Mul", [scores, step.const(np.array(1 / cap, np.float32), "inverse_cap")])])
        scores = step("Mul", [capped, step.const(np.array(cap, np.float32), "cap")])
    total = step("Gather", [step("Shape", [present_k]), step.const(np.array(2, np.int64), "seq_axis")], {"axis": 0})
    key_index = step("Range", [step.const(np.array(0, np.int64), "first_key"), total, step.const(np.array(1, np.int64), "key_step")])  # fmt: skip
    at = step("Unsqueeze", [positions, step.const(np.array([1, 3], np.int64), "mask_axes")])  # [B, 1, S, 1]
    allowed = step("LessOrEqual", [key_index, at])
    window = int(attribute(proto, "local_window_size", -1))
    if window >= 0:
        recent = step("Greater", [key_index, step("Sub", [at, step.const(np.array(window, np.int64), "window")])])
        allowed = step("And", [allowed, recent])
    masked = step("Where", [allowed, scores, step.const(np.array(-np.inf, np.float32), "masked")])
    probabilities = step("Softmax", [masked], {"axis": -1})
    merged = step("Transpose", [step("MatMul", [probabilities, values])], {"perm": [0, 2, 1, 3]})
    step("Reshape", [merged, step.const(np.array([0, 0, heads * depth], np.int64), "hidden")], out=proto.output[0])
