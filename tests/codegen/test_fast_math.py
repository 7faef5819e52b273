"""kiln's branch-free float32 exp, tanh and erf (vectorizable, unlike libm's) against float64 NumPy over
the whole float range: within 3 ulp where the result is a normal float, NaN and infinities kept,
absolute error below the smallest normal float where the result underflows."""

import math

import numpy as np
import pytest
from onnx import helper

import kiln
from tests.helpers import FLOAT, make_model

RNG = np.random.default_rng(11)
POINTS = np.concatenate(
    [
        np.linspace(-120, 100, 200_000, dtype=np.float32),
        (RNG.standard_normal(200_000) * 3).astype(np.float32),
        np.array(
            [
                np.nan,
                np.inf,
                -np.inf,
                0.0,
                -0.0,
                1e-30,
                -1e-30,
                1e-8,
                0.6249,
                0.6251,
                8.99,
                9.01,
                88.72,
                88.73,
                -87.5,
                -104,
            ],
            np.float32,
        ),
    ]
)
EXACT = {
    "Exp": lambda x: np.exp(x),
    "Tanh": lambda x: np.tanh(x),
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "Erf": lambda x: np.array([math.erf(v) for v in x]),
    "Gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
}


@pytest.mark.parametrize("op", list(EXACT))
def test_fast_float32_functions_are_within_a_few_ulp(op):
    attrs = {"approximate": "tanh"} if op == "Gelu" else {}
    model = make_model(
        [helper.make_node(op, ["x"], ["y"], **attrs)], [("x", FLOAT, [len(POINTS)])], [("y", FLOAT, None)], opset=20
    )
    compiled = kiln.compile(model)
    source = compiled.plans[0].source
    assert any(f"kiln_{f}f(" in source for f in ("exp", "tanh", "erf"))  # the fast path is what ran
    got = compiled(POINTS).astype(np.float64)
    with np.errstate(all="ignore"):
        want = EXACT[op](POINTS.astype(np.float64))
        want32 = want.astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want32))
    assert np.array_equal(got[np.isinf(want32)], want32[np.isinf(want32)])
    normal = np.isfinite(want32) & (np.abs(want32) >= np.finfo(np.float32).tiny)
    if op == "Gelu":  # 1 + tanh(..) cancels for negative x: float32 itself is only good to ~|x| ulp
        error = np.abs(got[normal] - want[normal]) / np.maximum(np.abs(POINTS[normal]), 1)
        assert error.max() <= 4 * np.finfo(np.float32).eps, (error.max(), POINTS[normal][error.argmax()])
    else:
        ulp = np.abs(got[normal] - want[normal]) / np.spacing(np.abs(want32[normal])).astype(np.float64)
        assert ulp.max() <= 3, (op, ulp.max(), POINTS[normal][ulp.argmax()])
    tiny = np.isfinite(want32) & ~normal
    assert np.all(np.abs(got[tiny] - want[tiny]) < np.finfo(np.float32).tiny)
