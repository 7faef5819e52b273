"""Depthwise and narrow grouped convolutions (the direct per-output kernel: interior without bounds
tests, border rows and columns with only their valid taps) on every target, against the reference:
kernel sizes 3/5/7, strides, dilations, asymmetric pads, maps smaller than the kernel, 1-D, fused
epilogues, several channels per group, and the shapes that fall back to the per-tap kernel."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.lower import window_lowering
from kiln.lower.kir import Load, Store, postorder
from tests.helpers import make_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(3)


def model(channels, size, kernel, attrs, multiplier=1, per_group=1, act=None, bias=True):
    spatial = len(size)
    groups = channels // per_group
    weight = RNG.standard_normal((groups * multiplier, per_group, *kernel)).astype(np.float32)
    inits = {"w": weight}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(groups * multiplier).astype(np.float32)
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c" if act else "y"], group=groups, **attrs)]
    if act == "relu6":
        inits.update(lo=np.array(0, np.float32), hi=np.array(6, np.float32))
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    elif act == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    assert spatial in (1, 2)
    return make_model([*nodes], [("x", F, [1, channels, *size])], [("y", 0, None)], inits)


CASES = {
    "3x3 s1 p1 relu6": (8, (9, 11), (3, 3), {"pads": [1, 1, 1, 1]}, {"act": "relu6"}),
    "3x3 s2 p1": (8, (10, 13), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, {}),
    "5x5 s2 p2 silu": (6, (15, 15), (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}, {"act": "silu"}),
    "7x7 s1 p3 on 7x7 (all border)": (4, (7, 7), (7, 7), {"pads": [3, 3, 3, 3]}, {}),
    "7x7 s1 p3 on 16x20": (4, (16, 20), (7, 7), {"pads": [3, 3, 3, 3]}, {"bias": False}),
    "3x3 dilation 2": (4, (12, 12), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, {}),
    "asymmetric pads": (4, (9, 9), (3, 3), {"pads": [0, 1, 2, 0]}, {}),
    "no padding": (4, (6, 8), (3, 3), {}, {}),
    "SAME_UPPER": (4, (7, 9), (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, {}),
    "channel multiplier 2": (4, (8, 8), (3, 3), {"pads": [1, 1, 1, 1]}, {"multiplier": 2}),
    "2 channels per group": (8, (8, 8), (3, 3), {"pads": [1, 1, 1, 1]}, {"per_group": 2}),
    "1-D k5": (6, (20,), (5,), {"pads": [2, 2]}, {}),
    # found by the fuzzer: a tap that is never inside (dilation 2, pads 2/1 on a width of 2)
    "a tap never inside the input": (3, (1, 2), (1, 3), {"pads": [0, 2, 0, 1], "dilations": [1, 2]}, {}),
    "kernel larger than the map": (3, (2, 3), (5, 5), {"pads": [2, 2, 2, 2]}, {}),
    # channel counts that fill whole vector blocks on every ISA: the channel-blocked kernel
    "blocked 5x5 s2 p2 silu, 48 channels": (
        48,
        (14, 14),
        (5, 5),
        {"pads": [2, 2, 2, 2], "strides": [2, 2]},
        {"act": "silu"},
    ),
    "blocked 7x7 on 7x7, 32 channels": (32, (7, 7), (7, 7), {"pads": [3, 3, 3, 3]}, {"bias": False}),
    "blocked 3x3 asymmetric pads dilation 2": (
        32,
        (9, 10),
        (3, 3),
        {"pads": [2, 1, 0, 2], "dilations": [2, 2]},
        {"act": "relu6"},
    ),
    "blocked 1-D k3": (16, (12,), (3,), {"pads": [1, 1]}, {}),
    "too many taps: per-tap kernel": (16, (6, 6), (3, 3), {"pads": [1, 1, 1, 1]}, {"per_group": 8}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_depthwise_matches_reference(name, target):
    channels, size, kernel, attrs, extra = CASES[name]
    onnx_model = model(channels, size, kernel, attrs, **extra)
    x = RNG.standard_normal((1, channels, *size)).astype(np.float32)
    got = kiln.compile(onnx_model, target=target)(x)
    want = kiln.compile(onnx_model, target="reference")(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _statements(body):
    for stmt in body:
        yield stmt
        yield from _statements(getattr(stmt, "body", []))


def test_the_direct_kernel_is_the_one_depthwise_layers_get():
    compiled = kiln.compile(model(8, (9, 11), (3, 3), {"pads": [1, 1, 1, 1]}, act="relu6"), target="kir")
    kernels = [k for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
    assert [k.kind for k in kernels] == ["depthwise-conv+epilogue"]  # the Clip joined it
    stores = [s for s in _statements(kernels[0].body) if isinstance(s, Store)]
    # each output stored once, from its whole sum: no read-modify-write of the output per tap
    assert stores and not any(isinstance(e, Load) and e.buffer is s.buffer for s in stores for e in postorder(s.value))
    assert window_lowering.DIRECT_MAX_TAPS >= 49  # ConvNeXt's 7x7 depthwise takes the direct kernel


def test_depthwise_on_small_planes_runs_channel_blocked(target):
    compiled = kiln.compile(model(64, (14, 14), (5, 5), {"pads": [2, 2, 2, 2]}, act="silu"), target=target)
    kernels = [k for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
    assert len(kernels) == 1
    scratch = [b.name for b in kernels[0].writes]
    assert any(name.startswith("dwpad") for name in scratch), scratch  # the zero-bordered, interleaved copy


def test_a_depthwise_after_folded_batchnorms_compiles_and_matches(target):
    """Found by the fuzzer: the direct kernel's bias scalar (stem "b") once got the same C name as
    a buffer (``b3``) when the model had as many buffers as the scalar's number; the C failed to
    compile. Generated names now can never be buffer names."""
    rng = np.random.default_rng(11)
    inits, nodes, current = {}, [], "x"
    for step, (channels, group) in enumerate([(1, None), (1, 1), (3, None), (3, 3)]):  # channels in
        out = f"t{step}"
        if group is None:  # a BatchNormalization that folds into the convolution next to it
            for name in ("scale", "bias", "mean"):
                inits[f"{name}{step}"] = rng.standard_normal(channels).astype(np.float32)
            inits[f"var{step}"] = rng.uniform(0.5, 2, channels).astype(np.float32)
            nodes.append(helper.make_node("BatchNormalization", [current, *(f"{n}{step}" for n in ("scale", "bias", "mean", "var"))], [out]))  # fmt: skip
        else:
            inits[f"w{step}"] = rng.standard_normal((3, channels // group, 1, 1)).astype(np.float32)
            nodes.append(helper.make_node("Conv", [current, f"w{step}"], [out], kernel_shape=[1, 1], group=group))
        current = out
    m = make_model(nodes, [("x", F, [1, 1, 1, 1])], [(current, 0, None)], inits)
    feeds = {"x": rng.standard_normal((1, 1, 1, 1)).astype(np.float32)}
    want = kiln.compile(m, target="reference").run(feeds)[current]
    np.testing.assert_allclose(kiln.compile(m, target=target).run(feeds)[current], want, rtol=1e-5, atol=1e-6)
