"""Fold inference-mode BatchNormalization into the Conv (or Gemm/MatMul) that feeds it.

    y = gamma * (conv(x, W) + b - mean) / sqrt(var + eps) + beta
      = conv(x, W * s) + (b - mean) * s + beta,   s = gamma / sqrt(var + eps) per output channel

Legal when the BatchNormalization has one output (inference mode), every parameter and the
weight are constants, and nothing else reads the conv's output. Runs after fold_constants.
"""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Graph, Node
from kiln.passes.rewrite import Rewriter, consumers_count


def fold_batchnorm(graph: Graph) -> Graph:
    readers = consumers_count(graph)
    producers = graph.producers()
    rewriter = Rewriter(graph)
    folded: set[Node] = set()
    replacement: dict[Node, Node] = {}
    for node in graph.nodes:
        if node.op != "BatchNormalization" or node.domain or len(node.outputs) != 1 or node.attrs.get("training_mode"):
            continue
        source = producers.get(node.inputs[0])  # type: ignore[arg-type]
        if source is None or source.op not in ("Conv", "Gemm") or readers.get(node.inputs[0], 0) != 1:  # type: ignore[arg-type]
            continue
        params = [graph.constants.get(v) for v in node.inputs[1:5]]  # type: ignore[arg-type]
        weight = graph.constants.get(source.inputs[1])  # type: ignore[arg-type]
        bias = (
            graph.constants.get(source.inputs[2]) if len(source.inputs) > 2 and source.inputs[2] is not None else None
        )
        if (
            weight is None
            or any(p is None for p in params)
            or (len(source.inputs) > 2 and source.inputs[2] is not None and bias is None)
        ):
            continue
        if source.op == "Gemm" and (
            source.attrs.get("transA") or source.attrs.get("alpha", 1.0) != 1.0 or source.attrs.get("beta", 1.0) != 1.0
        ):
            continue
        gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)  # type: ignore[arg-type]
        scale = gamma / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
        dtype = weight.dtype
        # the product in the weight's own type (scale rounded once): a float64 copy of a large
        # weight was four times its size, transiently, per folded layer
        if weight.dtype != np.float32:  # (half and integer weights: in float64, rounded once)
            weight = weight.astype(np.float64)
        factor = scale.astype(weight.dtype)
        if source.op == "Conv":
            new_weight = weight * factor.reshape(-1, *([1] * (weight.ndim - 1)))
        elif source.attrs.get("transB"):
            new_weight = weight * factor[:, None]
        else:
            new_weight = weight * factor[None, :]
        old_bias = np.zeros_like(mean) if bias is None else bias.astype(np.float64)
        new_bias = (old_bias - mean) * scale + beta
        weight_value = rewriter.add_constant(new_weight.astype(dtype, copy=False), f"{source.outputs[0].name}_w_bn")
        bias_value = rewriter.add_constant(new_bias.astype(dtype), f"{source.outputs[0].name}_b_bn")
        fused = Node(
            source.op,
            [source.inputs[0], weight_value, bias_value],
            [node.outputs[0]],
            dict(source.attrs),
            name=source.name,
            domain=source.domain,
        )
        replacement[source] = fused
        folded.add(node)
    if not folded:
        return graph
    for node in graph.nodes:
        if node in folded:
            rewriter.drop(node)
        else:
            rewriter.keep(replacement.get(node, node))
    return rewriter.finish()
