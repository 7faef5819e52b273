"""Weight-only int4 (``--precision int4-weights`` and its -g128 / -asym variants, gemm_w4.c): the
constant weights of matrix products as 4-bit codes with a float scale (and, asymmetric, an offset)
per group of 32 or 128 k-steps of a column. A decode step's few rows quantize their activations
per group to int8 at run time and sum code x activation in int32 (VNNI, VPMADDUBSW or plain vector
code: the same exact sums); a prompt's many rows multiply float32 activations by the weights
dequantized per block. Each is checked against a NumPy model of that arithmetic over the same
codes (float64 sums), on each ISA path the machine has (the host's -march=native, the AVX-512
baseline without VNNI, AVX2, the portable vector code; a path the machine lacks is skipped with
the reason): K not a multiple of the group, edge panels, a fused bias and Relu, a longer epilogue.
Then: the plan holds codes, not floats; the quantization error is a 4-bit one; a saved model
loads and runs the same; the codes themselves."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.backends.cpu import features
from kiln.driver.options import CompileOptions
from kiln.lower.engine import WEIGHT_FORMATS, pack_cols_int4, quantize_groups
from kiln.lower.kir import engine_calls
from tests.helpers import linear_layer

RNG = np.random.default_rng(4)
FORMS = ["int4-weights", "int4-weights-asym", "int4-weights-g128", "int4-weights-g128-asym"]


def _lacks(isa: str) -> str:
    flags = features.cpu_flags()
    needs = {"avx512": "avx512f", "avx2": "avx2"}.get(isa)
    return f"this CPU has no {needs}" if needs and needs not in flags else ""


TARGETS = [
    pytest.param(t, marks=pytest.mark.skipif(bool(_lacks(isa)), reason=_lacks(isa) or "-"))
    for t, isa in (("cpu", "host"), ("cpu:avx512", "avx512"), ("cpu:avx2", "avx2"), ("cpu:generic", "generic"))
]


def dequantized(w: np.ndarray, precision: str) -> np.ndarray:
    """The float weights a prompt's rows multiply by: code x scale + offset, per group."""
    _, group, symmetric, _ = WEIGHT_FORMATS[precision]
    codes, scales, offsets = quantize_groups(w, group, symmetric)
    dense = codes * np.repeat(scales, group, axis=0).astype(np.float64) + np.repeat(offsets, group, axis=0)
    return dense[: w.shape[0]]


def decode_product(x: np.ndarray, w: np.ndarray, precision: str) -> np.ndarray:
    """A decode step's x . W: x quantized per group (int8, scale = largest magnitude / 127, float32
    arithmetic and round-half-even as the engine's), exact integer sums with the codes, then per
    group scale_x x (scale_w x sum + offset_w x sum of the quantized x)."""
    _, group, symmetric, _ = WEIGHT_FORMATS[precision]
    codes, scales, offsets = quantize_groups(w, group, symmetric)
    rows, k = x.shape
    padded = np.zeros((rows, codes.shape[0]), np.float32)
    padded[:, :k] = x
    blocks = padded.reshape(rows, -1, group)
    top = np.abs(blocks).max(axis=2, keepdims=True)
    inverse = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), np.float32(0)).astype(np.float32)
    xq = np.rint(blocks * inverse).astype(np.float64)  # [rows, groups, group]
    sx = top[..., 0].astype(np.float64) / 127
    sums = np.einsum("rgk,gkn->rgn", xq, codes.reshape(-1, group, w.shape[1]).astype(np.float64))
    return ((sums * scales + xq.sum(axis=2)[..., None] * offsets) * sx[..., None]).sum(axis=1)


def linear(k: int, n: int, tail: str) -> tuple:
    """x [rows, k] . w + b, then ``tail`` (``tests.helpers.linear_layer``): (model, w, finish)."""
    return linear_layer(RNG, k, n, tail)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", FORMS)
