"""Weight-only int8 (``--precision int8-weights``, gemm_w8.c): the constant weights of matrix
products as int8 with one scale per output column, activations and sums float32. Checked against
NumPy products over the quantized weights themselves (so the arithmetic, not the quantization, is
what is compared), on each ISA path the machine has (AVX-512, AVX2 on cpu:avx2, the portable
element-by-element widening on cpu:generic; a path the machine lacks is skipped with the reason):
few rows (widened in registers) and many (a panel widened per block), edge tiles, a fused bias and
Relu, a longer epilogue, a batch range; and that the plan holds int8, not float32, weights."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.backends import parse
from kiln.backends.cpu import features
from kiln.driver.pipeline import resolve_precision
from kiln.errors import KilnError
from kiln.lower.engine import quantize_channels
from kiln.lower.kir import kernel_precision
from tests.helpers import linear_layer

RNG = np.random.default_rng(8)


def _lacks(isa: str) -> str:
    flags = features.cpu_flags()
    needs = {"avx512": "avx512f", "avx2": "avx2"}.get(isa)
    return f"this CPU has no {needs}" if needs and needs not in flags else ""


TARGETS = [
    pytest.param(t, marks=pytest.mark.skipif(bool(_lacks(isa)), reason=_lacks(isa) or "-"))
    for t, isa in (("cpu:avx512", "avx512"), ("cpu:avx2", "avx2"), ("cpu:generic", "generic"))
]


def quantized(w: np.ndarray) -> np.ndarray:
    """The float32 weights the int8 path multiplies by: each column's int8 values times its scale."""
    q, scales = quantize_channels(w.T)
    return (q.astype(np.float32) * scales[:, None]).T


def linear(k: int, n: int, tail: str) -> tuple:
    """x [batch, k] . w + b, then ``tail`` (``tests.helpers.linear_layer``): the model and its
    expected output from the int8 weights' own products."""
    model, w, finish = linear_layer(RNG, k, n, tail, rows="batch")

    def expected(x: np.ndarray) -> np.ndarray:
        return finish(x.astype(np.float64) @ quantized(w).astype(np.float64))

    return model, expected


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k,n,tail", [(96, 70, "relu"), (1, 3, "relu"), (100, 37, "square"), (64, 64, "square")])
def test_products_are_those_of_the_quantized_weights(target, k, n, tail):
    model, expected = linear(k, n, tail)
    compiled = kiln.compile(model, target=target, precision="int8-weights", dims={"batch": "1..40"})
    assert compiled.precision == "int8-weights"
    for rows in (1, 3, 9, 40):  # in registers (few rows), a panel widened per block (many)
        x = RNG.standard_normal((rows, k)).astype(np.float32)
        y = compiled.run({"x": x})["y"]
        want = expected(x)
        assert np.linalg.norm(y - want) <= 2e-6 * np.linalg.norm(want) + 1e-6, (rows, target)
    kernels = [k for plan in compiled.plans for step in plan.steps for k in getattr(step, "kernels", [])]
    assert "w8" in {kernel_precision(kernel) for kernel in kernels}  # the int8 path ran, not a fallback


def test_the_plan_holds_int8_weights_and_the_error_is_the_quantization():
    model, _ = linear(256, 192, "relu")
    x = RNG.standard_normal((4, 256)).astype(np.float32)
    fp32 = kiln.compile(model, dims={"batch": "4..4"})
    int8 = kiln.compile(model, precision="int8-weights", dims={"batch": "4..4"})
    y32, y8 = fp32.run({"x": x})["y"], int8.run({"x": x})["y"]
    error = np.linalg.norm(y8 - y32) / np.linalg.norm(y32)
    assert 1e-5 < error < 2e-2  # 8-bit weights: off by their rounding, never by more

    def weight_bytes(compiled) -> int:
        return sum(np.asarray(a).nbytes for plan in compiled.plans for a in plan.constants.values())

    assert weight_bytes(int8) < 0.3 * weight_bytes(fp32)  # int8 panels and scales, no float copy kept


def test_a_saved_int8_weights_model_loads_and_runs_the_same(tmp_path):
    model, _ = linear(48, 40, "square")
    compiled = kiln.compile(model, precision="int8-weights", dims={"batch": "1..8"})
    x = RNG.standard_normal((5, 48)).astype(np.float32)
    want = compiled.run({"x": x})["y"]
    compiled.save(str(tmp_path / "m.kiln"))
    loaded = kiln.load(str(tmp_path / "m.kiln"))
    assert loaded.precision == "int8-weights"
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], want)


def test_targets_without_the_path_say_why():
    with pytest.raises(KilnError, match="fixed point"):
        resolve_precision("int8-weights", parse("fpga"))
    assert resolve_precision("int8-weights", parse("cpu:generic")) == "int8-weights"


def test_weights_quantized_block_by_block_are_the_whole_matrix_quantized():
    """``pack_cols_int8`` quantizes a block of panels at a time (its float temporaries a block's):
    the panels and scales are those of the whole matrix quantized at once, edges padded with 0."""
    from kiln.lower.engine import pack_cols_int8

    k, n, cols = 64, 70_001, 32  # several blocks, a last panel of 17 columns
    w = RNG.standard_normal((k, n)).astype(np.float32)
    packed, scales = pack_cols_int8(w, cols)
    q, want_scales = quantize_channels(w.T)
    full = np.zeros((k, packed.shape[0] * cols), np.int8)
    full[:, :n] = q.T
    np.testing.assert_array_equal(packed, full.reshape(k, -1, cols).transpose(1, 0, 2))
    np.testing.assert_array_equal(scales, want_scales)
