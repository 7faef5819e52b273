"""Dead-code elimination: drop nodes none of whose outputs are read, and unused constants.

Every op in the registry is side-effect free, so an unread node can always go. Runs anywhere.
"""

from __future__ import annotations

from kiln.ir.graph import Graph, free_values


def dce(graph: Graph) -> Graph:
    """The graph without nodes whose outputs nobody reads (repeated to a fixed point)."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(out in live for out in node.outputs):
            kept.append(node)
            live.update(v for v in node.inputs if v is not None)
            for sub in node.subgraphs():
                live.update(free_values(sub))
    kept.reverse()
    constants = {v: a for v, a in graph.constants.items() if v in live}
    if len(kept) == len(graph.nodes) and len(constants) == len(graph.constants):
        return graph
    return graph.with_(nodes=kept, constants=constants)
