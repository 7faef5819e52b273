"""Neural-network ops: convolution, pooling, matrix products, normalization, softmax, recurrences,
attention and losses (signal processing, optimizers, sampling and random: ``kiln.ops.signal``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import ShapeInferenceError
from kiln.ir import dims as sizes
from kiln.ir.types import Dim, DType, TensorType, Type
from kiln.ops.registry import InferContext, declare_trait, normalize_axis, register, same_as_input
from kiln.ops.symbolic_dims import as_expr, dim_of


def _spatial_out(
    ctx: InferContext,
    size: Dim,
    kernel: int,
    stride: int,
    dilation: int,
    pad_begin: int,
    pad_end: int,
    auto_pad: str,
    ceil_mode: bool = False,
) -> Dim:
    effective = dilation * (kernel - 1) + 1
    if not isinstance(size, int):
        return _symbolic_out(ctx, size, effective, stride, pad_begin + pad_end, auto_pad, ceil_mode)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return -(-size // stride)
    if auto_pad == "VALID":
        return max((size - effective) // stride + 1, 0)
    padded = size + pad_begin + pad_end - effective
    if padded < 0 and not (ceil_mode and -padded < stride):  # ceil_mode: one window that overhangs
        raise ShapeInferenceError(f"kernel {kernel} (dilation {dilation}) exceeds padded input {size}")
    if ceil_mode:
        out = -(-padded // stride) + 1
        if (out - 1) * stride >= size + pad_begin:  # the last window must start inside the input
            out -= 1
        return out
    return padded // stride + 1


def _symbolic_out(
    ctx: InferContext, size: str, effective: int, stride: int, pads: int, auto_pad: str, ceil: bool
) -> Dim:
    """A window's output length over a symbolic one, as its expression (``(h-1)//2+1``) where
    that is a length at every binding (0 or more; a smaller input is refused when the binding
    compiles), else a fresh symbol (ceil_mode, a window that may exceed the padded input)."""
    x = as_expr(size)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = sizes.floordiv(sizes.add(x, sizes.const(stride - 1)), stride)
    elif ceil or auto_pad == "VALID":
        return ctx.fresh()
    else:
        out = sizes.add(sizes.floordiv(sizes.add(x, sizes.const(pads - effective)), stride), sizes.const(1))
    if sizes.bounds(out)[0] < 0 or not sizes.nameable(out):
        return ctx.fresh()  # (a long chain of strided windows starts again from a fresh size)
    return dim_of(out)


def window_out(ctx: InferContext, data: TensorType, kernel: list[int], channels: Dim) -> tuple:
    """[N, channels, *spatial out] of a windowed op over NCHW ``data`` (the window's attributes
    checked: counts, integers, bounds; a window larger than the padded input refused)."""
    spatial = len(kernel)
    strides = ctx.attr_or("strides", (1,) * spatial)
    dilations = ctx.attr_or("dilations", (1,) * spatial)
    pads = ctx.attr_or("pads", (0,) * (2 * spatial))
    auto_pad = ctx.attr_or("auto_pad", "NOTSET")
    ceil_mode = bool(ctx.attr_or("ceil_mode", 0))
    assert data.shape is not None
    for name, values, count, low in (
        ("kernel_shape", kernel, spatial, 1),
        ("strides", strides, spatial, 1),
        ("dilations", dilations, spatial, 1),
        ("pads", pads, 2 * spatial, 0),
    ):
        if len(values) != count:
            raise ShapeInferenceError(f"{name} has {len(values)} values, expected {count} for {spatial} spatial dims")
        if any(not isinstance(v, int) or v < low for v in values):
            raise ShapeInferenceError(f"{name} {list(values)} must be integers >= {low}")
    dims = [
        _spatial_out(
            ctx, data.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i], pads[i + spatial], auto_pad, ceil_mode
        )
        for i in range(spatial)
    ]
    return (data.shape[0], channels, *dims)


def _conv(ctx: InferContext) -> list[Type]:
    op = ctx.node.op
    x_index, w_index = (0, 3) if op == "QLinearConv" else (0, 1)
    data, weight = ctx.tensor(x_index), ctx.tensor(w_index)
    dtype = {"ConvInteger": DType.INT32}.get(op, data.dtype)
    if op == "QLinearConv":
        dtype = ctx.dtype(7)
    if data.shape is None or weight.shape is None:
        return [TensorType(dtype, None)]
    kernel = ctx.attr("kernel_shape") or weight.shape[2:]
    if not all(isinstance(k, int) for k in kernel):
        return [TensorType(dtype, ctx.fresh_shape(len(data.shape)))]
    if len(data.shape) != len(kernel) + 2:
        raise ShapeInferenceError(f"input rank {len(data.shape)} does not match a {len(kernel)}-D kernel")
    group = ctx.attr("group") or 1
    if group < 1:
        raise ShapeInferenceError(f"group {group} must be >= 1")
    out_channels = weight.shape[0]
    if isinstance(out_channels, int) and out_channels % group:
        raise ShapeInferenceError(f"weight has {out_channels} output channels, not a multiple of group {group}")
    in_channels, weight_channels = data.shape[1], weight.shape[1]
    if isinstance(in_channels, int) and isinstance(weight_channels, int) and in_channels != weight_channels * group:
        raise ShapeInferenceError(
            f"input has {in_channels} channels but the weight expects {weight_channels} x group {group}"
        )
    return [TensorType(dtype, window_out(ctx, data, list(kernel), weight.shape[0]))]


def _conv_transpose(ctx: InferContext) -> list[Type]:
    data, weight = ctx.tensor(0), ctx.tensor(1)
    if data.shape is None or weight.shape is None:
        return [TensorType(data.dtype, None)]
    spatial = len(data.shape) - 2
    kernel = ctx.attr("kernel_shape") or weight.shape[2:]
    strides = ctx.attr("strides") or (1,) * spatial
    dilations = ctx.attr("dilations") or (1,) * spatial
    pads = ctx.attr("pads") or (0,) * (2 * spatial)
    out_pad = ctx.attr("output_padding") or (0,) * spatial
    output_shape = ctx.attr("output_shape")
    auto_pad = ctx.attr("auto_pad") or "NOTSET"
    group = ctx.attr("group") or 1
    channels = weight.shape[1] * group if isinstance(weight.shape[1], int) else ctx.fresh()
    dims: list[Dim] = []
    for i in range(spatial):
        size = data.shape[2 + i]
        if output_shape:
            dims.append(output_shape[-spatial + i])
        elif not isinstance(size, int):
            dims.append(ctx.fresh())
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            dims.append(size * strides[i])
        else:
            total = strides[i] * (size - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
            dims.append(total - pads[i] - pads[i + spatial])
    return [TensorType(data.dtype, (data.shape[0], channels, *dims))]


def _pool(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, None)] * ctx.num_outputs
    shape = window_out(ctx, data, list(ctx.attr("kernel_shape")), data.shape[1])
    types: list[Type] = [TensorType(data.dtype, shape)]
    if ctx.num_outputs > 1:
        types.append(TensorType(DType.INT64, shape))
    return types


def _global_pool_reference(ctx: Any, inputs: list[Any]) -> list[Any]:
    """Global pooling over every spatial axis (onnx's reference divides by zero on a batch of 0)."""
    x = np.asarray(inputs[0])
    axes = tuple(range(2, x.ndim))
    if ctx.node.op == "GlobalMaxPool":
        return [np.max(x, axis=axes, keepdims=True) if x.size else np.empty(x.shape[:2] + (1,) * len(axes), x.dtype)]
    if ctx.node.op == "GlobalLpPool":
        p = float(ctx.attr("p") or 2)
        return [(np.sum(np.abs(x) ** p, axis=axes, keepdims=True) ** (1.0 / p)).astype(x.dtype)]
    return [
        np.mean(x, axis=axes, keepdims=True, dtype=np.float64 if x.dtype == np.float64 else np.float32).astype(x.dtype)
    ]


def _pool_reference(ctx: Any, inputs: list[Any]) -> list[Any]:
    """MaxPool / AveragePool in NumPy. onnx's reference (1.23) reads asymmetric ``pads`` in the
    wrong order (it swaps the first axis's end pad with the second axis's begin pad), so kiln
    keeps its own; MaxPool's optional indices output and LpPool still go to onnx's."""
    node = ctx.node
    if node.op == "LpPool" or len(node.outputs) > 1:
        from kiln.ops.onnx_bridge import make_onnx_op

        return list(make_onnx_op(node, ctx.opdef, [v.type if v is not None else None for v in node.inputs])(*inputs))
    x = np.asarray(inputs[0])
    spatial = x.ndim - 2
    kernel = list(ctx.attr("kernel_shape"))
    strides = list(ctx.attr("strides") or (1,) * spatial)
    dilations = list(ctx.attr("dilations") or (1,) * spatial) if "dilations" in ctx.opdef.attrs else [1] * spatial
    pads = list(ctx.attr("pads") or (0,) * (2 * spatial))
    auto_pad = ctx.attr("auto_pad") or "NOTSET"
    ceil_mode = bool(ctx.attr("ceil_mode") or 0)
    begin, end, outs = [], [], []
    for i in range(spatial):
        size, k, s, d = x.shape[2 + i], kernel[i], strides[i], dilations[i]
        pb, pe = (pads[i], pads[i + spatial]) if auto_pad == "NOTSET" else (0, 0)
        out = _spatial_out(None, size, k, s, d, pb, pe, auto_pad, ceil_mode)  # type: ignore[arg-type]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = max((out - 1) * s + d * (k - 1) + 1 - size, 0)
            pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pe = total - pb
        begin.append(pb)
        end.append(pe)
        outs.append(out)
    # taps that start past the end pad read nothing in any window (a ceil-mode window may overhang
    # the input by almost a whole kernel: EfficientNet's 2560-wide pool of a 7x7 map)
    kernel = [min(kernel[i], -(-(x.shape[2 + i] + begin[i] + end[i]) // dilations[i])) for i in range(spatial)]
    # room for windows that run past the end pad (ceil mode) without being part of the padding
    extra = [
        max((outs[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - (x.shape[2 + i] + begin[i] + end[i]), 0)
        for i in range(spatial)
    ]
    width = [(0, 0), (0, 0)] + [(begin[i], end[i] + extra[i]) for i in range(spatial)]
    is_max = node.op == "MaxPool"
    if is_max:
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        padded = np.pad(x, width, constant_values=fill)
    else:
        padded = np.pad(x.astype(np.float64), width)
        inside = np.pad(np.ones(x.shape[2:]), width[2:])  # 1 on real elements
        in_pads = np.pad(np.ones([x.shape[2 + i] + begin[i] + end[i] for i in range(spatial)]), [(0, e) for e in extra])
        counts = in_pads if ctx.attr("count_include_pad") else inside
    result = None
    divisor = None
    for offset in np.ndindex(*kernel):
        window = tuple(
            slice(offset[i] * dilations[i], offset[i] * dilations[i] + (outs[i] - 1) * strides[i] + 1, strides[i])
            for i in range(spatial)
        )
        part = padded[(slice(None), slice(None), *window)]
        if is_max:
            result = part if result is None else np.maximum(result, part)
        else:
            result = part if result is None else result + part
            weight = counts[window]
            divisor = weight if divisor is None else divisor + weight
    assert result is not None
    if not is_max:
        result = (result / np.maximum(divisor, 1)).astype(x.dtype)
    return [np.ascontiguousarray(result)]


def _global_pool(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    return [TensorType(data.dtype, (*data.shape[:2], *([1] * (len(data.shape) - 2))))]


def _max_unpool(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if ctx.has(2):
        target = ctx.dims_value(2)
        return [TensorType(data.dtype, tuple(target) if target else ctx.fresh_shape(data.rank))]
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    kernel = ctx.attr("kernel_shape")
    spatial = len(kernel)
    strides = ctx.attr("strides") or (1,) * spatial
    pads = ctx.attr("pads") or (0,) * (2 * spatial)
    dims = [
        (d - 1) * strides[i] + kernel[i] - pads[i] - pads[i + spatial] if isinstance(d, int) else ctx.fresh()
        for i, d in enumerate(data.shape[2:])
    ]
    return [TensorType(data.dtype, (*data.shape[:2], *dims))]


def _roi_pool(ctx: InferContext) -> list[Type]:
    data, rois = ctx.tensor(0), ctx.tensor(1)
    rois_count = rois.shape[0] if rois.shape else ctx.fresh()
    channels = data.shape[1] if data.shape else ctx.fresh()
    if ctx.node.op == "MaxRoiPool":
        height, width = ctx.attr("pooled_shape")
    else:
        height, width = ctx.attr("output_height"), ctx.attr("output_width")
    return [TensorType(data.dtype, (rois_count, channels, height, width))]


def _matmul_shape(ctx: InferContext, a: tuple | None, b: tuple | None) -> tuple | None:
    from kiln.ops.registry import broadcast_shapes

    if a is None or b is None:
        return None
    if not a or not b:
        raise ShapeInferenceError("MatMul inputs must have rank >= 1")
    a_2d = (1, *a) if len(a) == 1 else a
    b_2d = (*b, 1) if len(b) == 1 else b
    inner_a, inner_b = a_2d[-1], b_2d[-2]
    if isinstance(inner_a, int) and isinstance(inner_b, int) and inner_a != inner_b:
        raise ShapeInferenceError(f"MatMul inner dims differ: {list(a)} @ {list(b)}")
    batch = broadcast_shapes(ctx, a_2d[:-2], b_2d[:-2])
    assert batch is not None
    shape = (*batch, a_2d[-2], b_2d[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b) == 1:
        shape = shape[:-1]
    return shape


def _matmul(ctx: InferContext) -> list[Type]:
    op = ctx.node.op
    if op == "QLinearMatMul":
        shape = _matmul_shape(ctx, ctx.shape(0), ctx.shape(3))
        return [TensorType(ctx.dtype(7), shape)]
    dtype = DType.INT32 if op == "MatMulInteger" else ctx.dtype(0)
    return [TensorType(dtype, _matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def _gemm(ctx: InferContext) -> list[Type]:
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None:
        return [TensorType(ctx.dtype(0), ctx.fresh_shape(2))]
    if len(a) != 2 or len(b) != 2:
        raise ShapeInferenceError(f"Gemm needs 2-D inputs, got ranks {len(a)} and {len(b)}")
    m = a[1] if ctx.attr("transA") else a[0]
    n = b[0] if ctx.attr("transB") else b[1]
    return [TensorType(ctx.dtype(0), (m, n))]


def _einsum(ctx: InferContext) -> list[Type]:
    equation = ctx.attr("equation").replace(" ", "")
    inputs_part, _, output_part = equation.partition("->")
    terms = inputs_part.split(",")
    letters: dict[str, Dim] = {}
    ellipsis: tuple = ()
    for index, term in enumerate(terms):
        shape = ctx.shape(index)
        if shape is None:
            return [TensorType(ctx.dtype(0), None)]
        if "..." in term:
            head, tail = term.split("...")
            ell_rank = len(shape) - len(head) - len(tail)
            ell = shape[len(head) : len(head) + ell_rank]
            if len(ell) > len(ellipsis):
                ellipsis = tuple(ell)
            named = list(zip(head, shape[: len(head)])) + list(zip(tail, shape[len(shape) - len(tail) :]))
        else:
            if len(term) != len(shape):
                raise ShapeInferenceError(f"einsum term {term!r} does not match rank {len(shape)}")
            named = list(zip(term, shape))
        for letter, dim in named:
            if letters.get(letter) in (None, 1):
                letters[letter] = dim
    if "->" not in equation:
        counts = {c: inputs_part.count(c) for c in letters}
        output_part = ("..." if ellipsis else "") + "".join(sorted(c for c, n in counts.items() if n == 1))
    head, _, tail = output_part.partition("...")
    middle = list(ellipsis) if "..." in output_part else []
    shape = [letters[c] for c in head] + middle + [letters[c] for c in tail]
    return [TensorType(ctx.dtype(0), tuple(shape))]


def _batch_norm(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    types: list[Type] = [TensorType(data.dtype, data.shape)]
    for index in (3, 4)[: ctx.num_outputs - 1]:
        types.append(ctx.tensor(index))
    return types


def _layer_norm(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    types: list[Type] = [TensorType(data.dtype, data.shape)]
    if ctx.num_outputs > 1:
        stash = DType.from_onnx(int(ctx.attr("stash_type") or 1))
        if data.shape is None:
            stat = TensorType(stash, None)
        else:
            axis = normalize_axis(ctx.attr("axis"), len(data.shape))
            stat = TensorType(stash, (*data.shape[:axis], *([1] * (len(data.shape) - axis))))
        types.extend([stat] * (ctx.num_outputs - 1))
    return types


def _reduce(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    keepdims = bool(ctx.attr("keepdims"))
    if ctx.node.op in ("ArgMax", "ArgMin"):
        dtype, axes = DType.INT64, [ctx.attr("axis")]
    else:
        dtype = data.dtype
        axes = ctx.ints_value(1) if ctx.has(1) else []
        if axes is None:
            rank = data.rank
            return [TensorType(dtype, ctx.fresh_shape(rank if keepdims else None))]
    if data.shape is None:
        return [TensorType(dtype, None)]
    rank = len(data.shape)
    if not axes:
        if ctx.node.op not in ("ArgMax", "ArgMin") and ctx.attr("noop_with_empty_axes"):
            return [TensorType(dtype, data.shape)]
        axes = list(range(rank))
    axes = {normalize_axis(a, rank) for a in axes}
    if keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(data.shape))
    else:
        shape = tuple(d for i, d in enumerate(data.shape) if i not in axes)
    return [TensorType(dtype, shape)]


def _recurrent(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    hidden = ctx.attr("hidden_size")
    directions = 2 if ctx.attr("direction") == "bidirectional" else 1
    layout = ctx.attr("layout") or 0
    if data.shape is None:
        seq, batch = ctx.fresh(), ctx.fresh()
    else:
        seq, batch = (data.shape[0], data.shape[1]) if layout == 0 else (data.shape[1], data.shape[0])
    if hidden is None:
        weight = ctx.shape(2)
        hidden = weight[-1] if weight else ctx.fresh()
    if layout == 0:
        y = (seq, directions, batch, hidden)
        state = (directions, batch, hidden)
    else:
        y = (batch, seq, directions, hidden)
        state = (batch, directions, hidden)
    types = [TensorType(data.dtype, y), TensorType(data.dtype, state), TensorType(data.dtype, state)]
    return types[: ctx.num_outputs]


def _attention(ctx: InferContext) -> list[Type]:
    q, k, v = ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)
    dtype = q.dtype
    if q.shape is None or k.shape is None or v.shape is None:
        return [TensorType(dtype, None)] * ctx.num_outputs
    if len(q.shape) == 4:
        batch, q_heads, q_seq, _ = q.shape
        kv_heads, kv_seq, head_size = k.shape[1], k.shape[2], k.shape[3]
        v_head = v.shape[3]
        y: tuple = (batch, q_heads, q_seq, v_head)
    else:
        batch, q_seq = q.shape[0], q.shape[1]
        q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        if not q_heads or not kv_heads:
            raise ShapeInferenceError("3-D Attention inputs need q_num_heads and kv_num_heads")
        kv_seq = k.shape[1]
        head_size = k.shape[2] // kv_heads if isinstance(k.shape[2], int) else ctx.fresh()
        v_head = v.shape[2] // kv_heads if isinstance(v.shape[2], int) else ctx.fresh()
        y = (batch, q_seq, q_heads * v_head if isinstance(v_head, int) else ctx.fresh())
    total = kv_seq
    if ctx.has(4):
        past = ctx.shape(4)
        past_seq = past[2] if past else ctx.fresh()
        total = past_seq + kv_seq if isinstance(past_seq, int) and isinstance(kv_seq, int) else ctx.fresh()
    types: list[Type] = [TensorType(dtype, y)]
    if ctx.num_outputs > 1:
        types.append(TensorType(dtype, (batch, kv_heads, total, head_size)))
    if ctx.num_outputs > 2:
        types.append(TensorType(dtype, (batch, kv_heads, total, v_head)))
    if ctx.num_outputs > 3:
        types.append(TensorType(dtype, (batch, q_heads, q_seq, total)))
    return types


def _loss(ctx: InferContext) -> list[Type]:
    scores, target = ctx.tensor(0), ctx.tensor(1)
    loss_shape = target.shape if ctx.attr("reduction") == "none" else ()
    types: list[Type] = [TensorType(scores.dtype, loss_shape)]
    if ctx.num_outputs > 1:
        types.append(TensorType(scores.dtype, scores.shape))
    return types


def _causal_conv(ctx: InferContext) -> list[Type]:
    data, weight = ctx.tensor(0), ctx.tensor(1)
    types: list[Type] = [TensorType(data.dtype, data.shape)]
    if ctx.num_outputs > 1:
        if ctx.has(3):
            types.append(ctx.tensor(3))
        elif data.shape is not None and weight.shape is not None and isinstance(weight.shape[-1], int):
            types.append(TensorType(data.dtype, (data.shape[0], data.shape[1], weight.shape[-1] - 1)))
        else:
            types.append(TensorType(data.dtype, None))
    return types


def _linear_attention(ctx: InferContext) -> list[Type]:
    q, v = ctx.tensor(0), ctx.tensor(2)
    if q.shape is None or v.shape is None:
        return [TensorType(q.dtype, None)] * ctx.num_outputs
    if len(q.shape) == 4:
        y: tuple = (*q.shape[:3], v.shape[3])
        state: Type = TensorType(q.dtype, (q.shape[0], v.shape[1], q.shape[3], v.shape[3]))
    else:
        q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        v_width = v.shape[2]
        if q_heads and kv_heads and isinstance(v_width, int):
            width: Dim = q_heads * (v_width // kv_heads)
        else:
            width = ctx.fresh()
        y = (q.shape[0], q.shape[1], width)
        state = ctx.tensor(3) if ctx.has(3) else TensorType(q.dtype, ctx.fresh_shape(4))
    return [TensorType(q.dtype, y), state][: ctx.num_outputs]


def _flex_attention(ctx: InferContext) -> list[Type]:
    q, v = ctx.tensor(0), ctx.tensor(2)
    if q.shape is None or v.shape is None:
        return [TensorType(q.dtype, None)]
    return [TensorType(q.dtype, (*q.shape[:-1], v.shape[-1]))]


def _register() -> None:
    for op in ("Conv", "ConvInteger", "QLinearConv", "DeformConv"):
        register(op, _conv)
    register("ConvTranspose", _conv_transpose)
    for op in ("MaxPool", "AveragePool", "LpPool"):
        register(op, _pool, reference=_pool_reference)
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        register(op, _global_pool, reference=_global_pool_reference)
    register("MaxUnpool", _max_unpool)
    register("MaxRoiPool", _roi_pool)
    register("RoiAlign", _roi_pool)
    for op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        register(op, _matmul)
    register("Gemm", _gemm)
    register("Einsum", _einsum)
    register("BatchNormalization", _batch_norm)
    register("LayerNormalization", _layer_norm)
    for op in (
        "InstanceNormalization GroupNormalization RMSNormalization LRN LpNormalization "
        "MeanVarianceNormalization Softmax LogSoftmax Hardmax CumSum CumProd RotaryEmbedding"
    ).split():
        register(op, same_as_input())
    for op in (
        "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum "
        "ReduceLogSumExp ReduceSumSquare ArgMax ArgMin"
    ).split():
        register(op, _reduce)
    for op in ("RNN", "GRU", "LSTM"):
        register(op, _recurrent)
    register("Attention", _attention)
    register("NegativeLogLikelihoodLoss", _loss)
    register("SoftmaxCrossEntropyLoss", _loss)
    register("CausalConvWithState", _causal_conv)
    register("LinearAttention", _linear_attention)
    register("FlexAttention", _flex_attention, domain="ai.onnx.preview")
    register("SwiGLU", _swiglu)


def _swiglu(ctx: InferContext) -> list[Type]:
    from kiln.ops.registry import broadcast_shapes

    if ctx.has(1):
        return [TensorType(ctx.dtype(0), broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1)))]
    shape = ctx.shape(0)
    if shape is None:
        return [TensorType(ctx.dtype(0), None)]
    last = shape[-1]
    half = last // 2 if isinstance(last, int) else ctx.fresh()
    return [TensorType(ctx.dtype(0), (*shape[:-1], half))]


def _declare_traits() -> None:
    # the engine's two customers: output tiles take a fused epilogue, blocking is tuned
    declare_trait("anchor", ("Conv", "MatMul"))
    declare_trait("tunable", ("Conv", "MatMul"))


_register()
_declare_traits()
