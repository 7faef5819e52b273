"""The XLA row's conversion table: one function per ONNX op (``JAX_OPS``), each turning a kiln node
and its JAX operands into ``jax.numpy`` / ``lax`` calls; ``jax_backend.py`` walks a graph with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.bench.backends.base import Unavailable
from kiln.ir.graph import Node
from kiln.ir.types import DType

JaxOp = Callable[[Node, list[Any]], list[Any]]
JAX_OPS: dict[str, JaxOp] = {}


def jax_op(*names: str) -> Callable[[JaxOp], JaxOp]:
    def register(function: JaxOp) -> JaxOp:
        for name in names:
            JAX_OPS[name] = function
        return function

    return register


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _static(value: Any, what: str) -> np.ndarray:
    """A value XLA needs at trace time (a shape, axes, pads): it must not depend on the inputs."""
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except Exception as err:  # a tracer: the value depends on the model's inputs
        raise Unavailable(f"{what} computed from the inputs (XLA needs it static)") from err


def _unary(function: Callable[[Any], Any]) -> JaxOp:
    return lambda node, xs: [function(xs[0])]


def _binary(function: Callable[[Any, Any], Any]) -> JaxOp:
    return lambda node, xs: [function(xs[0], xs[1])]


def register_elementwise() -> None:
    import jax
    import jax.numpy as jnp
    from jax import lax

    unary = {
        "Relu": lambda x: jnp.maximum(x, 0),
        "Sigmoid": jax.nn.sigmoid,
        "Tanh": jnp.tanh,
        "Exp": jnp.exp,
        "Log": jnp.log,
        "Sqrt": jnp.sqrt,
        "Neg": jnp.negative,
        "Abs": jnp.abs,
        "Erf": lax.erf,
        "Reciprocal": lambda x: 1 / x,
        "Sin": jnp.sin,
        "Cos": jnp.cos,
        "Floor": jnp.floor,
        "Ceil": jnp.ceil,
        "Not": jnp.logical_not,
        "IsNaN": jnp.isnan,
        "Identity": lambda x: x,
        "Sign": jnp.sign,
    }
    for name, function in unary.items():
        JAX_OPS[name] = _unary(function)

    def divide(a: Any, b: Any) -> Any:
        if jnp.issubdtype(jnp.result_type(a), jnp.integer):
            return lax.div(a, jnp.asarray(b, jnp.result_type(a)))  # ONNX integer Div truncates
        return a / b

    binary = {
        "Add": jnp.add,
        "Sub": jnp.subtract,
        "Mul": jnp.multiply,
        "Div": divide,
        "Pow": lambda a, b: jnp.power(a, b.astype(a.dtype) if hasattr(b, "astype") else b),
        "Equal": jnp.equal,
        "Less": jnp.less,
        "LessOrEqual": jnp.less_equal,
        "Greater": jnp.greater,
        "GreaterOrEqual": jnp.greater_equal,
        "And": jnp.logical_and,
        "Or": jnp.logical_or,
        "Xor": jnp.logical_xor,
    }
    for name, function in binary.items():
        JAX_OPS[name] = _binary(function)


@jax_op("Max", "Min", "Sum", "Mean")
def _variadic(node: Node, xs: list[Any]) -> list[Any]:
    jnp = _jnp()
    fold = {"Max": jnp.maximum, "Min": jnp.minimum, "Sum": jnp.add, "Mean": jnp.add}[node.op]
    result = xs[0]
    for x in xs[1:]:
        result = fold(result, x)
    return [result / len(xs) if node.op == "Mean" else result]


@jax_op("Where")
def _where(node: Node, xs: list[Any]) -> list[Any]:
    return [_jnp().where(xs[0], xs[1], xs[2])]


JAX_TYPES = {"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
             "uint32", "uint64", "bool"}  # fmt: skip


@jax_op("Cast")
def _cast(node: Node, xs: list[Any]) -> list[Any]:
    target = np.dtype(DType.from_onnx(int(node.attrs["to"])).numpy)
    if target.name not in JAX_TYPES or np.dtype(xs[0].dtype).name not in JAX_TYPES:
        raise Unavailable(f"Cast between {np.dtype(xs[0].dtype).name} and {target.name}")
    return [xs[0].astype(target)]


@jax_op("Clip")
def _clip(node: Node, xs: list[Any]) -> list[Any]:
    jnp = _jnp()
    x = xs[0]
    low = xs[1] if len(xs) > 1 else None
    high = xs[2] if len(xs) > 2 else None
    if low is not None:
        x = jnp.maximum(x, low)
    if high is not None:
        x = jnp.minimum(x, high)
    return [x]


@jax_op("LeakyRelu")
def _leaky_relu(node: Node, xs: list[Any]) -> list[Any]:
    return [_jnp().where(xs[0] >= 0, xs[0], xs[0] * float(node.attrs.get("alpha", 0.01)))]


@jax_op("Gelu")
def _gelu(node: Node, xs: list[Any]) -> list[Any]:
    import jax

    return [jax.nn.gelu(xs[0], approximate=node.attrs.get("approximate", "none") == "tanh")]


@jax_op("HardSigmoid")
def _hard_sigmoid(node: Node, xs: list[Any]) -> list[Any]:
    alpha, beta = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    return [_jnp().clip(xs[0] * alpha + beta, 0, 1)]


@jax_op("HardSwish")
def _hard_swish(node: Node, xs: list[Any]) -> list[Any]:
    return [xs[0] * _jnp().clip(xs[0] / 6 + 0.5, 0, 1)]


# -- products, convolutions, pooling, normalization ------------------------------------------------------


@jax_op("MatMul")
def _matmul(node: Node, xs: list[Any]) -> list[Any]:
    from jax import lax

    return [_jnp().matmul(xs[0], xs[1], precision=lax.Precision.HIGHEST)]


@jax_op("Gemm")
def _gemm(node: Node, xs: list[Any]) -> list[Any]:
    from jax import lax

    a, b = xs[0], xs[1]
    if node.attrs.get("transA"):
        a = a.T
    if node.attrs.get("transB"):
        b = b.T
    y = float(node.attrs.get("alpha", 1.0)) * _jnp().matmul(a, b, precision=lax.Precision.HIGHEST)
    if len(xs) > 2 and xs[2] is not None:
        y = y + float(node.attrs.get("beta", 1.0)) * xs[2]
    return [y]


def _pads(
    node: Node, spatial: list[int], kernel: list[int], strides: list[int], dilations: list[int]
) -> list[tuple[int, int]]:
    """ONNX's pads (or auto_pad) as [(begin, end)] per spatial axis."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    rank = len(spatial)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        result = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            result.append((small, large) if auto == "SAME_UPPER" else (large, small))
        return result
    if auto == "VALID":
        return [(0, 0)] * rank
    pads = [int(p) for p in node.attrs.get("pads", [0] * 2 * rank)]
    return [(pads[i], pads[i + rank]) for i in range(rank)]


