"""Depthwise convolutions (MobileNet/EfficientNet layers): kiln's direct per-channel kernel vs
onnxruntime, in one run, medians and p90, ratios of the medians (kiln/ORT; below 1 means kiln is
faster), and kiln's compile time per layer (a cold library cache each: ``KILN_CACHE_DIR``).

python benchmarks/depthwise.py [--runs 50] [--layout nchw|nhwc]

``--layout nhwc``: each layer between two transposes, as the layout pass leaves ConvNeXt's 7x7
and MobileNet's 3x3 layers (kiln runs them as kiln::DepthwiseConv on channels-last data).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.bench.machine import fingerprint

# (channels, size, stride) of MobileNetV2's 3x3 depthwise layers at 224x224, each with its Relu
LAYERS = [
    (32, 112, 1, 3), (96, 112, 2, 3), (144, 56, 1, 3), (144, 56, 2, 3), (192, 28, 1, 3), (384, 14, 1, 3),
    (576, 14, 2, 3), (960, 7, 1, 3),
]  # fmt: skip
# (channels, size, stride, kernel) of ConvNeXt-T's 7x7 layers and some of MobileNetV2's, channels last
LAYERS_NHWC = [(96, 56, 1, 7), (192, 28, 1, 7), (384, 14, 1, 7), (768, 7, 1, 7), (32, 112, 1, 3), (144, 56, 2, 3)]


def layer(channels: int, size: int, stride: int, kernel: int = 3, channels_last: bool = False):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b")
    pad = kernel // 2
    conv = helper.make_node(
        "Conv", ["xc" if channels_last else "x", "w", "b"], ["c"], group=channels, pads=[pad] * 4,
        strides=[stride, stride], kernel_shape=[kernel, kernel],
    )  # fmt: skip
    nodes = [conv, helper.make_node("Relu", ["c"], ["a" if channels_last else "y"])]
    shape = [1, channels, size, size]
    if channels_last:
        nodes.insert(0, helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]))
        nodes.append(helper.make_node("Transpose", ["a"], ["y"], perm=[0, 2, 3, 1]))
        shape = [1, size, size, channels]
    graph = helper.make_graph(
        nodes,
        "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model, {"x": rng.standard_normal(shape).astype(np.float32)}


def _times_ms(run, feeds, runs: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(median, p90) of ``runs`` timed calls after five warm-up calls."""
    for _ in range(5):
        run(feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run(feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times)), float(np.percentile(times, 90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw")
    args = parser.parse_args()
    channels_last = args.layout == "nhwc"
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
        print("onnxruntime: not installed (kiln times only)")
    hardware = fingerprint()
    isa = " ".join(hardware["flags"]) or "no AVX2"
    print(f"# {hardware['cpu']} ({hardware['family_model']}; {isa}), layout {args.layout}, {args.runs} runs, 2 threads")
    print(
        f"{'layer':>20} {'compile s':>9} {'kiln ms':>8} {'p90':>7} {'ORT ms':>8} {'p90':>7} {'kiln/ORT':>8} {'max |diff|':>10}"
    )
    for channels, size, stride, kernel in LAYERS_NHWC if channels_last else LAYERS:
        model, feeds = layer(channels, size, stride, kernel, channels_last)
        with tempfile.TemporaryDirectory() as cold:
            os.environ["KILN_CACHE_DIR"] = cold
            started = time.perf_counter()
            compiled = kiln.compile(model, threads=2)
            compiled.run(feeds)
            compile_s = time.perf_counter() - started
            kiln_ms, kiln_p90 = _times_ms(compiled.run, feeds, args.runs)
        name = f"{channels}x{size}x{size} k{kernel}/s{stride}"
        row = f"{name:>20} {compile_s:9.2f} {kiln_ms:8.3f} {kiln_p90:7.3f}"
        if ort is None:
            print(row)
            continue
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        ort_ms, ort_p90 = _times_ms(lambda f: session.run(None, f), feeds, args.runs)
        diff = float(np.abs(compiled.run(feeds)["y"] - session.run(None, feeds)[0]).max())
        print(f"{row} {ort_ms:8.3f} {ort_p90:7.3f} {kiln_ms / ort_ms:8.2f} {diff:10.2e}")


if __name__ == "__main__":
    main()
