"""Where a model's latency stands against the machine: its nominal work (the FLOPs of its matrix
products and convolutions, from the ONNX file alone, so every engine is held to the same count),
the least memory traffic it can have, and the machine's measured peaks (a large matrix product's
FLOP/s, a large copy's bytes/s).

A roofline bound is min(peak FLOP/s, intensity x bandwidth) with intensity = FLOPs / minimum
traffic; a latency's achieved FLOP/s over that bound says how far the engine is from the machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

# the ops whose multiply-adds are counted; everything else (elementwise, softmax, norms) is taken
# as free: the count is the work every engine must do, not what one of them does
_CONTRACTIONS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "FusedMatMul")


@dataclass(frozen=True)
class Work:
    flops: int  # 2 x multiply-adds of the model's products and convolutions
    traffic_bytes: int  # weights, inputs and outputs, each read or written once
    unknown: int  # products whose shapes shape inference could not give (not counted)


@dataclass(frozen=True)
class Peaks:
    gflops: float  # a large fp32 matrix product at the run's threads
    gbps: float  # a large array copy (bytes read + written per second)
    how: str


def _shape(value: Any) -> list[int] | None:
    kind = getattr(value, "type", None)
    shape = getattr(kind, "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return [int(d) for d in shape]


def model_work(model: Any, inputs: dict[str, np.ndarray]) -> Work:
    """Nominal FLOPs and minimum traffic of an ONNX ``model`` run on ``inputs``. Shapes come from
    kiln's import with the inputs' sizes bound (its shape inference folds the Shape/Reshape
    arithmetic exporters write, which ONNX's own inference leaves unknown); the count is of the
    source graph's ops, before any rewriting."""
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.specialize import input_dims, specialize

    graph = import_onnx(model)
    graph = specialize(graph, input_dims(graph, inputs))
    flops = unknown = 0
    for node in graph.nodes:  # (products inside If/Loop bodies are not counted)
        if node.op not in _CONTRACTIONS or node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        out = _shape(node.outputs[0])
        a = _shape(node.inputs[0])
        b = _shape(node.inputs[1]) if len(node.inputs) > 1 else None
        if out is None or a is None or b is None:
            unknown += 1
            continue
        if node.op == "Conv":  # weight (O, C/g, kh, kw...): each output sums C/g x kernel taps
            reduction = int(np.prod(b[1:]))
        elif node.op == "ConvTranspose":  # weight (C, O/g, kh, kw...): each input fans out
            flops += 2 * int(np.prod(a)) * int(np.prod(b[1:]))
            continue
        elif node.op == "Gemm":
            reduction = a[0] if node.attrs.get("transA", 0) else a[-1]
        else:  # MatMul: the last axis of A
            reduction = a[-1]
        flops += 2 * int(np.prod(out)) * int(reduction)
    from onnx import helper

    weights = sum(
        int(np.prod(init.dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        for init in model.graph.initializer
    )
    given = sum(array.nbytes for array in inputs.values())
    produced = 0
    for value in graph.outputs:
        shape = _shape(value)
        if shape is not None:
            produced += int(np.prod(shape)) * np.dtype(value.type.dtype.numpy).itemsize
    return Work(flops, weights + given + produced, unknown)


def measure_peaks(threads: int, seconds: float = 1.0) -> Peaks:
    """The machine's fp32 FLOP/s (kiln's engine on a 1024-cube product at ``threads``:
    ``profile.matmul_peak``; onnxruntime's on the same model when it is faster) and its copy
    bandwidth (NumPy copying 256 MiB, one thread)."""
    from kiln.driver.profile import matmul_peak, square_product

    n = 1024
    best, by = matmul_peak(n, threads=threads), "kiln"
    try:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(
            square_product(n).SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feeds = {"a": np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)}
        rate = 2 * n**3 / _best_seconds(lambda: session.run(None, feeds), seconds) / 1e9
        if rate > best:
            best, by = rate, "onnxruntime"
    except ImportError:
        pass
    source = np.ones(64 << 20, np.float32)
    target = np.empty_like(source)
    copy = _best_seconds(lambda: np.copyto(target, source), seconds)
    return Peaks(best, 2 * source.nbytes / copy / 1e9, f"fp32 1024^3 product by {by}, {threads} threads; 256 MiB copy")


def _best_seconds(call: Any, budget: float) -> float:
    call()
    best = float("inf")
    deadline = time.perf_counter() + budget
    while True:
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            return best


def bound_ms(work: Work, peaks: Peaks) -> float:
    """The roofline's least latency for ``work``: compute-bound or traffic-bound, whichever is slower."""
    return max(work.flops / (peaks.gflops * 1e9), work.traffic_bytes / (peaks.gbps * 1e9)) * 1e3
