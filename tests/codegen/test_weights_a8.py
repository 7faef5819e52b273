"""Weight-only formats with a prompt's rows in int8 (``--precision int8-weights-a8``,
``int4-weights-a8`` and the int4 variants; gemm_wa8.c): each row of many is quantized to int8 by
its own range as the product runs, the weights widened to int8 per column (int8 codes as they
are; int4 codes re-quantized over the column's range), exact int32 sums on the int8 path's kernels,
then the row and column scales, the fused bias and Relu or a longer epilogue — checked against a
NumPy model of that arithmetic, K not a multiple of 64, edge panels, rows holding zeros or an inf;
a decode step's few rows are, for int4, the plain format's bit for bit, for int8 quantized as a
prompt's rows are (the prompt's results bit for bit). Skipped where the CPU has no int8
dot-product instructions (the compile refuses there: also checked)."""

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

RNG = np.random.default_rng(18)
FORMS = ["int8-weights-a8", "int4-weights-a8", "int4-weights-g128-asym-a8"]
VNNI = "avx512f" in features.cpu_flags() and features.int8_path("avx512")[0] >= features.INT8_PATHS["avx-vnni"]
needs_vnni = pytest.mark.skipif(
    not VNNI, reason="this CPU has no AVX-512 with VNNI or AMX-INT8 (the -a8 formats' kernels)"
)


def quantized_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's int8 codes and scale as the engine makes them (NaN scale: a row with an inf)."""
    top = np.abs(x).max(axis=1).astype(np.float32)
    finite = np.isfinite(x).all(axis=1)
    inv = np.where((top > 0) & finite, np.float32(127) / np.where(top > 0, top, 1), 0).astype(np.float32)
    with np.errstate(invalid="ignore"):
        codes = np.clip(np.nan_to_num(np.rint(x * inv[:, None]), nan=0.0), -127, 127)
    return codes.astype(np.int64), np.where(finite, top / np.float32(127), np.nan).astype(np.float32)


