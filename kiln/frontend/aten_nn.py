"""The conversion table's normalization and pooling entries (layer norm, batch norm in inference
and training form, max/average/adaptive pooling) and ``aten.empty``."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.frontend.aten import FxConverter, UnsupportedFxOp, converts, full_like_constant
from kiln.ir.graph import Value


@converts("aten.native_layer_norm.default")
def _layer_norm(fx: FxConverter, x: Value, shape: list, weight: Value | None, bias: Value | None, eps: float) -> tuple:
    axis = fx.rank(x) - len(shape)
    if weight is None:
        weight = fx.const(np.ones([int(s) for s in shape], x.type.dtype.numpy), "ones")  # type: ignore[union-attr]
    outputs = fx.emit("LayerNormalization", [x, weight, bias], {"axis": axis, "epsilon": float(eps)}, 3)
    return tuple(outputs)


@converts("aten.native_batch_norm.default")
def _native_batch_norm(fx: FxConverter, x, weight, bias, mean, var, training, momentum, eps) -> tuple:  # type: ignore[no-untyped-def]
    if training:
        raise UnsupportedFxOp("aten.native_batch_norm.default", "training-mode batch statistics")
    return _batch_norm(fx, x, weight, bias, mean, var, momentum, eps)


@converts("aten.empty.memory_format", "aten.empty_like.default")
def _empty(fx: FxConverter, size: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> Value:
    """Uninitialized memory: zeros (what reads it is undefined in torch too)."""
    if isinstance(size, Value):
        return fx.const(np.zeros([int(d) for d in fx.shape(size)], size.type.dtype.numpy), "empty")  # type: ignore[union-attr]
    return full_like_constant(fx, size, 0, dtype or __import__("torch").float32)


@converts("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(fx: FxConverter, x, weight, bias, mean, var, momentum, eps) -> tuple:  # type: ignore[no-untyped-def]
    channels = fx.shape(x)[1]
    dtype = x.type.dtype.numpy
    weight = weight if weight is not None else fx.const(np.ones(channels, dtype), "ones")
    bias = bias if bias is not None else fx.const(np.zeros(channels, dtype), "zeros")
    out = fx.one("BatchNormalization", [x, weight, bias, mean, var], epsilon=float(eps))
    return (out, None, None)


@converts("aten.max_pool2d_with_indices.default")
def _max_pool(fx: FxConverter, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False) -> tuple:  # type: ignore[no-untyped-def]
    kernel = [int(k) for k in kernel] * (2 if len(kernel) == 1 else 1)
    stride = [int(s) for s in (stride or kernel)] * (2 if len(stride or kernel) == 1 else 1)
    pad = [int(p) for p in padding] * (2 if len(padding) == 1 else 1)
    dilation = [int(d) for d in dilation] * (2 if len(dilation) == 1 else 1)
    out = fx.one(
        "MaxPool", [x], kernel_shape=kernel, strides=stride, pads=pad * 2, dilations=dilation, ceil_mode=int(ceil_mode)
    )
    return (out, None)


@converts("aten.avg_pool2d.default")
def _avg_pool(
    fx: FxConverter, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor=None
) -> Value:  # type: ignore[no-untyped-def]
    if divisor is not None:
        raise UnsupportedFxOp("aten.avg_pool2d.default", "divisor_override")
    kernel = [int(k) for k in kernel] * (2 if len(kernel) == 1 else 1)
    stride = [int(s) for s in (stride or kernel)] * (2 if len(stride or kernel) == 1 else 1)
    pad = [int(p) for p in padding] * (2 if len(padding) == 1 else 1)
    return fx.one(
        "AveragePool",
        [x],
        kernel_shape=kernel,
        strides=stride,
        pads=pad * 2,
        ceil_mode=int(ceil_mode),
        count_include_pad=int(count_include_pad),
    )


@converts("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool(fx: FxConverter, x: Value, size: list) -> Value:
    height, width = fx.shape(x)[2:]
    out_h, out_w = (int(s) for s in size)
    if (out_h, out_w) == (1, 1):
        return fx.one("GlobalAveragePool", [x])
    if isinstance(height, int) and isinstance(width, int) and height % out_h == 0 and width % out_w == 0:
        kernel = [height // out_h, width // out_w]
        return fx.one("AveragePool", [x], kernel_shape=kernel, strides=kernel)
    raise UnsupportedFxOp("aten._adaptive_avg_pool2d.default", f"{height}x{width} to {out_h}x{out_w}")
