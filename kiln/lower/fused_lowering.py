"""Lowering of ``kiln::Fused`` groups: the group's scalar expressions composed into one kernel."""

from __future__ import annotations

from kiln.ir.graph import Node
from kiln.lower.attention_lowering import lower_attention
from kiln.lower.engine import compose_chain
from kiln.lower.kir import Kernel, Store, affine, buffers_in
from kiln.lower.lowering import CannotLower, Lowerer, default_schedule, nest, strides


def lower_fused(lw: Lowerer, node: Node) -> list[Kernel]:
    body = node.attrs["body"]
    bindings = dict(zip(body.inputs, node.inputs))
    out = node.outputs[0]
    shape = lw.shape(out)
    if node.attrs.get("kind") == "epilogue":
        anchor, chain = body.nodes[0], body.nodes[1:]
        compose = compose_chain(lw, chain, bindings, shape, anchor.outputs[0])
        direct = Node(
            anchor.op,
            [None if v is None else bindings[v] for v in anchor.inputs],
            [out],
            dict(anchor.attrs),
            name=node.name,
            domain=anchor.domain,
        )
        key = f"{anchor.domain}::{anchor.op}" if anchor.domain else anchor.op
        kernels = lw.table[key](lw, direct, epilogue=compose)  # the engine, else the loop nests
        kernels[-1].kind = f"{kernels[-1].kind}+epilogue"  # the last kernel applies it
        for kernel in kernels:
            kernel.sources = [f"{node.name}: " + ", ".join(n.op for n in body.nodes)]
            # what the epilogue reads (a residual, a bias) lives until this kernel ran
            kernel.reads = [b for b in buffers_in(kernel.body) if b not in kernel.writes]
        return kernels
    if node.attrs.get("kind") == "attention":
        return lower_attention(lw, node)
    if node.attrs.get("kind") != "pointwise":
        raise CannotLower(f"fused group of kind {node.attrs.get('kind')!r}")
    compose = compose_chain(lw, list(body.nodes), bindings, shape, None)
    dst = lw.buffer(out)

    def kernel_body(indices):  # type: ignore[no-untyped-def]
        return [Store(dst, affine(list(zip(indices, strides(shape)))), compose(list(indices), None))]  # type: ignore[arg-type]

    stmts, indices = nest(lw, shape, kernel_body)
    kernel = lw.kernel(node, "pointwise", stmts, list(node.inputs), [out], default_schedule(lw.target, shape, indices))
    kernel.sources = [f"{node.name}: " + ", ".join(n.op for n in body.nodes)]
    return [kernel]
