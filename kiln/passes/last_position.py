"""A generation model's logits at each sequence's last position only.

Generating text reads one row of a step's logits: the last position's, from which the next token is
drawn. A decoder computes them for every position it is fed, and at a prompt's step that is the
whole prompt: for a 1B Llama with a 128,256-token vocabulary, 512 positions cost 269 GFLOP in the
head (a fifth of the prompt's work) and a 263 MB output, all but one row thrown away. This pass
gathers the head's input at the last position (``Gather(x, [-1], axis=1)``) before the product that
makes the logits, so the output becomes [batch, 1, vocab] (what ``kiln.generate`` reads: its
``logits[:, -1]``). It is not the same model: it runs only where the compile asks for it
(``kiln.compile(..., generation=True)``), and leaves the graph as it is (every position computed)
where the logits are not a product of position-wise rows.

The match is on the computation: from the logits output back through position-wise operations
(unary elementwise, Softmax/LogSoftmax over the last axis, a binary one with an operand that is the
same for every position, each read only by the next) to a product whose left operand is [batch,
positions, hidden] (a MatMul; ONNX Runtime's MatMulNBits is imported as one) — the head, however
an exporter spells it.
"""

from __future__ import annotations

import numpy as np

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import TensorType
from kiln.passes.rewrite import Rewriter, consumers_count

UNARY = frozenset({"Tanh", "Cast", "Relu", "Sigmoid", "Neg", "Identity", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Erf"})  # fmt: skip
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})


def last_position(graph: Graph, output: str) -> Graph:
    """``graph`` with its output named ``output`` computed at the last position of axis 1 only
    (see the module); unchanged where no head is found."""
    found = _chain(graph, output)
    if found is None:
        return graph
    head, chain = found
    rw = Rewriter(graph)
    skip = {id(n) for n in (head, *chain)}
    for node in graph.nodes:
        if id(node) not in skip:
            rw.keep(node)
            continue
        if node is not head:
            continue
        last = rw.add_constant(np.array([-1], np.int64), "last_position")  # (a Gather: the dim is 1)
        (rows,) = rw.emit("Gather", [head.inputs[0], last], {"axis": 1}, hint="last_position")
        (value,) = rw.emit(head.op, [rows, *head.inputs[1:]], dict(head.attrs), hint="head", domain=head.domain)
        before = head.outputs[0]
        for step in chain:
            inputs = [value if v is before else v for v in step.inputs]
            (value,) = rw.emit(step.op, inputs, dict(step.attrs), hint=step.op.lower(), domain=step.domain)
            before = step.outputs[0]
        final = rw.nodes.pop()  # (the output keeps its name)
        renamed = Value(output, value.type)
        rw.nodes.append(Node(final.op, final.inputs, [renamed], final.attrs, name=final.name, domain=final.domain))
        rw.replace(before, renamed)
    return rw.finish()


def _first_row_input(node: Node) -> Value | None:
    """The operand of ``node`` that carries the positions (the one of rank 3)."""
    return next((v for v in node.inputs if v is not None and _rank(v) == 3), None)


def _rank(value: Value) -> int | None:
    return value.type.rank if isinstance(value.type, TensorType) and value.type.shape is not None else None


def _chain(graph: Graph, output: str) -> tuple[Node, list[Node]] | None:
    """(the head's product, the position-wise nodes after it in order) making ``output``."""
    out = next((v for v in graph.outputs if v.name == output), None)
    if out is None or _rank(out) != 3:
        return None
    producer = {v: n for n in graph.nodes for v in n.outputs}
    readers = consumers_count(graph)
    chain: list[Node] = []
    value = out
    while (node := producer.get(value)) is not None:
        if node.op == "MatMul" and not node.domain:
            left = node.inputs[0]
            if (
                left is None
                or _rank(left) != 3
                or any(_rank(v) not in (1, 2) for v in node.inputs[1:2] if v is not None)
            ):
                return None
            return node, chain[::-1]
        if node.domain or not _position_wise(node, graph):
            return None
        chain.append(node)
        value = _first_row_input(node)  # type: ignore[assignment]
        if value is None or readers.get(value, 0) != 1 or value in graph.outputs:
            return None
    return None


def _position_wise(node: Node, graph: Graph) -> bool:
    """Each position's row of the output depends only on that position's row of the input."""
    if node.op in UNARY:
        return len(node.outputs) == 1
    if node.op in ("Softmax", "LogSoftmax"):
        return node.attrs.get("axis", -1) in (-1, 2)
    if node.op in BINARY and len(node.inputs) == 2:
        rows = [v for v in node.inputs if v is not None and _rank(v) == 3]
        other = [v for v in node.inputs if v is not None and v not in rows]
        if len(rows) != 1 or len(other) != 1:
            return False
        shape = other[0].type.shape if isinstance(other[0].type, TensorType) else None
        # an operand the same at every position: rank <= 1 (or rank 3 with one position)
        return shape is not None and (len(shape) <= 1 or (len(shape) == 3 and shape[1] == 1))
    return False
