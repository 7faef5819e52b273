"""Elementwise ops: unary math and activations, broadcasting binaries, comparisons, casts, quantize."""

from __future__ import annotations

from kiln.errors import ShapeInferenceError
from kiln.ir.types import DType, TensorType, Type
from kiln.ops.registry import (
    InferContext,
    broadcast_shapes,
    declare_trait,
    register,
    same_as_input,
)
from kiln.ops.size_contents import (
    SIZE_RULES,
    cast_contents,
    float_contents,
    rounded_contents,
    shape_vectors,
    size_contents,
)

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
    if element is not None and ctx.dtype(0).numpy.kind == "f":
        float_contents(ctx)
    elif element is not None:
        size_contents(ctx, element)
    return [TensorType(ctx.dtype(0), _broadcast(ctx, range(ctx.num_inputs)))]


def _compare(ctx: InferContext) -> list[Type]:
    if ctx.node.op == "Equal":
        _equal_sizes(ctx)
    return [TensorType(DType.BOOL, _broadcast(ctx, range(ctx.num_inputs)))]


def _equal_sizes(ctx: InferContext) -> None:
    """``Equal`` of shape vectors, element by element where it is known: equal ints, one symbol
    with itself, and never a symbol (a size, >= 0) with a negative number (the exporters' 'is it
    -1?' test before Expand): contents 1/0, so a Where on it picks statically."""
    vectors = shape_vectors(ctx, [0, 1])
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
    vectors = shape_vectors(ctx, [0, 1, 2])
    if vectors is not None and all(isinstance(c, int) for c in vectors[0]):
        ctx.out_symbolic[0] = tuple(x if c else y for c, x, y in zip(*vectors))
    return [TensorType(ctx.dtype(1), _broadcast(ctx, [0, 1, 2]))]


def _cast(ctx: InferContext) -> list[Type]:
    dtype = DType.from_onnx(int(ctx.attr("to")))
    cast_contents(ctx, dtype)
    return [TensorType(dtype, ctx.shape(0))]


def _rounding(ctx: InferContext) -> list[Type]:
    rounded_contents(ctx)
    return [ctx.input_types[0]]  # type: ignore[list-item]


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
        register(op, _rounding if op in ("Ceil", "Floor") else same_as_input())
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
