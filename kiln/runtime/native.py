"""The ``cpu`` target's model: native code for every node that has a lowering, host fallbacks for
the rest, one specialization per binding of the model's symbolic input dims."""

from __future__ import annotations

import ctypes
import queue
import threading
from typing import Any

import numpy as np

from kiln.compiler import Fallback, Plan, Segment, compile_plan, load_functions
from kiln.errors import ExecutionError
from kiln.ir.graph import Graph
from kiln.lower.kir import Buffer
from kiln.lower.memory import ALIGNMENT
from kiln.passes import specialize
from kiln.passes.specialize import input_dims
from kiln.runtime.interpreter import Interpreter, evaluate_node
from kiln.runtime.model import Model


class _Executable:
    """A compiled plan plus what running it needs: loaded functions, weights, an arena pool."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.functions = load_functions(plan)
        self.interpreter = Interpreter(plan.graph) if plan.whole_graph_reason else None
        self.arenas: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self.slots = len(plan.table)

    def _arena(self) -> np.ndarray:
        try:
            return self.arenas.get_nowait()
        except queue.Empty:
            raw = np.empty(self.plan.memory.arena_bytes + ALIGNMENT, dtype=np.uint8)
            shift = (-raw.ctypes.data) % ALIGNMENT
            return raw[shift : shift + self.plan.memory.arena_bytes]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.interpreter is not None:
            return self.interpreter.run(inputs)
        plan = self.plan
        arena = self._arena()
        try:
            views: dict[Buffer, np.ndarray] = {}
            for buffer, array in zip(plan.inputs, inputs):
                views[buffer] = np.ascontiguousarray(array).reshape(-1)
            for buffer, array in plan.constants.items():
                views[buffer] = array.reshape(-1)
            outputs = []
            for buffer in plan.outputs:
                if buffer not in views:
                    views[buffer] = np.empty(buffer.size, dtype=buffer.dtype.numpy)
                outputs.append(buffer)
            for buffer, offset in plan.memory.offsets.items():
                views[buffer] = arena[offset : offset + buffer.nbytes].view(buffer.dtype.numpy)
            status = np.zeros(1, dtype=np.int32)
            table = (ctypes.c_void_p * self.slots)()
            table[0] = status.ctypes.data
            for buffer, slot in plan.table.items():
                if slot and buffer in views:
                    table[slot] = views[buffer].ctypes.data
            functions = iter(self.functions)
            for step in plan.steps:
                if isinstance(step, Segment):
                    next(functions)(ctypes.cast(table, ctypes.c_void_p))
                    if status[0]:
                        raise ExecutionError(f"node {plan.kernel_labels.get(int(status[0]), '?')}: an index input is out of range")
                else:
                    self._fallback(step, views)
            results = []
            for value, buffer in zip(plan.graph.outputs, outputs):
                array = views[buffer].reshape([int(d) for d in value.type.shape])  # type: ignore[union-attr]
                results.append(array.copy() if buffer in plan.memory.offsets or buffer in plan.constants or buffer in plan.inputs else array)
            return results
        finally:
            self.arenas.put(arena)

    def _fallback(self, step: Fallback, views: dict[Buffer, np.ndarray]) -> None:
        plan = self.plan
        node = step.node
        args = [None if v is None else views[plan.roots[v]].reshape([int(d) for d in v.type.shape]) for v in node.inputs]  # type: ignore[union-attr]
        try:
            results = evaluate_node(node, args)
        except Exception as err:
            raise ExecutionError(f"node {node.label} (host fallback) failed: {type(err).__name__}: {err}") from err
        for value, result in zip(node.outputs, results):
            target = views[plan.roots[value]]
            result = np.asarray(result)
            if result.dtype != target.dtype or result.size != target.size:
                raise ExecutionError(f"node {node.label}: fallback produced {result.dtype}{list(result.shape)}, planned {value.type} (kiln bug)")
            np.copyto(target, result.reshape(-1))


class NativeModel(Model):
    """kiln's compiled CPU model. Symbolic input dims are bound at run time; each new binding
    compiles once (C compilation itself is cached on disk across processes)."""

    target = "cpu"

    def __init__(self, graph: Graph, level: int = 2, dims: dict[str, int] | None = None) -> None:
        super().__init__(graph)
        self.level = level
        self._variants: dict[tuple[tuple[str, int], ...], _Executable] = {}
        self._lock = threading.Lock()
        if dims is not None or all(isinstance(v.type.shape, tuple) and all(isinstance(d, int) for d in v.type.shape) for v in graph.inputs):  # type: ignore[union-attr]
            self._variant(dict(dims or {}))

    def _variant(self, dims: dict[str, int]) -> _Executable:
        key = tuple(sorted(dims.items()))
        executable = self._variants.get(key)
        if executable is None:
            with self._lock:
                executable = self._variants.get(key)
                if executable is None:
                    executable = _Executable(compile_plan(specialize(self.graph, dims), self.level))
                    self._variants[key] = executable
        return executable

    def _execute(self, inputs: list[Any]) -> list[Any]:
        dims = input_dims(self.graph, dict(zip(self.input_names, inputs)))
        return self._variant(dims).run(inputs)

    @property
    def plans(self) -> list[Plan]:
        return [v.plan for v in self._variants.values()]

    @property
    def is_native(self) -> bool | None:
        """True when every compiled variant runs with no host fallback (None before any compile)."""
        plans = self.plans
        return None if not plans else all(p.is_native for p in plans)
