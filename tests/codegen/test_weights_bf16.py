"""Weight-only formats with a prompt's rows in bfloat16 (``--precision int8-weights-bf16``,
``int4-weights-bf16`` and the int4 variants; gemm_wbf16.c): many rows multiply the weights widened
from their codes (code x scale (+ offset), float32) and rounded to bfloat16 by activations rounded
to bfloat16, sums in float32, on the bf16 path's kernels, with the fused bias and Relu or a longer
epilogue after — checked against a NumPy model of that arithmetic (float64 sums), K not a multiple
of 32, edge panels; a decode step's few rows are the plain format's, bit for bit. Skipped where
the CPU has no bf16 instructions (the compile refuses there: also checked)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.backends.cpu import features
from kiln.driver.options import CompileOptions
from kiln.errors import KilnError
from kiln.lower.engine import WEIGHT_FORMATS, pack_cols_int8, quantize_groups
from kiln.lower.kir import engine_calls
from tests.helpers import linear_layer, prompt_error_and_step_check

RNG = np.random.default_rng(8)
FORMS = ["int8-weights-bf16", "int4-weights-bf16", "int4-weights-g128-asym-bf16"]
BF16 = features.precision_paths()["bf16"] and "avx512f" in features.cpu_flags()
needs_bf16 = pytest.mark.skipif(not BF16, reason="this CPU has no bf16 instructions (AVX512_BF16 or AMX-BF16)")


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest, ties to even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def widened(w: np.ndarray, precision: str) -> np.ndarray:
    """The weights as the prompt rows' products read them: float32 from the codes, then bfloat16."""
    bits, group, symmetric, _ = WEIGHT_FORMATS[precision]
    if bits == 8:
        panels, scales = pack_cols_int8(w, 32)
        codes = panels.transpose(1, 0, 2).reshape(w.shape[0], -1)[:, : w.shape[1]]
        return bf16(codes.astype(np.float32) * scales)
    codes, scales, offsets = quantize_groups(w, group, symmetric)
    dense = codes.astype(np.float32) * np.repeat(scales, group, axis=0) + np.repeat(offsets, group, axis=0)
    return bf16(dense[: w.shape[0]].astype(np.float32))


def linear(k: int, n: int, tail: str) -> tuple:
    return linear_layer(RNG, k, n, tail)


@needs_bf16
@pytest.mark.parametrize("target", ["cpu", "cpu:avx512"])
@pytest.mark.parametrize("precision", FORMS)
@pytest.mark.parametrize("k,n,tail", [(100, 37, "relu"), (300, 70, "square")])
def test_prompt_rows_are_bf16_products_of_the_widened_codes(target, precision, k, n, tail):
    model, w, finish = linear(k, n, tail)
    whole = CompileOptions.from_env(disabled={"size-classes"}, precision=precision)
    compiled = kiln.compile(model, target=target, options=whole, dims={"rows": (40, 40)})
    assert compiled.precision == precision
    x = RNG.standard_normal((40, k)).astype(np.float32)
    y = compiled.run({"x": x})["y"]
    expected = finish(bf16(x).astype(np.float64) @ widened(w, precision).astype(np.float64))
    assert np.linalg.norm(y - expected) <= 2e-5 * np.linalg.norm(expected) + 1e-6, target
    # (float32 activations would be off by bf16's rounding: the bf16 path ran)
    plain = finish(x.astype(np.float64) @ widened(w, precision).astype(np.float64))
    assert np.linalg.norm(y - plain) > 2e-4 * np.linalg.norm(plain)
    calls = [c for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", []) for c in engine_calls(k)]
    assert [(c.precision[:2], c.prompt) for c in calls] == [(("w8" if "int8" in precision else "w4"), "bf16")]


@needs_bf16
@pytest.mark.parametrize("precision", FORMS)
def test_decode_rows_are_the_plain_formats_bit_for_bit(precision):
    model, _, _ = linear(256, 70, "relu")
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    got = kiln.compile(model, precision=precision, dims={"rows": (3, 3)}).run({"x": x})["y"]
    want = kiln.compile(model, precision=precision.removesuffix("-bf16"), dims={"rows": (3, 3)}).run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)


def test_a_target_without_the_bf16_path_refuses_the_format():
    model, _, _ = linear(64, 32, "relu")
    with pytest.raises(KilnError, match="int4-weights-bf16 is not available for target cpu:avx2"):
        kiln.compile(model, target="cpu:avx2", precision="int4-weights-bf16", dims={"rows": (2, 2)})


@needs_bf16
@pytest.mark.slow
def test_a_decode_steps_prompt_is_close_and_its_token_steps_are_the_plain_formats(monkeypatch):
    """A decoder at int8-weights-bf16: a prompt's step (its products and attention on the bf16
    kernels) within bf16's rounding of int8-weights; a step of one token bit for bit the same."""
    pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the decoders")
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    error = prompt_error_and_step_check("int8-weights-bf16", "int8-weights")
    assert 1e-5 < error < 2e-2, error  # (bf16's rounding: different, never by more)
