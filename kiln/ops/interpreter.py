"""The reference interpreter: runs a Graph node by node with each op's reference implementation.

It is the oracle for every later stage, so it favours exactness over speed, and it checks every
value it produces against the type inference recorded in the IR (dtype, rank, static dims, and a
consistent binding of every symbolic dim): an inference bug surfaces here, not as a wrong answer
later in compiled code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import ExecutionError, KilnError, ResourceError, ShapeInferenceError
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import DType, OptionalType, SequenceType, TensorType, Type
from kiln.ops.inference import infer_node
from kiln.ops.onnx_bridge import make_onnx_op
from kiln.ops.registry import RunContext, lookup

Runner = Callable[[list[Any], Any], list[Any]]  # (inputs, execution) -> outputs


def make_runner(node: Node) -> Runner:
    """A callable running ``node``'s reference: onnx's per-op code, or the op's own."""
    opdef = lookup(node.op, node.domain)
    if opdef is None:
        raise ExecutionError(f"node {node.label}: unknown op")
    if opdef.onnx_reference:
        onnx_op = make_onnx_op(node, opdef, [None if v is None else v.type for v in node.inputs])
        return lambda inputs, execution: [_normalize(o) for o in onnx_op(*inputs)]
    reference = opdef.reference
    assert reference is not None
    return lambda inputs, execution: [_normalize(o) for o in reference(RunContext(node, opdef, execution), inputs)]


def evaluate_node(node: Node, inputs: list[Any], execution: Any = None) -> list[Any]:
    """Run one node on concrete inputs (no type checks); used for compile-time evaluation too."""
    return make_runner(node)(inputs, execution)


def _normalize(value: Any) -> Any:
    """Outputs become owned, contiguous arrays: some references return broadcast views (zero
    strides over a tiny buffer) that later ops' reshapes cannot handle."""
    if value is None or isinstance(value, list):
        return value
    array = np.asarray(value)
    if not array.flags.c_contiguous or not array.flags.owndata:
        array = np.array(array, order="C", copy=True)  # (np.ascontiguousarray would make 0-d arrays 1-d)
    return array


class Interpreter:
    """Runs ``graph``; safe to call from several threads (each call has its own environment)."""

    def __init__(self, graph: Graph, check_types: bool = True) -> None:
        self.graph = graph
        self.check_types = check_types
        self._runners: dict[int, Runner] = {}
        self._shaped: dict[int, bool] = {}
        self._lock = threading.Lock()

    def run(self, inputs: list[Any]) -> list[Any]:
        return _Execution(self).run_graph(self.graph, inputs, {})

    def shaped_by_values(self, node: Node) -> bool:
        """Whether ``node``'s output shapes depend on its inputs' values (TopK's k, Pad's pads):
        types that are not static, an op without subgraphs."""
        found = self._shaped.get(id(node))
        if found is None:
            found = not all(isinstance(v.type, TensorType) and v.type.is_static for v in node.outputs) and not any(
                isinstance(a, Graph) for a in node.attrs.values()
            )
            self._shaped[id(node)] = found
        return found

    def runner(self, node: Node) -> Runner:
        key = id(node)
        runner = self._runners.get(key)
        if runner is None:
            runner = make_runner(node)
            with self._lock:
                self._runners[key] = runner
        return runner


