"""The conversion table of kiln's PyTorch frontend: core ATen ops (as ``torch.export`` and
``make_fx`` with torch's core decompositions leave them) -> the kiln ops that compute them.
``CONVERTERS`` maps an op overload's name (``aten.convolution.default``) to a function of the
converter (``kiln.frontend.fx.FxConverter``: ``one``/``emit`` make kiln nodes, ``const``/``ints``
constants) and the FX node's arguments, returning the kiln value(s) of the node's result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.ir.graph import Value
from kiln.ir.types import DType, TensorType

FxConverter = Any  # kiln.frontend.fx.FxConverter (which imports this table)

OPSET = 21


class UnsupportedFxOp(KilnError):
    """An FX node kiln has no conversion for (its ATen op is named)."""

    def __init__(self, op: str, detail: str = "") -> None:
        self.op = op
        super().__init__(f"no kiln conversion for {op}" + (f": {detail}" if detail else ""))


def torch_dtype(dtype: Any) -> DType:
    import torch

    table = {
        torch.float32: DType.FLOAT32,
        torch.float64: DType.FLOAT64,
        torch.float16: DType.FLOAT16,
        torch.bfloat16: DType.BFLOAT16,
        torch.int64: DType.INT64,
        torch.int32: DType.INT32,
        torch.int16: DType.INT16,
        torch.int8: DType.INT8,
        torch.uint8: DType.UINT8,
        torch.bool: DType.BOOL,
    }
    if dtype not in table:
        raise UnsupportedFxOp(f"dtype {dtype}")
    return table[dtype]


def dim_of(d: Any) -> int | str:
    """A torch size: an int, or a symbol's name (``s0``) when torch traced it symbolically."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    expr = d.node.expr if hasattr(d, "node") else d
    if getattr(expr, "is_number", False):
        return int(expr)
    name = str(expr)
    if not name.isidentifier():
        raise UnsupportedFxOp("a symbolic size", f"{name} (kiln's symbolic dims are single symbols)")
    return name


# -- the conversion table ---------------------------------------------------------------------------------

Converter = Callable[..., Any]
CONVERTERS: dict[str, Converter] = {}


def converts(*names: str) -> Callable[[Converter], Converter]:
    def register(function: Converter) -> Converter:
        for name in names:
            CONVERTERS[name] = function
        return function

    return register


def _unary(op: str) -> Converter:
    return lambda fx, x: fx.one(op, [x])


for _name, _op in {
    "relu": "Relu",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "neg": "Neg",
    "abs": "Abs",
    "erf": "Erf",
    "sin": "Sin",
    "cos": "Cos",
    "floor": "Floor",
    "ceil": "Ceil",
    "reciprocal": "Reciprocal",
    "logical_not": "Not",
    "sign": "Sign",
}.items():
    CONVERTERS[f"aten.{_name}.default"] = _unary(_op)


@converts(
    "aten.clone.default",
    "aten.alias.default",
    "aten.alias_copy.default",
    "aten.detach.default",
    "aten.detach_copy.default",
    "aten.lift_fresh_copy.default",
)
def _identity(fx: FxConverter, x: Value, **kwargs: Any) -> Value:
    return x


@converts("aten.copy.default")
def _copy(fx: FxConverter, dest: Value, source: Value, non_blocking: bool = False) -> Value:
    """dest's shape and type, source's values (broadcast)."""
    value = source if source.type.dtype is dest.type.dtype else fx.one("Cast", [source], to=dest.type.dtype.onnx_code)  # type: ignore[union-attr]
    return fx.one("Expand", [value, fx.ints(fx.shape(dest))]) if fx.shape(value) != fx.shape(dest) else value


@converts("aten._assert_tensor_metadata.default")
def _assert(fx: FxConverter, *args: Any, **kwargs: Any) -> None:
    return None


@converts("aten.rsqrt.default")
def _rsqrt(fx: FxConverter, x: Value) -> Value:
    return fx.one("Reciprocal", [fx.one("Sqrt", [x])])


def _binary(op: str) -> Converter:
    def convert(fx: FxConverter, a: Any, b: Any, alpha: Any = 1, rounding_mode: Any = None) -> Value:
        if rounding_mode is not None:
            raise UnsupportedFxOp(f"{op} with rounding_mode={rounding_mode}")
        a_value = fx.tensor(a, b if isinstance(b, Value) else None)
        b_value = fx.tensor(b, a_value)
        if alpha != 1:
            b_value = fx.one("Mul", [b_value, fx.tensor(alpha, b_value)])
        return fx.one(op, [a_value, b_value])

    return convert


for _suffix in ("Tensor", "Scalar"):
    CONVERTERS[f"aten.add.{_suffix}"] = _binary("Add")
    CONVERTERS[f"aten.sub.{_suffix}"] = _binary("Sub")
    CONVERTERS[f"aten.mul.{_suffix}"] = _binary("Mul")
    CONVERTERS[f"aten.div.{_suffix}"] = _binary("Div")
    CONVERTERS[f"aten.eq.{_suffix}"] = _binary("Equal")
    CONVERTERS[f"aten.lt.{_suffix}"] = _binary("Less")
    CONVERTERS[f"aten.le.{_suffix}"] = _binary("LessOrEqual")
    CONVERTERS[f"aten.gt.{_suffix}"] = _binary("Greater")
    CONVERTERS[f"aten.ge.{_suffix}"] = _binary("GreaterOrEqual")
    CONVERTERS[f"aten.pow.Tensor_{_suffix}"] = _binary("Pow")
