"""How compile time and memory scale where hostile or unusual models push them (issue 12):

    python benchmarks/hostile_scaling.py chain [--length 10000]   # an activation chain, fused in groups
    python benchmarks/hostile_scaling.py kernels [--length 10000]  # an unfused int64 chain: one kernel per node
    python benchmarks/hostile_scaling.py batches [--up-to 48]      # one model run at batch sizes 3..N

``chain`` and ``kernels`` print compile+first-run seconds and the generated C's size (the plan cache off, so
every run compiles); ``batches`` prints the RSS growth over the batch sizes and the plan cache's size on disk
(a fresh cache folder). Each compares with the reference interpreter's answer.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

import kiln


def _model(nodes, inputs, outputs, initializers=None):
    from onnx import numpy_helper

    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def chain(length: int, ops: list[str], dtype: int) -> None:
    nodes, previous = [], "x"
    for i in range(length):
        op = ops[i % len(ops)]
        nodes.append(helper.make_node(op, [previous, "x"] if op == "Add" else [previous], [f"v{i}"]))
        previous = f"v{i}"
    model = _model(nodes, [("x", dtype, [64])], [(previous, dtype, [64])])
    x = np.linspace(-3, 3, 64).astype(np.float32) if dtype == TensorProto.FLOAT else np.arange(64, dtype=np.int64)
    os.environ["KILN_PLAN_CACHE"] = "0"
    start = time.perf_counter()
    compiled = kiln.compile(model)
    got = compiled.run({"x": x})[previous]
    seconds = time.perf_counter() - start
    expected = kiln.compile(model, target="reference").run({"x": x})[previous]
    (plan,) = compiled.plans
    kernels = sum(len(s.kernels) for s in plan.steps if hasattr(s, "kernels"))
    print(
        f"{length} nodes ({','.join(ops)}): compile + first run {seconds:.1f} s, {kernels} kernels, "
        f"{len(plan.source) / 1e3:.0f} kB of C, max |diff| vs reference {np.abs(got - expected).max():.2e}"
    )


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def batches(up_to: int) -> None:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((1024, 4096)) * 0.01).astype(np.float32)
    w2 = (rng.standard_normal((4096, 1024)) * 0.01).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    model = _model(
        nodes, [("x", TensorProto.FLOAT, ["batch", 1024])], [("y", TensorProto.FLOAT, None)], {"w1": w1, "w2": w2}
    )
    cache = Path(tempfile.mkdtemp(prefix="kiln-bench-cache-"))
    os.environ["KILN_CACHE_DIR"] = str(cache)
    compiled = kiln.compile(model)
    for batch in (1, 2):
        compiled.run({"x": rng.standard_normal((batch, 1024)).astype(np.float32)})
    start = rss_mb()
    for batch in range(3, up_to + 1):
        compiled.run({"x": rng.standard_normal((batch, 1024)).astype(np.float32)})
    from kiln.driver import plan_cache

    plan_cache.wait()
    on_disk = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 2**20
    weights = (w1.nbytes + w2.nbytes) / 2**20
    print(
        f"MLP with {weights:.0f} MB of weights, batches 3..{up_to}: RSS +{rss_mb() - start:.0f} MB, "
        f"{len(compiled.plans)} variants kept ({compiled.evicted} evicted), plan cache {on_disk:.0f} MB in {cache}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=["chain", "kernels", "batches"])
    parser.add_argument("--length", type=int, default=10_000)
    parser.add_argument("--up-to", type=int, default=48)
    args = parser.parse_args()
    if args.case == "chain":
        chain(args.length, ["Neg", "Relu", "LeakyRelu", "HardSigmoid", "Clip", "Tanh"], TensorProto.FLOAT)
    elif args.case == "kernels":
        chain(args.length, ["Add"], TensorProto.INT64)
    else:
        batches(args.up_to)


if __name__ == "__main__":
    main()
