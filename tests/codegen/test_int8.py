"""int8 on the cpu target: the integer products on every path this machine has (AMX-INT8,
AVX512-VNNI, AVX-VNNI, AVX2's VPMADDUBSW on the cpu:avx2 target, portable C; a path the machine
lacks is skipped with the reason) against an exact NumPy integer reference, the calibration
methods, the accuracy report and the accuracy budget (mixed precision), and the calibration data
formats."""

from dataclasses import replace

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.backends import parse
from kiln.backends.cpu import features, host
from kiln.cli_support import calibration_data
from kiln.driver.options import CompileOptions, Quantization
from kiln.driver.quantize import AccuracyReport, clip_range, samples_from, split
from kiln.errors import KilnError
from kiln.frontend import to_graph
from kiln.lower import narrow_store
from kiln.lower.engine import activation_quantization, quantize_channels
from kiln.lower.kir import DirectOperand, GemmSpec, kernel_precision
from tests.helpers import FLOAT, make_model, residual_chain

RNG = np.random.default_rng(5)


def _path_reason(name, isa="avx512"):
    try:
        features.int8_path(isa, isa == "avx512", {"KILN_INT8_PATH": name})
    except KilnError as err:
        return str(err)
    if isa == "avx512" and host().isa != "avx512":
        return "the native target is not avx512 here"
    return ""


# (path, target): AVX2 runs 7-bit activations, so it is tested on the cpu:avx2 target, whose plans
# use them; the other paths on the native target (8-bit activations where the CPU has VNNI)
PATHS = [
    pytest.param(
        name,
        "cpu:avx2" if name == "avx2" else "cpu",
        marks=pytest.mark.skipif(
            bool(_path_reason(name, "avx2" if name == "avx2" else "avx512")),
            reason=_path_reason(name, "avx2" if name == "avx2" else "avx512") or "-",
        ),
    )
    for name in features.INT8_PATHS
]


def quantized_activations(x, lo, hi, qmax):
    scale, zero = activation_quantization(lo, hi, qmax)
    inv = np.float32(1.0 / scale)
    q = np.clip(np.rint(x.astype(np.float32) * inv) + zero, 0, qmax).astype(np.int64)
    return q, scale, zero


def compile_int8(model, ranges, target):
    options = CompileOptions(precision="int8", quantization=Quantization(ranges=tuple(ranges)), plan_cache=False)
    return kiln.compile(model, target=target, options=options)


def qmax_of(target):
    return parse(target).int8_max


MATMULS = {
    "one row": (1, 5, 3),
    "edges everywhere": (37, 100, 70),
    "one block": (32, 64, 32),
    "16 rows": (16, 128, 96),
    "deep": (50, 700, 40),
}


