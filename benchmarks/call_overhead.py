"""Python overhead of one run() call on a trivial model: kiln's targets vs onnxruntime.

python benchmarks/call_overhead.py
"""

from __future__ import annotations

import time

import numpy as np
from onnx import TensorProto, helper

import kiln


def per_call_us(run, feeds, calls: int = 5000) -> float:  # type: ignore[no-untyped-def]
    for _ in range(200):
        run(feeds)
    start = time.perf_counter()
    for _ in range(calls):
        run(feeds)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    feeds = {"x": np.ones((1, 8), np.float32)}
    for target in kiln.TARGETS:
        print(f"kiln {target:10} {per_call_us(kiln.compile(model, target=target).run, feeds):7.1f} us per call")
    try:
        import onnxruntime
    except ImportError:
        print("onnxruntime: not installed")
        return
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    print(f"onnxruntime     {per_call_us(lambda f: session.run(None, f), feeds):7.1f} us per call")


if __name__ == "__main__":
    main()
