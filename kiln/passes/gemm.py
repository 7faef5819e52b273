"""Gemm -> MatMul (+ Add): one canonical form for matrix products, so later passes (fusion, the
matmul kernels) see a single pattern. Y = alpha * A' @ B' + beta * C with A' = A or A^T, B' = B
or B^T; transposes and scales of constant operands are folded into new constants here."""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Graph
from kiln.passes.rewrite import Rewriter


def canonicalize_gemm(graph: Graph) -> Graph:
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        node = rewriter.resolved(node)
        if node.op != "Gemm" or node.domain:
            rewriter.keep(node)
            continue
        a, b = node.inputs[0], node.inputs[1]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
        hint = node.outputs[0].name
        if node.attrs.get("transA"):
            a = rewriter.emit("Transpose", [a], {"perm": (1, 0)}, hint=f"{hint}_at")[0]
        b_const = rewriter.constant_value(b)
        if b_const is not None:
            matrix = b_const.T if node.attrs.get("transB") else b_const
            if alpha != 1.0:
                matrix = (matrix * alpha).astype(b_const.dtype)
                alpha = 1.0
            # a transposed view, not a copy: the matmul lowering packs the weight into its own
            # layout anyway (one copy instead of two for a 400 MB classifier)
            b = rewriter.add_constant(matrix, f"{hint}_b")
        elif node.attrs.get("transB"):
            b = rewriter.emit("Transpose", [b], {"perm": (1, 0)}, hint=f"{hint}_bt")[0]
        product = rewriter.emit("MatMul", [a, b], {}, hint=f"{hint}_mm", name=node.name)[0]
        if alpha != 1.0:
            scale = rewriter.add_constant(np.array(alpha, dtype=product.type.dtype.numpy), f"{hint}_alpha")  # type: ignore[union-attr]
            product = rewriter.emit("Mul", [product, scale], {}, hint=f"{hint}_scaled")[0]
        if c is not None and beta != 0.0:
            c_const = rewriter.constant_value(c)
            if beta != 1.0:
                if c_const is not None:
                    c = rewriter.add_constant((c_const * beta).astype(c_const.dtype), f"{hint}_c")
                else:
                    beta_value = rewriter.add_constant(np.array(beta, dtype=c.type.dtype.numpy), f"{hint}_beta")  # type: ignore[union-attr]
                    c = rewriter.emit("Mul", [c, beta_value], {}, hint=f"{hint}_cb")[0]
            product = rewriter.emit("Add", [product, c], {}, hint=hint)[0]
        rewriter.replace(node.outputs[0], product)
        rewriter.drop(node)
    return rewriter.finish()