def widened(w: np.ndarray, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """The weights as the prompt rows' products read them: int8 codes [K, N], column scales."""
    bits, group, symmetric, _ = WEIGHT_FORMATS[precision]
    if bits == 8:
        panels, scales = pack_cols_int8(w, 32)
        codes = panels.transpose(1, 0, 2).reshape(w.shape[0], -1)[:, : w.shape[1]]
        return codes.astype(np.int64), scales[: w.shape[1]].astype(np.float32)
    codes, scales, offsets = quantize_groups(w, group, symmetric)
    top = np.maximum(np.abs(offsets), np.abs(np.float32(15) * scales + offsets)).max(axis=0)
    column = (top / np.float32(127)).astype(np.float32)
    inv = np.where(column > 0, np.float32(1) / np.where(column > 0, column, 1), 0).astype(np.float32)
    sc, off = (scales * inv).astype(np.float32), (offsets * inv).astype(np.float32)
    dense = codes.astype(np.float64) * np.repeat(sc, group, axis=0) + np.repeat(off, group, axis=0)  # (one FMA)
    return np.clip(np.rint(dense.astype(np.float32)), -127, 127)[: w.shape[0]].astype(np.int64), column


def model_product(x: np.ndarray, w: np.ndarray, precision: str) -> np.ndarray:
    rows, row_scale = quantized_rows(x)
    codes, column = widened(w, precision)
    sums = (rows @ codes).astype(np.float32)
    return sums * row_scale[:, None] * column[None, :]


@needs_vnni
@pytest.mark.parametrize("target", ["cpu", "cpu:avx512"])
@pytest.mark.parametrize("precision", FORMS)
@pytest.mark.parametrize("k,n,tail", [(100, 37, "relu"), (300, 70, "square")])
def test_prompt_rows_are_int8_products_of_the_widened_codes(target, precision, k, n, tail):
    model, w, finish = linear_layer(RNG, k, n, tail)
    whole = CompileOptions.from_env(disabled={"size-classes"}, precision=precision)
    compiled = kiln.compile(model, target=target, options=whole, dims={"rows": (40, 40)})
    assert compiled.precision == precision
    x = RNG.standard_normal((40, k)).astype(np.float32)
    x[5] = 0.0  # (a row of zeros: its scale is 0)
    x[7] *= 1000.0  # (another's range)
    y = compiled.run({"x": x})["y"]
    expected = finish(model_product(x, w, precision).astype(np.float64))
    # (a code rounded the other way at a tie: the only difference the model allows)
    assert np.linalg.norm(y - expected) <= 1e-4 * np.linalg.norm(expected) + 1e-6, target
    # (float32 activations would be off by int8's rounding: the int8 path ran)
    codes, column = widened(w, precision)
    plain = finish(x.astype(np.float64) @ (codes * column[None, :]).astype(np.float64))
    assert np.linalg.norm(y - plain) > 1e-3 * np.linalg.norm(plain)
    calls = [c for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", []) for c in engine_calls(k)]
    assert [(c.precision[:2], c.prompt) for c in calls] == [(("w8" if "int8" in precision else "w4"), "int8")]


@needs_vnni
@pytest.mark.parametrize("precision", ["int8-weights-a8", "int4-weights-a8"])
def test_a_row_with_an_inf_is_nan_and_leaves_the_others_alone(precision):
    model, _, _ = linear_layer(RNG, 128, 40, "square")
    whole = CompileOptions.from_env(disabled={"size-classes"}, precision=precision)
    compiled = kiln.compile(model, options=whole, dims={"rows": (32, 32)})
    x = RNG.standard_normal((32, 128)).astype(np.float32)
    clean = compiled.run({"x": x})["y"]
    x[3, 17] = np.inf
    x[9, 2] = np.nan
    y = compiled.run({"x": x})["y"]
    assert np.isnan(y[[3, 9]]).all()  # (the epilogue's Relu keeps a NaN: x < 0 is false)
    others = np.setdiff1d(np.arange(32), [3, 9])
    np.testing.assert_array_equal(y[others], clean[others])


@needs_vnni
@pytest.mark.parametrize("precision", ["int4-weights-a8", "int4-weights-g128-asym-a8"])
def test_int4_decode_rows_are_the_plain_formats_bit_for_bit(precision):
    model, _, _ = linear_layer(RNG, 256, 70, "relu")
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    got = kiln.compile(model, precision=precision, dims={"rows": (3, 3)}).run({"x": x})["y"]
    want = kiln.compile(model, precision=precision.removesuffix("-a8"), dims={"rows": (3, 3)}).run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)


@needs_vnni
@pytest.mark.parametrize("k,n,tail", [(256, 70, "relu"), (301, 100, "square"), (2050, 64, "relu")])
def test_int8_decode_rows_are_their_prompt_rows_bit_for_bit(k, n, tail):
    """int8-weights-a8's few rows (a decode step's: 1 to 5, over the 4 a kernel call takes) are
    quantized as a prompt's rows are and give the prompt's results bit for bit: K not a multiple of
    4 (the last quad's k-steps past K), edge panels, a row of zeros, a row with an inf; the int8
    arithmetic ran (not the float activations')."""
    model, w, finish = linear_layer(RNG, k, n, tail)
    x = RNG.standard_normal((40, k)).astype(np.float32)
    x[1] = 0.0
    x[3] *= 1000.0
    prompt = kiln.compile(model, precision="int8-weights-a8", dims={"rows": (40, 40)}).run({"x": x})["y"]
    x_inf = x.copy()
    x_inf[4, 5] = np.inf
    prompt_inf = kiln.compile(model, precision="int8-weights-a8", dims={"rows": (40, 40)}).run({"x": x_inf})["y"]
    few = kiln.compile(model, precision="int8-weights-a8", dims={"rows": (1, 5)})
    plain = kiln.compile(model, precision="int8-weights", dims={"rows": (1, 5)})
    for start, rows in ((0, 1), (1, 2), (3, 3), (6, 4), (10, 5)):
        got = few.run({"x": x[start : start + rows]})["y"]
        np.testing.assert_array_equal(got, prompt[start : start + rows])
        assert not np.array_equal(got, plain.run({"x": x[start : start + rows]})["y"]), (start, rows)
    np.testing.assert_array_equal(few.run({"x": x[2:5]})["y"], few.run({"x": x[2:5]})["y"])
    with_inf = few.run({"x": x_inf[2:6]})["y"]
    assert np.isnan(with_inf[2]).all()
    np.testing.assert_array_equal(with_inf[[0, 1, 3]], prompt_inf[[2, 3, 5]])
    expected = finish(model_product(x[:5], w, "int8-weights-a8").astype(np.float64))
    got = few.run({"x": x[:5]})["y"]
    assert np.linalg.norm(got - expected) <= 1e-4 * np.linalg.norm(expected) + 1e-6


def test_a_target_whose_int8_code_has_no_dot_product_refuses_the_format():
    model, _, _ = linear_layer(RNG, 64, 32, "relu")
    with pytest.raises(KilnError, match="int4-weights-a8 is not available for target cpu:avx2"):
        kiln.compile(model, target="cpu:avx2", precision="int4-weights-a8", dims={"rows": (2, 2)})


@needs_vnni
@pytest.mark.slow
def test_a_decode_steps_prompt_is_close_and_its_token_steps_are_the_plain_formats(monkeypatch):
    """A decoder at int4-weights-a8: a prompt's step (its products on the int8 kernels) within
    int8 activations' rounding of int4-weights; a step of one token bit for bit the same. At
    int8-weights-a8 a token's step is in int8 too: within the same rounding of int8-weights."""
    pytest.importorskip("transformers", reason="transformers (the 'zoo' extra) defines the decoders")
    monkeypatch.setenv("KILN_PLAN_CACHE", "0")
    error = prompt_error_and_step_check("int4-weights-a8", "int4-weights")
    assert 1e-4 < error < 5e-2, error  # (int8 activations' rounding: different, never by more)
    prompt, step = prompt_error_and_step_check("int8-weights-a8", "int8-weights", same_step=False)
    assert 1e-4 < prompt < 5e-2 and 1e-4 < step < 5e-2, (prompt, step)
