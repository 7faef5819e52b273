"""Lowering of ``kiln::Fused`` groups: the group's scalar expressions composed into one kernel."""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.graph import Node, Value
from kiln.lower.kir import Expr, Kernel, Load, Store, affine, i64
from kiln.lower.lowering import CannotLower, Lowerer, broadcast_index, default_schedule, nest, scalarize_for, strides
from kiln.lower.nn_lowering import lower_conv, lower_matmul


def _chain(lw: Lowerer, chain: list[Node], bindings: dict[Value, Value], out_shape: tuple[int, ...], start: Value | None) -> Callable[[list[Expr], Expr | None], Expr]:
    """The composed expression of ``chain`` at an output position; ``start`` (the anchor's
    output, if any) takes the value passed in."""

    def compose(position: list[Expr], value: Expr | None) -> Expr:
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
        compose = _chain(lw, chain, bindings, shape, anchor.outputs[0])
        direct = Node(anchor.op, [None if v is None else bindings[v] for v in anchor.inputs], [out], dict(anchor.attrs), name=node.name)
        lower = {"Conv": lower_conv, "MatMul": lower_matmul}[anchor.op]
        kernels = lower(lw, direct, epilogue=lambda position, value: compose(position, value))
        for kernel in kernels:
            kernel.kind = f"{anchor.op.lower()}+epilogue"
            kernel.sources = [f"{node.name}: " + ", ".join(n.op for n in body.nodes)]
            kernel.reads = kernel.reads + [lw.buffer(v) for v in node.inputs if v is not None and lw.buffer(v) not in kernel.reads]
        return kernels
    if node.attrs.get("kind") != "pointwise":
        raise CannotLower(f"fused group of kind {node.attrs.get('kind')!r}")
    compose = _chain(lw, list(body.nodes), bindings, shape, None)
    dst = lw.buffer(out)

    def kernel_body(indices):  # type: ignore[no-untyped-def]
        return [Store(dst, affine(list(zip(indices, strides(shape)))), compose(list(indices), None))]  # type: ignore[arg-type]

    stmts, indices = nest(lw, shape, kernel_body)
    kernel = lw.kernel(node, "pointwise", stmts, list(node.inputs), [out], default_schedule(shape, indices))
    kernel.sources = [f"{node.name}: " + ", ".join(n.op for n in body.nodes)]
    return [kernel]


LOWERINGS = {"Fused": lower_fused}
