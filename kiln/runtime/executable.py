"""Running a compiled plan: its segments through the runners its target's backend loaded, host
fallbacks on the reference implementation, one arena per concurrent request."""

from __future__ import annotations

import ctypes
import math
import queue
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from kiln.backends import Loaded, Threading
from kiln.backends import backend as backend_of
from kiln.backends.registry import HOST_CALLBACK
from kiln.errors import ExecutionError, KilnError
from kiln.ir.types import TensorType
from kiln.lower.kir import Buffer
from kiln.lower.memory import ALIGNMENT
from kiln.memory import aligned_copy, content_key, empty_aligned, same_bytes
from kiln.ops.interpreter import Interpreter, evaluate_node, node_failure
from kiln.passes.cache_in_place import cache_roles
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
        with self._lock:
            found = self._arrays.setdefault(content_key(array), [])
            for candidate in found:
                if same_bytes(candidate, array):
                    return candidate
            found.append(array)
            return array


def stored(
    buffer: Buffer, constants: dict[Buffer, np.ndarray], arena: np.ndarray, offsets: Mapping[Buffer, int]
) -> np.ndarray:
    """A weight's view, or a view of an arena buffer's bytes (KeyError: not a buffer of the plan)."""
    view = constants.get(buffer)
    if view is None:
        offset = offsets[buffer]
        view = arena[offset : offset + buffer.nbytes].view(buffer.dtype.numpy)
    return view


class _ArenaViews(dict):  # type: ignore[type-arg]
    """A run's buffer views: the given ones (inputs, fresh outputs) up front; weights from the
    executable's views and arena buffers' views made on first read (native code uses addresses
    only; fallbacks, the kir target and the outputs read views). The weights are looked up, not
    copied: a run's cost does not grow with them."""

    def __init__(
        self,
        given: dict[Buffer, np.ndarray],
        constants: dict[Buffer, np.ndarray],
        arena: np.ndarray,
        offsets: Mapping[Buffer, int],
    ) -> None:
        super().__init__(given)
        self.constants = constants
        self.arena = arena
        self.offsets = offsets

    def __missing__(self, buffer: Buffer) -> np.ndarray:
        view = self[buffer] = stored(buffer, self.constants, self.arena, self.offsets)
        return view

    def __contains__(self, buffer: object) -> bool:
        return super().__contains__(buffer) or buffer in self.constants or buffer in self.offsets

    def get(self, buffer: Buffer, default: Any = None) -> Any:  # type: ignore[override]
        return self[buffer] if buffer in self else default