@pytest.mark.parametrize("k,n,tail", [(100, 37, "relu"), (256, 70, "square")])
def test_products_are_those_of_the_codes(target, precision, k, n, tail):
    model, w, finish = linear(k, n, tail)
    # few rows; a prompt's (every row in one product: no size classes cutting 40 rows into 8s)
    whole = CompileOptions.from_env(disabled={"size-classes"}, precision=precision)
    for rows, want in ((1, decode_product), (3, decode_product), (40, None)):
        compiled = kiln.compile(model, target=target, options=whole, dims={"rows": (rows, rows)})
        assert compiled.precision == precision
        x = RNG.standard_normal((rows, k)).astype(np.float32)
        y = compiled.run({"x": x})["y"]
        h = want(x, w, precision) if want else x.astype(np.float64) @ dequantized(w, precision)
        expected = finish(h)
        assert np.linalg.norm(y - expected) <= 2e-6 * np.linalg.norm(expected) + 1e-6, (rows, target)
        calls = [c for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", []) for c in engine_calls(k)]
        assert [(c.precision, c.m) for c in calls] == [("w4", rows)]  # the int4 path ran, on every row at once


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", ["int4-weights", "int4-weights-g128-asym"])
@pytest.mark.parametrize("tail", ["relu", "square"])
def test_one_row_over_sets_of_panels_is_that_row_among_others_bit_for_bit(target, precision, tail):
    """A decode step's one row reads its panels in sets side by side (kiln_w4_row_set): each
    column's sums, scales and finish are the few-row kernel's, bit for bit, and the code model's;
    N spans whole sets, panels after them and an edge panel."""
    model, w, finish = linear(256, 2100, tail)
    whole = CompileOptions.from_env(disabled={"size-classes"}, precision=precision)
    one = kiln.compile(model, target=target, options=whole, dims={"rows": (1, 1)})
    three = kiln.compile(model, target=target, options=whole, dims={"rows": (3, 3)})
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    together = three.run({"x": x})["y"]
    for i in range(3):
        np.testing.assert_array_equal(one.run({"x": x[i : i + 1]})["y"], together[i : i + 1])
    expected = finish(decode_product(x, w, precision))
    assert np.linalg.norm(together - expected) <= 2e-6 * np.linalg.norm(expected) + 1e-6


def test_the_plan_holds_codes_and_the_error_is_a_four_bit_one(tmp_path):
    model, _, _ = linear(512, 256, "relu")
    x = RNG.standard_normal((1, 512)).astype(np.float32)
    fp32 = kiln.compile(model, dims={"rows": (1, 1)})
    y32 = fp32.run({"x": x})["y"]

    def weight_bytes(compiled) -> int:
        return sum(np.asarray(a).nbytes for plan in compiled.plans for a in plan.constants.values())

    for precision, share in (("int4-weights", 0.2), ("int4-weights-g128", 0.16), ("int4-weights-asym", 0.27)):
        int4 = kiln.compile(model, precision=precision, dims={"rows": (1, 1)})
        error = np.linalg.norm(int4.run({"x": x})["y"] - y32) / np.linalg.norm(y32)
        assert 1e-3 < error < 0.2, (precision, error)  # 4-bit weights: off by their rounding, never by more
        assert weight_bytes(int4) < share * weight_bytes(fp32)  # codes and scales, no float copy kept
    int4.save(str(tmp_path / "m.kiln"))
    loaded = kiln.load(str(tmp_path / "m.kiln"))
    assert loaded.precision == "int4-weights-asym"
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], int4.run({"x": x})["y"])


@pytest.mark.parametrize("symmetric", [True, False])
def test_codes_represent_each_group(symmetric):
    w = RNG.standard_normal((70, 45)).astype(np.float32) * RNG.uniform(0.01, 10, 45).astype(np.float32)
    w[:32, 3] = 0.25  # a constant group
    codes, scales, offsets = quantize_groups(w, 32, symmetric)
    assert codes.shape == (96, 45) and scales.shape == offsets.shape == (3, 45)
    assert codes.max() <= 15
    dense = codes * np.repeat(scales, 32, axis=0) + np.repeat(offsets, 32, axis=0)
    # within half a step of the weight, except past the top code (symmetric: +8 steps, beyond 15)
    step = np.repeat(np.abs(scales), 32, axis=0)[:70]
    assert np.all(np.abs(dense[:70] - w) <= np.where(codes[:70] == 15, 1.0, 0.5) * step + 1e-6)
    assert np.all(dense[70:] == 0) if symmetric else True  # the padding encodes 0 (symmetric: code 8)
    np.testing.assert_allclose(dense[:32, 3], 0.25, rtol=1e-6)
    np.testing.assert_array_equal(scales.astype(np.float16).astype(np.float32), scales)  # (stored as float16)
    if symmetric:
        np.testing.assert_array_equal(offsets, -8 * scales)
        top = np.abs(w[:32]).argmax(axis=0)  # each group's largest magnitude: code 0, off by the scale's rounding
        np.testing.assert_allclose(dense[top, np.arange(45)], w[top, np.arange(45)], rtol=2.0**-11)


def test_packed_words_hold_eight_k_steps_of_a_column():
    w = RNG.standard_normal((40, 37)).astype(np.float32)
    words, scales, offsets = pack_cols_int4(w, 16, 32, symmetric=False)
    codes, want_scales, want_offsets = quantize_groups(w, 32, False)
    assert words.shape == (3, 8, 16) and scales.shape == offsets.shape == (3, 2, 16)
    unpacked = np.stack([(words >> np.uint32(4 * t)) & 15 for t in range(8)], axis=2)  # [panel, chunk, t, col]
    full = unpacked.transpose(1, 2, 0, 3).reshape(64, 48)
    np.testing.assert_array_equal(full[:, :37], codes)
    assert scales.dtype == np.uint16  # (float16 bits)
    scales = scales.view(np.float16).astype(np.float32)
    assert np.all(full[:, 37:] == 0) and np.all(scales.transpose(1, 0, 2).reshape(2, 48)[:, 37:] == 0)
    np.testing.assert_array_equal(scales.transpose(1, 0, 2).reshape(2, 48)[:, :37], want_scales)
    np.testing.assert_array_equal(offsets.transpose(1, 0, 2).reshape(2, 48)[:, :37], want_offsets)
