"""Half precision legalization for the native path: ops with no float16/bfloat16 kernels (matrix
products, softmax, normalizations, reductions, convolution, pooling) run in float32 between casts:

    MatMul(a: f16, b: f16) -> Cast(MatMul(Cast(a, f32), Cast(b, f32)), f16)

The result is rounded to half precision once, at the end, as NumPy's half-precision arithmetic
rounds each result; intermediate values are more precise. Runs before lowering (cpu target).
"""

from __future__ import annotations

from kiln.ir.graph import Graph
from kiln.ir.types import DType, TensorType
from kiln.ops.registry import has_trait
from kiln.passes.rewrite import Rewriter

HALVES = (DType.FLOAT16, DType.BFLOAT16)


def widen_half(graph: Graph) -> Graph:
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        node = rewriter.resolved(node)
        half = {
            v.type.dtype
            for v in node.inputs
            if v is not None and isinstance(v.type, TensorType) and v.type.dtype in HALVES
        }
        if node.domain or not has_trait(node.op, "", "accumulating") or len(half) != 1 or len(node.outputs) != 1:
            rewriter.keep(node)
            continue
        inputs = []
        for value in node.inputs:
            if value is not None and isinstance(value.type, TensorType) and value.type.dtype in HALVES:
                value = rewriter.emit("Cast", [value], {"to": DType.FLOAT32.onnx_code}, hint=f"{value.name}_f32")[0]
            inputs.append(value)
        wide = rewriter.emit(node.op, inputs, dict(node.attrs), hint=f"{node.outputs[0].name}_f32", name=node.name)[0]
        out = node.outputs[0]
        narrow = (
            wide
            if out.type.dtype not in HALVES
            else rewriter.emit("Cast", [wide], {"to": out.type.dtype.onnx_code}, hint=out.name)[0]
        )  # type: ignore[union-attr]
        rewriter.replace(out, narrow)
        rewriter.drop(node)
    return rewriter.finish()