CONVERTERS["aten.div.Tensor_mode"] = _binary("Div")
CONVERTERS["aten.maximum.default"] = _binary("Max")
CONVERTERS["aten.minimum.default"] = _binary("Min")


@converts("aten.ne.Tensor", "aten.ne.Scalar")
def _not_equal(fx: FxConverter, a: Any, b: Any) -> Value:
    return fx.one("Not", [_binary("Equal")(fx, a, b)])


@converts("aten.bitwise_and.Tensor", "aten.logical_and.default")
def _and(fx: FxConverter, a: Value, b: Value) -> Value:
    return fx.one("And" if a.type.dtype is DType.BOOL else "BitwiseAnd", [a, fx.tensor(b, a)])  # type: ignore[union-attr]


@converts("aten.bitwise_or.Tensor", "aten.logical_or.default")
def _or(fx: FxConverter, a: Value, b: Value) -> Value:
    return fx.one("Or" if a.type.dtype is DType.BOOL else "BitwiseOr", [a, fx.tensor(b, a)])  # type: ignore[union-attr]


@converts("aten.where.self")
def _where(fx: FxConverter, cond: Value, a: Any, b: Any) -> Value:
    a_value = fx.tensor(a, b if isinstance(b, Value) else None)
    return fx.one("Where", [cond, a_value, fx.tensor(b, a_value)])


@converts("aten.gelu.default")
def _gelu(fx: FxConverter, x: Value, approximate: str = "none") -> Value:
    return fx.one("Gelu", [x], approximate=approximate)


@converts("aten.silu.default")
def _silu(fx: FxConverter, x: Value) -> Value:
    return fx.one("Mul", [x, fx.one("Sigmoid", [x])])


@converts("aten.hardtanh.default", "aten.clamp.default")
def _clamp(fx: FxConverter, x: Value, low: Any = None, high: Any = None) -> Value:
    if low is None and high is None:
        return x
    bound = [None if v is None else fx.const(np.asarray(v, x.type.dtype.numpy), "bound") for v in (low, high)]  # type: ignore[union-attr]
    return fx.one("Clip", [x, *bound])


@converts("aten.leaky_relu.default")
def _leaky_relu(fx: FxConverter, x: Value, slope: float = 0.01) -> Value:
    return fx.one("LeakyRelu", [x], alpha=float(slope))


@converts("aten.hardswish.default")
def _hardswish(fx: FxConverter, x: Value) -> Value:
    return fx.one("HardSwish", [x])


@converts("aten._softmax.default", "aten.softmax.int")
def _softmax(fx: FxConverter, x: Value, dim: int, half_to_float: Any = False) -> Value:
    return fx.one("Softmax", [x], axis=int(dim))


@converts("aten._log_softmax.default")
def _log_softmax(fx: FxConverter, x: Value, dim: int, half_to_float: Any = False) -> Value:
    return fx.one("LogSoftmax", [x], axis=int(dim))


@converts("aten.convolution.default")
def _convolution(fx: FxConverter, x, w, b, stride, padding, dilation, transposed, output_padding, groups) -> Value:  # type: ignore[no-untyped-def]
    spatial = fx.rank(x) - 2
    attrs: dict[str, Any] = {
        "strides": [int(s) for s in stride] * (spatial if len(stride) == 1 else 1),
        "pads": [int(p) for p in padding] * (2 if len(padding) == spatial else 1),
        "dilations": [int(d) for d in dilation] * (spatial if len(dilation) == 1 else 1),
        "group": int(groups),
    }
    if len(attrs["pads"]) != 2 * spatial:
        attrs["pads"] = [int(padding[0])] * 2 * spatial
    if transposed:
        attrs["output_padding"] = [int(p) for p in output_padding]
        return fx.one("ConvTranspose", [x, w, b], **attrs)
    return fx.one("Conv", [x, w, b], **attrs)


