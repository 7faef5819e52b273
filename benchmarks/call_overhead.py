"""Per-call cost of kiln's run() against onnxruntime's, and how it grows with the kernel count.

    python benchmarks/call_overhead.py [--calls N] [--rounds R] [--json]

Three models, each built here with fixed random weights:
- ``one-conv``: a 3x3 convolution (4 -> 8 channels on 8x8) then one linear layer: the issue's
  "one conv, one linear" model, where a call's cost is almost all overhead;
- ``chain-5`` and ``chain-500``: 5 and 500 small matrix products in a chain (8x8 each: their own
  time is a few hundred nanoseconds), so the difference per kernel is what each kernel costs a
  call beyond its own work.

One thread (``threads=1`` for kiln, ``intra_op_num_threads=1`` for onnxruntime), rounds alternating
between the engines in one process, medians of the rounds' means. kiln's native time is its
library's entry called alone (``Executable.native_seconds``, the best round); a call's cost beyond
it is what the Python side adds. Prints the CPU and its ISA."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kiln


def one_conv() -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    fc = numpy_helper.from_array(rng.standard_normal((8 * 8 * 8, 10)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "one_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, b, fc],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model, {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)}


def chain(length: int) -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(length)
    weights, nodes = [], []
    previous = "x"
    for i in range(length):
        weights.append(numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [f"h{i}"]))
        previous = f"h{i}"
    graph = helper.make_graph(
        nodes,
        f"chain_{length}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model, {"x": rng.standard_normal((8, 8)).astype(np.float32)}


def mean_us(run: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls * 1e6


def engines(model: Any, feeds: dict[str, np.ndarray], target: str) -> dict[str, Callable[[], Any]]:
    compiled = kiln.compile(model, target=target, threads=1)
    found: dict[str, Callable[[], Any]] = {f"kiln {target}": lambda: compiled.run(feeds)}
    try:
        import onnxruntime
    except ImportError:
        return found
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    found["onnxruntime"] = lambda: session.run(None, feeds)
    reference = session.run(None, feeds)[0]
    got = compiled.run(feeds)
    np.testing.assert_allclose(next(iter(got.values())), reference, rtol=1e-3, atol=1e-3)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per engine, alternating")
    parser.add_argument("--target", default="cpu", help="kiln target (default: cpu)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    from kiln.backends.cpu import host

    machine = {"cpu": platform.processor() or platform.machine(), "isa": host().isa, "features": list(host().features)}
    try:
        with open("/proc/cpuinfo") as info:
            machine["cpu"] = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import onnxruntime

        machine["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        machine["onnxruntime"] = "not installed"
    results: dict[str, dict[str, float]] = {}
    for name, (model, feeds) in {"one-conv": one_conv(), "chain-5": chain(5), "chain-500": chain(500)}.items():
        runs = engines(model, feeds, args.target)
        rounds: dict[str, list[float]] = {engine: [] for engine in runs}
        for run in runs.values():  # warm up
            mean_us(run, 200)
        for _ in range(args.rounds):
            for engine, run in runs.items():
                rounds[engine].append(mean_us(run, args.calls if name != "chain-500" else max(1, args.calls // 10)))
        results[name] = {engine: statistics.median(values) for engine, values in rounds.items()}
    kiln_name = f"kiln {args.target}"
    own_us = {}
    for name, (model, feeds) in {"one-conv": one_conv(), "chain-5": chain(5), "chain-500": chain(500)}.items():
        compiled = kiln.compile(model, target=args.target, threads=1)
        compiled.run(feeds)
        (executable,) = compiled.executables()
        calls = args.calls if name != "chain-500" else max(1, args.calls // 10)
        executable.native_seconds(list(feeds.values()), 200)
        own_us[name] = min(executable.native_seconds(list(feeds.values()), calls) for _ in range(args.rounds)) * 1e6
    beyond = {name: results[name][kiln_name] - own_us[name] for name in results}
    per_kernel = {
        engine: (results["chain-500"][engine] - results["chain-5"][engine]) / 495 for engine in results["chain-5"]
    }
    if args.json:
        print(
            json.dumps(
                {
                    "machine": machine,
                    "us_per_call": results,
                    "us_per_extra_kernel": per_kernel,
                    "kiln_kernels_us": own_us,
                    "kiln_beyond_kernels_us": beyond,
                },
                indent=2,
            )
        )
        return
    print(f"{machine['cpu']} (isa {machine['isa']}), onnxruntime {machine['onnxruntime']}; one thread, us per call")
    engines_seen = list(results["one-conv"])
    print(
        f"{'model':12}" + "".join(f"{e:>16}" for e in engines_seen) + ("   kiln/ort" if len(engines_seen) > 1 else "")
    )
    for name, row in results.items():
        ratio = f"{row[kiln_name] / row['onnxruntime']:11.2f}" if "onnxruntime" in row else ""
        print(f"{name:12}" + "".join(f"{row[e]:16.1f}" for e in engines_seen) + ratio)
    print(f"{'per kernel':12}" + "".join(f"{per_kernel[e]:16.2f}" for e in engines_seen))
    print("kiln's native entry alone, and a call's cost beyond it, us:")
    for name in results:
        print(f"{name:12}{own_us[name]:16.1f}{beyond[name]:16.1f}")


if __name__ == "__main__":
    main()