def address(array: np.ndarray) -> int:
    """Where a contiguous array's data starts: through the buffer protocol (a third of
    ``array.ctypes.data``'s cost), or ``ctypes.data`` for what it refuses (read-only, empty)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):
        return int(array.ctypes.data)


LARGE_OUTPUT = 1 << 18  # bytes: outputs this large come from Recycled, smaller ones from np.empty
RECYCLED_KEEP = 64  # arrays of one size kept for reuse


class Recycled:
    """Output arrays reused once nothing but this holds them (its list is their only owner: their
    reference count says so). A decode loop's present KV cache is 10-45 MB of outputs a step; fresh
    memory each step cost a page fault per 4 KB written (2,400 a step on GPT-2 124M at past 128:
    the Concats writing the present took 4x their time). Small outputs come from ``np.empty``
    (malloc reuses those itself). Thread-safe.

    Each kept array also knows, where a caller said how much a run wrote (``written``), that it is
    zero past that: a decode step's present is then already what the next step's past is laid out
    as (``laid_in_place``: dense in the first elements of a capacity buffer, the rest zero), and
    is read where it is instead of copied."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, str], list[np.ndarray]] = {}
        self.lock = threading.Lock()
        self.unheld = [np.empty(0)]  # an array nobody else holds: what a free one's count reads
        self.upto: dict[int, int] = {}  # id(kept array) -> elements past which it is zero
        self.unknown: set[int] = set()  # kept arrays written by a run that did not say how far

    def take(self, size: int, dtype: np.dtype) -> np.ndarray:
        if size * dtype.itemsize < LARGE_OUTPUT:
            return np.empty(size, dtype)
        with self.lock:
            for alone in self.unheld:  # (counted as the candidates are: in a list, by a loop's name)
                free = sys.getrefcount(alone)
            kept = self.kept.setdefault((size, dtype.str), [])
            for array in kept:
                if sys.getrefcount(array) <= free:
                    if id(array) in self.unknown:  # its last run wrote who knows how far
                        self.upto[id(array)] = size
                    self.unknown.add(id(array))
                    return array
            array = np.zeros(size, dtype)  # (zero pages from the system: faulted in as a run writes them)
            if len(kept) < RECYCLED_KEEP:
                kept.append(array)
                self.upto[id(array)] = 0
                self.unknown.add(id(array))
            return array

    def written(self, output: np.ndarray, count: int) -> None:
        """A run wrote the first ``count`` elements of ``output`` (a view of a kept array) and
        nothing past them: what an earlier run left past them is zeroed, so it is zero there."""
        base = output if output.base is None else output.base
        with self.lock:
            upto = self.upto.get(id(base))
            if upto is None or not isinstance(base, np.ndarray):
                return
            if upto > count:
                base.reshape(-1)[count:upto] = 0
            self.upto[id(base)] = count
            self.unknown.discard(id(base))

    def laid_in_place(self, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
        """``array`` laid out densely in the first elements of ``shape``, the rest zero, without a
        copy: where it is the start of a kept array known to be zero past it (None otherwise)."""
        base, count = array.base, math.prod(shape)
        if not isinstance(base, np.ndarray) or base.dtype != array.dtype or not array.flags.c_contiguous:
            return None
        with self.lock:
            upto = self.upto.get(id(base))
            if upto is None or id(base) in self.unknown or upto > array.size or base.size < count:
                return None
        if array.__array_interface__["data"][0] != base.__array_interface__["data"][0]:
            return None
        return base.reshape(-1)[:count].reshape(shape)


class _Bound:
    """The plan's model in its C API (``kiln_model_bind`` over the weights this executable holds),
    freed when the executable and every request's context are gone (each context's finalizer
    holds this, so the model outlives them)."""

    def __init__(self, api: Any, model: int, weights: Any) -> None:
        self.api, self.model, self.weights = api, model, weights  # (the weights outlive the model)
        weakref.finalize(self, api.free_model, model)


class _Request:
    """One concurrent request's memory: its arena and the pointer table that runs read. With the
    plan's C API (the cpu target), a context of it over the arena: its table, with the weights'
    and the arena buffers' addresses written by the API, is the one the native entry reads; a call
    writes its inputs' and outputs' addresses only (a call's cost does not grow with the plan's
    buffers). An arena that grows with a run-time length is laid out by the API per length, and
    its pages are touched as far as the longest length run so far needed."""

    __slots__ = ("__weakref__", "arena", "context", "offsets", "reached", "status", "table")

    def __init__(self, executable: Executable) -> None:
        bound = executable.bound
        size = executable.arena_bytes
        self.arena = empty_aligned(size, ALIGNMENT)
        self.reached = 0  # bytes of the arena whose pages were touched
        if executable.growing is None:
            self.touch(size)
        self.offsets: np.ndarray | None = None  # a run-time length: the arena's offsets at this run's length
        if bound is not None:
            api = bound.api
            self.context = api.context(bound.model, self.arena.ctypes.data, size, executable.threads)
            weakref.finalize(self, api.free_context, self.context, bound)
            self.table = (ctypes.c_void_p * executable.slots).from_address(api.table(self.context))
            self.status = np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(self.table[0]))
            if executable.growing is not None:
                count = len(executable.growing.order)
                self.offsets = np.ctypeslib.as_array((ctypes.c_int64 * count).from_address(api.offsets(self.context)))
            return
        self.context = None  # a backend whose runners are Python: the table is this request's own
        self.status = np.zeros(1, dtype=np.int32)
        table = (ctypes.c_void_p * executable.slots)(*executable.base_table)
        table[0] = self.status.ctypes.data
        base = self.arena.ctypes.data
        for buffer, offset in executable.plan.memory.offsets.items():
            table[executable.plan.table[buffer]] = base + offset
        self.table = table

    def touch(self, size: int) -> None:
        """Every page of the arena's first ``size`` bytes faulted in now, once (a run must not pay
        the faults of memory it was given in advance)."""
        if size > self.reached:
            self.arena[self.reached : size : 4096] = 0
            self.reached = size


class _GrowingOffsets(Mapping):  # type: ignore[type-arg]
    """A run-time length's arena offsets by buffer, read from the request's context (the API laid
    the arena out for the run's length)."""

    def __init__(self, index: dict[Buffer, int], offsets: np.ndarray) -> None:
        self.index, self.offsets = index, offsets

    def __getitem__(self, buffer: Buffer) -> int:
        return int(self.offsets[self.index[buffer]])

    def __contains__(self, buffer: object) -> bool:
        return buffer in self.index

    def __iter__(self) -> Iterator[Buffer]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


