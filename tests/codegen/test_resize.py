"""Resize lowered natively (nearest and linear, every coordinate transform kiln lowers, scales or
sizes, up and down) on every target, against the reference interpreter; what is not lowered
(cubic) says so and runs on the reference."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from tests.helpers import make_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(5)


def resize(shape, attrs, scales=None, sizes=None, opset=18):
    inits = {"roi": np.zeros(0, np.float32)}
    inputs = ["x", "roi"]
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
        inputs.append("scales")
    else:
        inits["scales"] = np.zeros(0, np.float32)
        inits["sizes"] = np.array(sizes, np.int64)
        inputs += ["scales", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    return make_model([node], [("x", F, list(shape))], [("y", 0, None)], inits, opset=opset)


CASES = {
    "bilinear x2 half_pixel (upsample_bilinear2d)": ((1, 3, 5, 7), {"mode": "linear"}, [1, 1, 2, 2], None),
    "bilinear align_corners to sizes": (
        (1, 2, 4, 6), {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [1, 2, 9, 11],
    ),
    "bilinear pytorch_half_pixel down": (
        (2, 2, 9, 8), {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [2, 2, 4, 1],
    ),
    "linear asymmetric 1.5": (
        (1, 1, 6, 6), {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 1.5, 1.5], None,
    ),
    "nearest x2 asymmetric floor (upsample_nearest2d)": (
        (1, 4, 3, 5), {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        [1, 1, 2, 2], None,
    ),
    "nearest half_pixel round_prefer_floor, odd sizes": ((1, 2, 5, 5), {"mode": "nearest"}, None, [1, 2, 8, 3]),
    "nearest round_prefer_ceil, 3-D": (
        (2, 3, 7), {"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, [1, 1, 2.5], None,
    ),
    "trilinear 5-D": ((1, 1, 3, 4, 5), {"mode": "linear"}, [1, 1, 2, 1.5, 0.6], None),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_resize_matches_reference(name, target):
    shape, attrs, scales, sizes = CASES[name]
    model = resize(shape, attrs, scales, sizes)
    x = RNG.standard_normal(shape).astype(np.float32)
    compiled = kiln.compile(model, target=target)
    got, want = compiled(x), kiln.compile(model, target="reference")(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert compiled.is_native, [(f.node.op, f.reason) for p in compiled.plans for f in p.fallbacks]


def test_cubic_resize_is_not_lowered_and_says_why():
    model = resize((1, 1, 4, 4), {"mode": "cubic"}, [1, 1, 2, 2], None)
    compiled = kiln.compile(model, target="cpu")
    x = RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(compiled(x), kiln.compile(model, target="reference")(x), rtol=1e-5, atol=1e-6)
    reasons = [f.reason for p in compiled.plans for f in p.fallbacks]
    assert reasons and "cubic" in reasons[0]
