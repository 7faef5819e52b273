"""A decode step's KV cache updated where it lies: the present written into the past's buffer.

A decoder's step reads each layer's past keys (and values) as a graph input ``[batch, heads, past,
depth]`` and gives the present, ``Concat(past, new)`` along the past axis, as a graph output that
the next step reads as its past. Laid out densely at its sizes, the present moves every cached row
each step (each head's block grows by the new rows): at a batch of 4 and 640 cached positions,
llama-1b's 16 layers copied ~335 MB a step. ``cache_pairs`` finds such pairs in a graph;
``in_place``, given each past's ``layout`` (its present's shape at the capacity, from the run-time
dims route, ``kiln.driver.spatial``), makes each Concat a ``kiln::CacheAppend``: the past laid out at
the layout's strides (a box at its origin, whatever the sizes), the present in that same buffer, so
a step writes its new rows only and the attention reads the cache where it lies.

Only where the lowerings that follow take a layout's strides: nothing but the Concat reads the past,
and every reader of the present is a float32 attention group's K or V operand (through Unsqueezes:
a grouped head's broadcast), whose strides ``attention_view`` gives at the layout. Else the pair
stays a Concat (dense, copied) and the route lays that input out densely, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import DType, TensorType
from kiln.passes.fuse import attention_view, transpose_perm

CACHE_APPEND = "CacheAppend"  # (domain kiln)


def cache_pairs(graph: Graph) -> list[tuple[Value, Node]]:
    """Each (past input, Concat) where a float graph input is read only as the first of a Concat's
    two operands (and by Shape or Size: its sizes, not its data), and that Concat's output is a
    graph output (once): a KV cache's past and present."""
    consumers = graph.consumers()
    outputs = list(graph.outputs)
    found = []
    for value in graph.inputs:
        if not _float_tensor(value):
            continue
        read, readers = value, _data_readers(consumers, value)
        while len(readers) == 1 and _identity(readers[0]) and read not in outputs:  # (an exporter's Identity)
            read = readers[0].outputs[0]
            readers = _data_readers(consumers, read)
        if len(readers) != 1 or read in outputs:
            continue
        node = readers[0]
        if node.op != "Concat" or node.domain or len(node.inputs) != 2 or node.inputs[0] is not read:
            continue
        if node.inputs[1] is read or outputs.count(node.outputs[0]) != 1:
            continue
        found.append((value, node))
    return found


def _data_readers(consumers, value: Value) -> list[Node]:  # type: ignore[no-untyped-def]
    """The nodes reading ``value``'s data (Shape and Size read its sizes only)."""
    return [r for r in consumers.get(value, []) if r.domain or r.op not in ("Shape", "Size")]


def _identity(node: Node) -> bool:
    """A node whose output is its one input: Identity, a Concat of one operand."""
    return not node.domain and (node.op == "Identity" or (node.op == "Concat" and len(node.inputs) == 1))


def in_place(graph: Graph, layouts: Mapping[str, tuple[int, ...]]) -> Graph:
    """``graph`` with each cache pair whose past is named in ``layouts`` (past input name -> the
    capacity's shape of its present) a ``kiln::CacheAppend`` at that layout, where its readers
    allow (see the module); the others unchanged."""
    if not layouts:
        return graph
    consumers = graph.consumers()
    replaced: dict[Node, Node] = {}
    for past, node in cache_pairs(graph):
        layout = layouts.get(past.name)
        if layout is None or node.inputs[0] is not past:  # (an Identity left between: not here)
            continue
        axis = int(node.attrs.get("axis", 0)) % len(layout)
        present = node.outputs[0]
        shape = present.type.shape  # type: ignore[union-attr]
        if shape is None or len(shape) != len(layout) or not _fits(shape, layout):
            continue
        if not all(_reads_in_place(reader, present, layout, graph, consumers) for reader in consumers.get(present, [])):
            continue
        replaced[node] = Node(
            CACHE_APPEND,
            node.inputs,
            node.outputs,
            {"axis": axis, "layout": tuple(int(d) for d in layout)},
            node.name,
            "kiln",
        )
    if not replaced:
        return graph
    return graph.with_(nodes=[replaced.get(n, n) for n in graph.nodes])


