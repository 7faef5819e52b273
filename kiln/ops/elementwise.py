"""Elementwise ops: unary math and activations, broadcasting binaries, comparisons, casts, quantize."""

from __future__ import annotations

from collections.abc import Callable

from kiln.errors import ShapeInferenceError
from kiln.ir.types import Dim, DType, TensorType, Type
from kiln.ops.registry import (
    InferContext,
    broadcast_shapes,
    declare_trait,
    register,
    same_as_input,
)
from kiln.ops.symbolic_dims import clamped, floored, scaled, scaled_parts

UNARY = (
    "Abs Neg Exp Log Sqrt Reciprocal Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Tanh "
    "Sigmoid Relu Erf Floor Ceil Round Sign Softplus Softsign Elu Selu LeakyRelu HardSigmoid "
    "HardSwish Mish Gelu ThresholdedRelu Celu Not BitwiseNot Shrink Swish"
).split()

BINARY_SAME_TYPE = "Add Sub Mul Div Pow Mod BitShift BitwiseAnd BitwiseOr BitwiseXor PRelu".split()
VARIADIC = "Max Min Sum Mean".split()
COMPARE = "Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor".split()


def _broadcast(ctx: InferContext, indices: range | list[int]) -> tuple | None:
    return broadcast_shapes(ctx, *(ctx.shape(i) for i in indices))


def _binary(ctx: InferContext) -> list[Type]:
    element = SIZE_RULES.get(ctx.node.op) if ctx.num_inputs == 2 else None
    if element is not None:
        _size_contents(ctx, element)
    return [TensorType(ctx.dtype(0), _broadcast(ctx, range(ctx.num_inputs)))]


def _size_contents(ctx: InferContext, element: Callable[[InferContext, Dim, Dim], Dim | None]) -> None:
    """Arithmetic on shape vectors keeps their contents as sizes, element by element (``element``
    returns None where the result may not be a size: then the vector has no contents)."""
    vectors = _shape_vectors(ctx, [0, 1])
    if vectors is None or ctx.dtype(0).numpy.kind not in "iu":
        return
    result = [element(ctx, a, b) for a, b in zip(*vectors)]
    if None not in result:
        ctx.out_symbolic[0] = tuple(result)  # type: ignore[arg-type]


def _size_arithmetic(ctx: InferContext, a: Dim, b: Dim) -> Dim | None:
    """Sums, products and quotients of sizes (``batch * heads``, a target shape's first element)
    stay sizes: ints computed, a size times an int a scaled size (``batch.x4``), divided back by
    what it was scaled with the size again, ``n + 0`` still ``n``, and a size kiln cannot name a
    fresh symbol (unknown, but one size: a Concat of it with known sizes keeps theirs). Only where
    both operands are sizes or numbers >= 0 (a divisor > 0): the result is >= 0, never the -1 an
    exporter's Equal tests for."""
    op = ctx.node.op
    if any(isinstance(x, int) and x < 0 for x in (a, b)) or (op == "Div" and not (isinstance(b, int) and b > 0)):
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a + b if op == "Add" else a * b if op == "Mul" else a // b
    if op == "Add" and 0 in (a, b):
        return b if a == 0 else a
    if op == "Mul" and (isinstance(a, int) or isinstance(b, int)):
        return scaled(b, a) if isinstance(a, int) else scaled(a, b)  # type: ignore[arg-type]
    if op == "Div" and isinstance(a, str) and isinstance(b, int):
        base, factor = scaled_parts(a) or (a, 1)
        return scaled(base, factor // b) if factor % b == 0 else floored(a, b)
    return ctx.fresh()


def _size_difference(ctx: InferContext, a: Dim, b: Dim) -> Dim | None:
    """A size minus itself is 0 (``key_length - query_length`` of one length: a causal window's
    start), minus 0 itself, ints computed; any other difference may be negative: no contents."""
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    if a == b:
        return 0
    return a if b == 0 else None


def _size_bounds(ctx: InferContext, a: Dim, b: Dim) -> Dim | None:
    """``min(n, c)`` of a size and a number >= 0 is the clamped size ``n.minc`` (a window capped at
    a table's length: ``min(seq, 2048)``); min and max of ints computed, of a size with itself that
    size, ``max(n, 0)`` n; any other pair of sizes a fresh size (>= 0 too)."""
    lowest = ctx.node.op == "Min"
    if any(isinstance(x, int) and x < 0 for x in (a, b)):
        return None
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b) if lowest else max(a, b)
    if a == b:
        return a
    if lowest and (isinstance(a, int) or isinstance(b, int)):
        size, cap = (b, a) if isinstance(a, int) else (a, b)
        return 0 if cap == 0 else clamped(size, cap)  # type: ignore[arg-type]
    if not lowest and 0 in (a, b):
        return b if a == 0 else a
    return ctx.fresh()


SIZE_RULES: dict[str, Callable[[InferContext, Dim, Dim], Dim | None]] = {
    "Add": _size_arithmetic,
    "Mul": _size_arithmetic,
    "Div": _size_arithmetic,
    "Sub": _size_difference,
    "Min": _size_bounds,
    "Max": _size_bounds,
}


def _compare(ctx: InferContext) -> list[Type]:
    if ctx.node.op == "Equal":
        _equal_sizes(ctx)
    return [TensorType(DType.BOOL, _broadcast(ctx, range(ctx.num_inputs)))]


