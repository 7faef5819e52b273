"""Reduced precision on the cpu target: which bf16/int8 paths a CPU offers (from its flags), the
AMX permission request, and the bf16 matrix products and convolutions on each path this machine
has (AMX-BF16 tiles, AVX512_BF16 dot products, portable C; a path the machine lacks is skipped
with the reason) against the float32 product of bf16-rounded operands."""

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.backends.cpu import CpuBackend, features, host
from kiln.driver.options import CompileOptions
from kiln.errors import KilnError
from kiln.lower.kir import kernel_precision
from tests.helpers import FLOAT, make_model, residual_chain

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


def _path_reason(name):
    """'' when this machine runs bf16 path ``name``, else why not (the skip reason): the bf16
    paths are the avx512 targets' (32-column panels), so a CPU whose cpu target is not avx512
    reaches none of them, the portable one included."""
    unreachable = CpuBackend().precisions(host())["bf16"]
    if unreachable and host().isa != "avx512":
        return unreachable
    try:
        features.bf16_path({"KILN_BF16_PATH": name})
    except KilnError as err:
        return str(err)
    return ""


PATHS = [
    pytest.param(name, marks=pytest.mark.skipif(bool(_path_reason(name)), reason=_path_reason(name) or "-"))
    for name in features.BF16_PATHS
]
needs_bf16 = pytest.mark.skipif(
    bool(CpuBackend().precisions(host())["bf16"]), reason=CpuBackend().precisions(host())["bf16"] or "-"
)


