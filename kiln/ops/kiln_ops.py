"""Ops kiln introduces itself (domain ``kiln``). Each has its own inference and reference."""

from __future__ import annotations

from typing import Any

from kiln.ir.graph import Graph
from kiln.ir.types import Type
from kiln.ops.interpreter import Interpreter
from kiln.ops.registry import REQUIRED, Attr, InferContext, RunContext, declare_trait, register

_BODIES: dict[int, Any] = {}


def _fused_infer(ctx: InferContext) -> list[Type]:
    body: Graph = ctx.attr("body")
    if len(body.inputs) != ctx.num_inputs:
        from kiln.errors import ShapeInferenceError

        raise ShapeInferenceError(f"Fused body takes {len(body.inputs)} inputs, node has {ctx.num_inputs}")
    return [v.type for v in body.outputs]


def _fused_reference(ctx: RunContext, inputs: list) -> list:
    """A fused group computes exactly what its body computes."""
    body: Graph = ctx.attr("body")
    interpreter = _BODIES.get(id(body))
    if interpreter is None or interpreter.graph is not body:
        interpreter = _BODIES[id(body)] = Interpreter(body)
    return interpreter.run(list(inputs))


register(
    "Fused",
    _fused_infer,
    domain="kiln",
    attrs={"body": Attr("graph", REQUIRED), "kind": Attr("string", "pointwise")},
    inputs=(0, -1),
    outputs=(1, -1),
    reference=_fused_reference,
    doc="A group of nodes compiled into one kernel (see kiln.passes.fuse).",
)


def _safe_softmax_reference(ctx: RunContext, inputs: list) -> list:
    """Softmax along ``axis`` with NaN results replaced by 0: exactly what exporters' pattern
    Where(IsNaN(Softmax(x)), 0, Softmax(x)) computes (NaN rows come from NaN or all -inf rows)."""
    import numpy as np

    x = inputs[0]
    axis = int(ctx.attr("axis"))
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        values = np.exp(shifted)
        values = values / np.sum(values, axis=axis, keepdims=True)
    return [np.where(np.isnan(values), np.zeros((), dtype=x.dtype), values).astype(x.dtype)]


register(
    "SafeSoftmax",
    lambda ctx: [ctx.input_types[0]],  # type: ignore[list-item]
    domain="kiln",
    attrs={"axis": Attr("int", -1)},
    inputs=1,
    outputs=1,
    reference=_safe_softmax_reference,
    doc="Softmax whose NaN outputs are 0 (the exporters' IsNaN+Where guard, as one op).",
)


def _depthwise_infer(ctx: InferContext) -> list[Type]:
    """x [N, H, W, C] (channels last), w [C, 1, KH, KW] -> [N, OH, OW, C]: the window as Conv's
    (``nn.window_out`` on the channels-first view of the same dims)."""
    from kiln.errors import ShapeInferenceError
    from kiln.ir.types import TensorType
    from kiln.ops.nn import window_out

    data, weight = ctx.tensor(0), ctx.tensor(1)
    if data.shape is None:  # the window's attributes are still checked
        window_out(ctx, TensorType(data.dtype, ctx.fresh_shape(4)), list(ctx.attr("kernel_shape")), ctx.fresh())
        return [TensorType(data.dtype, None)]
    if len(data.shape) != 4:
        raise ShapeInferenceError(f"DepthwiseConv reads [N, H, W, C], got rank {len(data.shape)}")
    batch, height, width, channels = data.shape
    if weight.shape is not None and (len(weight.shape) != 4 or weight.shape[1] != 1):
        raise ShapeInferenceError(f"DepthwiseConv's weight is [C, 1, KH, KW], got {weight.shape}")
    if weight.shape is not None and isinstance(channels, int) and weight.shape[0] != channels:
        raise ShapeInferenceError(f"{channels} channels, but the weight has {weight.shape[0]}")
    planes = TensorType(data.dtype, (batch, channels, height, width))
    _, _, out_h, out_w = window_out(ctx, planes, list(ctx.attr("kernel_shape")), channels)
    return [TensorType(data.dtype, (batch, out_h, out_w, channels))]


def _windows(ctx: RunContext, x: Any) -> list:
    """((tap row, tap column), the [N, OH, OW, C] input pixels that tap reads, float64) of a
    channels-last window op (kiln::DepthwiseConv, kiln::ConvNHWC), zero padded."""
    import numpy as np

    kh, kw = ctx.attr("kernel_shape")
    sh, sw = ctx.attr("strides") or (1, 1)
    dh, dw = ctx.attr("dilations") or (1, 1)
    top, left, bottom, right = ctx.attr("pads") or (0, 0, 0, 0)
    padded = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    out_h = (padded.shape[1] - ((kh - 1) * dh + 1)) // sh + 1
    out_w = (padded.shape[2] - ((kw - 1) * dw + 1)) // sw + 1
    return [
        ((i, j), padded[:, i * dh : i * dh + (out_h - 1) * sh + 1 : sh, j * dw : j * dw + (out_w - 1) * sw + 1 : sw])
        for i in range(kh)
        for j in range(kw)
    ]


