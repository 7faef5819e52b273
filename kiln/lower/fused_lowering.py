"""Lowering of ``kiln::Fused`` groups: the group's scalar expressions composed into one kernel."""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.graph import Node, Value
from kiln.lower.gemm_lowering import lower_conv_any, lower_matmul_any
from kiln.lower.kir import Expr, Kernel, Load, Store, affine, buffers_in, i64
from kiln.lower.lowering import CannotLower, Lowerer, broadcast_index, default_schedule, nest, scalarize_for, strides


def compose_chain(
    lw: Lowerer, chain: list[Node], bindings: dict[Value, Value], out_shape: tuple[int, ...], start: Value | None
) -> Callable[[list[Expr], Expr | None, Expr | None], Expr]:
    """The composed expression of ``chain`` at an output position (``flat``: the same position as a
    flat index, which operands of the output's own shape use directly); ``start`` (the anchor's
    output, if any) takes the value passed in."""

    def compose(position: list[Expr], value: Expr | None, flat: Expr | None = None) -> Expr:
        computed: dict[Value, Expr] = {}
        if start is not None and value is not None:
            computed[start] = value

        def operand(v: Value) -> Expr:
            if v in computed:
                return computed[v]
            actual = bindings[v]
            buffer = lw.buffer(actual)
            if buffer.size == 1:
                return Load(buffer, i64(0))
            if flat is not None and lw.shape(actual) == out_shape:
                return Load(buffer, flat)
            return Load(buffer, broadcast_index(lw.shape(actual), out_shape, position))  # type: ignore[arg-type]

        result: Expr | None = value
        for node in chain:
            scalarize = scalarize_for(node, [v.type.dtype for v in node.inputs if v is not None])  # type: ignore[union-attr]
            result = scalarize([None if v is None else operand(v) for v in node.inputs])  # type: ignore[arg-type]
            computed[node.outputs[0]] = result
        assert result is not None
        return result

    return compose


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
        )
        lower = {"Conv": lower_conv_any, "MatMul": lower_matmul_any}[anchor.op]
        kernels = lower(lw, direct, epilogue=compose)
        kernels[-1].kind = f"{kernels[-1].kind}+epilogue"  # the last kernel applies it
        for kernel in kernels:
            kernel.sources = [f"{node.name}: " + ", ".join(n.op for n in body.nodes)]
            # what the epilogue reads (a residual, a bias) lives until this kernel ran
            kernel.reads = [b for b in buffers_in(kernel.body) if b not in kernel.writes]
        return kernels
    if node.attrs.get("kind") == "attention":
        from kiln.lower.attention_lowering import lower_attention

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


LOWERINGS = {"Fused": lower_fused}
