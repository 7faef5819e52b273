"""The XLA row: the ONNX model imported by kiln's frontend, its graph converted op by op to
``jax.numpy`` / ``lax`` calls (``JAX_OPS``, one function per ONNX op) and ``jax.jit``-compiled:
the same ONNX program run by XLA.

Values computed from constants only (shape arithmetic: Shape -> Gather -> Concat -> Reshape) are
evaluated with kiln's NumPy reference while tracing, so XLA sees static shapes, as it must. A node
on the data path whose op has no JAX function makes the row "unavailable: no JAX conversion for
op X" before anything is compiled (never a crash mid-run). Each function is checked against kiln's
reference on the ONNX conformance cases of its op (``tests/bench/test_jax_backend.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.bench.backends.base import Backend, Session, Unavailable
from kiln.bench.backends.jax_ops import JAX_OPS as JAX_OPS
from kiln.bench.backends.jax_ops import JAX_TYPES, register_elementwise
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.types import TensorType


def data_path(graph: Graph) -> set[Node]:
    """The nodes whose value depends on the graph's inputs (the rest folds to constants)."""
    dynamic: set[Value] = set(graph.inputs)
    nodes = set()
    for node in graph.nodes:
        if any(v in dynamic for v in node.inputs if v is not None):
            nodes.add(node)
            dynamic.update(node.outputs)
    return nodes


def missing_ops(graph: Graph) -> list[str]:
    """The ops on the data path that have no JAX function here (the row's reason)."""
    _ensure_table()
    return sorted({n.op for n in data_path(graph) if n.domain or n.op not in JAX_OPS})


def unsupported_values(graph: Graph) -> list[str]:
    """Values on the data path XLA cannot hold: sequences, optionals, strings and other types
    outside JAX's numeric ones."""
    found = []
    path = data_path(graph)
    values = list(graph.inputs) + [v for n in graph.nodes if n in path for v in n.outputs]
    for value in values:
        kind = value.type
        if not isinstance(kind, TensorType):
            found.append(f"%{value.name} is a {type(kind).__name__}")
        elif np.dtype(kind.dtype.numpy).name not in JAX_TYPES:
            found.append(f"%{value.name} is {np.dtype(kind.dtype.numpy).name}")
    return found


def to_jax(graph: Graph) -> Callable[..., list[Any]]:
    """A function of the graph's inputs (jax arrays) returning its outputs, for ``jax.jit``."""
    from kiln.ops.interpreter import evaluate_node

    _ensure_table()
    missing = missing_ops(graph)
    if missing:
        raise Unavailable(f"no JAX conversion for op {', '.join(missing)}")
    odd = unsupported_values(graph)
    if odd:
        raise Unavailable(f"values XLA cannot hold: {'; '.join(odd[:3])}")
    dynamic = data_path(graph)

    def function(*inputs: Any) -> list[Any]:
        env: dict[Value, Any] = dict(graph.constants)
        env.update(zip(graph.inputs, inputs))
        for node in graph.nodes:
            args = [None if v is None else env[v] for v in node.inputs]
            if node in dynamic:
                outputs = JAX_OPS[node.op](node, args)
            else:  # constants only: kiln's NumPy reference, static for XLA
                outputs = evaluate_node(node, args)
            for value, data in zip(node.outputs, outputs):
                env[value] = data
        return [env[v] for v in graph.outputs]

    return function


_ready = False


def _ensure_table() -> None:
    global _ready
    if not _ready:
        register_elementwise()
        _ready = True


class JaxBackend(Backend):
    """XLA through JAX: kiln's import of the ONNX file, converted op by op and ``jax.jit``-ed for
    the example's shapes (``compile`` traces and compiles; ``load`` is the compiled executable)."""

    name = "jax"
    requires = ("jax",)

    def version(self) -> str:
        import jax

        return jax.__version__

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "precision": "float32 (matmul/conv precision HIGHEST)", "device": "cpu"}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        import jax

        from kiln.frontend.onnx import import_onnx
        from kiln.passes.specialize import input_dims, specialize

        imported = import_onnx(str(model.onnx_path))
        graph = specialize(imported, input_dims(imported, example))
        names = [v.name for v in graph.inputs]
        function = jax.jit(to_jax(graph))
        arrays = [example[n] for n in names]
        self.artifact = (function.lower(*arrays).compile(), names)

    def load(self) -> Session:
        compiled, names = self.artifact
        return _JaxSession(compiled, names)


class _JaxSession(Session):
    def __init__(self, compiled: Any, names: list[str]) -> None:
        self.compiled = compiled
        self.names = names

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self.compiled(*(feeds[n] for n in self.names))
        return [np.asarray(o) for o in outputs]
