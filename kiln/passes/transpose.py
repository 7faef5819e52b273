"""Transpose sinking: move a Transpose below the unary elementwise ops that read it, so that
transposes meet and cancel (simplify merges and removes the pairs), and layout changes end up at
graph edges. Transposes of constants are folded by fold_constants. Runs before simplify.

    Relu(Transpose(x, p)) -> Transpose(Relu(x), p)      (any "layout_free" op; one reader)
"""

from __future__ import annotations

from kiln.ir.graph import Graph, Node, Value
from kiln.ops.registry import has_trait
from kiln.passes.dce import dce
from kiln.passes.rewrite import Rewriter, consumers_count


def sink_transposes(graph: Graph) -> Graph:
    readers = consumers_count(graph)
    rewriter = Rewriter(graph)
    producers: dict[Value, Node] = {}
    for node in graph.nodes:
        node = rewriter.resolved(node)
        source = node.inputs[0] if node.inputs else None
        transpose = producers.get(source) if source is not None else None
        if (
            not node.domain
            and has_trait(node.op, "", "layout_free")
            and len(node.outputs) == 1
            and transpose is not None
            and transpose.op == "Transpose"
            and readers.get(transpose.outputs[0], 0) == 1
        ):
            inner = rewriter.emit(
                node.op, [transpose.inputs[0]], dict(node.attrs), hint=f"{node.outputs[0].name}_pre", name=node.name
            )[0]
            moved = rewriter.emit(
                "Transpose", [inner], dict(transpose.attrs), hint=node.outputs[0].name, name=transpose.name
            )[0]
            producers[moved] = rewriter.nodes[-1]
            readers[moved] = readers.get(node.outputs[0], 0)  # so it can keep sinking
            rewriter.replace(node.outputs[0], moved)
            rewriter.drop(node)
            continue
        rewriter.keep(node)
        for out in node.outputs:
            producers[out] = node
    return dce(rewriter.finish())