WINDOW_ATTRS = {
    "kernel_shape": Attr("ints", REQUIRED),
    "strides": Attr("ints", (1, 1)),
    "pads": Attr("ints", (0, 0, 0, 0)),
    "dilations": Attr("ints", (1, 1)),
}


def _depthwise_reference(ctx: RunContext, inputs: list) -> list:
    """Each channel's plane convolved with its own kernel, summed in float64."""
    import numpy as np

    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    out = sum(window * w[:, 0, i, j].astype(np.float64) for (i, j), window in _windows(ctx, x))
    if bias is not None:
        out += bias.astype(np.float64)
    return [out.astype(x.dtype)]


register(
    "DepthwiseConv",
    _depthwise_infer,
    domain="kiln",
    attrs=WINDOW_ATTRS,
    inputs=(2, 3),
    outputs=1,
    reference=_depthwise_reference,
    doc="A depthwise 2-D convolution on channels-last data: x [N, H, W, C], w [C, 1, KH, KW], "
    "bias [C] -> [N, OH, OW, C] (kiln.passes.layout puts it where a whole region runs channels last).",
)

declare_trait("anchor", ["DepthwiseConv"], domain="kiln")  # its outputs take a fused epilogue


def _conv_nhwc_infer(ctx: InferContext) -> list[Type]:
    """x [N, H, W, C] (channels last), w [OC, C, KH, KW] -> [N, OH, OW, OC]: the window as Conv's."""
    from kiln.errors import ShapeInferenceError
    from kiln.ir.types import TensorType
    from kiln.ops.nn import window_out

    data, weight = ctx.tensor(0), ctx.tensor(1)
    out_channels = weight.shape[0] if weight.shape is not None and len(weight.shape) == 4 else ctx.fresh()
    if data.shape is None:
        window_out(ctx, TensorType(data.dtype, ctx.fresh_shape(4)), list(ctx.attr("kernel_shape")), out_channels)
        return [TensorType(data.dtype, None)]
    if len(data.shape) != 4:
        raise ShapeInferenceError(f"ConvNHWC reads [N, H, W, C], got rank {len(data.shape)}")
    batch, height, width, channels = data.shape
    if weight.shape is not None and (
        len(weight.shape) != 4 or (isinstance(channels, int) and weight.shape[1] != channels)
    ):
        raise ShapeInferenceError(f"ConvNHWC's weight is [OC, {channels}, KH, KW], got {weight.shape}")
    planes = TensorType(data.dtype, (batch, channels, height, width))
    _, _, out_h, out_w = window_out(ctx, planes, list(ctx.attr("kernel_shape")), out_channels)
    return [TensorType(data.dtype, (batch, out_h, out_w, out_channels))]


def _conv_nhwc_reference(ctx: RunContext, inputs: list) -> list:
    """Every output channel's sum over the window and the input channels, in float64."""
    import numpy as np

    w = inputs[1].astype(np.float64)
    out = sum(window @ w[:, :, i, j].T for (i, j), window in _windows(ctx, inputs[0]))
    return [np.asarray(out).astype(inputs[0].dtype)]


register(
    "ConvNHWC",
    _conv_nhwc_infer,
    domain="kiln",
    attrs=WINDOW_ATTRS,
    inputs=2,
    outputs=1,
    reference=_conv_nhwc_reference,
    doc="A 2-D convolution (one group) on channels-last data: x [N, H, W, C], w [OC, C, KH, KW] -> "
    "[N, OH, OW, OC] (kiln.passes.layout puts it in a channels-last region where the int8 and bf16 "
    "paths' direct convolution reads and writes that layout; its bias is an Add after it).",
)

declare_trait("anchor", ["ConvNHWC"], domain="kiln")  # its outputs take a fused epilogue


def _cache_append_infer(ctx: InferContext) -> list[Type]:
    """Concat's: the past and the new rows joined along ``axis``."""
    from kiln.ops.registry import lookup

    concat = lookup("Concat")
    assert concat is not None
    return concat.infer(ctx)


def _cache_append_reference(ctx: RunContext, inputs: list) -> list:
    import numpy as np

    return [np.concatenate(inputs, axis=int(ctx.attr("axis")))]


register(
    "CacheAppend",
    _cache_append_infer,
    domain="kiln",
    attrs={"axis": Attr("int", REQUIRED), "layout": Attr("ints", REQUIRED)},
    inputs=2,
    outputs=1,
    reference=_cache_append_reference,
    doc="A KV cache's present: Concat(past, new) along ``axis`` whose past is a graph input laid out at "
    "``layout`` (the capacity's shape) and the present its output in that same buffer: only the new rows "
    "are written (kiln.passes.cache_in_place; the run-time dims route lays the past out so).",
)