@converts("aten.addmm.default")
def _addmm(fx: FxConverter, bias: Value, a: Value, b: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    product = fx.one("MatMul", [a, b])
    if alpha != 1:
        product = fx.one("Mul", [product, fx.tensor(alpha, product)])
    if beta != 1:
        bias = fx.one("Mul", [bias, fx.tensor(beta, bias)])
    return fx.one("Add", [product, bias])


@converts("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(fx: FxConverter, a: Value, b: Value) -> Value:
    return fx.one("MatMul", [a, b])


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
    return _full_like_constant(fx, size, 0, dtype or __import__("torch").float32)


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


def _reduce(op: str) -> Converter:
    def convert(fx: FxConverter, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
        axes = list(range(fx.rank(x))) if dims is None or dims == [] else [int(d) for d in dims]
        if dtype is not None:
            x = fx.one("Cast", [x], to=torch_dtype(dtype).onnx_code)
        return fx.one(op, [x, fx.ints(axes, "axes")], keepdims=int(bool(keepdim)))

    return convert


CONVERTERS["aten.mean.dim"] = _reduce("ReduceMean")
CONVERTERS["aten.sum.dim_IntList"] = _reduce("ReduceSum")
CONVERTERS["aten.amax.default"] = _reduce("ReduceMax")
CONVERTERS["aten.amin.default"] = _reduce("ReduceMin")


def _boolean_reduce(kind: str) -> Converter:
    def convert(fx: FxConverter, x: Value, dims: Any = None, keepdim: bool = False) -> Value:
        dims = [dims] if isinstance(dims, int) else dims
        count = fx.one("Cast", [x], to=DType.INT32.onnx_code)
        folded = _reduce("ReduceMax" if kind == "any" else "ReduceMin")(fx, count, dims, keepdim)
        return fx.one("Cast", [folded], to=DType.BOOL.onnx_code)

    return convert


for _kind in ("any", "all"):
    for _overload in ("dim", "dims", "default"):
        CONVERTERS[f"aten.{_kind}.{_overload}"] = _boolean_reduce(_kind)


@converts("aten.log1p.default")
def _log1p(fx: FxConverter, x: Value) -> Value:
    return fx.one("Log", [fx.one("Add", [x, fx.tensor(1.0, x)])])


@converts("aten.expm1.default")
def _expm1(fx: FxConverter, x: Value) -> Value:
    return fx.one("Sub", [fx.one("Exp", [x]), fx.tensor(1.0, x)])


@converts("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(fx: FxConverter, x: Value, mask: Value, value: Any) -> Value:
    return fx.one("Where", [mask, fx.one("Cast", [fx.tensor(value, x)], to=x.type.dtype.onnx_code), x])  # type: ignore[union-attr]


@converts("aten.full_like.default")
def _full_like(fx: FxConverter, x: Value, value: Any, dtype: Any = None, **kwargs: Any) -> Value:
    return _copy(
        fx,
        x if dtype is None else fx.const(np.zeros(fx.shape(x), torch_dtype(dtype).numpy)),
        fx.tensor(value, x),
    )


CONVERTERS["aten.zeros_like.default"] = lambda fx, x, dtype=None, **kwargs: _full_like(fx, x, 0, dtype)
CONVERTERS["aten.ones_like.default"] = lambda fx, x, dtype=None, **kwargs: _full_like(fx, x, 1, dtype)


@converts("aten.mean.default")
def _mean_all(fx: FxConverter, x: Value, dtype: Any = None) -> Value:
    return _reduce("ReduceMean")(fx, x, dtype=dtype)


@converts("aten.sum.default")
def _sum_all(fx: FxConverter, x: Value, dtype: Any = None) -> Value:
    return _reduce("ReduceSum")(fx, x, dtype=dtype)


def _target_shape(fx: FxConverter, x: Value, shape: list) -> Value:
    """A view's target shape: one symbolic size (a dynamic batch) is the -1 Reshape infers."""
    sizes = [dim_of(s) for s in shape]
    symbolic = [i for i, s in enumerate(sizes) if not isinstance(s, int)]
    if len(symbolic) > 1 or (symbolic and -1 in sizes):
        raise UnsupportedFxOp("aten.view.default", f"a target shape with several symbolic sizes {sizes}")
    return fx.ints([-1 if i in symbolic else s for i, s in enumerate(sizes)])


@converts("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default")
def _view(fx: FxConverter, x: Value, shape: list) -> Value:
    return fx.one("Reshape", [x, _target_shape(fx, x, shape)])


@converts("aten.expand.default", "aten.expand_copy.default")
def _expand(fx: FxConverter, x: Value, shape: list, implicit: bool = False) -> Value:
    rank = len(shape)
    current = (1,) * (rank - fx.rank(x)) + fx.shape(x)
    sizes = []
    for have, want in zip(current, (dim_of(s) for s in shape)):
        if want == -1 or (not isinstance(want, int) and have == want):
            sizes.append(1)  # kept: Expand broadcasts a size against 1
        elif not isinstance(want, int):
            raise UnsupportedFxOp("aten.expand.default", f"expanding a dim of {have} to the symbolic size {want}")
        else:
            sizes.append(want)
    return fx.one("Expand", [x, fx.ints(sizes)])


@converts("aten.permute.default", "aten.permute_copy.default")
def _permute(fx: FxConverter, x: Value, dims: list) -> Value:
    perm = [fx.axis(int(d), x) for d in dims]
    if x in fx.constants:  # a weight's transpose (nn.Linear's): a transposed view, copied neither
        # here nor each run (the matmul lowering packs a weight into its own layout anyway)
        return fx.const(fx.constants[x].transpose(perm), "transposed")
    return fx.one("Transpose", [x], perm=perm)


@converts("aten.t.default", "aten.t_copy.default")
def _t(fx: FxConverter, x: Value) -> Value:
    return _permute(fx, x, [1, 0]) if fx.rank(x) == 2 else x


@converts("aten.transpose.int", "aten.transpose_copy.int")
def _transpose(fx: FxConverter, x: Value, a: int, b: int) -> Value:
    perm = list(range(fx.rank(x)))
    a, b = fx.axis(a, x), fx.axis(b, x)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(fx, x, perm)


@converts("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def _unsqueeze(fx: FxConverter, x: Value, dim: int) -> Value:
    dim = dim + fx.rank(x) + 1 if dim < 0 else dim
    return fx.one("Unsqueeze", [x, fx.ints([dim], "axes")])


@converts(
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze.default",
    "aten.squeeze_copy.dim",
    "aten.squeeze_copy.dims",
    "aten.squeeze_copy.default",
)
def _squeeze(fx: FxConverter, x: Value, dims: Any = None) -> Value:
    if dims is None:
        dims = [i for i, d in enumerate(fx.shape(x)) if d == 1]
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = [fx.axis(int(d), x) for d in dims if fx.shape(x)[fx.axis(int(d), x)] == 1]
    return fx.one("Squeeze", [x, fx.ints(dims, "axes")]) if dims else x


@converts("aten.flatten.using_ints")
def _flatten(fx: FxConverter, x: Value, start: int = 0, end: int = -1) -> Value:
    shape = fx.shape(x)
    start, end = fx.axis(start, x), fx.axis(end, x)
    middle = int(np.prod(shape[start : end + 1]))
    return fx.one("Reshape", [x, fx.ints([*shape[:start], middle, *shape[end + 1 :]])])


@converts("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice(fx: FxConverter, x: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Value:
    size = fx.shape(x)[fx.axis(dim, x)]
    start = 0 if start is None else int(start)
    end = np.iinfo(np.int64).max if end is None else int(end)
    if isinstance(size, int) and start == 0 and end >= size and step == 1:
        return x
    return fx.one("Slice", [x, fx.ints([start]), fx.ints([end]), fx.ints([fx.axis(dim, x)]), fx.ints([int(step)])])


@converts("aten.select.int", "aten.select_copy.int")
def _select(fx: FxConverter, x: Value, dim: int, index: int) -> Value:
    return fx.one("Gather", [x, fx.const(np.asarray(int(index), np.int64), "index")], axis=fx.axis(dim, x))


@converts("aten.cat.default")
def _cat(fx: FxConverter, tensors: list, dim: int = 0) -> Value:
    tensors = [t for t in tensors if not (isinstance(t.type, TensorType) and 0 in t.type.shape)]
    return fx.one("Concat", list(tensors), axis=fx.axis(dim, tensors[0]))


@converts(
    "aten.split_with_sizes.default", "aten.split.Tensor", "aten.split_with_sizes_copy.default", "aten.split_copy.Tensor"
)
def _split(fx: FxConverter, x: Value, sizes: Any, dim: int = 0) -> tuple:
    axis = fx.axis(dim, x)
    if isinstance(sizes, int):
        total = fx.shape(x)[axis]
        sizes = [sizes] * (total // sizes) + ([total % sizes] if total % sizes else [])
    return tuple(fx.emit("Split", [x, fx.ints(sizes, "split")], {"axis": axis}, len(sizes)))


@converts("aten.embedding.default")
def _embedding(fx: FxConverter, weight: Value, indices: Value, *rest: Any) -> Value:
    return fx.one("Gather", [weight, indices], axis=0)


@converts("aten.gather.default")
def _gather(fx: FxConverter, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    return fx.one("GatherElements", [x, index], axis=fx.axis(dim, x))


@converts("aten.index.Tensor")
def _index(fx: FxConverter, x: Value, indices: list) -> Value:
    """x[..., i0, i1, ...] with index tensors on adjacent axes (NumPy's advanced indexing): the
    indices broadcast together and stacked, one GatherND on x with those axes brought first, the
    result's indexed dims put back where the first indexed axis was."""
    given = [(axis, i) for axis, i in enumerate(indices) if i is not None]
    axes = [axis for axis, _ in given]
    if axes != list(range(axes[0], axes[0] + len(axes))):
        raise UnsupportedFxOp("aten.index.Tensor", "index tensors on axes that are not adjacent")
    if len(given) == 1:
        return fx.one("Gather", [x, given[0][1]], axis=axes[0])
    shapes = [fx.shape(i) for _, i in given]
    if not all(isinstance(d, int) for shape in shapes for d in shape):
        raise UnsupportedFxOp("aten.index.Tensor", "symbolic index shapes")
    common = list(np.broadcast_shapes(*shapes))
    stacked = [
        fx.one(
            "Unsqueeze",
            [fx.one("Expand", [fx.one("Cast", [i], to=DType.INT64.onnx_code), fx.ints(common)]), fx.ints([-1], "axes")],
        )
        for _, i in given
    ]
    rank = fx.rank(x)
    rest = [a for a in range(rank) if a not in axes]
    front = fx.one("Transpose", [x], perm=axes + rest) if axes[0] != 0 else x
    gathered = fx.one("GatherND", [front, fx.one("Concat", stacked, axis=-1)])
    if axes[0] == 0:
        return gathered
    # the gathered dims (len(common) of them) go where the first indexed axis was
    count, before = len(common), axes[0]
    perm = [*range(count, count + before), *range(count), *range(count + before, count + len(rest))]
    return fx.one("Transpose", [gathered], perm=perm)


@converts("aten._to_copy.default", "aten.to.dtype")
def _to_copy(fx: FxConverter, x: Value, dtype: Any = None, **kwargs: Any) -> Value:
    if dtype is None or torch_dtype(dtype) is x.type.dtype:  # type: ignore[union-attr]
        return x
    return fx.one("Cast", [x], to=torch_dtype(dtype).onnx_code)


def _full_like_constant(fx: FxConverter, size: list, value: Any, dtype: Any) -> Value:
    numpy = torch_dtype(dtype).numpy if dtype is not None else (np.float32 if isinstance(value, float) else np.int64)
    if not all(isinstance(s, int) for s in size):
        raise UnsupportedFxOp("aten.full.default", "a symbolic size")
    return fx.const(np.full([int(s) for s in size], value, dtype=numpy), "full")


@converts("aten.full.default")
def _full(fx: FxConverter, size: list, value: Any, dtype: Any = None, **kwargs: Any) -> Value:
    return _full_like_constant(fx, size, value, dtype)


@converts("aten.zeros.default")
def _zeros(fx: FxConverter, size: list, dtype: Any = None, **kwargs: Any) -> Value:
    return _full_like_constant(fx, size, 0, dtype or __import__("torch").float32)


@converts("aten.ones.default")
def _ones(fx: FxConverter, size: list, dtype: Any = None, **kwargs: Any) -> Value:
    return _full_like_constant(fx, size, 1, dtype or __import__("torch").float32)


@converts("aten.scalar_tensor.default")
def _scalar_tensor(fx: FxConverter, value: Any, dtype: Any = None, **kwargs: Any) -> Value:
    return _full_like_constant(fx, [], value, dtype or __import__("torch").float32)


@converts("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def _arange(fx: FxConverter, start: Any, end: Any = None, step: Any = 1, dtype: Any = None, **kwargs: Any) -> Value:
    if end is None:
        start, end = 0, start
    numpy = torch_dtype(dtype).numpy if dtype is not None else np.int64
    if any(not isinstance(v, (int, float)) for v in (start, end, step)):
        raise UnsupportedFxOp("aten.arange", "symbolic bounds")
    return fx.const(np.arange(start, end, step, dtype=numpy), "arange")


@converts("aten.constant_pad_nd.default")
def _pad(fx: FxConverter, x: Value, pad: list, value: float = 0.0) -> Value:
    rank = fx.rank(x)
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):  # torch lists the last dim first
        begins[rank - 1 - i], ends[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    constant = fx.const(np.asarray(value, x.type.dtype.numpy), "pad_value")  # type: ignore[union-attr]
    return fx.one("Pad", [x, fx.ints(begins + ends, "pads"), constant])


# -- PyTorch's fused inference fast paths ---------------------------------------------------------------
# nn.TransformerEncoderLayer calls one fused op in eval mode without gradients (batch_first; dynamo
# keeps it; nn.MultiheadAttention's own fast path it traces through); no decomposition reaches core
# ATen, so it is written out here in kiln ops, in the form kiln's attention fusion matches.


def _linear(fx: FxConverter, x: Value, weight: Value, bias: Value | None) -> Value:
    product = fx.one("MatMul", [x, _t(fx, weight)])
    return product if bias is None else fx.one("Add", [product, bias])


def _heads_attention(fx: FxConverter, q: Value, k: Value, v: Value, heads: int, mask: Value | None) -> Value:
    """softmax(q k^T / sqrt(d) + mask) v over ``heads`` heads of [batch, seq, embed] projections."""
    embed = int(fx.shape(q)[-1])
    depth = embed // heads
    split = [
        fx.one("Transpose", [fx.one("Reshape", [t, fx.ints([0, 0, heads, depth])])], perm=[0, 2, 1, 3])
        for t in (q, k, v)
    ]
    scores = fx.one("MatMul", [split[0], fx.one("Transpose", [split[1]], perm=[0, 1, 3, 2])])
    scores = fx.one("Mul", [scores, fx.const(np.asarray(1.0 / np.sqrt(depth), q.type.dtype.numpy), "scale")])  # type: ignore[union-attr]
    if mask is not None:
        scores = fx.one("Add", [scores, mask])
    context = fx.one("MatMul", [fx.one("Softmax", [scores], axis=-1), split[2]])
    return fx.one("Reshape", [fx.one("Transpose", [context], perm=[0, 2, 1, 3]), fx.ints([0, 0, embed])])


def _attention_mask(fx: FxConverter, op: str, mask: Value | None, mask_type: Any, dtype: Any) -> Value | None:
    """A fast path's mask as an additive one broadcast over [batch, heads, query, key]: type 0 an
    [query, key] attention mask, 1 a [batch, key] padding mask (True: ignored), 2 already
    [batch, heads, query, key]."""
    if mask is None:
        return None
    if mask.type.dtype is DType.BOOL:  # type: ignore[union-attr]
        zero, low = (fx.const(np.asarray(v, dtype), "mask") for v in (0.0, -np.inf))
        mask = fx.one("Where", [mask, low, zero])
    rank = fx.rank(mask)
    if mask_type == 1 and rank == 2:
        return fx.one("Unsqueeze", [mask, fx.ints([1, 2], "axes")])  # [batch, 1, 1, key]
    if rank in (2, 4):  # [query, key] or [batch, heads, query, key]: broadcasts as it is
        return mask
    raise UnsupportedFxOp(op, f"a rank-{rank} mask of type {mask_type}")


@converts("aten._transformer_encoder_layer_fwd.default")
def _encoder_layer(  # type: ignore[no-untyped-def]
    fx: FxConverter,
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
) -> Value:
    def norm(x: Value, weight: Value, bias: Value) -> Value:
        return fx.emit("LayerNormalization", [x, weight, bias], {"axis": -1, "epsilon": float(eps)}, 1)[0]

    embed = int(embed_dim)
    mask = _attention_mask(fx, "aten._transformer_encoder_layer_fwd.default", mask, mask_type, src.type.dtype.numpy)
    x = src
    attend = norm(x, norm_weight_1, norm_bias_1) if norm_first else x
    q, k, v = fx.emit(
        "Split", [_linear(fx, attend, qkv_weight, qkv_bias), fx.ints([embed] * 3, "split")], {"axis": -1}, 3
    )
    x = fx.one("Add", [x, _linear(fx, _heads_attention(fx, q, k, v, int(num_heads), mask), proj_weight, proj_bias)])
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    hidden = _linear(fx, norm(x, norm_weight_2, norm_bias_2) if norm_first else x, ffn_weight_1, ffn_bias_1)
    hidden = fx.one("Gelu", [hidden]) if use_gelu else fx.one("Relu", [hidden])
    x = fx.one("Add", [x, _linear(fx, hidden, ffn_weight_2, ffn_bias_2)])
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


# -- scaled dot-product attention ------------------------------------------------------------------------
# Kept out of torch's decompositions (``KEPT``): torch's math decomposition scales q and k apart
# and guards against NaN in ways kiln's attention fusion does not match; written here as
# softmax(q k^T * scale + mask) v, the one form kiln fuses into its attention kernel.

KEPT = ("aten.scaled_dot_product_attention.default", "aten._scaled_dot_product_flash_attention_for_cpu.default")


def decompositions() -> dict:
    """torch's core ATen decompositions, without the ops this table converts whole (``KEPT``)."""
    from torch._decomp import core_aten_decompositions

    return {op: fn for op, fn in core_aten_decompositions().items() if str(op) not in KEPT}


def _causal_mask(fx: FxConverter, scores: Value) -> Value:
    """0 where key <= query, -inf above the diagonal ([query, key], top-left aligned as torch's
    is_causal); from the scores' shape, so a symbolic sequence length works too."""
    dtype = scores.type.dtype.numpy  # type: ignore[union-attr]
    shape = fx.shape(scores)
    if all(isinstance(d, int) for d in shape[-2:]):
        queries, keys = shape[-2], shape[-1]
        return fx.const(np.triu(np.full((queries, keys), -np.inf, dtype), 1).astype(dtype), "causal")
    sizes = fx.one("Shape", [scores])
    zero, one = fx.const(np.asarray(0, np.int64)), fx.const(np.asarray(1, np.int64))
    rows = fx.one("Range", [zero, fx.one("Gather", [sizes, fx.const(np.asarray(-2, np.int64))], axis=0), one])
    cols = fx.one("Range", [zero, fx.one("Gather", [sizes, fx.const(np.asarray(-1, np.int64))], axis=0), one])
    future = fx.one(
        "Greater",
        [fx.one("Unsqueeze", [cols, fx.ints([0], "axes")]), fx.one("Unsqueeze", [rows, fx.ints([1], "axes")])],
    )
    return fx.one("Where", [future, fx.const(np.asarray(-np.inf, dtype)), fx.const(np.asarray(0, dtype))])


def _sdpa(
    fx: FxConverter,
    q: Value,
    k: Value,
    v: Value,
    mask: Value | None,
    dropout: float,
    causal: bool,
    scale: Any,
    gqa: bool,
) -> Value:
    op = "aten.scaled_dot_product_attention.default"
    if dropout:
        raise UnsupportedFxOp(op, f"dropout_p={dropout} (inference only)")
    if fx.shape(q)[:-2] != fx.shape(k)[:-2]:
        raise UnsupportedFxOp(
            op, f"query heads {fx.shape(q)[:-2]} and key heads {fx.shape(k)[:-2]} differ (grouped-query attention)"
        )
    depth = fx.shape(q)[-1]
    if scale is None and not isinstance(depth, int):
        raise UnsupportedFxOp(op, f"a symbolic head size {depth}")
    dtype = q.type.dtype.numpy  # type: ignore[union-attr]
    factor = float(scale) if scale is not None else 1.0 / float(np.sqrt(depth))
    perm = list(range(fx.rank(k)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = fx.one(
        "Mul",
        [fx.one("MatMul", [q, fx.one("Transpose", [k], perm=perm)]), fx.const(np.asarray(factor, dtype), "scale")],
    )
    if causal:
        scores = fx.one("Add", [scores, _causal_mask(fx, scores)])
    if mask is not None:
        if mask.type.dtype is DType.BOOL:  # type: ignore[union-attr]  True: attend
            mask = fx.one("Where", [mask, fx.const(np.asarray(0, dtype)), fx.const(np.asarray(-np.inf, dtype))])
        scores = fx.one("Add", [scores, mask])
    return fx.one("MatMul", [fx.one("Softmax", [scores], axis=-1), v])


@converts("aten.scaled_dot_product_attention.default")
def _scaled_dot_product_attention(  # type: ignore[no-untyped-def]
    fx: FxConverter, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
) -> Value:
    return _sdpa(fx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@converts("aten._scaled_dot_product_flash_attention_for_cpu.default")
def _flash_attention_cpu(  # type: ignore[no-untyped-def]
    fx: FxConverter, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
) -> tuple:
    # (output, logsumexp): the log-sum-exp is for the backward pass; a graph reading it is refused
    return _sdpa(fx, q, k, v, attn_mask, dropout_p, is_causal, scale, False), None


# -- more of core ATen: index and order ops, normalizations, resizing ------------------------------------

for _name, _op in {
    "round": "Round",
    "isnan": "IsNaN",
    "atan": "Atan",
    "tan": "Tan",
    "asin": "Asin",
    "acos": "Acos",
}.items():
    CONVERTERS[f"aten.{_name}.default"] = _unary(_op)
CONVERTERS["aten.clamp.Tensor"] = lambda fx, x, low=None, high=None: _clamp_tensor(fx, x, low, high)
CONVERTERS["aten.prod.dim_int"] = lambda fx, x, dim, keepdim=False, dtype=None: _reduce("ReduceProd")(
    fx, x, [dim], keepdim, dtype
)


def _clamp_tensor(fx: FxConverter, x: Value, low: Any, high: Any) -> Value:
    if low is not None:
        x = fx.one("Max", [x, fx.tensor(low, x)])
    if high is not None:
        x = fx.one("Min", [x, fx.tensor(high, x)])
    return x


@converts("aten.trunc.default")
def _trunc(fx: FxConverter, x: Value) -> Value:
    negative = fx.one("Less", [x, fx.tensor(0.0, x)])
    return fx.one("Where", [negative, fx.one("Ceil", [x]), fx.one("Floor", [x])])


@converts("aten.log2.default")
def _log2(fx: FxConverter, x: Value) -> Value:
    return fx.one("Div", [fx.one("Log", [x]), fx.tensor(float(np.log(2.0)), x)])


@converts("aten.exp2.default")
def _exp2(fx: FxConverter, x: Value) -> Value:
    return fx.one("Pow", [fx.tensor(2.0, x), x])


@converts("aten.bitwise_not.default")
def _bitwise_not(fx: FxConverter, x: Value) -> Value:
    return fx.one("Not" if x.type.dtype is DType.BOOL else "BitwiseNot", [x])  # type: ignore[union-attr]


@converts("aten.remainder.Scalar", "aten.remainder.Tensor")
def _remainder(fx: FxConverter, a: Value, b: Any) -> Value:
    """Python's modulo (the divisor's sign): a - floor(a / b) * b for floats, Mod for integers."""
    b_value = fx.tensor(b, a)
    if not np.issubdtype(a.type.dtype.numpy, np.floating):  # type: ignore[union-attr]
        return fx.one("Mod", [a, b_value], fmod=0)
    return fx.one("Sub", [a, fx.one("Mul", [fx.one("Floor", [fx.one("Div", [a, b_value])]), b_value])])


@converts("aten.fmod.Scalar", "aten.fmod.Tensor")
def _fmod(fx: FxConverter, a: Value, b: Any) -> Value:
    return fx.one("Mod", [a, fx.tensor(b, a)], fmod=1)


@converts("aten.elu.default")
def _elu(fx: FxConverter, x: Value, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Value:
    """scale * elu(input_scale * x, alpha) (SELU is this with its constants)."""
    if input_scale != 1:
        x = fx.one("Mul", [x, fx.tensor(float(input_scale), x)])
    y = fx.one("Elu", [x], alpha=float(alpha))
    return fx.one("Mul", [y, fx.tensor(float(scale), y)]) if scale != 1 else y


def _arg(op: str) -> Converter:
    def convert(fx: FxConverter, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
        if dim is None:  # over the flattened tensor
            x, dim = fx.one("Reshape", [x, fx.ints([-1])]), 0
            keepdim = False
        return fx.one(op, [x], axis=fx.axis(int(dim), x), keepdims=int(bool(keepdim)), select_last_index=0)

    return convert


CONVERTERS["aten.argmax.default"] = _arg("ArgMax")
CONVERTERS["aten.argmin.default"] = _arg("ArgMin")


def _extreme(reduce: str, arg: str) -> Converter:
    def convert(fx: FxConverter, x: Value, dim: int, keepdim: bool = False) -> tuple:
        axis = fx.axis(int(dim), x)
        values = fx.one(reduce, [x, fx.ints([axis], "axes")], keepdims=int(bool(keepdim)))
        return values, fx.one(arg, [x], axis=axis, keepdims=int(bool(keepdim)), select_last_index=0)

    return convert


CONVERTERS["aten.max.dim"] = _extreme("ReduceMax", "ArgMax")
CONVERTERS["aten.min.dim"] = _extreme("ReduceMin", "ArgMin")


@converts("aten.cumsum.default")
def _cumsum(fx: FxConverter, x: Value, dim: int, dtype: Any = None) -> Value:
    if dtype is not None:
        x = fx.one("Cast", [x], to=torch_dtype(dtype).onnx_code)
    elif x.type.dtype in (DType.BOOL, DType.INT32, DType.INT16, DType.INT8, DType.UINT8):  # type: ignore[union-attr]
        x = fx.one("Cast", [x], to=DType.INT64.onnx_code)  # torch sums small integers as int64
    return fx.one("CumSum", [x, fx.const(np.asarray(fx.axis(int(dim), x), np.int64), "axis")])


@converts("aten.index_select.default")
def _index_select(fx: FxConverter, x: Value, dim: int, index: Value) -> Value:
    return fx.one("Gather", [x, index], axis=fx.axis(int(dim), x))


@converts("aten.flip.default")
def _flip(fx: FxConverter, x: Value, dims: list) -> Value:
    axes = [fx.axis(int(d), x) for d in dims]
    last = np.iinfo(np.int64).min
    return fx.one(
        "Slice", [x, fx.ints([-1] * len(axes)), fx.ints([last] * len(axes)), fx.ints(axes), fx.ints([-1] * len(axes))]
    )


@converts("aten.repeat.default")
def _repeat(fx: FxConverter, x: Value, repeats: list) -> Value:
    extra = len(repeats) - fx.rank(x)
    if extra > 0:
        x = fx.one("Unsqueeze", [x, fx.ints(list(range(extra)), "axes")])
    return fx.one("Tile", [x, fx.ints(repeats, "repeats")])


@converts("aten.scatter.src", "aten.scatter.value")
def _scatter(fx: FxConverter, x: Value, dim: int, index: Value, src: Any) -> Value:
    if not isinstance(src, Value):
        src = fx.one("Expand", [fx.tensor(src, x), fx.one("Shape", [index])])
    return fx.one("ScatterElements", [x, index, src], axis=fx.axis(int(dim), x))


@converts("aten.topk.default")
def _topk(fx: FxConverter, x: Value, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
    values, indices = fx.emit(
        "TopK",
        [x, fx.ints([int(k)], "k")],
        {"axis": fx.axis(int(dim), x), "largest": int(bool(largest)), "sorted": 1},
        2,
    )
    return values, indices


@converts("aten.sort.default")
def _sort(fx: FxConverter, x: Value, dim: int = -1, descending: bool = False) -> tuple:
    size = fx.shape(x)[fx.axis(int(dim), x)]
    if not isinstance(size, int):
        raise UnsupportedFxOp("aten.sort.default", f"sorting along the symbolic size {size}")
    return _topk(fx, x, size, dim, largest=descending)


@converts("aten.var_mean.correction")
def _var(fx: FxConverter, x: Value, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    """The variance (torch's ``correction``: 1 by default, Bessel's), and for var_mean the mean."""
    axes = list(range(fx.rank(x))) if dims is None else [fx.axis(int(d), x) for d in dims]
    sizes = [fx.shape(x)[a] for a in axes]
    if not all(isinstance(s, int) for s in sizes):
        raise UnsupportedFxOp("aten.var.correction", "a variance over symbolic sizes")
    count = int(np.prod(sizes))
    mean = fx.one("ReduceMean", [x, fx.ints(axes, "axes")], keepdims=1)
    centered = fx.one("Sub", [x, mean])
    total = fx.one(
        "ReduceSum", [fx.one("Mul", [centered, centered]), fx.ints(axes, "axes")], keepdims=int(bool(keepdim))
    )
    divisor = max(count - (1 if correction is None else float(correction)), 0)
    variance = fx.one("Div", [total, fx.tensor(float(divisor), total)])
    if not keepdim:
        mean = fx.one("Squeeze", [mean, fx.ints(axes, "axes")])
    return variance, mean  # var.correction is the first of these


CONVERTERS["aten.var.correction"] = lambda fx, *args, **kwargs: _var(fx, *args, **kwargs)[0]


@converts("aten.linalg_vector_norm.default")
def _vector_norm(
    fx: FxConverter, x: Value, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
) -> Value:
    axes = (
        list(range(fx.rank(x)))
        if dim is None
        else [fx.axis(int(d), x) for d in ([dim] if isinstance(dim, int) else dim)]
    )
    attrs = {"keepdims": int(bool(keepdim))}
    if ord == 2:
        return fx.one("Sqrt", [fx.one("ReduceSumSquare", [x, fx.ints(axes, "axes")], **attrs)])
    if ord == 1:
        return fx.one("ReduceL1", [x, fx.ints(axes, "axes")], **attrs)
    if ord == float("inf"):
        return fx.one("ReduceMax", [fx.one("Abs", [x]), fx.ints(axes, "axes")], **attrs)
    raise UnsupportedFxOp("aten.linalg_vector_norm.default", f"ord={ord}")


@converts("aten.native_group_norm.default")
def _group_norm(
    fx: FxConverter, x: Value, weight: Any, bias: Any, n: Any, c: Any, hw: Any, groups: int, eps: float
) -> tuple:
    """(normalized, mean, rstd) over ``groups`` groups of channels; the statistics [N, groups]."""
    shape = fx.shape(x)
    grouped = fx.one("Reshape", [x, fx.ints([0, int(groups), -1])])
    mean = fx.one("ReduceMean", [grouped, fx.ints([2], "axes")], keepdims=1)
    centered = fx.one("Sub", [grouped, mean])
    variance = fx.one("ReduceMean", [fx.one("Mul", [centered, centered]), fx.ints([2], "axes")], keepdims=1)
    rstd = fx.one("Reciprocal", [fx.one("Sqrt", [fx.one("Add", [variance, fx.tensor(float(eps), variance)])])])
    y = fx.one("Reshape", [fx.one("Mul", [centered, rstd]), fx.one("Shape", [x])])
    per_channel = [int(shape[1])] + [1] * (len(shape) - 2)
    if weight is not None:
        y = fx.one("Mul", [y, fx.one("Reshape", [weight, fx.ints(per_channel)])])
    if bias is not None:
        y = fx.one("Add", [y, fx.one("Reshape", [bias, fx.ints(per_channel)])])
    squeeze = fx.ints([2], "axes")
    return y, fx.one("Squeeze", [mean, squeeze]), fx.one("Squeeze", [rstd, squeeze])


def _resize(mode: str) -> Converter:
    """Resize to the traced op's ``output_size`` with torch's pixel centres: align_corners, else
    half-pixel (torch clamps a source index below 0 to the edge, as Resize's edge handling does);
    torch's bicubic is Keys' with a = -0.75."""

    def convert(fx: FxConverter, x: Value, output_size: list, align_corners: bool, *scales: Any) -> Value:
        sizes = [dim_of(d) for d in (*fx.shape(x)[:2], *output_size)]
        if not all(isinstance(s, int) for s in sizes):
            raise UnsupportedFxOp(f"aten.upsample_{mode}2d.default", "a symbolic output size")
        attrs: dict[str, Any] = {
            "mode": "cubic" if mode == "bicubic" else "linear",
            "coordinate_transformation_mode": "align_corners" if align_corners else "pytorch_half_pixel",
        }
        if mode == "bicubic":
            attrs["cubic_coeff_a"] = -0.75
        empty = fx.const(np.zeros((0,), np.float32), "roi")
        return fx.one("Resize", [x, empty, empty, fx.ints(sizes, "sizes")], **attrs)

    return convert


CONVERTERS["aten.upsample_bilinear2d.default"] = _resize("bilinear")
CONVERTERS["aten.upsample_bicubic2d.default"] = _resize("bicubic")
