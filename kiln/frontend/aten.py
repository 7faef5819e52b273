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
from kiln.ops import symbolic_dims

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
    """A torch size: an int, or the canonical text of the expression torch traced it as
    (``s0``, ``4*s34``, ``s0*s1``, ``(s1+3)//4``: ``kiln.ir.dims``)."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    expr = d.node.expr if hasattr(d, "node") else d
    if getattr(expr, "is_number", False):
        return int(expr)
    found = symbolic_dims.from_sympy(expr)
    if found is None:
        raise UnsupportedFxOp(
            "a symbolic size",
            f"{expr} (kiln's symbolic dims are sums, products, floor divisions, remainders, "
            "minima and maxima of symbols and integers)",
        )
    return symbolic_dims.dim_of(found)


# -- the conversion table ---------------------------------------------------------------------------------

Converter = Callable[..., Any]
CONVERTERS: dict[str, Converter] = {}


def converts(*names: str) -> Callable[[Converter], Converter]:
    def register(function: Converter) -> Converter:
        for name in names:
            CONVERTERS[name] = function
        return function

    return register


def unary_op(op: str) -> Converter:
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
    CONVERTERS[f"aten.{_name}.default"] = unary_op(_op)


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
    if fx.shape(value) == fx.shape(dest):
        return value
    return fx.one("Expand", [value, _shape_of(fx, dest)])


def _shape_of(fx: FxConverter, x: Value) -> Value:
    """``x``'s shape as a value: constants, or read at run time where a dim is symbolic."""
    shape = fx.shape(x)
    return fx.ints(shape) if all(isinstance(d, int) for d in shape) else fx.one("Shape", [x])


@converts("aten._assert_tensor_metadata.default")
def _assert(fx: FxConverter, *args: Any, **kwargs: Any) -> None:
    return None


@converts("aten.rsqrt.default")
def _rsqrt(fx: FxConverter, x: Value) -> Value:
    return fx.one("Reciprocal", [fx.one("Sqrt", [x])])


def _promoted(fx: FxConverter, a: Value, b: Value) -> tuple[Value, Value]:
    """Two tensors of different dtypes in torch's type promotion: a float beats an integer or a
    bool (``slopes * arange(n)``: BLOOM's ALiBi), the wider of two floats or two integers wins."""
    types = [getattr(v.type, "dtype", None) for v in (a, b)]
    if None in types or types[0] is types[1]:
        return a, b

    def rank(dtype: Any) -> tuple[int, int]:
        kind = dtype.numpy.kind
        return ({"b": 0, "u": 1, "i": 1, "f": 2}.get(kind, 3), dtype.numpy.itemsize)

    wanted = max(types, key=rank)  # type: ignore[arg-type]
    return tuple(  # type: ignore[return-value]
        v if t is wanted else fx.one("Cast", [v], to=wanted.onnx_code) for v, t in zip((a, b), types)
    )


def _binary(op: str) -> Converter:
    def convert(fx: FxConverter, a: Any, b: Any, alpha: Any = 1, rounding_mode: Any = None) -> Value:
        if rounding_mode is not None:
            raise UnsupportedFxOp(f"{op} with rounding_mode={rounding_mode}")
        a_value = fx.tensor(a, b if isinstance(b, Value) else None)
        b_value = fx.tensor(b, a_value)
        if alpha != 1:
            b_value = fx.one("Mul", [b_value, fx.tensor(alpha, b_value)])
        a_value, b_value = _promoted(fx, a_value, b_value)
        if op == "Div" and a_value.type.dtype.numpy.kind in "biu":  # type: ignore[union-attr]
            # torch's true division: integers divide as float32 (DeBERTa's log(distance / bucket))
            a_value, b_value = (fx.one("Cast", [v], to=DType.FLOAT32.onnx_code) for v in (a_value, b_value))
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


