"""Decomposition: replace an op that has no native lowering by the ONNX function that defines it
(Attention, NegativeLogLikelihoodLoss, RMSNormalization... are specified as functions of simpler
ops), so the compiled path can run it natively. The function is imported through the frontend
(with the node's attributes substituted), its values renamed under the node's name, and spliced
in. Semantics are unchanged by definition of the function; the pipeline's verifier and the
differential tests hold it to that. Runs before the other passes (cpu target only).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import helper

from kiln.ir.graph import Graph, Node, Value, unique_name
from kiln.ir.types import OptionalType, SequenceType, TensorType, Type
from kiln.passes.rewrite import Rewriter, substitute_free

MAX_ROUNDS = 4  # functions may use other function ops


def _function_for(node: Node, opset: int) -> onnx.FunctionProto | None:
    import onnx.defs

    if not onnx.defs.has(node.op, node.domain or ""):  # no C++ exception (ASan, KILN_DEBUG)
        return None
    try:
        schema = onnx.defs.get_schema(node.op, opset, node.domain or "")
    except Exception:
        return None
    if schema.has_function:
        return _without_control_flow(schema.function_body)
    if schema.has_context_dependent_function:
        from kiln.ops.onnx_bridge import node_to_proto, type_to_proto
        from kiln.ops.registry import lookup

        opdef = lookup(node.op, node.domain)
        if opdef is None or any(v is not None and not isinstance(v.type, TensorType) for v in node.inputs):
            return None
        proto = node_to_proto(node, opdef)
        types = [type_to_proto(v.type) if v is not None else onnx.TypeProto() for v in node.inputs]
        try:
            body = schema.get_context_dependent_function(
                proto.SerializeToString(), [t.SerializeToString() for t in types]
            )
        except Exception:
            return None
        function = onnx.FunctionProto()
        function.ParseFromString(body)
        return _without_control_flow(function)
    return None


def _without_control_flow(function: onnx.FunctionProto) -> onnx.FunctionProto | None:
    """None for bodies with If/Loop/Scan: inlining them would make shapes dynamic and send the
    whole graph to the reference, the opposite of the point."""
    if any(n.op_type in ("If", "Loop", "Scan", "SequenceMap") for n in function.node):
        return None
    return function


def _as_model(node: Node, function: onnx.FunctionProto, opset: int) -> onnx.ModelProto:
    """The function as a standalone model whose inputs have the node's input types."""
    from kiln.ops.onnx_bridge import attr_to_proto, type_to_proto
    from kiln.ops.registry import lookup

    opdef = lookup(node.op, node.domain)
    given = {
        k: attr_to_proto(k, v, opdef.attrs[k].kind if opdef and k in opdef.attrs else None)
        for k, v in node.attrs.items()
    }
    nodes = []
    for inner in function.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        del copy.attribute[:]
        for attribute in inner.attribute:
            if attribute.ref_attr_name:
                if attribute.ref_attr_name in given:
                    resolved = onnx.AttributeProto()
                    resolved.CopyFrom(given[attribute.ref_attr_name])
                    resolved.name = attribute.name
                    copy.attribute.append(resolved)
                continue  # the caller left it unset: the inner op's default applies
            copy.attribute.append(attribute)
        nodes.append(copy)
    inputs = []
    for index, name in enumerate(function.input):
        value = node.inputs[index] if index < len(node.inputs) else None
        if value is not None:
            inputs.append(helper.make_value_info(name, type_to_proto(value.type)))
    present = {i.name for i in inputs}
    # Optional inputs the node omits: function nodes read them as "" (absent).
    for inner in nodes:
        for position, name in enumerate(inner.input):
            if name in function.input and name not in present:
                inner.input[position] = ""
    outputs = [helper.make_value_info(name, onnx.TypeProto()) for name in function.output[: len(node.outputs)]]
    graph = helper.make_graph(nodes, f"{node.op}_function", inputs, outputs)
    imports = [helper.make_opsetid(o.domain, o.version) for o in function.opset_import] or [
        helper.make_opsetid("", opset)
    ]
    return helper.make_model(graph, opset_imports=imports)


def decompose(graph: Graph, keep: Callable[[Node], bool]) -> Graph:
    """Inline the ONNX function of every node for which ``keep(node)`` is False."""
    from kiln.frontend.onnx import import_onnx

    for _ in range(MAX_ROUNDS):
        rewriter = Rewriter(graph)
        for node in graph.nodes:
            node = rewriter.resolved(node)
            function = None if keep(node) else _function_for(node, graph.opsets.get(node.domain or "", graph.opset))
            if function is None:
                rewriter.keep(node)
                continue
            try:
                body = import_onnx(_as_model(node, function, graph.opset))
            except Exception:
                rewriter.keep(node)  # a function kiln cannot import stays a (fallback) node
                continue
            _splice(rewriter, node, body)
        new = rewriter.finish()
        if new is graph:
            return graph
        graph = new
    return graph


def _local_symbols(body: Graph, prefix: str) -> Callable[[Type], Type]:
    """Renames the symbols minted inside ``body`` (every copy of a function needs its own), keeping
    the ones its inputs share with the host graph."""
    shared = {d for v in body.inputs for d in _dims(v.type) if isinstance(d, str)}
    tag = "".join(c if c.isalnum() else "_" for c in prefix)

    def rename(value_type: Type) -> Type:
        if isinstance(value_type, TensorType) and value_type.shape is not None:
            dims = tuple(f"{tag}{d}" if isinstance(d, str) and d not in shared else d for d in value_type.shape)
            return TensorType(value_type.dtype, dims)
        if isinstance(value_type, (SequenceType, OptionalType)):
            return type(value_type)(rename(value_type.elem))
        return value_type

    return rename


def _dims(value_type: Type) -> tuple:
    if isinstance(value_type, TensorType):
        return value_type.shape or ()
    if isinstance(value_type, (SequenceType, OptionalType)):
        return _dims(value_type.elem)
    return ()


def _splice(rewriter: Rewriter, node: Node, body: Graph) -> None:
    prefix = (node.outputs[0].name if node.outputs else node.op) + "."
    source = f"{node.name or prefix[:-1]}/"  # node names keep the source node's name (errors, fallbacks)
    rename = _local_symbols(body, prefix)
    mapping: dict[Value, Value] = {}
    actual = [v for v in node.inputs if v is not None]
    for formal, value in zip(body.inputs, actual):
        mapping[formal] = value  # type: ignore[assignment]
    for value, array in body.constants.items():
        mapping[value] = rewriter.add_constant(array, prefix + value.name)
    for inner in body.nodes:
        outputs = [Value(unique_name(prefix + v.name, rewriter.taken), rename(v.type)) for v in inner.outputs]
        mapping.update(zip(inner.outputs, outputs))
        inputs = [None if v is None else mapping.get(v, v) for v in inner.inputs]
        # bodies of If/Loop inside the function read its values from their enclosing scope
        attrs = {
            k: substitute_free(a, lambda v: mapping.get(v, v)) if isinstance(a, Graph) else a
            for k, a in inner.attrs.items()
        }
        rewriter.keep(
            Node(inner.op, inputs, outputs, attrs, name=source + (inner.name or inner.op), domain=inner.domain)
        )
    for old, new in zip(node.outputs, body.outputs):
        rewriter.replace(old, mapping.get(new, new))
    rewriter.drop(node)
