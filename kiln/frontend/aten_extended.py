"""The conversion table's index and order ops, statistics, normalizations and resizing (argmax,
topk, sort, cumsum, scatter, variance, norms, group norm, bilinear/bicubic upsampling, arange,
constant padding...)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.frontend.aten import (
    CONVERTERS,
    Converter,
    UnsupportedFxOp,
    converts,
    dim_of,
    reduce_op,
    size_value,
    torch_dtype,
    unary_op,
)
from kiln.ir.graph import Value
from kiln.ir.types import DType

FxConverter = Any  # kiln.frontend.fx.FxConverter


# -- more of core ATen: index and order ops, normalizations, resizing ------------------------------------

for _name, _op in {
    "round": "Round",
    "isnan": "IsNaN",
    "atan": "Atan",
    "tan": "Tan",
    "asin": "Asin",
    "acos": "Acos",
}.items():
    CONVERTERS[f"aten.{_name}.default"] = unary_op(_op)
CONVERTERS["aten.clamp.Tensor"] = lambda fx, x, low=None, high=None: _clamp_tensor(fx, x, low, high)
CONVERTERS["aten.prod.dim_int"] = lambda fx, x, dim, keepdim=False, dtype=None: reduce_op("ReduceProd")(
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
    if all(isinstance(dim_of(r), int) for r in repeats):
        return fx.one("Tile", [x, fx.ints(repeats, "repeats")])
    # a count read from a size (DeBERTa's table repeated once per sample: repeat(batch, 1, 1))
    return fx.one("Tile", [x, fx.one("Concat", [size_value(fx, r) for r in repeats], axis=0)])


@converts("aten.scatter.src", "aten.scatter.value")
def _scatter(fx: FxConverter, x: Value, dim: int, index: Value, src: Any) -> Value:
    if not isinstance(src, Value):
        src = fx.one("Expand", [fx.tensor(src, x), fx.one("Shape", [index])])
    return fx.one("ScatterElements", [x, index, src], axis=fx.axis(int(dim), x))


@converts("aten.slice_scatter.default")
def _slice_scatter(
    fx: FxConverter, x: Value, src: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Value:
    """``x`` with ``src`` written over ``x[start:end:step]`` along ``dim`` (what functionalize makes of
    a write through a slice, ``x[:, :2].add_(1)``): a ScatterElements of constant positions."""
    axis = fx.axis(int(dim), x)
    size, shape = fx.shape(x)[axis], fx.shape(src)
    if not isinstance(size, int) or not all(isinstance(d, int) for d in shape):
        raise UnsupportedFxOp("aten.slice_scatter.default", "a symbolic size")
    positions = np.arange(size)[slice(start, end, int(step))]
    if len(positions) != shape[axis]:
        raise UnsupportedFxOp("aten.slice_scatter.default", f"{shape[axis]} values for {len(positions)} positions")
    view = [1] * len(shape)
    view[axis] = len(positions)
    index = np.ascontiguousarray(np.broadcast_to(positions.reshape(view), shape).astype(np.int64))
    return fx.one("ScatterElements", [x, fx.const(index, "positions"), src], axis=axis)


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
    as_int = [fx.one("Cast", [i], to=DType.INT64.onnx_code) for _, i in given]
    if all(isinstance(d, int) for shape in shapes for d in shape):
        common = list(np.broadcast_shapes(*shapes))
        broadcast = [fx.one("Expand", [i, fx.ints(common)]) for i in as_int]
    else:  # symbolic index shapes (a mask[b, j] lookup over seq): expanded to the shape of their sum
        common = [0] * max(len(shape) for shape in shapes)  # (only its length is used below)
        total = as_int[0]
        for i in as_int[1:]:
            total = fx.one("Add", [total, i])
        target = fx.one("Shape", [total])
        broadcast = [fx.one("Expand", [i, target]) for i in as_int]
    stacked = [fx.one("Unsqueeze", [i, fx.ints([-1], "axes")]) for i in broadcast]
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


@converts("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def _arange(fx: FxConverter, start: Any, end: Any = None, step: Any = 1, dtype: Any = None, **kwargs: Any) -> Value:
    if end is None:
        start, end = 0, start
    numpy = torch_dtype(dtype).numpy if dtype is not None else np.int64
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        return fx.const(np.arange(start, end, step, dtype=numpy), "arange")
    # a bound that is a symbol (arange(seq)): a Range on the bound sizes, folded once they are known
    floats = any(isinstance(v, float) for v in (start, end, step))
    kind = np.dtype(numpy) if floats and np.dtype(numpy).kind == "f" else np.dtype(np.float32 if floats else np.int64)
    bounds = []
    for v in (start, end, step):
        if isinstance(v, (int, float)):
            bounds.append(fx.const(np.array(v, dtype=kind), "bound"))
            continue
        scalar = fx.one("Squeeze", [size_value(fx, v), fx.ints([0], "axes")])
        bounds.append(scalar if kind.kind == "i" else fx.one("Cast", [scalar], to=DType.from_numpy(kind).onnx_code))
    result = fx.one("Range", bounds)
    if np.dtype(numpy) != kind:
        result = fx.one("Cast", [result], to=DType.from_numpy(numpy).onnx_code)
    return result


@converts("aten.constant_pad_nd.default")
def _pad(fx: FxConverter, x: Value, pad: list, value: float = 0.0) -> Value:
    rank = fx.rank(x)
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):  # torch lists the last dim first
        begins[rank - 1 - i], ends[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    constant = fx.const(np.asarray(value, x.type.dtype.numpy), "pad_value")  # type: ignore[union-attr]
    return fx.one("Pad", [x, fx.ints(begins + ends, "pads"), constant])
