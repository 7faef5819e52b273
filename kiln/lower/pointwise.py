"""Scalar semantics of elementwise ops as kernel-IR expressions: one table, one line per op.

Each entry maps an op to ``fn(args, attrs, dtype) -> Expr``; ``args`` are the loaded inputs.
NaN behaviour follows NumPy (the reference): max/min propagate NaN, Relu keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.ir.types import DType
from kiln.lower.kir import Binary, Cast, Const, Expr, Select, Unary

Scalarize = Callable[[list[Expr], dict[str, Any], DType], Expr]


def c(value: float, dtype: DType) -> Const:
    return Const(value, dtype)


def _not_nan_const(e: Expr) -> bool:
    return isinstance(e, Const) and not (isinstance(e.value, float) and math.isnan(e.value))


# np.maximum's NaN rule (a NaN in either operand is the result): the kernel IR's max and min; how
# a target computes them (the C renderer's select chains GCC vectorizes) is the renderer's business
def _max(a: Expr, b: Expr) -> Expr:
    return Binary("max", a, b)


def _min(a: Expr, b: Expr) -> Expr:
    return Binary("min", a, b)


def _divide(x: Expr, y: Expr, t: DType) -> Expr:
    """x / y; by a constant, x times its reciprocal (a division is ~10x a multiply's cost on a
    vector unit: GELU's x / sqrt(2) in a matmul epilogue). Exact for powers of two, else within
    one ulp of the quotient (the reciprocal rounded once, the product once)."""
    if isinstance(y, Const) and isinstance(y.value, float) and math.isfinite(y.value) and y.value != 0:
        if t is DType.FLOAT32:
            reciprocal = float(np.float32(1) / np.float32(y.value))
        elif t is DType.FLOAT64:
            reciprocal = 1.0 / y.value
        else:
            return Binary("/", x, y)
        if math.isfinite(reciprocal) and reciprocal != 0:
            return Binary("*", x, Const(reciprocal, t))
    return Binary("/", x, y)


def _sigmoid(x: Expr, t: DType) -> Expr:
    return Binary("/", c(1, t), Binary("+", c(1, t), Unary("exp", Unary("-", x))))


def _softplus(x: Expr, t: DType) -> Expr:
    return Unary("log", Binary("+", Unary("exp", x), c(1, t)))


def _fold(op: Callable[[Expr, Expr], Expr]) -> Scalarize:
    def scalarize(args: list[Expr], attrs: dict[str, Any], t: DType) -> Expr:
        result = args[0]
        for arg in args[1:]:
            result = op(result, arg)
        return result

    return scalarize


def _gelu(args: list[Expr], attrs: dict[str, Any], t: DType) -> Expr:
    x = args[0]
    half_x = Binary("*", c(0.5, t), x)
    if attrs.get("approximate", "none") == "tanh":
        cube = Binary("*", c(0.044715, t), Binary("*", x, Binary("*", x, x)))
        inner = Binary("*", c(math.sqrt(2 / math.pi), t), Binary("+", x, cube))
        return Binary("*", half_x, Binary("+", c(1, t), Unary("tanh", inner)))
    return Binary("*", half_x, Binary("+", c(1, t), Unary("erf", Binary("*", x, c(1 / math.sqrt(2), t)))))


def _elu(alpha: float, x: Expr, t: DType) -> Expr:
    return Select(Binary("<", x, c(0, t)), Binary("*", c(alpha, t), Binary("-", Unary("exp", x), c(1, t))), x)


FLOAT_OPS: dict[str, Scalarize] = {
    "Add": lambda a, k, t: Binary("+", a[0], a[1]),  # x + y
    "Sub": lambda a, k, t: Binary("-", a[0], a[1]),  # x - y
    "Mul": lambda a, k, t: Binary("*", a[0], a[1]),  # x * y
    "Div": lambda a, k, t: _divide(a[0], a[1], t),  # x / y
    "Pow": lambda a, k, t: Binary("pow", a[0], Cast(t, a[1])),  # x ** y
    "Where": lambda a, k, t: Select(a[0], a[1], a[2]),  # cond ? x : y (a bool condition: masks)
    "Max": _fold(_max),
    "Min": _fold(_min),
    "Sum": _fold(lambda x, y: Binary("+", x, y)),
    "Mean": lambda a, k, t: Binary("/", _fold(lambda x, y: Binary("+", x, y))(a, k, t), c(len(a), t)),
    "Neg": lambda a, k, t: Unary("-", a[0]),
    "Abs": lambda a, k, t: Unary("abs", a[0]),
    "Relu": lambda a, k, t: Select(Binary("<", a[0], c(0, t)), c(0, t), a[0]),  # max(x, 0), NaN kept
    "Sigmoid": lambda a, k, t: _sigmoid(a[0], t),
    "Tanh": lambda a, k, t: Unary("tanh", a[0]),
    "Exp": lambda a, k, t: Unary("exp", a[0]),
    "Log": lambda a, k, t: Unary("log", a[0]),
    "Sqrt": lambda a, k, t: Unary("sqrt", a[0]),
    "Reciprocal": lambda a, k, t: Binary("/", c(1, t), a[0]),
    "Erf": lambda a, k, t: Unary("erf", a[0]),
    "Floor": lambda a, k, t: Unary("floor", a[0]),
    "Ceil": lambda a, k, t: Unary("ceil", a[0]),
    "Round": lambda a, k, t: Unary("round_even", a[0]),  # half to even, as ONNX and NumPy
    "Sin": lambda a, k, t: Unary("sin", a[0]),
    "Cos": lambda a, k, t: Unary("cos", a[0]),
    "Tan": lambda a, k, t: Unary("tan", a[0]),
    "Asin": lambda a, k, t: Unary("asin", a[0]),
    "Acos": lambda a, k, t: Unary("acos", a[0]),
    "Atan": lambda a, k, t: Unary("atan", a[0]),
    "Sinh": lambda a, k, t: Unary("sinh", a[0]),
    "Cosh": lambda a, k, t: Unary("cosh", a[0]),
    "Asinh": lambda a, k, t: Unary("asinh", a[0]),
    "Acosh": lambda a, k, t: Unary("acosh", a[0]),
    "Atanh": lambda a, k, t: Unary("atanh", a[0]),
    "Sign": lambda a, k, t: Select(
        Binary(">", a[0], c(0, t)), c(1, t), Select(Binary("<", a[0], c(0, t)), c(-1, t), a[0])
    ),
    "Softplus": lambda a, k, t: _softplus(a[0], t),  # log(exp(x) + 1)
    "Softsign": lambda a, k, t: Binary("/", a[0], Binary("+", c(1, t), Unary("abs", a[0]))),
    "Elu": lambda a, k, t: _elu(k.get("alpha", 1.0), a[0], t),
    "Selu": lambda a, k, t: Binary(
        "*", c(k.get("gamma", 1.0507009873554805), t), _elu(k.get("alpha", 1.6732632423543772), a[0], t)
    ),
    "Celu": lambda a, k, t: Select(  # max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
        Binary("<", a[0], c(0, t)),
        Binary(
            "*",
            c(k.get("alpha", 1.0), t),
            Binary("-", Unary("exp", Binary("/", a[0], c(k.get("alpha", 1.0), t))), c(1, t)),
        ),
        a[0],
    ),
    "LeakyRelu": lambda a, k, t: Select(
        Binary("<", a[0], c(0, t)), Binary("*", c(k.get("alpha", 0.01), t), a[0]), a[0]
    ),
    "ThresholdedRelu": lambda a, k, t: Select(Binary(">", a[0], c(k.get("alpha", 1.0), t)), a[0], c(0, t)),
    "HardSigmoid": lambda a, k, t: _max(
        c(0, t), _min(c(1, t), Binary("+", Binary("*", c(k.get("alpha", 0.2), t), a[0]), c(k.get("beta", 0.5), t)))
    ),
    "HardSwish": lambda a, k, t: Binary(
        "*", a[0], _max(c(0, t), _min(c(1, t), Binary("+", Binary("*", c(1 / 6, t), a[0]), c(0.5, t))))
    ),
    "Gelu": _gelu,
    "Mish": lambda a, k, t: Binary("*", a[0], Unary("tanh", _softplus(a[0], t))),
    "PRelu": lambda a, k, t: Select(Binary("<", a[0], c(0, t)), Binary("*", a[1], a[0]), a[0]),
}

# Ops whose semantics are the same for every numeric dtype (integers included).
ANY_NUMERIC: dict[str, Scalarize] = {
    "Add": FLOAT_OPS["Add"],
    "Sub": FLOAT_OPS["Sub"],
    "Mul": FLOAT_OPS["Mul"],
    "Max": FLOAT_OPS["Max"],
    "Min": FLOAT_OPS["Min"],
    "Sum": FLOAT_OPS["Sum"],
    "Neg": FLOAT_OPS["Neg"],
    "Relu": FLOAT_OPS["Relu"],
    "Abs": lambda a, k, t: Select(Binary("<", a[0], c(0, t)), Unary("-", a[0]), a[0]),
    "Sign": FLOAT_OPS["Sign"],
}

COMPARE: dict[str, str] = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}
LOGIC: dict[str, str] = {"And": "&&", "Or": "||", "Xor": "!="}

NATIVE_FLOATS = (DType.FLOAT32, DType.FLOAT64)
# float16 is stored as C's _Float16 and computed in float32, as NumPy computes half precision.
HALF = DType.FLOAT16
BF16 = DType.BFLOAT16
NATIVE_INTS = (DType.INT8, DType.UINT8, DType.INT16, DType.UINT16, DType.INT32, DType.UINT32, DType.INT64, DType.UINT64)
NATIVE = (*NATIVE_FLOATS, HALF, BF16, *NATIVE_INTS, DType.BOOL)
