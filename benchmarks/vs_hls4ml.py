"""kiln's fpga target vs hls4ml on the FPGA-size zoo models: accuracy at equal total bits, and
kiln's per-layer ESTIMATES beside hls4ml's design rules for the same layers and reuse factor.

    python benchmarks/vs_hls4ml.py                              # jet-mlp and mnist-cnn, 16/12/10 bits (~4 min)
    python benchmarks/vs_hls4ml.py --models jet-mlp --bits 16 --samples 200

Accuracy: both designs run as C simulations (no FPGA here) on the same random inputs (seeds 100
and up); each is compared with the model's fp32 torch output: relative L2 and top-1 agreement.
kiln's tensors are ``ap_fixed<W, I>`` with I per tensor from calibration (seeds 1..40); hls4ml's
are its default ``fixed<W, 6>`` everywhere (io_parallel, QONNX in), as its users start.

Estimates: hls4ml gives resources and latency only by synthesis (vitis_hls, not installed here).
Its documented rules for the same layer are what kiln's estimates are set beside: a Dense layer
at reuse R has n_in * n_out / R multipliers (one DSP48 each at 16 bits) and accepts an input every
R cycles; an io_parallel Conv2D (latency strategy, parallelization factor 1) has K*K*C*F / R
multipliers and takes one output pixel per R cycles. The II columns are cycles between inputs
(a kernel's, under DATAFLOW). Every kiln figure here is an ESTIMATE from kiln's analytical
model. Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import math
import tempfile

import numpy as np


def accuracy(y: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    rel = float(np.linalg.norm(y - want) / np.linalg.norm(want))
    return rel, float((y.argmax(-1) == want.argmax(-1)).mean())


def compare_accuracy(name: str, bits: list[int], samples: int) -> None:
    import torch

    import kiln
    from kiln import zoo
    from kiln.bench.backends import fpga_backends

    path = str(zoo.onnx_path(name))
    net = zoo.get(name).build(zoo.options_for(name))
    inputs = [zoo.example_inputs(name, seed=100 + i)["x"] for i in range(samples)]
    batch = np.concatenate(inputs)
    with torch.no_grad():
        want = net(torch.from_numpy(batch)).numpy()
    calibration = [zoo.example_inputs(name, seed=s) for s in range(1, 41)]
    print(f"\n{name}: accuracy vs fp32 on {samples} random inputs (C simulations)")
    print(
        f"{'bits':>5} | {'hls4ml fixed<W,6>: rel L2':>26} {'top-1':>7} | {'kiln fixed<W,I>: rel L2':>24} {'top-1':>7}"
    )
    for w in bits:
        fpga_backends.BITS = w
        with tempfile.TemporaryDirectory() as folder:
            peer = fpga_backends.convert(path, folder)
            theirs = np.asarray(peer.predict(np.ascontiguousarray(batch))).reshape(want.shape)
        compiled = kiln.compile(path, target=f"fpga:vitis,bits={w}", calibration=calibration)
        ours = np.concatenate([next(iter(compiled.run({"x": x}).values())) for x in inputs])
        (hr, ht), (kr, kt) = accuracy(theirs, want), accuracy(ours, want)
        print(f"{w:>5} | {hr:>26.2e} {ht:>7.1%} | {kr:>24.2e} {kt:>7.1%}")


def hls4ml_rule(node, weights: dict, pixels: dict, reuse: int) -> tuple[str, int, int] | None:  # type: ignore[no-untyped-def]
    """(layer, multipliers, cycles per input) of hls4ml's rules for a Gemm/MatMul/Conv node."""
    w = weights.get(node.input[1]) if len(node.input) > 1 else None
    if w is None:
        return None
    if node.op_type in ("Gemm", "MatMul"):
        return f"Dense {w.shape[0]}x{w.shape[1]}", math.ceil(w.size / reuse), reuse
    if node.op_type == "Conv":
        label = f"Conv {w.shape[2]}x{w.shape[3]} {w.shape[1]}->{w.shape[0]}"
        return label, math.ceil(w.size / reuse), pixels[node.output[0]] * reuse
    return None


def compare_estimates(name: str, reuse: int) -> None:
    import onnx

    import kiln
    from kiln import zoo
    from kiln.backends.fpga.estimate import estimate
    from kiln.driver.fixed_point import design_of

    path = str(zoo.onnx_path(name))
    graph = onnx.shape_inference.infer_shapes(onnx.load(path)).graph
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    pixels = {  # output pixels of every 4-d value (an io_parallel conv takes one per R cycles)
        v.name: v.type.tensor_type.shape.dim[2].dim_value * v.type.tensor_type.shape.dim[3].dim_value
        for v in graph.value_info
        if len(v.type.tensor_type.shape.dim) == 4
    }
    model = kiln.compile(path, target=f"fpga:vitis,reuse={reuse}", calibration=[zoo.example_inputs(name, seed=1)])
    ((plan, design, facts),) = design_of(model)
    found = estimate(design, facts, plan.target)
    print(f"\n{name} at reuse {reuse}: kiln's ESTIMATES beside hls4ml's rules (hls4ml: no estimate without synthesis)")
    print(f"{'layer':<24} {'kiln latency':>12} {'kiln II':>8} {'kiln DSP':>9} | {'hls4ml mults':>12} {'hls4ml II':>10}")
    for kd, usage in found.kernels:
        nodes = [n for n in graph.node if n.name and any(f"[{n.name}]" in s for s in kd.kernel.sources)]
        rule = next((r for n in nodes if (r := hls4ml_rule(n, weights, pixels, reuse)) is not None), None)
        label = rule[0] if rule else ", ".join(kd.kernel.sources)[:24]
        theirs = f"{rule[1]:>12,} {rule[2]:>10,}" if rule else f"{'-':>12} {'-':>10}"
        interval = usage.interval or usage.cycles
        print(f"{label:<24} {usage.cycles:>12,} {interval:>8,} {usage.dsp:>9,} | {theirs}")
    print(f"model (estimate): latency {found.latency:,} cycles, interval {found.interval:,}, DSP {found.total.dsp:,}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="jet-mlp,mnist-cnn")
    parser.add_argument("--bits", default="16,12,10", help="total bits of both designs (comma-separated)")
    parser.add_argument("--samples", type=int, default=100, help="random inputs the accuracy is measured on")
    parser.add_argument("--reuse", type=int, default=1, help="the reuse factor of the estimates' comparison")
    args = parser.parse_args()
    from kiln.bench.backends.base import module_exists

    if not (module_exists("hls4ml") and module_exists("qonnx")):
        print("hls4ml is not installed (make setup installs the fpga extra)")
        return 1
    for name in args.models.split(","):
        compare_accuracy(name, [int(b) for b in args.bits.split(",")], args.samples)
        compare_estimates(name, args.reuse)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