def reduce_op(op: str) -> Converter:
    def convert(fx: FxConverter, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
        axes = list(range(fx.rank(x))) if dims is None or dims == [] else [int(d) for d in dims]
        if dtype is not None:
            x = fx.one("Cast", [x], to=torch_dtype(dtype).onnx_code)
        return fx.one(op, [x, fx.ints(axes, "axes")], keepdims=int(bool(keepdim)))

    return convert


CONVERTERS["aten.mean.dim"] = reduce_op("ReduceMean")
CONVERTERS["aten.sum.dim_IntList"] = reduce_op("ReduceSum")
CONVERTERS["aten.amax.default"] = reduce_op("ReduceMax")
CONVERTERS["aten.amin.default"] = reduce_op("ReduceMin")


def _boolean_reduce(kind: str) -> Converter:
    def convert(fx: FxConverter, x: Value, dims: Any = None, keepdim: bool = False) -> Value:
        dims = [dims] if isinstance(dims, int) else dims
        count = fx.one("Cast", [x], to=DType.INT32.onnx_code)
        folded = reduce_op("ReduceMax" if kind == "any" else "ReduceMin")(fx, count, dims, keepdim)
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
    if dtype is None or all(isinstance(d, int) for d in fx.shape(x)):
        return _copy(
            fx,
            x if dtype is None else fx.const(np.zeros(fx.shape(x), torch_dtype(dtype).numpy)),
            fx.tensor(value, x),
        )
    fill = fx.tensor(value, x)  # a symbolic shape in another dtype: the value cast, expanded to x's shape
    wanted = torch_dtype(dtype)
    if fill.type.dtype is not wanted:  # type: ignore[union-attr]
        fill = fx.one("Cast", [fill], to=wanted.onnx_code)
    return fx.one("Expand", [fill, fx.one("Shape", [x])])


CONVERTERS["aten.zeros_like.default"] = lambda fx, x, dtype=None, **kwargs: _full_like(fx, x, 0, dtype)
CONVERTERS["aten.ones_like.default"] = lambda fx, x, dtype=None, **kwargs: _full_like(fx, x, 1, dtype)


@converts("aten.mean.default")
def _mean_all(fx: FxConverter, x: Value, dtype: Any = None) -> Value:
    return reduce_op("ReduceMean")(fx, x, dtype=dtype)


@converts("aten.sum.default")
def _sum_all(fx: FxConverter, x: Value, dtype: Any = None) -> Value:
    return reduce_op("ReduceSum")(fx, x, dtype=dtype)


def _static(d: Any) -> int | None:
    """A torch size that is a number (an int, or a SymInt torch resolved), else None."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    expr = d.node.expr if hasattr(d, "node") else d
    return int(expr) if getattr(expr, "is_number", False) else None


def size_value(fx: FxConverter, d: Any) -> Value:
    """A torch size as a one-element int64 tensor: a number, a symbol (its input's ``Shape``
    entry) or an expression of symbols (``s30*s54``: a flattened H*W), computed from the inputs'
    shapes, so a specialization folds it to the bound value."""
    number = _static(d)
    if number is not None:
        return fx.ints([number], "size")
    expr = d.node.expr if hasattr(d, "node") else d
    return _expression(fx, expr)


def _expression(fx: FxConverter, expr: Any) -> Value:
    kind = type(expr).__name__
    if getattr(expr, "is_number", False):
        return fx.ints([int(expr)], "size")
    if getattr(expr, "is_Symbol", False):
        name = str(expr)
        for value in fx.inputs:
            shape = getattr(value.type, "shape", None) or ()
            if name in shape:
                axis = shape.index(name)
                return fx.one("Shape", [value], start=axis, end=axis + 1)
        raise UnsupportedFxOp("a symbolic size", f"{name} is no input's dim")
    parts = [_expression(fx, arg) for arg in getattr(expr, "args", ())]
    if kind in ("Mul", "Add") and parts:
        result = parts[0]
        for part in parts[1:]:
            result = fx.one(kind, [result, part])
        return result
    if kind == "FloorDiv" and len(parts) == 2:  # sizes are non-negative: truncation is the floor
        return fx.one("Div", parts)
    if kind in ("Mod", "PythonMod") and len(parts) == 2:
        return fx.one("Mod", parts)
    if kind == "Pow" and len(parts) == 2 and getattr(expr.args[1], "is_Integer", False) and int(expr.args[1]) > 0:
        result = parts[0]
        for _ in range(int(expr.args[1]) - 1):
            result = fx.one("Mul", [result, parts[0]])
        return result
    raise UnsupportedFxOp("a symbolic size", f"{expr} ({kind})")


def _target_shape(fx: FxConverter, x: Value, shape: list) -> Value:
    """A view's target shape: one symbolic size (a dynamic batch) is the -1 Reshape infers; with
    more (a flattened H*W beside the batch), the sizes are computed from the inputs' shapes."""
    sizes = [_static(s) for s in shape]
    symbolic = [i for i, s in enumerate(sizes) if s is None]
    if len(symbolic) <= 1 and not (symbolic and -1 in sizes):
        if symbolic and not isinstance(dim_of_or_none(shape[symbolic[0]]), str):
            pass  # an expression: computed below
        else:
            return fx.ints([-1 if i in symbolic else s for i, s in enumerate(sizes)])
    return fx.one("Concat", [size_value(fx, s) for s in shape], axis=0)


def dim_of_or_none(d: Any) -> int | str | None:
    try:
        return dim_of(d)
    except UnsupportedFxOp:
        return None


@converts("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default")
def _view(fx: FxConverter, x: Value, shape: list) -> Value:
    return fx.one("Reshape", [x, _target_shape(fx, x, shape)])


@converts("aten.expand.default", "aten.expand_copy.default")
def _expand(fx: FxConverter, x: Value, shape: list, implicit: bool = False) -> Value:
    rank = len(shape)
    current = (1,) * (rank - fx.rank(x)) + fx.shape(x)
    sizes: list = []
    for have, given in zip(current, shape):
        want = dim_of(given)
        if want == -1 or (not isinstance(want, int) and have == want):
            sizes.append(1)  # kept: Expand broadcasts a size against 1
        elif not isinstance(want, int):
            sizes.append(given)  # a symbolic size (a dim of 1 or one kiln named otherwise): computed
        else:
            sizes.append(want)
    if all(isinstance(s, int) for s in sizes):
        return fx.one("Expand", [x, fx.ints(sizes)])
    return fx.one("Expand", [x, fx.one("Concat", [size_value(fx, s) for s in sizes], axis=0)])


@converts("aten.permute.default", "aten.permute_copy.default")
def _permute(fx: FxConverter, x: Value, dims: list) -> Value:
    perm = [fx.axis(int(d), x) for d in dims]
    if x in fx.constants:  # a weight's transpose (nn.Linear's): a transposed view, copied neither
        # here nor each run (the matmul lowering packs a weight into its own layout anyway)
        return fx.const(fx.constants[x].transpose(perm), "transposed")
    return fx.one("Transpose", [x], perm=perm)


@converts("aten.t.default", "aten.t_copy.default")
def transpose_2d(fx: FxConverter, x: Value) -> Value:
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
    start = 0 if start is None else start
    end = np.iinfo(np.int64).max if end is None else end
    if _static(start) is None or _static(end) is None:  # an end read from a size (buffer[:, :seq]): computed
        bounds = [fx.ints([_static(b)]) if _static(b) is not None else size_value(fx, b) for b in (start, end)]
        return fx.one("Slice", [x, *bounds, fx.ints([fx.axis(dim, x)]), fx.ints([int(step)])])
    start, end = int(start), int(end)
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


@converts("aten._to_copy.default", "aten.to.dtype")
def _to_copy(fx: FxConverter, x: Value, dtype: Any = None, **kwargs: Any) -> Value:
    if dtype is None or torch_dtype(dtype) is x.type.dtype:  # type: ignore[union-attr]
        return x
    return fx.one("Cast", [x], to=torch_dtype(dtype).onnx_code)


def full_like_constant(fx: FxConverter, size: list, value: Any, dtype: Any) -> Value:
    numpy = torch_dtype(dtype).numpy if dtype is not None else (np.float32 if isinstance(value, float) else np.int64)
    if all(isinstance(s, int) for s in size):
        return fx.const(np.full([int(s) for s in size], value, dtype=numpy), "full")
    if not isinstance(value, (int, float, bool)):
        raise UnsupportedFxOp("aten.full.default", "a symbolic size with a value that is no number")
    # a symbolic size (torch.full((seq, seq), ...)): the value expanded to the sizes computed from the inputs
    shape = fx.one("Concat", [size_value(fx, d) for d in size], axis=0)
    return fx.one("Expand", [fx.const(np.array(value, dtype=numpy), "fill"), shape])


@converts("aten.full.default")
def _full(fx: FxConverter, size: list, value: Any, dtype: Any = None, **kwargs: Any) -> Value:
    return full_like_constant(fx, size, value, dtype)


@converts("aten.zeros.default")
def _zeros(fx: FxConverter, size: list, dtype: Any = None, **kwargs: Any) -> Value:
    return full_like_constant(fx, size, 0, dtype or __import__("torch").float32)


@converts("aten.ones.default")
def _ones(fx: FxConverter, size: list, dtype: Any = None, **kwargs: Any) -> Value:
    return full_like_constant(fx, size, 1, dtype or __import__("torch").float32)


@converts("aten.scalar_tensor.default")
def _scalar_tensor(fx: FxConverter, value: Any, dtype: Any = None, **kwargs: Any) -> Value:
    return full_like_constant(fx, [], value, dtype or __import__("torch").float32)
