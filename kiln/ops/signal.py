"""The ops beside a network's core: signal processing (windows, mel weights, DFT, STFT), training
optimizers, grid sampling, non-maximum suppression, determinants and random sampling."""

from __future__ import annotations

from kiln.ir.types import DType, TensorType, Type
from kiln.ops.registry import InferContext, normalize_axis, register


def _register() -> None:
    for op in ("HannWindow", "HammingWindow", "BlackmanWindow"):
        register(op, window)
    register("MelWeightMatrix", _mel)
    register("DFT", _dft)
    register("STFT", _stft)
    for op in ("Adagrad", "Adam", "Momentum"):
        register(op, _optimizer, domain="ai.onnx.preview.training")
    register("GridSample", _grid_sample)
    register("AffineGrid", _affine_grid)
    register("NonMaxSuppression", _nms)
    register("Det", _det)
    for op in ("Bernoulli", "RandomUniformLike", "RandomNormalLike"):
        register(op, _random_like)


def window(ctx: InferContext) -> list[Type]:
    size = ctx.ints_value(0)
    dtype = DType.from_onnx(int(ctx.attr("output_datatype")))
    return [TensorType(dtype, (size[0] if size else ctx.fresh("n"),))]


def _mel(ctx: InferContext) -> list[Type]:
    mel_bins, dft_length = ctx.ints_value(0), ctx.ints_value(1)
    dtype = DType.from_onnx(int(ctx.attr("output_datatype")))
    rows = dft_length[0] // 2 + 1 if dft_length else ctx.fresh()
    return [TensorType(dtype, (rows, mel_bins[0] if mel_bins else ctx.fresh()))]


def _dft(ctx: InferContext) -> list[Type]:
    data = ctx.tensor(0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    axis_value = ctx.ints_value(2) if ctx.has(2) else None
    axis = axis_value[0] if axis_value else (-2 if ctx.has(2) is False else None)
    if axis is None:
        return [TensorType(data.dtype, ctx.fresh_shape(rank))]
    axis = normalize_axis(axis, rank)
    dims = list(data.shape)
    length = ctx.ints_value(1) if ctx.has(1) else None
    if ctx.has(1) and length is None:
        dims[axis] = ctx.fresh()
    elif length:
        dims[axis] = length[0]
    if ctx.attr("onesided") and ctx.attr("inverse"):
        # A one-sided spectrum transformed back: a real signal of 2 * (n - 1) samples.
        if not length:
            dims[axis] = 2 * (dims[axis] - 1) if isinstance(dims[axis], int) else ctx.fresh()
        dims[-1] = 1
        return [TensorType(data.dtype, tuple(dims))]
    if ctx.attr("onesided") and isinstance(dims[axis], int):
        dims[axis] = dims[axis] // 2 + 1
    dims[-1] = 2
    return [TensorType(data.dtype, tuple(dims))]


def _stft(ctx: InferContext) -> list[Type]:
    signal = ctx.tensor(0)
    step = ctx.ints_value(1)
    frame_length = ctx.ints_value(3) if ctx.has(3) else None
    if frame_length is None and ctx.has(2):
        window = ctx.shape(2)
        frame_length = [window[0]] if window and isinstance(window[0], int) else None
    if signal.shape is None or step is None or frame_length is None or not isinstance(signal.shape[1], int):
        return [TensorType(signal.dtype, ctx.fresh_shape(4))]
    length = frame_length[0]
    frames = (signal.shape[1] - length) // step[0] + 1
    bins = length // 2 + 1 if ctx.attr("onesided") else length
    return [TensorType(signal.dtype, (signal.shape[0], frames, bins, 2))]


def _optimizer(ctx: InferContext) -> list[Type]:
    """Adagrad/Adam/Momentum: each output matches the tensor it updates."""
    groups = {"Adagrad": (0, 2), "Momentum": (0, 2), "Adam": (0, 2, 3)}[ctx.node.op]
    streams = {"Adagrad": 3, "Momentum": 3, "Adam": 4}[ctx.node.op]
    count = (ctx.num_inputs - 2) // streams
    types: list[Type] = []
    for group in groups:
        types.extend(ctx.tensor(2 + group * count + i) for i in range(count))
    return types


def _grid_sample(ctx: InferContext) -> list[Type]:
    data, grid = ctx.tensor(0), ctx.tensor(1)
    if data.shape is None or grid.shape is None:
        return [TensorType(data.dtype, None)]
    return [TensorType(data.dtype, (data.shape[0], data.shape[1], *grid.shape[1:-1]))]


def _affine_grid(ctx: InferContext) -> list[Type]:
    size = ctx.ints_value(1)
    if size is None:
        return [TensorType(ctx.dtype(0), None)]
    spatial = size[2:]
    return [TensorType(ctx.dtype(0), (size[0], *spatial, len(spatial)))]


def _nms(ctx: InferContext) -> list[Type]:
    return [TensorType(DType.INT64, (ctx.fresh("n"), 3))]


def _det(ctx: InferContext) -> list[Type]:
    shape = ctx.shape(0)
    return [TensorType(ctx.dtype(0), None if shape is None else shape[:-2])]


def _random_like(ctx: InferContext) -> list[Type]:
    dtype = ctx.attr("dtype")
    return [TensorType(DType.from_onnx(int(dtype)) if dtype else ctx.dtype(0), ctx.shape(0))]


_register()