@jax_op("Conv")
def _conv(node: Node, xs: list[Any]) -> list[Any]:
    from jax import lax

    x, w = xs[0], xs[1]
    rank = x.ndim - 2
    kernel = list(w.shape[2:])
    strides = [int(s) for s in node.attrs.get("strides", [1] * rank)]
    dilations = [int(d) for d in node.attrs.get("dilations", [1] * rank)]
    pads = _pads(node, list(x.shape[2:]), kernel, strides, dilations)
    letters = "DHW"[-rank:] if rank <= 3 else None
    if letters is None:
        raise Unavailable(f"a {rank}-d convolution")
    numbers = (f"NC{letters}", f"OI{letters}", f"NC{letters}")
    y = lax.conv_general_dilated(
        x,
        w,
        window_strides=strides,
        padding=pads,
        rhs_dilation=dilations,
        dimension_numbers=numbers,
        feature_group_count=int(node.attrs.get("group", 1)),
        precision=lax.Precision.HIGHEST,
    )
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2].reshape((1, -1) + (1,) * rank)
    return [y]


def _window(node: Node, x: Any) -> tuple[list[int], list[int], list[tuple[int, int]], list[int]]:
    rank = x.ndim - 2
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    strides = [int(s) for s in node.attrs.get("strides", [1] * rank)]
    dilations = [int(d) for d in node.attrs.get("dilations", [1] * rank)]
    pads = _pads(node, list(x.shape[2:]), kernel, strides, dilations)
    if node.attrs.get("ceil_mode"):  # extra end padding so the last partial window counts
        grown = []
        for (begin, end), size, k, s, d in zip(pads, x.shape[2:], kernel, strides, dilations):
            span = (k - 1) * d + 1
            floor_out = (size + begin + end - span) // s + 1
            ceil_out = -(-(size + begin + end - span) // s) + 1
            if (ceil_out - 1) * s >= size + begin:  # a window starting in the end padding is dropped
                ceil_out -= 1
            grown.append((begin, end + (ceil_out - floor_out) * s))
        pads = grown
    return kernel, strides, pads, dilations


@jax_op("MaxPool")
def _max_pool(node: Node, xs: list[Any]) -> list[Any]:
    from jax import lax

    x = xs[0]
    kernel, strides, pads, dilations = _window(node, x)
    if len(node.outputs) > 1:
        raise Unavailable("MaxPool's indices output")
    low = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    y = lax.reduce_window(
        x, np.array(low, x.dtype), lax.max, (1, 1, *kernel), (1, 1, *strides), [(0, 0), (0, 0), *pads],
        window_dilation=(1, 1, *dilations),
    )  # fmt: skip
    return [y]


@jax_op("AveragePool")
def _average_pool(node: Node, xs: list[Any]) -> list[Any]:
    from jax import lax

    jnp = _jnp()
    x = xs[0]
    kernel, strides, pads, dilations = _window(node, x)
    window = ((1, 1, *kernel), (1, 1, *strides), [(0, 0), (0, 0), *pads])
    total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, *window, window_dilation=(1, 1, *dilations))
    if node.attrs.get("count_include_pad"):
        # the explicit pads count, the ceil_mode extension does not (as ONNX's reference)
        explicit = _pads(node, list(x.shape[2:]), kernel, [1] * len(kernel), dilations)
        padded = jnp.pad(jnp.ones(x.shape[2:], x.dtype), explicit, constant_values=1)
        extra = [(0, p[1] - e[1]) for p, e in zip(window[2][2:], explicit)]
        counts = lax.reduce_window(padded, np.array(0, x.dtype), lax.add, tuple(kernel), tuple(strides), extra,
                                   window_dilation=tuple(dilations))  # fmt: skip
    else:
        ones = jnp.ones(x.shape[2:], x.dtype)
        counts = lax.reduce_window(ones, np.array(0, x.dtype), lax.add, tuple(kernel), tuple(strides), window[2][2:],
                                   window_dilation=tuple(dilations))  # fmt: skip
    return [total / counts]


