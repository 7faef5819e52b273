"""Depthwise convolutions in both layouts: kiln's NCHW kernels (the graph as exported) against its
channels-last kernel (kiln::DepthwiseConv, what kiln.passes.layout puts in a channels-last region),
each layer with its Relu, in one process, rounds alternating, best of the rounds (ms).

    python benchmarks/layouts.py [--threads 1] [--rounds 300]
    python benchmarks/layouts.py --models mobilenet_v2,resnet50 --threads 2   # whole models

Layers alone miss what a layout does to the kernels around them, so ``--models`` times whole zoo
models (batch 1) three ways, each in its own process with no plan cache: the layout pass's choice,
NCHW forced (the pass disabled) and channels last forced (its price overridden); medians and p90 of
``--rounds`` runs after a warm-up. The layout pass prices each depthwise convolution as saving the
conversion of its input and output; this is the measurement that says whether it does."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# (channels, size, stride, kernel): MobileNetV2's 3x3 layers at 224x224, EfficientNet's 5x5, ConvNeXt's 7x7
LAYERS = [
    (32, 112, 1, 3), (96, 112, 2, 3), (144, 56, 1, 3), (144, 56, 2, 3), (192, 28, 1, 3), (384, 14, 1, 3),
    (576, 14, 2, 3), (960, 7, 1, 3), (240, 28, 1, 5), (672, 14, 1, 5), (96, 56, 1, 7), (768, 7, 1, 7),
]  # fmt: skip


def layer(channels: int, size: int, stride: int, kernel: int, channels_last: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b"),
    ]
    pad = kernel // 2
    conv = helper.make_node(
        "Conv", ["xc", "w", "b"], ["c"], group=channels, pads=[pad] * 4, strides=[stride] * 2, kernel_shape=[kernel] * 2
    )
    if channels_last:  # the input and output are channels last: the pass leaves no conversion
        first = helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2])
        last = helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1])
        shape = [1, size, size, channels]
    else:
        first, last = helper.make_node("Identity", ["x"], ["xc"]), helper.make_node("Identity", ["r"], ["y"])
        shape = [1, channels, size, size]
    graph = helper.make_graph(
        [first, conv, helper.make_node("Relu", ["c"], ["r"]), last], "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


MODEL_JOB = r"""
import json, os, statistics, sys, time
import numpy as np
import kiln
import kiln.passes.layout as layout
from kiln import zoo
model, mode, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "nhwc":
    layout.pays = lambda before, after, saved: True
feeds = {k: np.asarray(v) for k, v in zoo.example_inputs(model, batch=1).items()}
compiled = kiln.compile(zoo.onnx_path(model), dims={"batch": 1}, threads=threads)
for _ in range(10):
    compiled.run(feeds)
times = []
for _ in range(rounds):
    start = time.perf_counter()
    compiled.run(feeds)
    times.append((time.perf_counter() - start) * 1e3)
times.sort()
print(json.dumps({"p50": statistics.median(times), "p90": times[int(0.9 * (len(times) - 1))]}))
"""


def whole_models(models: list[str], threads: int, rounds: int) -> None:
    """Each model under the pass's choice, NCHW forced and channels last forced, fresh processes."""
    for model in models:
        row: dict = {"model": model}
        for mode in ("auto", "nchw", "nhwc"):
            env = dict(os.environ, KILN_PLAN_CACHE="0")
            if mode == "nchw":
                env["KILN_DISABLE"] = ",".join(filter(None, [env.get("KILN_DISABLE", ""), "assign_layouts"]))
            done = subprocess.run(
                [sys.executable, "-c", MODEL_JOB, model, mode, str(threads), str(rounds)],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode:
                row[mode] = f"failed: {done.stderr.strip().splitlines()[-1:]}"
                continue
            times = json.loads(done.stdout.strip().splitlines()[-1])
            row[f"{mode}_p50_ms"], row[f"{mode}_p90_ms"] = round(times["p50"], 3), round(times["p90"], 3)
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--models", help="zoo models timed whole, in each layout (comma-separated)")
    args = parser.parse_args()

    import kiln
    from kiln.bench.machine import fingerprint

    machine = fingerprint()
    print(json.dumps({"cpu": machine.get("cpu"), "flags": machine.get("flags"), "threads": args.threads}))
    if args.models:
        whole_models(args.models.split(","), args.threads, args.rounds)
        return
    with tempfile.TemporaryDirectory() as folder:
        for channels, size, stride, kernel in LAYERS:
            models = []
            for channels_last in (False, True):
                path = Path(folder) / f"dw{int(channels_last)}.onnx"
                model = layer(channels, size, stride, kernel, channels_last)
                onnx.save(model, path)
                shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
                feed = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
                models.append((kiln.compile(str(path), threads=args.threads), feed))
            best = [float("inf"), float("inf")]
            for _ in range(args.rounds):
                for i, (compiled, feed) in enumerate(models):
                    start = time.perf_counter()
                    compiled.run(feed)
                    best[i] = min(best[i], time.perf_counter() - start)
            flops = 2 * channels * (-(-size // stride)) ** 2 * kernel * kernel
            print(json.dumps({
                "layer": f"{channels}x{size}x{size} k{kernel} s{stride}",
                "nchw_ms": round(best[0] * 1e3, 4), "nhwc_ms": round(best[1] * 1e3, 4),
                "nhwc_over_nchw": round(best[1] / best[0], 3),
                "nhwc_gflops": round(flops / best[1] / 1e9, 1),
            }))  # fmt: skip


if __name__ == "__main__":
    main()