def rounded(array):
    """``array`` rounded to bfloat16 (nearest even) and back: what the bf16 path multiplies."""
    return np.asarray(array, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def check_bf16(model_of, feeds, rounded_feeds, path, monkeypatch):
    """The bf16 compile of ``model_of(round=False)`` against the float32 reference of
    ``model_of(round=True)`` (its product operands rounded to bf16 beforehand): bf16 products are
    exact in float32, so only the order of the float32 sums may differ."""
    monkeypatch.setenv("KILN_BF16_PATH", path)
    model = kiln.compile(model_of(False), precision="bf16", options=CompileOptions(plan_cache=False))
    assert model.precision == "bf16"
    got = model.run(feeds)
    want = kiln.compile(model_of(True), target="reference").run(rounded_feeds)
    for name, value in want.items():
        scale = float(np.abs(value).max()) or 1.0
        np.testing.assert_allclose(got[name], value, rtol=0, atol=2e-6 * scale * np.sqrt(value.size + 64))
    return got


MATMULS = {  # (A shape, B shape, B constant)
    "one element": ((1, 1), (1, 1), True),
    "edges everywhere": ((37, 100), (100, 70), True),
    "one tile": ((32, 32), (32, 32), True),
    "16 rows": ((16, 64), (64, 96), True),
    "transformer block": ((128, 768), (768, 256), True),
    "batched activations": ((2, 3, 33, 65), (65, 40), True),
    "two activations": ((2, 19, 48), (2, 48, 35), False),
    "batched weights": ((3, 20, 40), (3, 40, 50), True),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", MATMULS)
def test_bf16_matmul_matches_the_product_of_rounded_operands(case, path, monkeypatch):
    a_shape, b_shape, constant = MATMULS[case]
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    residual = RNG.standard_normal(np.broadcast_shapes((*a_shape[:-1], 1), (*b_shape[:-2], 1, b_shape[-1]))).astype(np.float32)  # fmt: skip

    def model_of(round_weights):
        nodes = [helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("Add", ["p", "r"], ["y"])]
        inputs = [("a", FLOAT, list(a_shape)), ("r", FLOAT, list(residual.shape))]
        inits = {}
        if constant:
            inits["b"] = rounded(b) if round_weights else b
        else:
            inputs.append(("b", FLOAT, list(b_shape)))
        return make_model(nodes, inputs, [("y", FLOAT, None)], inits)

    feeds = {"a": a, "r": residual} | ({} if constant else {"b": b})
    rounded_feeds = {"a": rounded(a), "r": residual} | ({} if constant else {"b": rounded(b)})
    check_bf16(model_of, feeds, rounded_feeds, path, monkeypatch)


CONVS = {  # (input shape, weight shape, attributes)
    "3x3 pad 1": ((1, 16, 14, 14), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    "1x1": ((2, 64, 7, 9), (33, 64, 1, 1), {}),
    "7x7 stride 2": ((1, 3, 30, 30), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    "1-D dilated": ((1, 8, 50), (12, 8, 3), {"dilations": [2]}),
    "direct 3x3": ((1, 40, 9, 11), (24, 40, 3, 3), {"pads": [1, 1, 1, 1]}),
    "direct two images": ((2, 64, 7, 7), (70, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    "direct 5x3 asymmetric pads": ((1, 33, 6, 13), (40, 33, 5, 3), {"pads": [2, 0, 1, 2]}),
    # strided: the padded copy split into stride phases, each tap a stride-1 read of one of them
    "direct 3x3 stride 2": ((1, 40, 13, 14), (24, 40, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "direct 1x1 stride 2 two images": ((2, 64, 10, 9), (40, 64, 1, 1), {"strides": [2, 2]}),
    "direct 5x3 strides 3x2 asymmetric pads": (
        (1, 36, 17, 12),
        (33, 36, 5, 3),
        {"pads": [2, 0, 1, 2], "strides": [3, 2]},
    ),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CONVS)
def test_bf16_convolution_with_bias_and_relu_matches_rounded_operands(case, path, monkeypatch):
    x_shape, w_shape, attrs = CONVS[case]
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    bias = RNG.standard_normal(w_shape[0]).astype(np.float32)

    def model_of(round_weights):
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
        inits = {"w": rounded(w) if round_weights else w, "b": bias}
        return make_model(nodes, [("x", FLOAT, list(x_shape))], [("y", FLOAT, None)], inits)

    got = check_bf16(model_of, {"x": x}, {"x": rounded(x)}, path, monkeypatch)
    assert (got["y"] >= 0).all() and (got["y"] > 0).any()  # the epilogue ran


@needs_bf16
def test_bf16_differs_from_fp32_as_much_as_rounding_explains():
    """bf16 is a different accuracy class: the relative error against fp32 is about bf16's
    rounding (2^-9 per operand), far above fp32's and far below garbage."""
    a = RNG.standard_normal((64, 512)).astype(np.float32)
    b = RNG.standard_normal((512, 128)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", FLOAT, [64, 512])], [("y", FLOAT, None)], {"b": b})  # fmt: skip
    exact = a.astype(np.float64) @ b.astype(np.float64)
    error = {}
    for precision in ("fp32", "bf16"):
        got = kiln.compile(model, precision=precision).run({"a": a})["y"]
        error[precision] = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert error["fp32"] < 1e-6
    assert 5e-4 < error["bf16"] < 1e-2


def test_bf16_path_choice_follows_the_machine_and_refuses_what_it_lacks():
    mode, name = features.bf16_path({})
    assert (mode, name) == (features.BF16_PATHS[name], name)
    paths = features.precision_paths()["bf16"]
    if "amx-bf16" in paths and features.request_amx()[0]:
        assert name == "amx"
    elif "avx512-bf16" in paths:
        assert name == "avx512"
    else:
        assert name == "portable"
    assert features.bf16_path({"KILN_BF16_PATH": "portable"}) == (0, "portable")  # always runs
    with pytest.raises(KilnError, match="the paths are"):
        features.bf16_path({"KILN_BF16_PATH": "tpu"})


def test_precision_errors_name_the_reason_and_auto_says_what_it_picked(monkeypatch):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, None)])
    with pytest.raises(KilnError, match="precision 'fp8' is not supported"):
        kiln.compile(model, precision="fp8")
    with pytest.raises(KilnError, match="has no bf16 path"):
        kiln.compile(model, target="cpu:avx2", precision="bf16")
    with pytest.raises(KilnError, match="fp32 only"):
        kiln.compile(model, target="reference", precision="bf16")
    native = not CpuBackend().precisions(host())["bf16"]
    assert kiln.compile(model, precision="auto").precision == ("bf16" if native else "fp32")
    assert kiln.compile(model, target="cpu:avx2", precision="auto").precision == "fp32"
    # a CPU without bf16 instructions: bf16 refused with the reason, auto falls back to fp32
    monkeypatch.setattr(features, "precision_paths", lambda flags=None: {"bf16": [], "int8": ["avx2"]})
    reason = "no bf16 instructions" if host().isa == "avx512" else "has no bf16 path"  # an AVX2 CPU's cpu target
    with pytest.raises(KilnError, match=reason):
        kiln.compile(model, precision="bf16")
    assert kiln.compile(model, precision="auto").precision == "fp32"


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


def test_the_bf16_packings_put_each_k_pair_together_and_pad_with_zeros():
    from kiln.lower.engine import pack_pairs_bf16, pack_rows_bf16

    b = RNG.standard_normal((1, 5, 40)).astype(np.float32)  # K 5 -> 32, N 40 -> 64
    pairs = pack_pairs_bf16(b)
    assert pairs.shape == (1, 2, 16, 32, 2) and pairs.dtype == np.uint16
    bits = rounded(b).view(np.uint32) >> 16
    assert pairs[0, 1, 1, 3, 0] == bits[0, 2, 35] and pairs[0, 1, 1, 3, 1] == bits[0, 3, 35]
    assert not pairs[0, 1, :, 8:].any() and not pairs[0, :, 3:].any()  # padded columns and k
    a = RNG.standard_normal((2, 33, 7)).astype(np.float32)
    rows = pack_rows_bf16(a)
    assert rows.shape == (2, 64, 32) and rows[1, 32, 6] == rounded(a).view(np.uint32)[1, 32, 6] >> 16
    assert not rows[:, 33:].any() and not rows[:, :, 7:].any()


@needs_bf16
@pytest.mark.parametrize("path", PATHS)
def test_bf16_attention_runs_its_products_in_bf16_and_stays_close_to_fp32(path, monkeypatch):
    from kiln.ops.interpreter import Interpreter
    from tests.passes.test_fuse import attention

    graph = attention(queries=40, keys=40, depth=64, mask_shape="1,1,40,40")
    feeds = [RNG.standard_normal(tuple(int(d) for d in v.type.shape)).astype(np.float32) for v in graph.inputs]
    want = Interpreter(graph).run(feeds)[0]
    monkeypatch.setenv("KILN_BF16_PATH", path)
    compiled = kiln.compile(graph, precision="bf16", options=CompileOptions(plan_cache=False))
    kernels = [k for step in compiled.plans[-1].steps for k in getattr(step, "kernels", [])]
    assert [(k.kind, kernel_precision(k)) for k in kernels] == [("attention", "bf16")]
    got = compiled.run(dict(zip([v.name for v in graph.inputs], feeds)))["o"]
    error = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 1e-5 < error < 2e-2  # bf16 operands (not fp32), softmax in float32


@pytest.mark.parametrize("path", PATHS)
def test_a_channels_last_bf16_region_computes_what_the_nchw_graph_does(path, monkeypatch):
    """In a bf16 compile the layout pass runs a ResNet-like chain channels last (3x3
    convolutions of stride 1 and 2 as kiln::ConvNHWC on the direct path, 1x1 ones as MatMuls on
    NHWC rows): the same bf16 operands summed in float32, so it matches the NCHW compile up to
    the order of the sums."""
    from kiln.lower.kir import DirectOperand, GemmSpec

    model, x = residual_chain(np.random.default_rng(13))
    monkeypatch.setenv("KILN_BF16_PATH", path)
    options = CompileOptions(precision="bf16", plan_cache=False)
    last = kiln.compile(model, options=options)
    planes = kiln.compile(model, options=CompileOptions(precision="bf16", plan_cache=False, disabled=frozenset({"assign_layouts"})))  # fmt: skip
    kernels = [k for s in last.plans[-1].steps for k in getattr(s, "kernels", [])]
    calls = [st for k in kernels for st in k.body if isinstance(st, GemmSpec)]
    assert [c.precision for c in calls] == ["bf16"] * 4
    assert [c.b.geometry[9:] for c in calls if isinstance(c.b, DirectOperand)] == [(1, 1, 1), (2, 2, 1)]
    got, want = last.run({"x": x})["y"], planes.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("path", PATHS)
def test_bf16_activations_pass_between_layers_as_bf16_bit_for_bit(path, monkeypatch):
    """In a bf16 compile a product whose output only bf16 products read stores it as bfloat16
    halves only (``Requantize.bf16``, ``only``) and its readers take them in place
    (``GemmSpec.given``): the 1x1's rows (K 48, padded: converted from the halves) and the
    stride-2 convolution's padded copy. The output the residual Add reads keeps its floats and
    no copy (dropped: it would only move the rounding). The readers' operands are the very
    halves they would have rounded, so the output is bit for bit the compile without it."""
    from kiln.lower.kir import GemmSpec

    model, x = residual_chain(np.random.default_rng(17))
    monkeypatch.setenv("KILN_BF16_PATH", path)
    options = CompileOptions(precision="bf16", plan_cache=False)
    chained = kiln.compile(model, options=options)
    apart = kiln.compile(model, options=CompileOptions(precision="bf16", plan_cache=False, disabled=frozenset({"requantize"})))  # fmt: skip
    calls = [st for s in chained.plans[-1].steps for k in getattr(s, "kernels", []) for st in k.body if isinstance(st, GemmSpec)]  # fmt: skip
    assert [c.precision for c in calls] == ["bf16"] * 4
    assert [c.requant is not None and c.requant.bf16 and c.requant.only for c in calls] == [True, True, False, False]
    assert [c.given is calls[i - 1].requant.dest if i in (1, 2) else c.given is None for i, c in enumerate(calls)] == [True] * 4  # fmt: skip
    np.testing.assert_array_equal(chained.run({"x": x})["y"], apart.run({"x": x})["y"])
