"""Running a compiled plan: its segments through the runners its target's backend loaded, host
fallbacks on the reference implementation, one arena per concurrent request."""

from __future__ import annotations

import ctypes
import queue
import threading
from typing import Any

import numpy as np

from kiln.backends import Threading
from kiln.backends import backend as backend_of
from kiln.errors import ExecutionError, KilnError
from kiln.ir.types import TensorType
from kiln.lower.kir import Buffer
from kiln.lower.memory import ALIGNMENT
from kiln.memory import aligned_copy, empty_aligned
from kiln.ops.interpreter import Interpreter, evaluate_node, node_failure
from kiln.runtime.plan import Fallback, Plan, Segment


class WeightStore:
    """Each distinct weight array of a model's variants held once. Every binding of the symbolic
    dims compiles its own plan, with its own folded and packed copies of the weights; packing does
    not depend on the batch, so the copies are equal and all variants can read one. Arrays are
    matched by content (a sample of their bytes, then an exact comparison): never by name."""

    SMALL = 4096  # bytes: below this, sharing saves nothing worth a comparison

    def __init__(self) -> None:
        self._arrays: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def share(self, array: np.ndarray) -> np.ndarray:
        if array.nbytes < self.SMALL or not array.flags.c_contiguous:
            return array
        raw = array.reshape(-1).view(np.uint8)
        key = (array.dtype.str, array.shape, raw[:: max(1, raw.size // 64)][:64].tobytes())
        with self._lock:
            found = self._arrays.setdefault(key, [])
            for candidate in found:
                if candidate is array or np.array_equal(candidate.reshape(-1).view(np.uint8), raw):
                    return candidate
            found.append(array)
            return array


class _ArenaViews(dict):  # type: ignore[type-arg]
    """A run's buffer views: given ones (weights, inputs, outputs) up front; arena buffers' views
    made on first read (native segments use addresses only; fallbacks and the kir target read
    views)."""

    def __init__(self, given: dict[Buffer, np.ndarray], arena: np.ndarray, offsets: dict[Buffer, int]) -> None:
        super().__init__(given)
        self.arena = arena
        self.offsets = offsets

    def __missing__(self, buffer: Buffer) -> np.ndarray:
        offset = self.offsets[buffer]  # KeyError: not a buffer of this plan
        view = self.arena[offset : offset + buffer.nbytes].view(buffer.dtype.numpy)
        self[buffer] = view
        return view

    def __contains__(self, buffer: object) -> bool:
        return super().__contains__(buffer) or buffer in self.offsets

    def get(self, buffer: Buffer, default: Any = None) -> Any:  # type: ignore[override]
        return self[buffer] if buffer in self else default


class Executable:
    """A compiled plan plus what running it needs: loaded functions, weights, an arena pool."""

    def __init__(
        self,
        plan: Plan,
        keep: list[int] | None = None,
        weights: WeightStore | None = None,
        parallelism: Threading | None = None,
    ) -> None:
        if weights is not None:
            shared = {id(a): weights.share(a) for a in plan.constants.values()}
            plan.constants = {buffer: shared[id(array)] for buffer, array in plan.constants.items()}
            # the optimized graph holds the same arrays (for host fallbacks): let go of the copies
            graph = plan.graph
            plan.graph = graph.with_(constants={v: shared.get(id(a), a) for v, a in graph.constants.items()})
        self.plan = plan
        self.keep = keep  # positions of the inputs the plan takes (others were frozen)
        # one runner per native segment, from the backend of the target the plan was built for
        parallelism = parallelism or Threading()
        self.runners = (
            backend_of(plan.target.backend).load(plan, plan.target, parallelism) if plan.target is not None else []
        )
        self.status_buffer = next((b for b, slot in plan.table.items() if slot == 0), None)
        self.interpreter = Interpreter(plan.graph) if plan.whole_graph_reason else None
        self.arenas: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self.slots = len(plan.table)
        # What every request shares, computed once: weight views and their slots in the table,
        # the outputs' shapes and which of them must be copied out of memory they don't own.
        # every weight 64-byte aligned: the engine loads packed panels with aligned vector loads,
        # and small arrays unpickled from the plan cache come back only 16-byte aligned
        self.constant_views = {
            buffer: (view if view.ctypes.data % ALIGNMENT == 0 else aligned_copy(view, ALIGNMENT))
            for buffer, view in ((b, a.reshape(-1)) for b, a in plan.constants.items())
        }
        self.arena_slots = [(plan.table[buffer], offset) for buffer, offset in plan.memory.offsets.items()]
        self.base_table: list[int | None] = [None] * self.slots
        for buffer, view in self.constant_views.items():
            self.base_table[plan.table[buffer]] = view.ctypes.data
        shared = set(plan.memory.offsets) | set(plan.constants) | set(plan.inputs)
        self.output_layout = [
            (
                buffer,
                [int(d) for d in value.type.shape]
                if isinstance(value.type, TensorType) and value.type.shape is not None
                else [],
                buffer in shared,
            )
            for value, buffer in zip(plan.graph.outputs, plan.outputs)
        ]

    def _arena(self) -> np.ndarray:
        try:
            return self.arenas.get_nowait()
        except queue.Empty:
            return empty_aligned(self.plan.memory.arena_bytes, ALIGNMENT)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.keep is not None:
            inputs = [inputs[i] for i in self.keep]
        if self.interpreter is not None:
            return self.interpreter.run(inputs)
        plan = self.plan
        arena = self._arena()
        try:
            views: dict[Buffer, np.ndarray] = dict(self.constant_views)
            per_request: list[Buffer] = []
            for buffer, array in zip(plan.inputs, inputs):
                views[buffer] = np.ascontiguousarray(array).reshape(-1)
                per_request.append(buffer)
            for buffer in plan.outputs:
                if buffer not in views and buffer not in plan.memory.offsets:
                    views[buffer] = np.empty(buffer.size, dtype=buffer.dtype.numpy)
                    per_request.append(buffer)
            views = _ArenaViews(views, arena, plan.memory.offsets)  # arena views made when read
            status = np.zeros(1, dtype=np.int32)
            table = (ctypes.c_void_p * self.slots)(*self.base_table)
            table[0] = status.ctypes.data
            for buffer in per_request:
                table[plan.table[buffer]] = views[buffer].ctypes.data
            base = arena.ctypes.data
            for slot, offset in self.arena_slots:  # addresses, not views: ~130 views cost 0.4 ms a run
                table[slot] = base + offset
            if self.status_buffer is not None:
                views[self.status_buffer] = status
            runners = iter(self.runners)
            for step in plan.steps:
                if isinstance(step, Segment):
                    next(runners)(table, views, status)
                    if status[0]:
                        raise ExecutionError(
                            f"node {plan.kernel_labels.get(int(status[0]), '?')}: an index input is out of range "
                            "for the dimension it indexes (stage: run)"
                        )
                else:
                    self._fallback(step, views)
            results = []
            for buffer, shape, copy in self.output_layout:
                array = views[buffer].reshape(shape)
                results.append(array.copy() if copy else array)
            return results
        finally:
            self.arenas.put(arena)

    def _fallback(self, step: Fallback, views: dict[Buffer, np.ndarray]) -> None:
        plan = self.plan
        node = step.node
        args = [
            None if v is None else views[plan.roots[v]].reshape([int(d) for d in v.type.shape]) for v in node.inputs
        ]  # type: ignore[union-attr]
        try:
            results = evaluate_node(node, args)
        except KilnError:
            raise
        except Exception as err:
            raise node_failure(node, args, err, stage="run, host fallback") from err
        for value, result in zip(node.outputs, results):
            target = views[plan.roots[value]]
            result = np.asarray(result)
            if result.dtype != target.dtype or result.size != target.size:
                raise ExecutionError(
                    f"node {node.label}: fallback produced {result.dtype}{list(result.shape)}, planned {value.type} (kiln bug)"
                )
            np.copyto(target, result.reshape(-1))
