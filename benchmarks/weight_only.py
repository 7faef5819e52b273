"""One decode-step linear layer, y = x . W with x [rows, K] and W constant [K, N], in each of kiln's
weight precisions (fp32, int8-weights, int4-weights and its group/offset variants) and in ONNX
Runtime's MatMulNBits (its int4 product, the one ONNX Runtime GenAI's builder writes) on the same
4-bit codes and scales, in the same run. A decode step is one such product per weight matrix: at
rows 1 the weights' bytes decide its time, so each row reports the bytes read per call and the
bytes per second they imply, beside the machine's measured bandwidth (``kiln.bench.bandwidth.bandwidth_gb_s``).

    python benchmarks/weight_only.py [--k 4096] [--n 8192] [--rows 1,4,128] [--calls 200]
                                     [--threads 2] [--json]

Prints, per engine and rows: median and p90 microseconds per call, weight MB, GB/s, and the
relative L2 of the output against float64 products of the same quantized weights (of the fp32
weights for fp32). ORT rows: accuracy_level 0 (float products) and 4 (int8 activations, what
the builder asks on CPU). Not a test: no pass/fail (tests/codegen/test_int4_weights.py is).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _timed(call, calls: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    for _ in range(max(3, calls // 10)):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e6), float(np.percentile(times, 90) * 1e6)


def _linear(k: int, n: int, w: np.ndarray):  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _nbits(k: int, n: int, codes: np.ndarray, scales: np.ndarray, group: int, level: int):  # type: ignore[no-untyped-def]
    """ONNX Runtime's MatMulNBits over kiln's symmetric codes (weight = (code - 8) x scale, its
    default zero point 8): B [N, blocks, group / 2] bytes, low nibble first."""
    from onnx import TensorProto, helper, numpy_helper

    blocks = codes.shape[0] // group
    by_column = codes.T.reshape(n, blocks, group // 2, 2)
    packed = (by_column[..., 0] | (by_column[..., 1] << 4)).astype(np.uint8)
    node = helper.make_node(
        "MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=group,
        accuracy_level=level,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(np.ascontiguousarray(scales.T).ravel(), "s")],
    )  # fmt: skip
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def _weights(precision: str, w: np.ndarray) -> tuple[np.ndarray, float]:
    """The float weights ``precision`` multiplies by and the bytes it reads per call."""
    from kiln.lower.engine import WEIGHT_FORMATS, quantize_channels, quantize_groups

    if precision == "fp32":
        return w, w.nbytes
    bits, group, symmetric, _ = WEIGHT_FORMATS[precision]
    if bits == 8:
        q, s = quantize_channels(w.T)
        return (q.astype(np.float32) * s[:, None]).T, w.size + 4 * w.shape[1]
    codes, scales, offsets = quantize_groups(w, group, symmetric)
    dense = codes * np.repeat(scales, group, axis=0) + np.repeat(offsets, group, axis=0)
    return dense[: w.shape[0]], w.size / 2 + scales.nbytes * (1 if symmetric else 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--rows", default="1,4,128")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,int8-weights,int4-weights,int4-weights-asym,int4-weights-g128")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import kiln
    from kiln.bench.bandwidth import bandwidth_gb_s
    from kiln.lower.engine import quantize_groups

    rng = np.random.default_rng(0)
    w = rng.standard_normal((args.k, args.n)).astype(np.float32)
    rows_list = [int(r) for r in args.rows.split(",")]
    dims = {"rows": (1, max(rows_list))}
    results, engines = [], {}
    for precision in args.precisions.split(","):
        compiled = kiln.compile(_linear(args.k, args.n, w), precision=precision, dims=dims, threads=args.threads)
        engines[f"kiln {precision}"] = (compiled, *_weights(precision, w))
    try:
        import onnxruntime as ort

        codes, scales, _ = quantize_groups(w, 32, True)
        dense, nbytes = _weights("int4-weights", w)
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        for level in (0, 4):
            model = _nbits(args.k, args.n, codes, scales, 32, level).SerializeToString()
            session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            engines[f"onnxruntime MatMulNBits level {level}"] = (session, dense, nbytes)
    except ImportError:
        print("onnxruntime: not installed", file=sys.stderr)
    for name, (engine, dense, nbytes) in engines.items():
        for rows in rows_list:
            x = rng.standard_normal((rows, args.k)).astype(np.float32)
            if name.startswith("kiln"):
                call = lambda: engine.run({"x": x})  # noqa: E731
                y = call()["y"]
            else:
                call = lambda: engine.run(None, {"x": x})  # noqa: E731
                y = call()[0]
            want = x.astype(np.float64) @ dense.astype(np.float64)
            median, p90 = _timed(call, args.calls)
            results.append({"engine": name, "rows": rows, "median_us": median, "p90_us": p90, "weight_mb": nbytes / 1e6,
                            "gb_s": nbytes / median / 1e3, "rel_l2": float(np.linalg.norm(y - want) / np.linalg.norm(want))})  # fmt: skip
    bandwidth = bandwidth_gb_s(threads=args.threads)
    if args.json:
        print(json.dumps({"bandwidth_gb_s": bandwidth, "k": args.k, "n": args.n, "results": results}, indent=1))
        return 0
    print(f"x [rows, {args.k}] . W [{args.k}, {args.n}], {args.threads} threads; bandwidth {bandwidth:.1f} GB/s")
    for r in results:
        print(f"{r['engine']:38s} rows {r['rows']:4d}  {r['median_us']:9.1f} us (p90 {r['p90_us']:9.1f})  "
              f"{r['weight_mb']:7.1f} MB  {r['gb_s']:6.1f} GB/s  rel L2 {r['rel_l2']:.1e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
