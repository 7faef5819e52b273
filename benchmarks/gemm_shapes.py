"""Single matrix products of the seed models' shapes: kiln's engine vs onnxruntime (MLAS), in one
run, medians, GFLOP/s and ratios (kiln/ORT time; below 1: kiln is faster). Isolates the engine
from everything else a model does.

python benchmarks/gemm_shapes.py [--runs 40] [--threads 2] [--precision fp32]
"""

from __future__ import annotations

import argparse

import numpy as np
from onnx import TensorProto, helper, numpy_helper

# (M, K, N, what): bert/gpt2 at sequence 128 (QKV, projections, MLP), resnet50's 1x1 convs as GEMMs
SHAPES = [
    (128, 768, 768, "bert attn proj"),
    (128, 768, 2304, "gpt2 qkv"),
    (128, 768, 3072, "mlp up"),
    (128, 3072, 768, "mlp down"),
    (128, 512, 512, "llama-512 attn proj"),
    (128, 512, 1376, "llama-512 mlp up"),
    (128, 1376, 512, "llama-512 mlp down"),
    (3136, 64, 256, "r50 1x1 56x56 64->256"),
    (784, 512, 128, "r50 1x1 28x28 512->128"),
    (196, 1024, 256, "r50 1x1 14x14 1024->256"),
    (49, 2048, 512, "r50 1x1 7x7 2048->512"),
    (512, 2048, 2048, "llama-1b prompt attn proj"),
    (512, 2048, 8192, "llama-1b prompt mlp up"),
    (512, 8192, 2048, "llama-1b prompt mlp down"),
]


def model(m: int, k: int, n: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, b],
    )
    feeds = {"x": rng.standard_normal((m, k)).astype(np.float32)}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="fp32", help="kiln's (fp32, bf16, int8-weights-bf16, ...)")
    args = parser.parse_args()
    import kiln
    from kiln.bench.scenarios import median_latency_ms

    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
        print("onnxruntime: not installed (kiln only)")
    print(f"{'shape':>28} {'kiln GF/s':>10} {'ORT GF/s':>10} {'kiln/ORT':>9}")
    for m, k, n, what in SHAPES:
        proto, feeds = model(m, k, n)
        flops = 2 * m * k * n
        kiln_s = (
            median_latency_ms(kiln.compile(proto, threads=args.threads, precision=args.precision).run, feeds, args.runs)
            / 1e3
        )
        line = f"{what:>28} {flops / kiln_s / 1e9:10.1f}"
        if ort is not None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
            ort_s = median_latency_ms(lambda f: session.run(None, f), feeds, args.runs) / 1e3
            line += f" {flops / ort_s / 1e9:10.1f} {kiln_s / ort_s:9.2f}"
            del session  # its spinning worker threads would take cores from the next shape's kiln run
        print(line)


if __name__ == "__main__":
    main()