def _shape_vectors(ctx: InferContext, indices: list[int]) -> list[tuple] | None:
    """The contents of 1-D (or scalar) shape vectors ``indices`` (integers or a condition),
    broadcast to one length; None for anything else (float data is never a shape)."""
    if any(ctx.shape(i) is None or len(ctx.shape(i)) > 1 for i in indices):  # type: ignore[arg-type]
        return None
    if any(ctx.dtype(i).numpy.kind not in "iub" for i in indices):
        return None
    vectors = [ctx.dims_value(i) for i in indices]
    if any(v is None for v in vectors):
        return None
    length = max(len(v) for v in vectors)  # type: ignore[arg-type]
    if any(len(v) not in (1, length) for v in vectors):  # type: ignore[arg-type]
        return None
    return [tuple(v) * length if len(v) == 1 else tuple(v) for v in vectors]  # type: ignore[arg-type]


def _equal_sizes(ctx: InferContext) -> None:
    """``Equal`` of shape vectors, element by element where it is known: equal ints, one symbol
    with itself, and never a symbol (a size, >= 0) with a negative number (the exporters' 'is it
    -1?' test before Expand): contents 1/0, so a Where on it picks statically."""
    vectors = _shape_vectors(ctx, [0, 1])
    if vectors is None:
        return
    result = []
    for a, b in zip(*vectors):
        if isinstance(a, int) and isinstance(b, int):
            result.append(int(a == b))
        elif a == b:
            result.append(1)
        elif (isinstance(a, int) and a < 0) or (isinstance(b, int) and b < 0):
            result.append(0)
        else:
            return
    ctx.out_symbolic[0] = tuple(result)


def _where(ctx: InferContext) -> list[Type]:
    vectors = _shape_vectors(ctx, [0, 1, 2])
    if vectors is not None and all(isinstance(c, int) for c in vectors[0]):
        ctx.out_symbolic[0] = tuple(x if c else y for c, x, y in zip(*vectors))
    return [TensorType(ctx.dtype(1), _broadcast(ctx, [0, 1, 2]))]


def _cast(ctx: InferContext) -> list[Type]:
    dtype = DType.from_onnx(int(ctx.attr("to")))
    shape = ctx.shape(0)
    if dtype in (DType.INT64, DType.INT32) and shape is not None and len(shape) <= 1:
        contents = ctx.dims_value(0)  # a size cast to an int wide enough for it stays that size
        if contents is not None:
            ctx.out_symbolic[0] = tuple(contents)
    return [TensorType(dtype, shape)]


def _cast_like(ctx: InferContext) -> list[Type]:
    return [TensorType(ctx.dtype(1), ctx.shape(0))]


def _quantize(ctx: InferContext) -> list[Type]:
    if ctx.has(2):
        dtype = ctx.dtype(2)
    elif ctx.attr("output_dtype"):
        dtype = DType.from_onnx(int(ctx.attr("output_dtype")))
    else:
        dtype = DType.UINT8
    return [TensorType(dtype, ctx.shape(0))]


def _dequantize(ctx: InferContext) -> list[Type]:
    output_dtype = ctx.attr("output_dtype")
    dtype = DType.from_onnx(int(output_dtype)) if output_dtype else ctx.dtype(1)
    return [TensorType(dtype, ctx.shape(0))]


def _dynamic_quantize(ctx: InferContext) -> list[Type]:
    return [
        TensorType(DType.UINT8, ctx.shape(0)),
        TensorType(DType.FLOAT32, ()),
        TensorType(DType.UINT8, ()),
    ]


def _bitcast(ctx: InferContext) -> list[Type]:
    source = ctx.tensor(0)
    target = DType.from_onnx(int(ctx.attr("to")))
    if source.dtype.numpy.itemsize == target.numpy.itemsize or source.shape is None:
        return [TensorType(target, source.shape)]
    shape = source.shape
    ratio = source.dtype.numpy.itemsize / target.numpy.itemsize
    if ratio > 1:  # each element splits into several: a new trailing dim
        return [TensorType(target, (*shape, int(ratio)))]
    if shape and shape[-1] == round(1 / ratio):  # a trailing dim merges into one element
        return [TensorType(target, shape[:-1])]
    raise ShapeInferenceError(f"cannot bitcast {source} to {target.short}")


def _dropout(ctx: InferContext) -> list[Type]:
    shape = ctx.shape(0)
    types: list[Type] = [TensorType(ctx.dtype(0), shape)]
    if ctx.num_outputs > 1:
        types.append(TensorType(DType.BOOL, shape))
    return types


def _register() -> None:
    for op in UNARY:
        register(op, same_as_input())
    register("Identity", lambda ctx: [ctx.input_types[0]])
    for op in ("IsNaN", "IsInf"):
        register(op, same_as_input(dtype=DType.BOOL))
    for op in BINARY_SAME_TYPE:
        register(op, _binary)
    for op in VARIADIC:
        register(op, _binary)
    for op in COMPARE:
        register(op, _compare)
    register("Where", _where)
    register("Clip", same_as_input())
    register("Cast", _cast)
    register("CastLike", _cast_like)
    register("QuantizeLinear", _quantize)
    register("DequantizeLinear", _dequantize)
    register("DynamicQuantizeLinear", _dynamic_quantize)
    register("BitCast", _bitcast)
    register("Dropout", _dropout)
    register("Binarizer", same_as_input(), domain="ai.onnx.ml")
    # float elementwise ops with one line of scalar semantics each in kiln.lower.pointwise (a test
    # holds the two together): they may join a fused loop
    declare_trait("fusable", FUSABLE)
    declare_trait("alias", ("Identity", "Dropout"))


FUSABLE = (
    "Add Sub Mul Div Pow Max Min Neg Abs Relu Sigmoid Tanh Exp Log Sqrt Reciprocal Erf Floor Ceil Softplus "
    "Softsign Elu Selu Celu LeakyRelu ThresholdedRelu HardSigmoid HardSwish Gelu Mish PRelu Clip Where"
).split()


_register()