@pytest.mark.parametrize("path,target", PATHS)
@pytest.mark.parametrize("case", MATMULS)
def test_int8_matmul_is_the_exact_integer_product(case, path, target, monkeypatch):
    m, k, n = MATMULS[case]
    x = RNG.standard_normal((m, k)).astype(np.float32) * 3
    w = RNG.standard_normal((k, n)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", FLOAT, [m, k])], [("y", FLOAT, None)], {"w": w})  # fmt: skip
    lo, hi = float(x.min()) * 0.8, float(x.max()) * 0.8  # some values clip
    monkeypatch.setenv("KILN_INT8_PATH", path)
    compiled = compile_int8(model, [("x", lo, hi)], target)
    kernels = [k for s in compiled.plans[-1].steps for k in getattr(s, "kernels", [])]
    assert [kernel_precision(k) for k in kernels] == ["int8"]
    got = compiled.run({"x": x})["y"]
    qmax = qmax_of(target)
    qx, scale, zero = quantized_activations(x, lo, hi, qmax)
    qw_t, channel = quantize_channels(w.T)  # per output column
    sums = (qx - zero) @ qw_t.T.astype(np.int64)  # exact
    want = sums.astype(np.int32).astype(np.float32) * (channel.astype(np.float64) * scale).astype(np.float32)
    np.testing.assert_array_equal(got, want)


CONVS = {
    "3x3 pad 1 bias relu": ((1, 8, 9, 11), (24, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    "1x1 two images": ((2, 40, 5, 7), (33, 40, 1, 1), {}),
    "5x5 stride 2": ((1, 3, 17, 17), (16, 3, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),
    # the direct convolution (stride 1, 32+ channels): no im2col, a channels-last copy of the input
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


def uses_direct(compiled):
    from kiln.lower.kir import DirectOperand, GemmSpec

    kernels = [k for s in compiled.plans[-1].steps for k in getattr(s, "kernels", [])]
    return any(isinstance(st, GemmSpec) and isinstance(st.b, DirectOperand) for k in kernels for st in k.body)


def im2col(q, w_shape, attrs, pad_value):
    n, c, h, wd = q.shape
    kh, kw = w_shape[2:]
    pads = attrs.get("pads", [0, 0, 0, 0])
    sh, sw = attrs.get("strides", [1, 1])  # (pads: top, left, bottom, right)
    padded = np.full((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), pad_value, np.int64)
    padded[:, :, pads[0] : pads[0] + h, pads[1] : pads[1] + wd] = q
    oh = (padded.shape[2] - kh) // sh + 1
    ow = (padded.shape[3] - kw) // sw + 1
    cols = np.empty((n, c, kh, kw, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = padded[:, :, i : i + sh * oh : sh, j : j + sw * ow : sw]
    return cols.reshape(n, c * kh * kw, oh * ow), (oh, ow)


@pytest.mark.parametrize("path,target", PATHS)
@pytest.mark.parametrize("case", CONVS)
def test_int8_convolution_is_the_exact_integer_product_then_its_epilogue(case, path, target, monkeypatch):
    x_shape, w_shape, attrs = CONVS[case]
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    bias = RNG.standard_normal(w_shape[0]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", FLOAT, list(x_shape))], [("y", FLOAT, None)], {"w": w, "b": bias})
    lo, hi = float(x.min()), float(x.max())
    monkeypatch.setenv("KILN_INT8_PATH", path)
    compiled = compile_int8(model, [("x", lo, hi)], target)
    got = compiled.run({"x": x})["y"]
    assert uses_direct(compiled) == case.startswith("direct")
    qx, scale, zero = quantized_activations(x, lo, hi, qmax_of(target))
    cols, (oh, ow) = im2col(qx, w_shape, attrs, zero)  # padding is x = 0, quantized: the zero point
    qw, channel = quantize_channels(w.reshape(w_shape[0], -1))
    sums = np.einsum("mk,nkp->nmp", qw.astype(np.int64), cols - zero)
    product = (
        sums.astype(np.int32).astype(np.float32) * (channel.astype(np.float64) * scale).astype(np.float32)[:, None]
    )
    want = np.maximum(product + bias[:, None], 0).reshape(x_shape[0], w_shape[0], oh, ow)
    np.testing.assert_array_equal(got, want)


def test_paths_follow_the_machine_and_the_target():
    mode, name = features.int8_path("avx2", native=False, env={})
    assert name in ("avx2", "portable") and mode == features.INT8_PATHS[name]  # cpu:avx2 stands for AVX2-only
    assert features.int8_path("avx512", env={"KILN_INT8_PATH": "portable"}) == (0, "portable")
    with pytest.raises(KilnError, match="the paths are"):
        features.int8_path("avx512", env={"KILN_INT8_PATH": "tpu"})
    assert parse("cpu:avx2").int8_max == 127  # may run on VPMADDUBSW: 7-bit activations


def test_int8_needs_an_x86_target_and_says_so():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, None)])
    with pytest.raises(KilnError, match="has no int8 path"):
        kiln.compile(model, target="cpu:generic", precision="int8")


def test_calibration_methods_clip_outliers_differently():
    values = np.concatenate([RNG.standard_normal(100_000), [40.0]])  # one far outlier
    histogram = np.histogram(values, 2048, (values.min(), values.max()))[0]
    extent = (float(values.min()), float(values.max()))

    class Target:
        int8_max = 255

    lo, hi = clip_range("percentile", extent, histogram, Target)
    assert hi < 10 and lo > extent[0] - 1e-6  # the outlier is outside the 99.99th percentile
    assert clip_range("entropy", extent, histogram, Target)[1] < 40.0  # KL clips the sparse tail
    positive = np.abs(values)
    histogram = np.histogram(positive, 2048, (0.0, positive.max()))[0]
    lo, hi = clip_range("entropy", (0.0, float(positive.max())), histogram, Target)
    assert lo == 0.0 and 2.0 < hi < 40.0


def small_cnn(features_only=False):
    w1 = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.3
    fc = RNG.standard_normal((16, 10)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    if features_only:  # the feature map: no class scores, so the budget is on the relative L2
        return make_model(nodes[:4], [("x", FLOAT, [1, 3, 16, 16])], [("r2", FLOAT, None)], {"w1": w1, "w2": w2})
    return make_model(nodes, [("x", FLOAT, [1, 3, 16, 16])], [("y", FLOAT, None)], {"w1": w1, "w2": w2, "fc": fc})


def test_int8_compile_calibrates_reports_accuracy_and_keeps_layers_within_a_budget():
    model = small_cnn()
    data = [{"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(10)]
    quantized = kiln.compile(model, precision="int8", calibration=data)
    report = quantized.accuracy
    assert isinstance(report, AccuracyReport) and report.samples == 2 and report.layers == 3
    assert not report.kept_fp32 and report.top1 is not None
    fp32 = kiln.compile(model)
    want = fp32.run(data[-1])["y"]
    error = np.linalg.norm(quantized.run(data[-1])["y"] - want) / np.linalg.norm(want)
    assert 1e-5 < error < 0.2  # quantized (not fp32), and close
    assert report.rel_l2 == pytest.approx(max(report.rel_l2, error), rel=1e-6)  # it measured this sample
    kinds = [k for s in quantized.plans[-1].steps for k in getattr(s, "kernels", [])]
    assert sum(kernel_precision(k) == "int8" for k in kinds) == 3
    # a budget it cannot meet with every layer in int8: layers go back to fp32 until it fits
    features_model = small_cnn(features_only=True)
    loose = kiln.compile(features_model, precision="int8", calibration=data).accuracy
    assert loose.top1 is None and loose.drop() == loose.rel_l2 > 1e-4 and not loose.kept_fp32
    budget = loose.rel_l2 / 3
    mixed = kiln.compile(features_model, precision="int8", calibration=data, max_accuracy_drop=budget)
    strict = mixed.accuracy
    assert strict.kept_fp32 and strict.rel_l2 <= budget and "kept in fp32" in strict.line()
    kernels = [k for s in mixed.plans[-1].steps for k in getattr(s, "kernels", [])]
    int8 = sum(kernel_precision(k) == "int8" for k in kernels)
    assert int8 == strict.layers - len(strict.kept_fp32)  # the kept layers really run in fp32


def test_calibration_data_formats(tmp_path):
    model = small_cnn()
    graph = to_graph(model)
    stacked = RNG.standard_normal((5, 1, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=stacked)
    samples = samples_from(tmp_path / "data.npz", graph)
    assert len(samples) == 5 and samples[2]["x"].shape == (1, 3, 16, 16)
    np.testing.assert_array_equal(samples[2]["x"], stacked[2])
    assert len(samples_from(None, graph)) == 8  # random when none given
    calibrating, evaluating = split(samples)
    assert len(calibrating) == 4 and len(evaluating) == 1
    from PIL import Image

    for i in range(3):
        pixels = RNG.integers(0, 255, (20, 24, 3), dtype=np.uint8)
        (tmp_path / "images" / "cat").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(tmp_path / "images" / "cat" / f"{i}.png")
    images = calibration_data(str(tmp_path / "images"), graph)  # the CLI's --calibrate DIR
    assert len(images) == 3 and images[0]["x"].shape == (1, 3, 16, 16) and images[0]["x"].dtype == np.float32
    np.savez(tmp_path / "wrong.npz", y=stacked)
    with pytest.raises(KilnError, match="no array for input"):
        samples_from(tmp_path / "wrong.npz", graph)
    with pytest.raises(KilnError, match="an .npz file"):
        samples_from(tmp_path / "missing.txt", graph)
    with pytest.raises(KilnError, match="read its images into input dicts"):  # the driver reads no folders
        samples_from(tmp_path / "images", graph)


def test_a_qdq_model_from_onnxruntimes_quantizer_runs_on_the_int8_kernels(tmp_path):
    """onnxruntime's quantize_static writes QDQ models (QuantizeLinear/DequantizeLinear around
    every product): kiln runs their products on its int8 path with the model's own scales and
    zero points, and agrees with kiln's reference running the same quantized model (QuantizeLinear
    and DequantizeLinear exactly as ONNX defines them) within what the path's arithmetic allows."""
    pytest.importorskip("onnxruntime", reason="onnxruntime (the 'peers' extra) writes the QDQ model")
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model = small_cnn()
    data = [{"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(data)

        def get_next(self):
            return next(self.items, None)

    import onnx

    onnx.save(model, tmp_path / "fp32.onnx")
    quantize_static(
        str(tmp_path / "fp32.onnx"), str(tmp_path / "qdq.onnx"), Reader(), quant_format=QuantFormat.QDQ,
        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    compiled = kiln.compile(str(tmp_path / "qdq.onnx"))  # no precision asked: the model says int8
    feeds = {"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    got = compiled.run(feeds)["y"]
    kernels = [k for s in compiled.plans[-1].steps for k in getattr(s, "kernels", [])]
    assert sum(kernel_precision(k) == "int8" for k in kernels) == 3  # both convolutions and the classifier
    want = kiln.compile(str(tmp_path / "qdq.onnx"), target="reference").run(feeds)["y"]
    fp32 = kiln.compile(model).run(feeds)["y"]
    # the same quantized computation: on an 8-bit path (VNNI, AMX: 255 activation levels, the
    # model's own) only rounding at the requantizations differs; a 7-bit path (AVX2's VPMADDUBSW
    # must keep pairs of products within 16 bits) halves the activation levels, doubling the step
    # of every activation's quantization and so the error it contributes
    levels = compiled.compiled_for.int8_max
    gap = np.linalg.norm(got - want) / np.linalg.norm(want)
    quantization = np.linalg.norm(fp32 - want) / np.linalg.norm(want)  # what 8-bit quantization itself costs
    assert gap < 0.02 * 255 / levels, (gap, levels)
    assert gap < 0.5 * quantization * 255 / levels, (gap, quantization, levels)


def test_qlinear_ops_run_natively_and_kiln_annotations_cannot_come_from_a_model():
    from kiln.errors import UnsupportedModelError

    rng = np.random.default_rng(8)
    x = rng.integers(0, 255, (2, 6), dtype=np.uint8)
    w = rng.integers(-100, 100, (6, 5), dtype=np.int8)
    inits = {
        "xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8), "w": w,
        "ws": np.array(0.02, np.float32), "wz": np.array(0, np.int8),
        "ys": np.array(0.1, np.float32), "yz": np.array(10, np.uint8),
    }  # fmt: skip
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    model = make_model([node], [("x", onnx_uint8(), [2, 6])], [("y", onnx_uint8(), None)], inits)
    compiled = kiln.compile(model)
    got = compiled.run({"x": x})["y"]
    assert compiled.is_native  # decomposed into QDQ form, lowered natively (the product on the int8 path)
    exact = (x.astype(np.int64) - 128) @ w.astype(np.int64)
    want = np.clip(np.rint(exact * (0.05 * 0.02 / 0.1)) + 10, 0, 255)
    assert np.abs(got.astype(np.int64) - want).max() <= 1  # (a tie may round either way in float32)
    kernels = [k for s in compiled.plans[-1].steps for k in getattr(s, "kernels", [])]
    assert "int8" in [kernel_precision(k) for k in kernels]
    forged = make_model(
        [helper.make_node("Relu", ["a"], ["b"], kiln_qdq=[1.0, 0, 0])], [("a", FLOAT, [2])], [("b", FLOAT, None)]
    )
    with pytest.raises(UnsupportedModelError, match="kiln's own"):
        kiln.compile(forged)


def onnx_uint8():
    from onnx import TensorProto

    return TensorProto.UINT8


@pytest.mark.parametrize("scale", [1.0, 1e-3, 50.0])
def test_dynamic_quantize_linear_runs_natively_and_matches_the_reference_exactly(scale):
    from onnx import TensorProto

    x = (RNG.standard_normal((3, 50)) * scale).astype(np.float32)
    x[0, :5] = [0.0, -0.0, scale * 0.5, np.float32(2.5) * scale, -scale]
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    outputs = [("y", TensorProto.UINT8, None), ("s", FLOAT, None), ("z", TensorProto.UINT8, None)]
    model = make_model([node], [("x", FLOAT, [3, 50])], outputs, opset=20)
    compiled = kiln.compile(model)
    got = compiled.run({"x": x})
    assert compiled.is_native
    want = kiln.compile(model, target="reference").run({"x": x})
    for name in ("y", "s", "z"):
        np.testing.assert_array_equal(got[name], want[name])


def _engine_calls(compiled):
    kernels = [k for s in compiled.plans[-1].steps for k in getattr(s, "kernels", [])]
    return [st for k in kernels for st in k.body if isinstance(st, GemmSpec)]


@pytest.mark.parametrize("path,target", PATHS)
def test_int8_activations_leave_their_producer_quantized_for_the_next_int8_product(path, target, monkeypatch):
    """A chain of int8 products: each one read by an int8 product stores its finished output
    (after bias, Relu, a residual Add) quantized with its reader's parameters, and the reader
    takes those bytes instead of quantizing the floats again: on the direct convolution's
    channels-last copy, a pointwise convolution's B, a strided convolution's im2col and a
    MatMul's A rows. The bytes are the ones the reader would have made, so the outputs are
    bit for bit those of the compile that quantizes in each reader (--disable requantize)."""
    rng = np.random.default_rng(11)
    weights = {
        "w1": rng.standard_normal((48, 40, 3, 3)).astype(np.float32) * 0.1,  # direct (stride 1, 40 channels)
        "b1": rng.standard_normal(48).astype(np.float32),
        "w2": rng.standard_normal((48, 48, 1, 1)).astype(np.float32) * 0.2,  # pointwise
        "w3": rng.standard_normal((32, 48, 3, 3)).astype(np.float32) * 0.1,  # dilated: im2col
        "w4": rng.standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.2,
        "shape": np.array([1, -1], np.int64),
        "w5": rng.standard_normal((960, 50)).astype(np.float32) * 0.05,
        "w6": rng.standard_normal((50, 10)).astype(np.float32) * 0.2,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["a"]),
        helper.make_node("Conv", ["a", "w2"], ["b"]),
        helper.make_node("Conv", ["b", "w3"], ["c3"], pads=[2, 2, 2, 2], strides=[2, 2], dilations=[2, 2]),
        helper.make_node("Relu", ["c3"], ["c"]),
        helper.make_node("Conv", ["c", "w4"], ["c4"]),
        helper.make_node("Add", ["c4", "c"], ["s"]),  # c read by a product and by its epilogue
        helper.make_node("Relu", ["s"], ["d"]),
        helper.make_node("Reshape", ["d", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w5"], ["m5"]),
        helper.make_node("Relu", ["m5"], ["e"]),
        helper.make_node("MatMul", ["e", "w6"], ["y"]),
    ]
    model = make_model(nodes, [("x", FLOAT, [1, 40, 9, 11])], [("y", FLOAT, None)], weights)
    x = rng.standard_normal((1, 40, 9, 11)).astype(np.float32)
    x[0, 3, 4, 5] = np.nan  # quantized to the zero point, in the producer as in a reader
    ranges = [("x", -2.5, 2.5), ("a", 0.0, 4.0), ("b", -3.0, 5.0), ("c", 0.0, 2.0), ("flat", 0.0, 3.0), ("e", 0, 6)]
    monkeypatch.setenv("KILN_INT8_PATH", path)
    options = CompileOptions(
        precision="int8",
        quantization=Quantization(ranges=tuple(ranges)),
        plan_cache=False,
        disabled=frozenset({"assign_layouts"}),  # NCHW throughout (the channels-last chain: its own test)
    )
    chained = kiln.compile(model, target=target, options=options)
    apart = kiln.compile(model, target=target, options=replace(options, disabled=options.disabled | {"requantize"}))
    calls = _engine_calls(chained)
    assert [c.precision for c in calls] == ["int8"] * 6
    # a, b, c and e are read by int8 products (d only through a Reshape: quantized by its reader)
    assert sum(c.requant is not None for c in calls) == 4
    readers = [c for c in calls if c.quant.given is not None]
    assert len(readers) == 4
    assert {type(c.b).__name__ for c in readers if c.quant.rows} == {"MatrixOperand", "Im2colOperand"}
    assert any(type(c.a).__name__ == "MatrixOperand" and not c.quant.rows for c in readers)  # the MatMul's rows
    assert not any(c.requant is not None or c.quant.given is not None for c in _engine_calls(apart))
    assert isinstance(calls[0].b, DirectOperand) and calls[0].requant is not None  # a producer on the direct path
    got, want = chained.run({"x": x})["y"], apart.run({"x": x})["y"]
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)
    _assert_the_bytes_are_read(model, x, target, options, apart, monkeypatch)


def _assert_the_bytes_are_read(model, x, target, options, apart, monkeypatch):
    """The readers really take the producers' bytes: producers made to store them with another
    scale (their readers still told the bytes are their own) change the result."""
    original = narrow_store.requantize

    def skewed(lw, out):
        stored = original(lw, out)
        return None if stored is None else replace(stored, inv=stored.inv * 0.5)

    monkeypatch.setattr(narrow_store, "requantize", skewed)
    broken = kiln.compile(model, target=target, options=options)
    assert not np.array_equal(broken.run({"x": x})["y"], apart.run({"x": x})["y"])


@pytest.mark.parametrize("path,target", PATHS)
def test_the_direct_convolution_reads_the_bytes_its_producer_stored(path, target, monkeypatch):
    """Two stride-1 3x3 convolutions of 40+ channels: the second (direct, channels-last copy made
    from its producer's NCHW bytes) matches the compile that quantizes its floats itself."""
    rng = np.random.default_rng(12)
    weights = {
        "w1": rng.standard_normal((40, 36, 3, 3)).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((24, 40, 3, 3)).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["a"]),
        helper.make_node("Conv", ["a", "w2"], ["y"], pads=[0, 1, 2, 1]),
    ]
    model = make_model(nodes, [("x", FLOAT, [2, 36, 19, 21])], [("y", FLOAT, None)], weights)
    x = rng.standard_normal((2, 36, 19, 21)).astype(np.float32)
    monkeypatch.setenv("KILN_INT8_PATH", path)
    options = CompileOptions(
        precision="int8", quantization=Quantization(ranges=(("x", -3.0, 3.0), ("a", 0.0, 3.0))), plan_cache=False
    )
    chained = kiln.compile(model, target=target, options=options)
    apart = kiln.compile(model, target=target, options=replace(options, disabled=frozenset({"requantize"})))
    calls = _engine_calls(chained)
    assert isinstance(calls[1].b, DirectOperand) and calls[1].quant.given is calls[0].requant.dest
    np.testing.assert_array_equal(chained.run({"x": x})["y"], apart.run({"x": x})["y"])

    _assert_the_bytes_are_read(model, x, target, options, apart, monkeypatch)


@pytest.mark.parametrize("path,target", PATHS)
def test_a_channels_last_int8_region_computes_what_the_nchw_graph_does(path, target, monkeypatch):
    """In an int8 compile the layout pass runs a ResNet-like chain channels last: 3x3
    convolutions (stride 1 and 2) as kiln::ConvNHWC on the direct path reading NHWC bytes and
    writing NHWC rows, 1x1 ones as MatMuls on those rows, the residual Add on NHWC data, each
    product reading what its producer stored quantized. The calibrated ranges are the NCHW
    graph's (by the name of each convolution's input before the rewrite), the integer sums are
    exact, so the output is bit for bit the NCHW compile's."""
    model, x = residual_chain(np.random.default_rng(13))
    ranges = (("x", -2.5, 2.5), ("a", 0.0, 4.0), ("b", -3.0, 5.0), ("c", 0.0, 2.0))
    monkeypatch.setenv("KILN_INT8_PATH", path)
    options = CompileOptions(precision="int8", quantization=Quantization(ranges=ranges), plan_cache=False)
    last = kiln.compile(model, target=target, options=options)
    planes = kiln.compile(model, target=target, options=replace(options, disabled=frozenset({"assign_layouts"})))
    calls = _engine_calls(last)
    assert [c.precision for c in calls] == ["int8"] * 4
    direct = [c for c in calls if isinstance(c.b, DirectOperand)]
    assert [c.b.geometry[9:] for c in direct] == [(1, 1, 1), (2, 2, 1)]  # strides, channels last
    assert sum(c.quant.given is not None for c in calls) == 3  # a, b and c: their producers' bytes
    # a and b are read by nothing else: their producers store only the bytes (c: the residual's floats too)
    assert [c.requant.only for c in calls if c.requant is not None] == [True, True, False]
    assert not any(isinstance(c.b, DirectOperand) and c.b.geometry[11] for c in _engine_calls(planes))
    np.testing.assert_array_equal(last.run({"x": x})["y"], planes.run({"x": x})["y"])
