"""Resize (and the older Upsample) in nearest and linear modes: every axis's source positions and
weights depend only on static sizes, so they are computed here once, as constant tables, and the
kernel is a loop nest over the output reading 1 (nearest) or 2^k (linear over k resized axes)
input elements per output through those tables. Cubic, antialiased downsampling and
tf_crop_and_resize stay on the reference (CannotLower says which)."""

from __future__ import annotations

import math

import numpy as np

from kiln.ir.graph import Node
from kiln.ir.types import DType
from kiln.lower.kir import Binary, Expr, Index, Kernel, Load, Stmt, Store, affine, buffers_in
from kiln.lower.lowering import CannotLower, Lowerer, default_schedule, nest, strides

TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn")


def source_position(out: np.ndarray, scale: float, in_size: int, out_size: int, transform: str) -> np.ndarray:
    """Where each output coordinate ``out`` samples the input (ONNX Resize's coordinate transforms)."""
    if transform == "half_pixel":
        return (out + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (out + 0.5) / scale - 0.5 if out_size > 1 else np.zeros_like(out)
    if transform == "align_corners":
        return out * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros_like(out)
    if transform == "asymmetric":
        return out / scale
    if transform == "tf_half_pixel_for_nn":
        return (out + 0.5) / scale
    raise CannotLower(f"Resize coordinate_transformation_mode {transform!r} is not lowered natively")


def _nearest(position: np.ndarray, mode: str) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.where(position - np.floor(position) == 0.5, np.floor(position), np.round(position))
    if mode == "round_prefer_ceil":
        return np.where(position - np.floor(position) == 0.5, np.ceil(position), np.round(position))
    if mode == "floor":
        return np.floor(position)
    if mode == "ceil":
        return np.ceil(position)
    raise CannotLower(f"Resize nearest_mode {mode!r} is not lowered natively")


def axis_tables(
    in_size: int, out_size: int, scale: float, transform: str, mode: str, nearest_mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """(indices [out, taps], weights [out, taps]) of one axis: 1 tap (nearest) or 2 (linear)."""
    position = source_position(np.arange(out_size, dtype=np.float64), scale, in_size, out_size, transform)
    if mode == "nearest":
        index = np.clip(_nearest(position, nearest_mode), 0, in_size - 1).astype(np.int64)
        return index[:, None], np.ones((out_size, 1))
    position = np.clip(position, 0, in_size - 1)  # edge samples repeat (ONNX's and PyTorch's linear)
    low = np.floor(position)
    frac = position - low
    low = low.astype(np.int64)
    high = np.minimum(low + 1, in_size - 1)
    return np.stack([low, high], axis=1), np.stack([1 - frac, frac], axis=1)


def lower_resize(lw: Lowerer, node: Node) -> list[Kernel]:
    x, out = node.inputs[0], node.outputs[0]
    assert x is not None
    if out.type.dtype not in (DType.FLOAT32, DType.FLOAT64):  # type: ignore[union-attr]
        raise CannotLower("Resize is lowered for float32/float64")
    in_shape, out_shape = lw.shape(x), lw.shape(out)
    rank = len(in_shape)
    mode = node.attrs.get("mode", "nearest")
    transform = node.attrs.get("coordinate_transformation_mode", "half_pixel" if node.op == "Resize" else "asymmetric")
    if node.op == "Upsample":
        transform = "asymmetric"
    if mode not in ("nearest", "linear"):
        raise CannotLower(f"Resize mode {mode!r} is not lowered natively")
    if node.attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise CannotLower("Resize keep_aspect_ratio_policy other than stretch is not lowered natively")
    scales = _scales(lw, node, in_shape, out_shape)
    if node.attrs.get("antialias", 0) and mode == "linear" and any(s < 1 for s in scales):
        raise CannotLower("antialiased downsampling is not lowered natively")
    nearest_mode = node.attrs.get("nearest_mode", "round_prefer_floor")
    resized = [a for a in range(rank) if in_shape[a] != out_shape[a] or scales[a] != 1.0]
    tables = {}
    for a in resized:
        index, weight = axis_tables(in_shape[a], out_shape[a], scales[a], transform, mode, nearest_mode)
        if mode == "linear" and np.all(weight[:, 1] == 0) and np.array_equal(index[:, 0], np.arange(out_shape[a])):
            continue  # this axis maps each output to its own input element
        tables[a] = (index, weight)
    dtype = out.type.dtype  # type: ignore[union-attr]
    src, dst = lw.buffer(x), lw.buffer(out)
    buffers = {}
    for a, (index, weight) in tables.items():
        key = ("resize", a, in_shape[a], out_shape[a], scales[a], transform, mode, nearest_mode)
        buffers[a] = (
            lw.packed_constant((*key, "index"), lambda index=index: index.reshape(-1).copy()),
            lw.packed_constant((*key, "weight"), lambda weight=weight: weight.reshape(-1).astype(dtype.numpy)),
        )
    in_strides, out_strides = strides(in_shape), strides(out_shape)
    taps = 1 if mode == "nearest" else 2

    def body(indices: list[Index]) -> list[Stmt]:
        corners: list[tuple[list[Expr], Expr | None]] = [([], None)]  # per corner: input coords, weight
        for a in range(rank):
            if a not in tables:
                corners = [([*coords, indices[a]], w) for coords, w in corners]
                continue
            index_buf, weight_buf = buffers[a]
            grown = []
            for coords, w in corners:
                for t in range(taps):
                    at = affine([(indices[a], taps)], t)
                    coord = Load(index_buf, at)
                    weight = None if mode == "nearest" else Load(weight_buf, at)
                    grown.append(
                        ([*coords, coord], weight if w is None else (w if weight is None else Binary("*", w, weight)))
                    )
            corners = grown
        value: Expr | None = None
        for coords, w in corners:
            read = Load(src, affine([(c, in_strides[a]) for a, c in enumerate(coords)]))  # type: ignore[misc]
            term = read if w is None else Binary("*", w, read)
            value = term if value is None else Binary("+", value, term)
        assert value is not None
        return [Store(dst, affine(list(zip(indices, out_strides))), value)]  # type: ignore[arg-type]

    stmts, indices = nest(lw, out_shape, body)
    lw.kernel_count += 1
    return [
        Kernel(
            f"k{lw.kernel_count}",
            "resize",
            stmts,
            [b for b in buffers_in(stmts) if b is not dst],  # the input and the position tables
            [dst],
            [node.label],
            default_schedule(lw.target, out_shape, indices),
        )
    ]


def _scales(lw: Lowerer, node: Node, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[float]:
    """Each axis's scale: the scales input where given (it sets the coordinate mapping, even when
    floor(size * scale) rounded the output size), else output / input."""
    rank = len(in_shape)
    if node.op == "Upsample":
        given = lw.constant(node.inputs[1]) if len(node.inputs) > 1 else None
        axes = list(range(rank))
    else:
        given = lw.constant(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        axes = [a % rank for a in node.attrs.get("axes", range(rank))]
        if node.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
            raise CannotLower("tf_crop_and_resize is not lowered natively")
    if len(node.inputs) > 2 and node.inputs[2] is not None and given is None:
        raise CannotLower("Resize scales are not a constant")
    scales = [out_shape[a] / in_shape[a] if in_shape[a] else 1.0 for a in range(rank)]
    if given is not None and given.size:
        for i, a in enumerate(axes):
            scales[a] = float(given.reshape(-1)[i])
    if any(not math.isfinite(s) or s <= 0 for s in scales):
        raise CannotLower("Resize scales must be positive")
    return scales


LOWERINGS = {"Resize": lower_resize, "Upsample": lower_resize}
