"""Depthwise convolutions (MobileNet/EfficientNet layers): kiln's direct per-channel kernel vs
onnxruntime, in one run, medians, ratios (kiln/ORT; below 1 means kiln is faster).

python benchmarks/depthwise.py [--runs 50]
"""

from __future__ import annotations

import argparse

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.bench.scenarios import median_latency_ms

# (channels, size, stride) of MobileNetV2's 3x3 depthwise layers at 224x224, each with its Relu
LAYERS = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (384, 14, 1), (576, 14, 2), (960, 7, 1)]


def layer(channels: int, size: int, stride: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((channels, 1, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], group=channels, pads=[1, 1, 1, 1], strides=[stride, stride]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model, {"x": rng.standard_normal((1, channels, size, size)).astype(np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
        print("onnxruntime: not installed (kiln times only)")
    print(f"{'layer':>18} {'kiln ms':>9} {'ORT ms':>9} {'kiln/ORT':>9} {'max |diff|':>11}")
    for channels, size, stride in LAYERS:
        model, feeds = layer(channels, size, stride)
        compiled = kiln.compile(model)
        kiln_ms = median_latency_ms(compiled.run, feeds, args.runs)
        name = f"{channels}x{size}x{size}/s{stride}"
        if ort is None:
            print(f"{name:>18} {kiln_ms:9.3f}")
            continue
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        ort_ms = median_latency_ms(lambda f: session.run(None, f), feeds, args.runs)
        diff = float(np.abs(compiled.run(feeds)["y"] - session.run(None, feeds)[0]).max())
        print(f"{name:>18} {kiln_ms:9.3f} {ort_ms:9.3f} {kiln_ms / ort_ms:9.2f} {diff:11.2e}")


if __name__ == "__main__":
    main()
