"""Shape manipulation, indexing and data movement ops.

Shape tensors get symbolic contents (``ctx.out_symbolic``) so that ``Shape -> Gather -> Concat ->
Reshape`` chains keep ``batch`` and ``seq`` symbolic instead of losing them.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.errors import ShapeInferenceError
from kiln.ir import dims as sizes
from kiln.ir.sized import regrouped
from kiln.ir.types import Dim, DType, TensorType, Type
from kiln.ops.registry import (
    InferContext,
    RunContext,
    broadcast_shapes,
    declare_trait,
    normalize_axis,
    register,
    same_as_input,
)
from kiln.ops.symbolic_dims import (
    arranged,
    as_expr,
    carry_contents,
    dim_of,
    quotient,
    sliced_to_sizes,
    symbolic_product,
)

INT64_MAX = 2**63 - 1


def _reshape(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    target = ctx.dims_value(1)
    allow_zero = bool(ctx.attr("allowzero"))
    if target is None:
        target_shape = ctx.shape(1)
        rank = target_shape[0] if target_shape and isinstance(target_shape[0], int) else None
        return [TensorType(data.dtype, ctx.fresh_shape(rank))]
    dims: list[Dim] = []
    infer_at = None
    for axis, dim in enumerate(target):
        if dim == 0 and not allow_zero:
            if data.shape is None or axis >= len(data.shape):
                raise ShapeInferenceError(f"shape entry 0 at axis {axis} copies a missing dim")
            dims.append(data.shape[axis])
        elif dim == -1:
            if infer_at is not None:
                raise ShapeInferenceError("more than one -1 in the target shape")
            infer_at = axis
            dims.append(1)
        elif isinstance(dim, int) and dim < -1:
            raise ShapeInferenceError(f"invalid target dim {dim}")
        else:
            dims.append(dim)
    if infer_at is not None:
        if data.shape is None:
            dims[infer_at] = ctx.fresh()
        else:
            rest = [d for i, d in enumerate(dims) if i != infer_at]
            dims[infer_at] = quotient(ctx, list(data.shape), rest)
    elif data.is_static and all(isinstance(d, int) for d in dims):
        if math.prod(data.shape) != math.prod(dims):  # type: ignore[arg-type]
            raise ShapeInferenceError(f"cannot reshape {data} to {list(dims)}")
    if data.shape is not None:
        dims = regrouped(tuple(data.shape), dims)  # a folded target keeps the sizes' expressions
        carry_contents(ctx, tuple(dims), lambda contents: contents)  # a shape vector stays itself
    return [TensorType(data.dtype, tuple(dims))]


def _flatten(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, ctx.fresh_shape(2))]
    rank = len(data.shape)
    axis = ctx.attr("axis")
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        raise ShapeInferenceError(f"axis {ctx.attr('axis')} is out of range for rank {rank}")
    outer = symbolic_product(ctx, data.shape[:axis]) if axis else 1
    inner = symbolic_product(ctx, data.shape[axis:])
    return [TensorType(data.dtype, (outer, inner))]


def _squeeze(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    axes = ctx.ints_value(1) if ctx.has(1) else None
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    if axes is None:
        if ctx.has(1):
            return [TensorType(data.dtype, None)]
        if any(isinstance(d, str) for d in data.shape):
            return [TensorType(data.dtype, None)]
        shape = tuple(d for d in data.shape if d != 1)
        carry_contents(ctx, shape, lambda dims: dims)  # a size [n] squeezed to a scalar stays n
        return [TensorType(data.dtype, shape)]
    rank = len(data.shape)
    axes = {normalize_axis(a, rank) for a in axes}
    for axis in axes:
        if isinstance(data.shape[axis], int) and data.shape[axis] != 1:
            raise ShapeInferenceError(f"cannot squeeze axis {axis} of size {data.shape[axis]}")
    shape = tuple(d for i, d in enumerate(data.shape) if i not in axes)
    carry_contents(ctx, shape, lambda dims: dims)
    return [TensorType(data.dtype, shape)]


def _unsqueeze(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    axes = ctx.ints_value(1)
    if data.shape is None or axes is None:
        rank = None
        if data.shape is not None and ctx.shape(1) and isinstance(ctx.shape(1)[0], int):
            rank = len(data.shape) + ctx.shape(1)[0]
        return [TensorType(data.dtype, ctx.fresh_shape(rank))]
    rank = len(data.shape) + len(axes)
    axes_set = {normalize_axis(a, rank) for a in axes}
    if len(axes_set) != len(axes):
        raise ShapeInferenceError(f"repeated axes {axes}")
    source = iter(data.shape)
    shape = tuple(1 if i in axes_set else next(source) for i in range(rank))
    carry_contents(ctx, shape, lambda dims: dims)
    return [TensorType(data.dtype, shape)]


def _transpose(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    perm = ctx.attr("perm")
    perm = list(range(rank))[::-1] if perm is None else [normalize_axis(p, rank) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise ShapeInferenceError(f"perm {list(perm)} is not a permutation of {rank} axes")
    arranged(ctx, lambda grid: grid.transpose(perm))
    return [TensorType(data.dtype, tuple(data.shape[p] for p in perm))]


def _concat(ctx: InferContext) -> list[Type]:
    types = [ctx.tensor(i) for i in range(ctx.num_inputs)]
    dtype = types[0].dtype
    shapes = [t.shape for t in types]
    if any(s is None for s in shapes):
        known = next((s for s in shapes if s is not None), None)
        return [TensorType(dtype, ctx.fresh_shape(None if known is None else len(known)))]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise ShapeInferenceError(f"inputs have different ranks: {[len(s) for s in shapes]}")
    axis = normalize_axis(ctx.attr("axis"), rank)
    dims: list[Dim] = []
    for i in range(rank):
        column = [s[i] for s in shapes]
        if i == axis:
            if all(isinstance(d, int) for d in column):
                dims.append(sum(column))
            else:
                # the sum of the pieces' sizes (a KV cache's [past] joined with [1] is past+1)
                dims.append(dim_of(sizes.add(*(as_expr(d) for d in column))))
        else:
            static = {d for d in column if isinstance(d, int)}
            if len(static) > 1:
                raise ShapeInferenceError(f"inputs disagree on dim {i}: {column}")
            dims.append(static.pop() if static else column[0])
    parts = [ctx.integers_value(i) for i in range(ctx.num_inputs)] if rank == 1 else []
    for i, part in enumerate(parts):  # a piece of unknown contents but known length: fresh dims (not
        length = shapes[i][0]  # named by the value: a name may stand for other values after rewrites)
        if part is None and isinstance(length, int) and any(p is not None for p in parts):
            parts[i] = tuple(ctx.fresh() for _ in range(length))
    if parts and all(p is not None for p in parts):
        ctx.out_symbolic[0] = tuple(d for p in parts for d in p)  # type: ignore[union-attr]
    return [TensorType(dtype, tuple(dims))]


def _split(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    count = ctx.num_outputs
    if data.shape is None:
        return [TensorType(data.dtype, None)] * count
    rank = len(data.shape)
    axis = normalize_axis(ctx.attr("axis"), rank)
    dim = data.shape[axis]
    sizes: list[Dim] | None = ctx.ints_value(1) if ctx.has(1) else None
    if sizes is None and ctx.has(1):
        sizes = [ctx.fresh() for _ in range(count)]
    if sizes is None:
        if isinstance(dim, int):
            # Equal chunks of ceil(dim / count); trailing chunks are cut at the end of the dim.
            chunk = -(-dim // count)
            sizes = [max(0, min(dim, (i + 1) * chunk) - min(dim, i * chunk)) for i in range(count)]
        else:
            sizes = [ctx.fresh() for _ in range(count)]
    if len(sizes) != count:
        raise ShapeInferenceError(f"split has {len(sizes)} sizes for {count} outputs")
    if isinstance(dim, int) and all(isinstance(s, int) for s in sizes) and sum(sizes) != dim:
        raise ShapeInferenceError(f"split sizes {sizes} do not add up to dim {dim}")
    return [TensorType(data.dtype, (*data.shape[:axis], size, *data.shape[axis + 1 :])) for size in sizes]


def _slice(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    starts, ends = ctx.ints_value(1), ctx.ints_value(2)
    axes = ctx.ints_value(3) if ctx.has(3) else None
    steps = ctx.ints_value(4) if ctx.has(4) else None
    known = starts is not None and (axes is not None or not ctx.has(3)) and (steps is not None or not ctx.has(4))
    symbolic_ends = ctx.dims_value(2) if known and ends is None else None
    if not known or (ends is None and symbolic_ends is None):
        if axes is not None:  # only the sliced dims are unknown
            touched = {normalize_axis(a, rank) for a in axes}
            return [TensorType(data.dtype, tuple(ctx.fresh() if i in touched else d for i, d in enumerate(data.shape)))]
        return [TensorType(data.dtype, ctx.fresh_shape(rank))]
    axes = list(range(len(starts))) if axes is None else [normalize_axis(a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    dims = list(data.shape)
    if ends is None:  # ends computed from shapes
        return [TensorType(data.dtype, sliced_to_sizes(ctx, dims, starts, symbolic_ends, axes, steps))]
    cuts = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0:
            raise ShapeInferenceError("slice step cannot be 0")
        dim = dims[axis]
        if isinstance(dim, int):
            dims[axis] = len(range(*slice(start, end, step).indices(dim)))
            cuts[axis] = slice(start, end, step)
        elif start == 0 and end >= INT64_MAX // 2 and step == 1:
            pass  # the whole dim
        else:
            dims[axis] = ctx.fresh()
    if all(isinstance(d, int) for d in dims):
        arranged(ctx, lambda grid: grid[tuple(cuts)])
    return [TensorType(data.dtype, tuple(dims))]


def _gather(ctx: InferContext) -> list[Type]:
    data, indices = ctx.tensor(0), ctx.tensor(1)
    if data.shape is None or indices.shape is None:
        return [TensorType(data.dtype, None)]
    axis = normalize_axis(ctx.attr("axis"), len(data.shape))
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1 :]
    source = ctx.integers_value(0) if len(data.shape) == 1 else None
    picks = ctx.ints_value(1) if source is not None else None
    if source is not None and picks is not None and all(-len(source) <= i < len(source) for i in picks):
        ctx.out_symbolic[0] = tuple(source[i] for i in picks)
    return [TensorType(data.dtype, shape)]


def _gather_nd(ctx: InferContext) -> list[Type]:
    data, indices = ctx.tensor(0), ctx.tensor(1)
    batch_dims = ctx.attr("batch_dims")
    if data.shape is None or indices.shape is None or not isinstance(indices.shape[-1], int):
        return [TensorType(data.dtype, None)]
    depth = indices.shape[-1]
    return [TensorType(data.dtype, indices.shape[:-1] + data.shape[batch_dims + depth :])]


def _expand(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    target = ctx.dims_value(1)
    if target is None:
        target_shape = ctx.shape(1)
        rank = target_shape[0] if target_shape and isinstance(target_shape[0], int) else None
        if rank is not None and data.shape is not None:
            rank = max(rank, len(data.shape))
        return [TensorType(data.dtype, ctx.fresh_shape(rank))]
    return [TensorType(data.dtype, broadcast_shapes(ctx, data.shape, tuple(target)))]


def _tile(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    counts = ctx.dims_value(1)  # ints, or sizes (DeBERTa's relative positions repeated once per sample)
    if counts is not None and len(counts) != len(data.shape):
        raise ShapeInferenceError(f"Tile of a rank-{len(data.shape)} tensor by {len(counts)} repeats")
    if counts is None or any(isinstance(c, int) and c < 0 for c in counts):
        return [TensorType(data.dtype, ctx.fresh_shape(len(data.shape)))]
    return [TensorType(data.dtype, tuple(symbolic_product(ctx, [d, c]) for d, c in zip(data.shape, counts)))]


def _pad(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    pads = ctx.dims_value(1)  # amounts computed from sizes (a window's pad) are symbols: those dims are new
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    axes = ctx.ints_value(3) if ctx.has(3) else list(range(rank))
    if pads is None or axes is None:
        return [TensorType(data.dtype, ctx.fresh_shape(rank))]
    axes = [normalize_axis(a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ShapeInferenceError(f"{len(pads)} pads for {len(axes)} axes")
    dims = list(data.shape)
    for i, axis in enumerate(axes):
        begin, end = pads[i], pads[i + len(axes)]
        if isinstance(dims[axis], int) and isinstance(begin, int) and isinstance(end, int):
            dims[axis] = dims[axis] + begin + end
            continue
        # the dim plus amounts that are sizes (a window's pad, ``(4-h%4)%4``): its expression,
        # where that is a size at every binding; else a dim known only at run time
        grown = sizes.add(as_expr(dims[axis]), as_expr(begin), as_expr(end))
        dims[axis] = dim_of(grown) if sizes.bounds(grown)[0] >= 0 and sizes.nameable(grown) else ctx.fresh()
    return [TensorType(data.dtype, tuple(dims))]


def _shape(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(DType.INT64, (ctx.fresh("rank"),))]
    rank = len(data.shape)
    start, end = ctx.attr("start") or 0, ctx.attr("end")
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
    dims = data.shape[start:end]
    ctx.out_symbolic[0] = tuple(dims)
    return [TensorType(DType.INT64, (len(dims),))]


def _size(ctx: InferContext) -> list[Type]:
    return [TensorType(DType.INT64, ())]


def _constant_of_shape(ctx: InferContext) -> list[Type]:
    value = ctx.attr("value")
    dtype = DType.FLOAT32 if value is None else DType.from_numpy(np.asarray(value).dtype)
    dims = ctx.dims_value(0)
    if dims is None:
        shape = ctx.shape(0)
        rank = shape[0] if shape and isinstance(shape[0], int) else None
        return [TensorType(dtype, ctx.fresh_shape(rank))]
    return [TensorType(dtype, tuple(dims))]


def _range(ctx: InferContext) -> list[Type]:
    dtype = ctx.dtype(0)
    start, limit, delta = ctx.value(0), ctx.value(1), ctx.value(2)
    if limit is None and start is not None and delta is not None:  # Range(0, n, 1) of a size n: n long
        size = ctx.dims_value(1)
        first, step = (float(np.asarray(v).reshape(-1)[0]) for v in (start, delta))
        if size is not None and len(size) == 1 and isinstance(size[0], str) and (first, step) == (0, 1):
            return [TensorType(dtype, (size[0],))]
    if start is None or limit is None or delta is None:
        return [TensorType(dtype, (ctx.fresh("n"),))]
    start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in (start, limit, delta))
    if delta == 0:
        raise ShapeInferenceError("Range delta cannot be 0")
    count = max(int(np.ceil((limit - start) / delta)), 0)
    return [TensorType(dtype, (count,))]


def _nonzero(ctx: InferContext) -> list[Type]:
    rank = ctx.tensor(0).rank
    return [TensorType(DType.INT64, (rank if rank is not None else ctx.fresh("rank"), ctx.fresh("n")))]


def _compress(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    axis = ctx.attr("axis")
    if axis is None or data.shape is None:
        return [TensorType(data.dtype, (ctx.fresh("n"),))]
    axis = normalize_axis(axis, len(data.shape))
    dims = list(data.shape)
    dims[axis] = ctx.fresh("n")
    return [TensorType(data.dtype, tuple(dims))]


def _unique(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    axis = ctx.attr("axis")
    count = ctx.fresh("n")
    if axis is None or data.shape is None:
        values = TensorType(data.dtype, (count,))
    else:
        dims = list(data.shape)
        dims[normalize_axis(axis, len(dims))] = count
        values = TensorType(data.dtype, tuple(dims))
    flat = symbolic_product(ctx, data.shape) if data.shape is not None else ctx.fresh()
    inverse = (flat,) if axis is None or data.shape is None else (data.shape[normalize_axis(axis, len(data.shape))],)
    return [
        values,
        TensorType(DType.INT64, (count,)),
        TensorType(DType.INT64, inverse),
        TensorType(DType.INT64, (count,)),
    ][: ctx.num_outputs]


def _topk(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, None), TensorType(DType.INT64, None)]
    axis = normalize_axis(ctx.attr("axis"), len(data.shape))
    k = ctx.ints_value(1)
    dims = list(data.shape)
    if k and (k[0] < 0 or (isinstance(dims[axis], int) and k[0] > dims[axis])):
        raise ShapeInferenceError(f"TopK: k={k[0]} is outside 0..{dims[axis]} (the size of axis {axis})")
    dims[axis] = k[0] if k else ctx.fresh("k")
    return [TensorType(data.dtype, tuple(dims)), TensorType(DType.INT64, tuple(dims))]


def _one_hot(ctx: InferContext) -> list[Type]:
    indices = ctx.tensor(0)
    depth = ctx.value(1)
    dtype = ctx.dtype(2)
    if indices.shape is None:
        return [TensorType(dtype, None)]
    rank = len(indices.shape) + 1
    axis = normalize_axis(ctx.attr("axis"), rank)
    dims = list(indices.shape)
    if depth is not None and np.asarray(depth).size != 1:
        raise ShapeInferenceError(f"OneHot: depth must be one number, got {np.asarray(depth).size}")
    classes = int(np.asarray(depth).reshape(-1)[0]) if depth is not None else None
    if classes is not None and classes < 0:
        raise ShapeInferenceError(f"OneHot: depth {classes} is negative (the number of classes)")
    dims.insert(axis, classes if classes is not None else ctx.fresh())
    return [TensorType(dtype, tuple(dims))]


def _depth_to_space(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    block = ctx.attr("blocksize")
    if data.shape is None:
        return [TensorType(data.dtype, ctx.fresh_shape(4))]
    n, c, h, w = data.shape
    scale = lambda d, f: d * f if isinstance(d, int) else ctx.fresh()  # noqa: E731
    if ctx.node.op == "DepthToSpace":
        channels = c // (block * block) if isinstance(c, int) else ctx.fresh()
        return [TensorType(data.dtype, (n, channels, scale(h, block), scale(w, block)))]
    shrink = lambda d: d // block if isinstance(d, int) else ctx.fresh()  # noqa: E731
    return [TensorType(data.dtype, (n, scale(c, block * block), shrink(h), shrink(w)))]


def _eye_like(ctx: InferContext) -> list[Type]:
    dtype = ctx.attr("dtype")
    return [TensorType(DType.from_onnx(int(dtype)) if dtype else ctx.dtype(0), ctx.shape(0))]


def _constant(ctx: InferContext) -> list[Type]:
    from kiln.ops.constant import constant_value

    array = constant_value(ctx.node.attrs)
    return [TensorType(DType.from_numpy(array.dtype), array.shape)]


def _resize(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    if ctx.node.op == "Upsample":
        scales_index, sizes_index, axes = 1, None, None
    else:
        scales_index, sizes_index, axes = 2, 3, ctx.attr("axes")
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    dims = list(data.shape)
    sizes = ctx.dims_value(sizes_index) if sizes_index is not None and ctx.has(sizes_index) else None
    scales = ctx.value(scales_index) if ctx.has(scales_index) else None
    policy = ctx.attr("keep_aspect_ratio_policy") if ctx.node.op == "Resize" else "stretch"
    if sizes is not None and policy in ("not_larger", "not_smaller") and not all(isinstance(d, int) for d in sizes):
        sizes = None  # (sizes from shapes under an aspect policy: dims known at run time)
    if sizes is not None and len(sizes):
        if policy in ("not_larger", "not_smaller") and all(isinstance(dims[a], int) for a in axes):
            ratios = [sizes[i] / dims[a] for i, a in enumerate(axes)]
            ratio = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                dims[a] = int(np.floor(dims[a] * ratio + 0.5))
        else:
            for i, a in enumerate(axes):
                dims[a] = sizes[i]
    elif scales is not None and np.asarray(scales).size:
        for i, a in enumerate(axes):
            scale = float(np.asarray(scales).reshape(-1)[i])
            dims[a] = (
                int(np.floor(dims[a] * scale)) if isinstance(dims[a], int) else (dims[a] if scale == 1 else ctx.fresh())
            )
    else:
        dims = list(ctx.fresh_shape(rank) or ())
    return [TensorType(data.dtype, tuple(dims))]


def _center_crop_pad(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    target = ctx.ints_value(1)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    axes = ctx.attr("axes")
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    dims = list(data.shape)
    for i, axis in enumerate(axes):
        dims[axis] = target[i] if target is not None else ctx.fresh()
    return [TensorType(data.dtype, tuple(dims))]


def _col2im(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    image, block = ctx.ints_value(1), ctx.ints_value(2)
    if data.shape is None or image is None or block is None:
        return [TensorType(data.dtype, None)]
    channels = data.shape[1]
    channels = channels // math.prod(block) if isinstance(channels, int) else ctx.fresh()
    return [TensorType(data.dtype, (data.shape[0], channels, *image))]


def _array_feature_extractor(ctx: InferContext) -> list[Type]:
    data, indices = ctx.tensor(0), ctx.tensor(1)
    if data.shape is None or indices.shape is None:
        return [TensorType(data.dtype, None)]
    count = symbolic_product(ctx, indices.shape)
    return [TensorType(data.dtype, (*data.shape[:-1], count) if len(data.shape) > 1 else (1, count))]


def _gather_elements_reference(ctx: RunContext, inputs: list) -> list:
    # kiln's own: onnx's version relies on np.choose, which fails past 32 choices along the axis.
    data, indices = inputs
    axis = normalize_axis(ctx.attr("axis"), data.ndim)
    size = data.shape[axis]
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise IndexError(f"GatherElements index out of range [-{size}, {size - 1}]")
    indices = np.where(indices < 0, indices + size, indices)
    return [np.take_along_axis(data, indices.astype(np.int64), axis=axis)]


def _register() -> None:
    register("Reshape", _reshape)
    register("Flatten", _flatten)
    register("Squeeze", _squeeze)
    register("Unsqueeze", _unsqueeze)
    register("Transpose", _transpose)
    register("Concat", _concat)
    register("Split", _split)
    register("Slice", _slice)
    register("Gather", _gather)
    register(
        "GatherElements",
        lambda ctx: [TensorType(ctx.dtype(0), ctx.shape(1))],
        reference=_gather_elements_reference,
    )
    register("GatherND", _gather_nd)
    for op in ("ScatterElements", "ScatterND", "Scatter", "TensorScatter"):
        register(op, same_as_input())
    register("Expand", _expand)
    register("Tile", _tile)
    register("Pad", _pad)
    register("Shape", _shape)
    register("Size", _size)
    register("ConstantOfShape", _constant_of_shape)
    register("Range", _range)
    register("Trilu", same_as_input())
    register("NonZero", _nonzero)
    register("Compress", _compress)
    register("Unique", _unique)
    register("TopK", _topk)
    register("OneHot", _one_hot)
    register("DepthToSpace", _depth_to_space)
    register("SpaceToDepth", _depth_to_space)
    register("ReverseSequence", same_as_input())
    register("EyeLike", _eye_like)
    register("Constant", _constant)
    register("Resize", _resize)
    register("Upsample", _resize)
    register("CenterCropPad", _center_crop_pad)
    register("Col2Im", _col2im)
    register("ArrayFeatureExtractor", _array_feature_extractor, domain="ai.onnx.ml")
    # the output is the input's data in another shape: a view, no kernel
    declare_trait("alias", RESHAPES)
    declare_trait("reshape", RESHAPES)


RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


_register()