@jax_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(node: Node, xs: list[Any]) -> list[Any]:
    jnp = _jnp()
    axes = tuple(range(2, xs[0].ndim))
    reduce = jnp.mean if node.op == "GlobalAveragePool" else jnp.max
    return [reduce(xs[0], axis=axes, keepdims=True)]


@jax_op("BatchNormalization")
def _batch_norm(node: Node, xs: list[Any]) -> list[Any]:
    x, scale, bias, mean, var = xs[:5]
    if node.attrs.get("training_mode"):
        raise Unavailable("BatchNormalization in training mode")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    eps = float(node.attrs.get("epsilon", 1e-5))
    jnp = _jnp()
    y = (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)
    return [y]


@jax_op("LayerNormalization")
def _layer_norm(node: Node, xs: list[Any]) -> list[Any]:
    jnp = _jnp()
    x = xs[0]
    axis = int(node.attrs.get("axis", -1))
    axes = tuple(range(axis % x.ndim, x.ndim))
    eps = float(node.attrs.get("epsilon", 1e-5))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    inv = 1 / jnp.sqrt(jnp.mean(centered * centered, axis=axes, keepdims=True) + eps)
    y = centered * inv * xs[1]
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2]
    return [y, mean, inv][: len(node.outputs)]


@jax_op("Softmax", "LogSoftmax")
def _softmax(node: Node, xs: list[Any]) -> list[Any]:
    import jax

    axis = int(node.attrs.get("axis", -1))
    function = jax.nn.softmax if node.op == "Softmax" else jax.nn.log_softmax
    return [function(xs[0], axis=axis)]


def _axes(node: Node, xs: list[Any], position: int) -> list[int] | None:
    if len(xs) > position and xs[position] is not None:
        return [int(a) for a in _static(xs[position], f"{node.op}'s axes")]
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    return None


@jax_op("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL2")
def _reduce(node: Node, xs: list[Any]) -> list[Any]:
    jnp = _jnp()
    axes = _axes(node, xs, 1)
    keep = bool(node.attrs.get("keepdims", 1))
    if axes is None or axes == []:
        if axes == [] and node.attrs.get("noop_with_empty_axes"):
            return [xs[0]]
        axes = list(range(xs[0].ndim))
    x = xs[0]
    if node.op in ("ReduceSumSquare", "ReduceL2"):
        x = x * x
    axes_tuple = tuple(a % xs[0].ndim for a in axes)
    if node.op in ("ReduceMax", "ReduceMin"):  # an empty reduction is the identity, as ONNX's
        dtype = np.dtype(x.dtype)
        if dtype == np.bool_:
            low, high = False, True
        elif np.issubdtype(dtype, np.integer):
            low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
        else:
            low, high = -np.inf, np.inf
        if node.op == "ReduceMax":
            return [jnp.max(x, axis=axes_tuple, keepdims=keep, initial=low)]
        initial = high
        return [jnp.min(x, axis=axes_tuple, keepdims=keep, initial=initial)]
    function = {
        "ReduceMean": jnp.mean, "ReduceSum": jnp.sum, "ReduceProd": jnp.prod, "ReduceSumSquare": jnp.sum,
        "ReduceL2": jnp.sum,
    }[node.op]  # fmt: skip
    y = function(x, axis=axes_tuple, keepdims=keep)
    return [jnp.sqrt(y) if node.op == "ReduceL2" else y]