class _Execution:
    """One call's state: the value environments of the graph and the subgraphs being run."""

    def __init__(self, interpreter: Interpreter) -> None:
        self.interpreter = interpreter
        self.scopes: list[dict[Value, Any]] = []

    def run_subgraph(self, graph: Graph, inputs: list[Any]) -> list[Any]:
        return self.run_graph(graph, inputs, self.scopes[-1])

    def run_graph(self, graph: Graph, inputs: list[Any], outer: dict[Value, Any]) -> list[Any]:
        env = dict(outer)
        bindings: dict[str, int] = {}
        check = self.interpreter.check_types
        if len(inputs) != len(graph.inputs):
            raise ExecutionError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, got {len(inputs)}")
        for value, data in zip(graph.inputs, inputs):
            env[value] = data
        env.update(graph.constants)
        self.scopes.append(env)
        try:
            for node in graph.nodes:
                args = [None if v is None else env[v] for v in node.inputs]
                if self.interpreter.shaped_by_values(node):
                    check_values(node, args)
                try:
                    outputs = self.interpreter.runner(node)(args, self)
                except KilnError:
                    raise
                except Exception as err:
                    raise node_failure(node, args, err) from err
                if len(outputs) < len(node.outputs):
                    raise ExecutionError(
                        f"node {node.label}: produced {len(outputs)} outputs, expected {len(node.outputs)}"
                    )
                for value, data in zip(node.outputs, outputs):
                    if check:
                        problem = check_value(value.type, data, bindings)
                        if problem:
                            raise ExecutionError(
                                f"node {node.label}: output %{value.name} {problem} (kiln bug: type inference "
                                "disagrees with the reference implementation)"
                            )
                    env[value] = data
        finally:
            self.scopes.pop()
        return [env[v] for v in graph.outputs]


def check_values(node: Node, args: list[Any]) -> None:
    """Raises ExecutionError when the values given make ``node``'s shape invalid (a TopK k outside
    its axis, Pad removing more than a dim holds, a negative OneHot depth): the type inference
    every compiled target runs, here on the values (an op's reference may not check them)."""
    if not all(a is None or isinstance(a, np.ndarray) for a in args):
        return
    types: list[Type | None] = [None if a is None else TensorType(DType.from_numpy(a.dtype), a.shape) for a in args]
    try:
        infer_node(node, types, list(args), [None] * len(args))
    except ShapeInferenceError as err:
        raise ExecutionError(f"node {node.label}: {err}") from None
    except Exception:  # inference that cannot judge these values leaves the judgement to the op
        return


def node_failure(node: Node, args: list[Any], err: Exception, stage: str = "run") -> KilnError:
    """The user's error for a node whose computation failed on these inputs: ResourceError when
    memory ran out (naming the size NumPy asked for), else ExecutionError naming the node."""
    shapes = ", ".join(_describe(a) for a in args)
    if isinstance(err, MemoryError):
        return ResourceError(f"node {node.label} ran out of memory on inputs ({shapes}) (stage: {stage}): {err}")
    return ExecutionError(
        f"node {node.label} failed on inputs ({shapes}) (stage: {stage}): {type(err).__name__}: {err}"
    )


def _describe(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, list):
        return f"sequence[{len(value)}]"
    return type(value).__name__


def check_value(expected: Type, data: Any, bindings: dict[str, int]) -> str | None:
    """None when ``data`` fits ``expected`` (binding symbols as it goes), else what is wrong."""
    if isinstance(expected, OptionalType):
        return None if data is None else check_value(expected.elem, data, bindings)
    if isinstance(expected, SequenceType):
        if not isinstance(data, list):
            return f"should be a sequence, got {_describe(data)}"
        for item in data:
            problem = check_value(expected.elem, item, {})
            if problem:
                return f"element {problem}"
        return None
    assert isinstance(expected, TensorType)
    if not isinstance(data, np.ndarray):
        return f"should be a tensor {expected}, got {_describe(data)}"
    try:
        got = DType.from_numpy(data.dtype)
    except ValueError:
        return f"has unsupported dtype {data.dtype}"
    if got != expected.dtype:
        return f"should be {expected}, got dtype {got.short}{list(data.shape)}"
    if expected.shape is None:
        return None
    if len(expected.shape) != data.ndim:
        return f"should be {expected}, got shape {list(data.shape)}"
    for dim, size in zip(expected.shape, data.shape):
        if isinstance(dim, int):
            if dim != size:
                return f"should be {expected}, got shape {list(data.shape)}"
        elif bindings.setdefault(dim, size) != size:
            return f"should be {expected} with {dim}={bindings[dim]}, got shape {list(data.shape)}"
    return None
