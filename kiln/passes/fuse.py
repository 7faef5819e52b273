"""Fusion: group nodes into kernels, as ``kiln::Fused`` nodes whose ``body`` is the group.

Three kinds of group:

* ``pointwise``: elementwise ops forming an expression tree (each intermediate read only inside
  the group; the group's inputs may be read many times, as GELU reads x), one loop over the
  output instead of one per op;
* ``epilogue``: a Conv or MatMul followed by such a chain (bias, activation, residual add,
  scale), applied to each output plane/row while it is still in cache;
* ``attention``: MatMul(Q, K^T) -> elementwise (scale, mask) -> Softmax(last axis) -> MatMul(., V)
  as one kernel that never writes the [.., Lq, Lk] score tensor: each query row's scores live in a
  small scratch row (it pays whenever the scores would be written and read back three times; it
  is refused when the rows are too long for the scratch or the operands broadcast). Transposes
  that only rearrange Q, K^T, V (splitting heads) or the output (merging them) join the group: the
  kernel reads and writes those tensors through strides instead of copying them
  (``attention_view``).

Legality (``can_fuse``) is kept apart from benefit (``fusion_benefit``: bytes of intermediate
traffic saved); every refusal is recorded with a reason (``kiln explain`` lists them). A Fused
node's reference is its body run by the interpreter, so the differential tests check fusion too.
Runs last in the pipeline (after the algebraic passes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.sized import size_product
from kiln.ir.types import TensorType
from kiln.ops.registry import has_trait
from kiln.passes.rewrite import consumers_count


def _anchor(node: Node) -> bool:
    """A Conv or MatMul whose output tiles can take a fused epilogue (the op's "anchor" trait)."""
    return has_trait(node.op, node.domain, "anchor")


def _fusable(node: Node) -> bool:
    """An elementwise op with scalar semantics the fused loop can inline ("fusable" trait)."""
    return has_trait(node.op, node.domain, "fusable")


@dataclass
class Refusal:
    node: str
    candidate: str
    reason: str


def _float_static(value: Value | None) -> bool:
    return (
        value is not None
        and isinstance(value.type, TensorType)
        and value.type.is_static
        and value.type.dtype.short in ("f32", "f64")
    )


def can_fuse(
    producer: Node, consumer: Node, readers: dict[Value, int], outputs: set[Value], inside: int = 1
) -> str | None:
    """None when ``consumer`` may join ``producer``'s group, else why not (``inside``: how many
    of the link's readers are in the group; every one must be)."""
    if not _fusable(consumer):
        return f"{consumer.op} is not an elementwise op"
    link = producer.outputs[0]
    if readers.get(link, 0) != inside:
        return f"%{link.name} has {readers.get(link, 0)} readers: the intermediate must be kept"
    if link in outputs:
        return f"%{link.name} is a graph output"
    if not _float_operands(consumer):
        return "needs static float32/float64 tensors (a Where's condition: static bool)"
    if consumer.outputs[0].type != link.type:
        return "the consumer broadcasts the chain to a larger shape"
    if consumer.op == "Clip" and any(v is not None and v.type.shape != () for v in consumer.inputs[1:]):  # type: ignore[union-attr]
        return "Clip bounds must be scalars"
    return None


def _float_operands(node: Node) -> bool:
    """Static float tensors in and out; a Where's condition (a mask) is a static bool tensor."""
    values = [*node.inputs, *node.outputs]
    if node.op == "Where" and not node.domain:
        condition = values.pop(0)
        if not (condition is not None and isinstance(condition.type, TensorType) and condition.type.is_static):
            return False
        if condition.type.dtype.short != "bool":
            return False
    return all(_float_static(v) for v in values)


def _elementwise(node: Node) -> bool:
    return _fusable(node) and len(node.outputs) == 1 and _float_operands(node)


def fusion_benefit(link: Value) -> int:
    """Bytes of memory traffic saved: the intermediate is neither written nor read back."""
    return 2 * size_product(link.type.shape) * link.type.dtype.numpy.itemsize  # type: ignore[union-attr, arg-type]


MAX_GROUP = 48  # elementwise ops in one group: GCC's time on one loop body grows faster than its length
MAX_ATTENTION_KEYS = 16384  # scores per query row held in the scratch row


def _softmax(node: Node) -> bool:
    """Softmax, or kiln's NaN-safe Softmax (a fully masked row gives zeros: the exporters' guard)."""
    return (node.op == "Softmax" and not node.domain) or (node.op == "SafeSoftmax" and node.domain == "kiln")


def attention_group(
    start: Node,
    consumer_of: dict[Value, Node],
    readers: dict[Value, int],
    outputs: set[Value],
    producer: dict[Value, Node] | None = None,
) -> tuple[list[Node] | None, str]:
    """The nodes of an attention pattern starting at MatMul ``start`` (None and why not); with
    ``producer``, Transposes feeding Q, K^T, V or reading the output join it when they fold."""
    if start.op != "MatMul" or start.domain or not _float_static(start.outputs[0]):
        return None, "not a float MatMul"
    group = [start]
    while True:
        link = group[-1].outputs[0]
        consumer = consumer_of.get(link)
        if consumer is None or readers.get(link, 0) != 1 or link in outputs:
            return None, f"%{link.name} is read elsewhere or is a graph output"
        if _softmax(consumer):
            break
        reason = can_fuse(group[-1], consumer, readers, outputs)
        if reason is not None:
            return None, reason
        group.append(consumer)
    softmax = consumer
    scores = softmax.inputs[0]
    rank = len(scores.type.shape)  # type: ignore[union-attr, arg-type]
    if int(softmax.attrs.get("axis", -1)) % rank != rank - 1:
        return None, "attention: Softmax is not over the last axis"
    group.append(softmax)
    link = softmax.outputs[0]
    second = consumer_of.get(link)
    if second is None or second.op != "MatMul" or second.domain or readers.get(link, 0) != 1 or link in outputs:
        return None, "attention: the Softmax does not feed exactly one MatMul"
    if second.inputs[0] is not link or not _float_static(second.outputs[0]):
        return None, "attention: the probabilities are not the MatMul's left operand"
    group.append(second)
    q, kt, v, out = start.inputs[0], start.inputs[1], second.inputs[1], second.outputs[0]
    if not all(_float_static(x) for x in (q, kt, v)) or any(x.type.dtype.short != "f32" for x in (q, kt, v, out)):  # type: ignore[union-attr]
        return None, "attention: attention kernel is float32"
    batch = tuple(out.type.shape[:-2])  # type: ignore[union-attr, index]
    if rank < 2 or any(
        attention_view(tuple(x.type.shape), tuple(range(len(x.type.shape))), False, batch) is None  # type: ignore[union-attr, arg-type]
        for x in (q, kt, v)
    ):
        return None, "attention: Q, K or V neither has the output's batch dims nor broadcasts to them in two strides"
    if scores.type.shape[-1] > MAX_ATTENTION_KEYS:  # type: ignore[union-attr, index]
        return None, f"attention: rows of {scores.type.shape[-1]} keys exceed the scratch row ({MAX_ATTENTION_KEYS})"  # type: ignore[union-attr, index]
    if producer is not None:
        for operand in (q, kt, v):
            before = producer.get(operand)
            if before is not None and _foldable_transpose(before, operand, readers, outputs):
                stored = before.inputs[0].type.shape  # type: ignore[union-attr]
                if attention_view(stored, transpose_perm(before), False, batch) is not None:  # type: ignore[arg-type]
                    group.insert(0, before)
        after = consumer_of.get(out)
        if after is not None and _foldable_transpose(after, out, readers, outputs):
            view = attention_view(after.outputs[0].type.shape, transpose_perm(after), inverse=True)  # type: ignore[union-attr, arg-type]
            if view is not None and view[-1] == 1:  # rows of the output stay contiguous
                group.append(after)
    return group, ""


def transpose_perm(node: Node) -> tuple[int, ...]:
    rank = len(node.inputs[0].type.shape)  # type: ignore[union-attr, arg-type]
    perm = node.attrs.get("perm")
    return tuple(int(p) % rank for p in perm) if perm is not None else tuple(reversed(range(rank)))


def _foldable_transpose(node: Node, link: Value, readers: dict[Value, int], outputs: set[Value]) -> bool:
    """A plain Transpose whose only link to the rest of the graph is ``link`` (read once, not an output)."""
    return (
        node.op == "Transpose"
        and not node.domain
        and readers.get(link, 0) == 1
        and link not in outputs
        and all(_float_static(v) and v.type.dtype.short == "f32" for v in (node.inputs[0], node.outputs[0]))  # type: ignore[union-attr]
    )


def attention_view(
    stored: tuple[int, ...],
    perm: tuple[int, ...],
    inverse: bool,
    batch: tuple[int, ...] | None = None,
    layout: tuple[int, ...] | None = None,
) -> tuple[int, int, int, int, int, int] | None:
    """How an attention operand X of rank >= 2 sits in a contiguous tensor P of shape ``stored``:
    ``X = Transpose(P, perm)``, or ``P = Transpose(X, perm)`` when ``inverse`` (the output). The
    answer is ``(outer, outer_stride, inner, inner_stride, row_stride, col_stride)`` in elements:
    X's batch dims merged into at most two strided dims (flat batch index = outer * inner, in X's
    order), then its matrix rows and columns; None when the batch dims do not merge into two.
    ``batch``: the output's batch dims, when X broadcasts against them (multi-query and grouped
    attention: one K/V head for several query heads): X's dims of 1 there repeat with stride 0.
    ``layout``: P's sizes are a box at the origin of a contiguous tensor of this shape (a KV cache
    at its capacity, ``kiln.passes.cache_in_place``): the strides are the layout's."""
    rank = len(stored)
    laid = stored if layout is None else layout
    contiguous = [size_product(laid[i + 1 :]) for i in range(rank)]
    if inverse:  # P dim i is X dim perm[i]
        shape, stride = [0] * rank, [0] * rank
        for i, p in enumerate(perm):
            shape[p], stride[p] = stored[i], contiguous[i]
    else:  # X dim i is P dim perm[i]
        shape, stride = [stored[p] for p in perm], [contiguous[p] for p in perm]
    if batch is not None:
        if rank < 2 or rank - 2 > len(batch):
            return None
        missing = len(batch) + 2 - rank  # a lower-rank operand broadcasts over the leading dims
        shape, stride = [1] * missing + shape, [0] * missing + stride
        if any(c not in (1, b) for c, b in zip(shape[:-2], batch, strict=True)):
            return None
        for axis, (count, wanted) in enumerate(zip(shape[:-2], batch, strict=True)):
            if count != wanted:
                shape[axis], stride[axis] = wanted, 0
    merged: list[list[int]] = []  # [count, stride], outermost first
    for count, step in zip(shape[:-2], stride[:-2]):
        if count == 1:
            continue
        if merged and merged[-1][1] == step * count:
            merged[-1] = [merged[-1][0] * count, step]
        else:
            merged.append([count, step])
    if len(merged) > 2:
        return None
    while len(merged) < 2:
        merged.insert(0, [1, 0])
    (outer, outer_stride), (inner, inner_stride) = merged
    return outer, outer_stride, inner, inner_stride, stride[-2], stride[-1]


def consumer_map(graph: Graph) -> dict[Value, Node]:
    """Each value's (last) reading node: the one a chain follows where the value is read once."""
    consumer_of: dict[Value, Node] = {}
    for node in graph.nodes:
        for value in node.inputs:
            if value is not None:
                consumer_of[value] = node
    return consumer_of


def fuse(graph: Graph, refusals: list[Refusal] | None = None) -> Graph:
    readers = consumers_count(graph)
    outputs = set(graph.outputs)
    consumer_of = consumer_map(graph)
    producer = graph.producers()
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    groups, grouped, kinds = _attention_groups(graph, consumer_of, readers, outputs, producer, order, refusals)
    # Elementwise groups grow backwards from each sink (latest node first): a producer joins when
    # its output has no reader outside the group (so the group is an expression tree over values
    # computed elsewhere), then a Conv/MatMul producing one of the group's inputs joins as its
    # anchor when every reader of its result is in the group (the epilogue may read it often).
    for sink in reversed(graph.nodes):
        if id(sink) in grouped or not _elementwise(sink):
            continue
        members = _grow(sink, producer, grouped, readers, outputs, refusals)
        _join_anchor(members, sink, producer, grouped, readers, outputs, refusals)
        if len(members) > 1:
            # the anchor first (an epilogue group's body starts with its product), then the rest
            # in graph order: elementwise work on other inputs (the SiLU of a gated MLP's other
            # product) may precede the anchor in the graph, and depends on none of the group
            groups.append(sorted(members.values(), key=lambda n: (not _anchor(n), order[id(n)])))
            grouped.update(members)
    if not groups:
        return graph
    replacement: dict[int, Node] = {}
    drop: set[int] = set()
    for group in groups:
        fused = _fused_node(group, kinds.get(id(group[0])))
        replacement[id(group[-1])] = fused
        drop.update(id(n) for n in group[:-1])
    nodes = [replacement.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return graph.with_(nodes=nodes)


def _attention_groups(graph, consumer_of, readers, outputs, producer, order, refusals):  # type: ignore[no-untyped-def]
    """Attention first (its MatMul would otherwise anchor an epilogue): (groups, grouped node
    ids, kind by first node id)."""
    groups: list[list[Node]] = []
    grouped: set[int] = set()
    kinds: dict[int, str] = {}
    for node in graph.nodes:
        if node.op != "MatMul" or node.domain:
            continue
        group, reason = attention_group(node, consumer_of, readers, outputs, producer)
        if group is None:
            if (
                refusals is not None
                and consumer_of.get(node.outputs[0]) is not None
                and reason.startswith("attention: ")
            ):
                refusals.append(Refusal(node.label, "attention", reason))
            continue
        if any(id(n) in grouped for n in group):
            continue
        group.sort(key=lambda n: order[id(n)])  # absorbed Transposes first, the output's last
        groups.append(group)
        grouped.update(id(n) for n in group)
        kinds[id(group[0])] = "attention"
    return groups, grouped, kinds


def _grow(sink, producer, grouped, readers, outputs, refusals) -> dict[int, Node]:  # type: ignore[no-untyped-def]
    """The elementwise group grown backwards from ``sink`` (each refusal recorded with its reason).
    A candidate read more than once joins when every one of its readers is in the group (a
    biased product's output read by SiLU's Sigmoid and Mul): such candidates wait until the
    group has stopped growing, then are tried again."""
    members = {id(sink): sink}
    stack = [sink]
    waiting: dict[int, tuple[Node, Node, str]] = {}
    while True:
        while stack:
            consumer = stack.pop()
            for value in consumer.inputs:
                candidate = producer.get(value) if value is not None else None
                if candidate is None or id(candidate) in members or _anchor(candidate):
                    continue
                reason = _refusal(candidate, consumer, sink, members, grouped, readers, outputs)
                if reason is not None:
                    waiting[id(candidate)] = (candidate, consumer, reason)
                    continue
                waiting.pop(id(candidate), None)
                members[id(candidate)] = candidate
                stack.append(candidate)
        for key, (candidate, consumer, _) in list(waiting.items()):
            uses = sum(1 for node in members.values() for v in node.inputs if v is candidate.outputs[0])
            if uses > 1 and _refusal(candidate, consumer, sink, members, grouped, readers, outputs, uses) is None:
                del waiting[key]
                members[id(candidate)] = candidate
                stack.append(candidate)
        if not stack:
            break
    if refusals is not None:
        refusals.extend(
            Refusal(candidate.label, consumer.label, reason)
            for candidate, consumer, reason in waiting.values()
            if _elementwise(candidate)
        )
    return members


def _refusal(candidate, consumer, sink, members, grouped, readers, outputs, inside=1) -> str | None:  # type: ignore[no-untyped-def]
    """Why ``candidate`` may not join the group through ``consumer`` (None: it may); ``inside``
    of its readers are in the group."""
    value = candidate.outputs[0]
    reason = (
        "already fused into another group"
        if id(candidate) in grouped
        else can_fuse(candidate, consumer, readers, outputs, inside)
    )
    if reason is None and candidate.outputs[0].type != sink.outputs[0].type:
        reason = "the group's loop runs over another shape"
    if reason is None and not _elementwise(candidate):
        reason = f"{candidate.op} is not an elementwise op"
    if reason is None and fusion_benefit(value) <= 0:
        reason = "nothing to save"
    if reason is None and len(members) >= MAX_GROUP:
        reason = (
            f"the group has {MAX_GROUP} ops (longer chains split: the C compiler's time grows faster than a loop body)"
        )
    return reason


def _join_anchor(members, sink, producer, grouped, readers, outputs, refusals) -> None:  # type: ignore[no-untyped-def]
    """A Conv/MatMul producing one of the group's inputs joins ``members`` as its anchor when every
    reader of its result is in the group."""
    inside = {out for node in members.values() for out in node.outputs}
    uses: dict[Value, int] = {}
    for node in members.values():
        for value in node.inputs:
            if value is not None and value not in inside:
                uses[value] = uses.get(value, 0) + 1
    for value in uses:
        anchor = producer.get(value)
        if anchor is None or not _anchor(anchor) or id(anchor) in grouped:
            continue
        if not _float_static(value) or value.type != sink.outputs[0].type or value in outputs:
            reason = (
                "the epilogue would run over another shape" if _float_static(value) else "needs static float tensors"
            )
        elif readers.get(value, 0) != uses[value]:
            reason = f"%{value.name} is also read outside the group"
        else:
            members[id(anchor)] = anchor
            return
        if refusals is not None:
            refusals.append(Refusal(anchor.label, sink.label, reason))


def _fused_node(group: list[Node], kind: str | None = None) -> Node:
    members = {out for node in group for out in node.outputs}
    external: list[Value] = []
    for node in group:
        for value in node.inputs:
            if value is not None and value not in members and value not in external:
                external.append(value)
    formal = {v: Value(f"in{i}", v.type) for i, v in enumerate(external)}
    inner_values: dict[Value, Value] = dict(formal)
    body_nodes = []
    for position, node in enumerate(group):
        out = node.outputs[0]
        inner_out = Value(f"t{position}", out.type)
        inner_values[out] = inner_out
        body_nodes.append(
            Node(
                node.op,
                [None if v is None else inner_values[v] for v in node.inputs],
                [inner_out],
                dict(node.attrs),
                name=node.name,
                domain=node.domain,
            )
        )
    body = Graph(list(formal.values()), [inner_values[group[-1].outputs[0]]], body_nodes, name="fused")
    kind = kind or ("epilogue" if _anchor(group[0]) else "pointwise")
    label = "+".join(n.op for n in group)
    named = next((n for n in group if _anchor(n)), group[0])  # an attention's first MatMul
    return Node(
        "Fused",
        external,
        [group[-1].outputs[0]],
        {"body": body, "kind": kind},
        name=f"{label} [{named.name or named.outputs[0].name}]",
        domain="kiln",
    )


def unfuse(graph: Graph, keep: Callable[[Node], bool]) -> Graph:
    """``graph`` with every ``kiln::Fused`` node ``keep`` refuses replaced by its body's nodes (the
    group's computation, op by op): what a target that cannot run a group as one kernel lowers
    instead of running the group on the host."""
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        if not (node.domain == "kiln" and node.op == "Fused") or keep(node):
            nodes.append(node)
            continue
        changed = True
        body = node.attrs["body"]
        outer: dict[Value, Value] = dict(zip(body.inputs, node.inputs))  # type: ignore[arg-type]
        outer[body.outputs[0]] = node.outputs[0]
        for inner in body.nodes:
            for value in inner.outputs:
                if value not in outer:  # an intermediate of the group: a value of the graph now
                    outer[value] = Value(f"{node.outputs[0].name}/{value.name}", value.type)
            nodes.append(
                Node(
                    inner.op,
                    [None if v is None else outer[v] for v in inner.inputs],
                    [outer[v] for v in inner.outputs],
                    dict(inner.attrs),
                    name=inner.name,
                    domain=inner.domain,
                )
            )
    return graph.with_(nodes=nodes) if changed else graph
