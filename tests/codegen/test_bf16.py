"""Reduced-precision hardware: which bf16/int8 paths a CPU offers (from its flags), the AMX
permission request, the AMX-BF16 tile product and the AVX-512-BF16 micro-kernel against NumPy
(skipped, with the reason, where the CPU or the OS does not offer them)."""

import ml_dtypes
import numpy as np
import pytest

from kiln.backends.cpu import bf16, features
from kiln.errors import KilnError

RNG = np.random.default_rng(11)


def test_precision_paths_follow_the_cpu_flags_best_first():
    sapphire = frozenset("avx2 avx512f avx512_bf16 avx512_vnni avx_vnni amx_tile amx_bf16 amx_int8".split())
    assert features.precision_paths(sapphire) == {
        "bf16": ["amx-bf16", "avx512-bf16"],
        "int8": ["amx-int8", "avx512-vnni", "avx-vnni", "avx2"],
    }
    haswell = frozenset("avx2 fma".split())
    assert features.precision_paths(haswell) == {"bf16": [], "int8": ["avx2"]}  # bf16 would be emulated
    assert features.precision_paths(frozenset("amx_bf16 avx512f".split()))["bf16"] == []  # no amx_tile: no tiles


def test_amx_permission_is_granted_or_refused_with_a_reason():
    granted, reason = features.request_amx()
    assert granted == (reason == "")
    if "amx_tile" not in features.cpu_flags():
        assert not granted and "no AMX" in reason
    assert features.request_amx() == (granted, reason)  # asked once per process


needs_amx = pytest.mark.skipif(bool(bf16.available()), reason=f"AMX-BF16 not usable here: {bf16.available()}")


def random_bf16(shape):
    return RNG.standard_normal(shape).astype(ml_dtypes.bfloat16)


@needs_amx
@pytest.mark.parametrize("k", [32, 128])
def test_amx_bf16_tile_product_matches_numpy(k):
    a, b = random_bf16((16, k)), random_bf16((k, 16))
    start = RNG.standard_normal((16, 16)).astype(np.float32)
    got = bf16.tile_product(a.view(np.uint16), b.view(np.uint16), start)
    want = start.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    # bf16 products are exact in float32; only the float32 accumulation rounds
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_amx_tile_product_refuses_shapes_it_cannot_take():
    if bf16.available():
        with pytest.raises(KilnError, match="unavailable"):
            bf16.tile_product(np.zeros((16, 32), np.uint16), np.zeros((32, 16), np.uint16))
        return
    with pytest.raises(KilnError, match="multiple of 32"):
        bf16.tile_product(np.zeros((16, 40), np.uint16), np.zeros((40, 16), np.uint16))


def test_kiln_targets_reports_the_reduced_precision_hardware():
    import json

    from click.testing import CliRunner

    from kiln.cli import main

    result = CliRunner().invoke(main, ["targets", "--json"])
    assert result.exit_code == 0, result.output
    cpu = [row for row in json.loads(result.output) if row["backend"] == "cpu"]
    paths = features.precision_paths()
    assert cpu and all(row["reduced_precision"]["bf16"] == paths["bf16"] for row in cpu)
    assert all(row["reduced_precision"]["int8"] == paths["int8"] for row in cpu)


needs_dpbf16 = pytest.mark.skipif(bool(bf16.dot_available()), reason=f"AVX-512-BF16 not here: {bf16.dot_available()}")


@needs_dpbf16
@pytest.mark.parametrize("k", [2, 64, 258])
def test_avx512_bf16_micro_kernel_matches_numpy(k):
    a, b = random_bf16((8, k)), random_bf16((k, 32))
    start = RNG.standard_normal((8, 32)).astype(np.float32)
    got = bf16.dot_tile(a.view(np.uint16), b.view(np.uint16), start)
    want = start.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_the_pair_layouts_put_each_k_pair_together():
    a = np.arange(8 * 4, dtype=np.uint16).reshape(8, 4)
    words = bf16.pack_pairs_a(a)  # [K/2][rows]: low half k even, high half k odd
    assert words.shape == (2, 8)
    assert int(words[1, 3]) == int(a[3, 2]) | (int(a[3, 3]) << 16)
    b = np.arange(4 * 32, dtype=np.uint16).reshape(4, 32)
    pairs = bf16.pair_layout(b).reshape(2, 32, 2)
    assert pairs[1, 5, 0] == b[2, 5] and pairs[1, 5, 1] == b[3, 5]


def test_the_bf16_micro_kernel_refuses_an_odd_depth():
    if bf16.dot_available():
        with pytest.raises(KilnError, match="unavailable"):
            bf16.dot_tile(np.zeros((8, 2), np.uint16), np.zeros((2, 32), np.uint16))
        return
    with pytest.raises(KilnError, match="K even"):
        bf16.dot_tile(np.zeros((8, 3), np.uint16), np.zeros((3, 32), np.uint16))