def layouts_of(graph: Graph) -> dict[Value, tuple[int, ...]]:
    """Each value laid out at a layout other than its shape's: a CacheAppend's past and present,
    and the Unsqueezes of the present its attention reads (a 1 inserted in the layout where the
    Unsqueeze inserts one)."""
    found: dict[Value, tuple[int, ...]] = {}
    consumers = graph.consumers()
    for node in graph.nodes:
        if node.domain != "kiln" or node.op != CACHE_APPEND:
            continue
        layout = tuple(node.attrs["layout"])
        past, present = node.inputs[0], node.outputs[0]
        assert past is not None
        found[past] = found[present] = layout
        for reader in consumers.get(present, []):
            if reader.op == "Unsqueeze" and not reader.domain:
                axes = _unsqueeze_axes(reader, graph)
                assert axes is not None
                found[reader.outputs[0]] = _unsqueezed(layout, axes)
    return found


def _reads_in_place(reader: Node, value: Value, layout: tuple[int, ...], graph: Graph, consumers) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``reader`` reads ``value`` (laid out at ``layout``) through strides the lowering
    gives at that layout: an attention group's K or V, or an Unsqueeze only such groups read."""
    if reader.op == "Unsqueeze" and not reader.domain and reader.inputs[0] is value:
        axes = _unsqueeze_axes(reader, graph)
        out = reader.outputs[0]
        if axes is None or out in graph.outputs:
            return False
        wider = _unsqueezed(layout, axes)
        return all(
            r.domain == "kiln" and r.op == "Fused" and _attention_reads(r, out, wider) for r in consumers.get(out, [])
        )
    return reader.domain == "kiln" and reader.op == "Fused" and _attention_reads(reader, value, layout)


def _attention_reads(node: Node, value: Value, layout: tuple[int, ...]) -> bool:
    """Whether the attention group ``node`` reads ``value`` only as its K (through a Transpose) or
    its V, in float32, with strides the layout gives."""
    if node.attrs.get("kind") != "attention" or value.type.dtype is not DType.FLOAT32:  # type: ignore[union-attr]
        return False
    body: Graph = node.attrs["body"]
    nodes = list(body.nodes)
    matmuls = [n for n in nodes if n.op == "MatMul"]
    softmax = next((n for n in nodes if n.op in ("Softmax", "SafeSoftmax")), None)
    if len(matmuls) != 2 or softmax is None:
        return False
    out_shape = matmuls[1].outputs[0].type.shape  # type: ignore[union-attr]
    batch = tuple(out_shape[:-2])
    inner = body.consumers()
    for position, bound in zip(node.inputs, body.inputs):
        if position is not value:
            continue
        for user in inner.get(bound, []):
            perm = tuple(range(len(layout)))
            if user.op == "Transpose":
                perm = transpose_perm(user)
                readers = inner.get(user.outputs[0], [])
                if len(readers) != 1 or readers[0] is not matmuls[0] or readers[0].inputs[1] is not user.outputs[0]:
                    return False
            elif not (user is matmuls[1] and user.inputs[1] is bound and user.inputs[0] is not bound):
                return False
            shape = tuple(bound.type.shape)  # type: ignore[union-attr]
            if attention_view(shape, perm, False, batch, layout) is None:
                return False
    return True


def _unsqueeze_axes(node: Node, graph: Graph) -> tuple[int, ...] | None:
    """The axes an Unsqueeze inserts (its attribute, or its constant second input), normalized."""
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        found = graph.constants.get(node.inputs[1])
        axes = None if found is None else [int(a) for a in found.reshape(-1)]
    if axes is None:
        return None
    rank = len(node.outputs[0].type.shape)  # type: ignore[union-attr, arg-type]
    return tuple(sorted(int(a) % rank for a in axes))


def _unsqueezed(layout: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    dims = list(layout)
    for axis in axes:
        dims.insert(axis, 1)
    return tuple(dims)


def _fits(shape: tuple, layout: tuple[int, ...]) -> bool:
    """Each of the present's sizes inside the layout's (a symbol: checked by the route's ranges)."""
    return all(not isinstance(d, int) or int(d) <= int(c) for d, c in zip(shape, layout))


def _float_tensor(value: Value) -> bool:
    return isinstance(value.type, TensorType) and value.type.shape is not None and value.type.dtype.is_float


def cache_roles(graph: Graph) -> tuple[dict[int, tuple[int, ...]], dict[int, int]]:
    """(input position -> the layout it is laid out at, output position -> the input position whose
    buffer holds it) of ``graph``'s CacheAppends: what a run lays out and gives back."""
    boxed: dict[int, tuple[int, ...]] = {}
    updates: dict[int, int] = {}
    for node in graph.nodes:
        if node.domain != "kiln" or node.op != CACHE_APPEND:
            continue
        past, present = node.inputs[0], node.outputs[0]
        position = next(i for i, v in enumerate(graph.inputs) if v is past)
        boxed[position] = tuple(int(d) for d in node.attrs["layout"])
        updates[next(i for i, v in enumerate(graph.outputs) if v is present)] = position
    return boxed, updates