# -- shapes and data movement ----------------------------------------------------------------------------


@jax_op("Shape")
def _shape(node: Node, xs: list[Any]) -> list[Any]:
    shape = np.asarray(xs[0].shape, dtype=np.int64)  # static under jit
    start, end = node.attrs.get("start"), node.attrs.get("end")
    return [shape[slice(start, end)]]


@jax_op("Reshape")
def _reshape(node: Node, xs: list[Any]) -> list[Any]:
    shape = [int(d) for d in _static(xs[1], "Reshape's shape")]
    if not node.attrs.get("allowzero"):
        shape = [xs[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [xs[0].reshape(shape)]


@jax_op("Flatten")
def _flatten(node: Node, xs: list[Any]) -> list[Any]:
    x = xs[0]
    axis = int(node.attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    outer = int(np.prod(x.shape[:axis])) if axis else 1
    return [x.reshape(outer, -1)]


@jax_op("Transpose")
def _transpose(node: Node, xs: list[Any]) -> list[Any]:
    perm = node.attrs.get("perm")
    return [_jnp().transpose(xs[0], None if perm is None else [int(p) for p in perm])]


@jax_op("Squeeze")
def _squeeze(node: Node, xs: list[Any]) -> list[Any]:
    axes = _axes(node, xs, 1)
    return [_jnp().squeeze(xs[0], axis=None if axes is None else tuple(a % xs[0].ndim for a in axes))]


@jax_op("Unsqueeze")
def _unsqueeze(node: Node, xs: list[Any]) -> list[Any]:
    axes = _axes(node, xs, 1) or []
    rank = xs[0].ndim + len(axes)
    return [_jnp().expand_dims(xs[0], tuple(sorted(a % rank for a in axes)))]


@jax_op("Concat")
def _concat(node: Node, xs: list[Any]) -> list[Any]:
    return [_jnp().concatenate([x for x in xs if x is not None], axis=int(node.attrs["axis"]))]


@jax_op("Split")
def _split(node: Node, xs: list[Any]) -> list[Any]:
    x = xs[0]
    axis = int(node.attrs.get("axis", 0)) % x.ndim
    if len(xs) > 1 and xs[1] is not None:
        sizes = [int(s) for s in _static(xs[1], "Split's sizes")]
    elif "split" in node.attrs:
        sizes = [int(s) for s in node.attrs["split"]]
    else:
        parts = int(node.attrs.get("num_outputs", len(node.outputs)))
        each = -(-x.shape[axis] // parts)
        sizes = [min(each, x.shape[axis] - i * each) for i in range(parts)]
    return list(_jnp().split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis))


@jax_op("Slice")
def _slice(node: Node, xs: list[Any]) -> list[Any]:
    x = xs[0]
    starts = _static(xs[1], "Slice's starts")
    ends = _static(xs[2], "Slice's ends")
    axes = _static(xs[3], "Slice's axes") if len(xs) > 3 and xs[3] is not None else np.arange(len(starts))
    steps = _static(xs[4], "Slice's steps") if len(xs) > 4 and xs[4] is not None else np.ones(len(starts), np.int64)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[int(axis) % x.ndim] = slice(int(start), int(end), int(step))  # Python's clamping is ONNX's
    return [x[tuple(index)]]


@jax_op("Gather", "GatherElements")
def _gather(node: Node, xs: list[Any]) -> list[Any]:
    jnp = _jnp()
    x, indices = xs
    axis = int(node.attrs.get("axis", 0)) % x.ndim
    indices = jnp.where(indices < 0, indices + x.shape[axis], indices)  # ONNX counts negatives from the end
    take = jnp.take if node.op == "Gather" else jnp.take_along_axis
    return [take(x, indices, axis=axis)]


@jax_op("GatherND")
def _gather_nd(node: Node, xs: list[Any]) -> list[Any]:
    x, indices = xs
    if int(node.attrs.get("batch_dims", 0)):
        raise Unavailable("GatherND with batch_dims")
    depth = indices.shape[-1]
    jnp = _jnp()
    fixed = jnp.where(indices < 0, indices + jnp.asarray(x.shape[:depth]), indices)
    return [x[tuple(fixed[..., i] for i in range(depth))]]


@jax_op("Expand")
def _expand(node: Node, xs: list[Any]) -> list[Any]:
    shape = tuple(int(d) for d in _static(xs[1], "Expand's shape"))
    return [_jnp().broadcast_to(xs[0], np.broadcast_shapes(xs[0].shape, shape))]


@jax_op("Tile")
def _tile(node: Node, xs: list[Any]) -> list[Any]:
    return [_jnp().tile(xs[0], tuple(int(r) for r in _static(xs[1], "Tile's repeats")))]


# -- the graph -------------------------------------------------------------------------------------------