class Executable:
    """A compiled plan plus what running it needs: loaded functions, weights, an arena pool. A
    backend whose code has kiln's C API (``Loaded.api``) runs the whole plan in one native call,
    the host fallbacks called back from it; others run segment by segment from here."""

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
        self.native = plan.is_native  # no host fallback: what the driver asks of every run
        self.keep = keep  # positions of the inputs the plan takes (others were frozen)
        # one runner per native segment, from the backend of the target the plan was built for
        loaded = (
            backend_of(plan.target.backend).load(plan, plan.target, parallelism or Threading())
            if plan.target is not None
            else Loaded([])
        )
        self.runners = loaded.segments
        self.api = loaded.api
        self.threads = (parallelism or Threading()).threads  # its runs' own (the library may be another model's too)
        self.status_buffer = next((b for b, slot in plan.table.items() if slot == 0), None)
        self.interpreter = Interpreter(plan.graph) if plan.whole_graph_reason else None
        self.requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self.recycled = Recycled()  # the fresh outputs' memory, reused once the caller let go of it
        self.slots = len(plan.table)
        # What every request shares, computed once: weight views and their slots in the table,
        # the outputs' shapes and which of them must be copied out of memory they don't own.
        # every weight 64-byte aligned: the engine loads packed panels with aligned vector loads,
        # and small arrays unpickled from the plan cache come back only 16-byte aligned
        self.constant_views = {
            buffer: (view if view.ctypes.data % ALIGNMENT == 0 else aligned_copy(view, ALIGNMENT))
            for buffer, view in ((b, a.reshape(-1)) for b, a in plan.constants.items())
        }
        self.base_table: list[int | None] = [None] * self.slots
        for buffer, view in self.constant_views.items():
            self.base_table[plan.table[buffer]] = view.ctypes.data
        self._bind_api(plan)
        self.input_slots = [(buffer, plan.table[buffer]) for buffer in plan.inputs]
        # outputs no input, weight or arena buffer holds: a fresh array per call
        self.fresh_outputs = list(
            dict.fromkeys(
                b
                for b in plan.outputs
                if b not in self.constant_views and b not in plan.memory.offsets and b not in plan.inputs
            )
        )
        shared = set(plan.memory.offsets) | set(plan.constants) | set(plan.inputs)
        # a KV cache updated in place (kiln.passes.cache_in_place): input position -> the shape it is
        # laid out at, output position -> the input whose buffer holds it (given back, never copied:
        # the caller lays those inputs out, kiln.driver.laid.LaidInputs)
        self.boxed, self.updates = cache_roles(plan.graph)
        self.output_layout = [
            (
                buffer,
                [int(d) for d in value.type.shape]
                if isinstance(value.type, TensorType) and value.type.shape is not None
                else [],
                buffer in shared and position not in self.updates,
            )
            for position, (value, buffer) in enumerate(zip(plan.graph.outputs, plan.outputs))
        ]
        # the fallbacks between native segments, by gap (gap i: before segment i; the last: after all)
        self.gaps: list[list[Fallback]] = [[]]
        for step in plan.steps:
            if isinstance(step, Segment):
                self.gaps.append([])
            else:
                self.gaps[-1].append(step)
        self.current = threading.local()  # the views of the run a host callback serves
        # no fallbacks: a null callback, which the entry never calls
        self.host = HOST_CALLBACK(self._host) if self.api is not None and plan.fallbacks else HOST_CALLBACK()
        self._prepare_first_request()

    def _bind_api(self, plan: Plan) -> None:
        """The plan's model in its C API, over these weights (one per executable; a context per
        request); an arena that grows with a run-time length is laid out per length by the API."""
        self.bound = _Bound(self.api, self.api.bind(self.base_table), self.constant_views) if self.api else None
        self.growing = plan.memory.growing
        self.arena_bytes = int(plan.memory.arena_bytes)
        if self.growing is not None:
            if self.bound is None:
                raise ExecutionError("a plan with a run-time length runs only through kiln's C API (kiln bug)")
            self.arena_bytes = self.bound.api.workspace(self.bound.model)
            self.growing_index = {buffer: i for i, buffer in enumerate(self.growing.order)}
            self.valid_position = plan.inputs.index(self.growing.valid)
            self.touched: dict[int, int] = {}  # length -> the arena's bytes a run at it reaches

    def _prepare_first_request(self) -> None:
        """The first request's memory made (and its pages faulted in) now, not in the first run (an
        arena that grows with a run-time length is touched as lengths come)."""
        if (self.api is not None or self.runners) and self.growing is None:
            try:
                self.requests.put(_Request(self))
            except MemoryError:  # the first run says so, as it did before
                pass

    def _request(self) -> _Request:
        try:
            return self.requests.get_nowait()
        except queue.Empty:
            return _Request(self)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.keep is not None:
            inputs = [inputs[i] for i in self.keep]
        if self.interpreter is not None:
            return self.interpreter.run(inputs)
        request = self._request()
        try:
            length = self._length(request, inputs)
            given = self._bind(request, inputs)
            request.status[0] = 0
            if self.api is not None:
                self._api_run(request, given, length)
            else:
                self._segment_run(request, given)
            offsets = self._offsets(request)
            results = []  # (runners and fallbacks write in place: the outputs are where they were bound)
            for buffer, shape, copy in self.output_layout:
                array = given.get(buffer)
                if array is None:
                    array = stored(buffer, self.constant_views, request.arena, offsets)
                array = array.reshape(shape)
                results.append(array.copy() if copy else array)
            return results
        finally:
            self.requests.put(request)

    def _length(self, request: _Request, inputs: list[np.ndarray]) -> int:
        """A run-time length's value for this call (the arena's pages it reaches touched); 0 for
        a plan without one."""
        if self.growing is None:
            return 0
        length = int(np.asarray(inputs[self.valid_position]).reshape(-1)[0])
        reached = self.touched.get(length)
        if reached is None:
            assert self.bound is not None
            if len(self.touched) >= 4096:
                self.touched.clear()
            reached = self.touched[length] = self.bound.api.workspace(self.bound.model, length)
        request.touch(reached)
        return length

    def _offsets(self, request: _Request) -> Mapping[Buffer, int]:
        """The arena's offsets of this request's run."""
        if request.offsets is None:
            return self.plan.memory.offsets
        return _GrowingOffsets(self.growing_index, request.offsets)

    def native_seconds(self, inputs: list[np.ndarray], calls: int) -> float:
        """Mean seconds of the native entry alone over ``calls`` calls on ``inputs`` (no Python
        around it: what a run costs beyond its checks and tables). Plans without the C API, or
        with host fallbacks, are refused with ValueError."""
        if self.api is None or self.host or self.interpreter is not None:
            raise ValueError("only a plan with a native entry and no host fallback runs natively alone")
        if self.keep is not None:
            inputs = [inputs[i] for i in self.keep]
        request = self._request()
        try:
            length = self._length(request, inputs)
            _alive = self._bind(request, inputs)  # the arrays the table points at, alive while timed
            run, context = self.api.run, request.context
            start = time.perf_counter()
            for _ in range(calls):
                run(context, length, self.host)
            return (time.perf_counter() - start) / max(calls, 1)
        finally:
            self.requests.put(request)

    def _bind(self, request: _Request, inputs: list[np.ndarray]) -> dict[Buffer, np.ndarray]:
        """The request's table pointed at this call's inputs and fresh outputs; returns them by
        buffer (the caller keeps them alive while native code runs)."""
        table = request.table
        given: dict[Buffer, np.ndarray] = {}
        for (buffer, slot), array in zip(self.input_slots, inputs):
            array = given[buffer] = np.ascontiguousarray(array).reshape(-1)
            table[slot] = address(array)
        for buffer in self.fresh_outputs:
            array = given[buffer] = self.recycled.take(buffer.size, np.dtype(buffer.dtype.numpy))
            table[self.plan.table[buffer]] = address(array)
        return given

    def _views(self, request: _Request, given: dict[Buffer, np.ndarray]) -> _ArenaViews:
        views = _ArenaViews(given, self.constant_views, request.arena, self._offsets(request))
        if self.status_buffer is not None:
            views[self.status_buffer] = request.status
        return views

    def _api_run(self, request: _Request, given: dict[Buffer, np.ndarray], length: int) -> None:
        """The whole plan in one native call through the C API; the fallbacks called back from it
        (only they read views: a plan without them makes none)."""
        self.current.views = self._views(request, given) if self.host else None
        self.current.error = None
        try:
            code = self.api.run(request.context, length, self.host)
        finally:
            error, self.current.views, self.current.error = self.current.error, None, None
        if code != 0:
            if request.status[0]:
                self._status_error(request.status)
            if error is not None:
                raise error
            raise ExecutionError(f"the native entry failed: {self.api.last_error()} (kiln bug)")

    def _host(self, gap: int) -> int:
        """Called from the native entry before segment ``gap``: runs the fallbacks there. An error
        is kept for the run to raise (it cannot cross the C frames) and stops the entry."""
        try:
            for step in self.gaps[gap]:
                self._fallback(step, self.current.views)
            return 0
        except BaseException as err:
            self.current.error = err
            return 1

    def _segment_run(self, request: _Request, given: dict[Buffer, np.ndarray]) -> None:
        """Segment by segment from Python: backends whose runners are Python (gpu, test targets)."""
        views = self._views(request, given)
        runners = iter(self.runners)
        for step in self.plan.steps:
            if isinstance(step, Segment):
                next(runners)(request.table, views, request.status)
                if request.status[0]:
                    self._status_error(request.status)
            else:
                self._fallback(step, views)

    def _status_error(self, status: np.ndarray) -> None:
        raise ExecutionError(
            f"node {self.plan.kernel_labels.get(int(status[0]), '?')}: an index input is out of range "
            "for the dimension it indexes (stage: run)"
        )

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
