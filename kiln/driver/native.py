"""The ``cpu`` target's model: native code for every node that has a lowering, host fallbacks for
the rest, one specialization per binding of the model's symbolic input dims."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.backends import Threading
from kiln.driver import plan_cache
from kiln.driver.artifact import save
from kiln.driver.options import CompileOptions
from kiln.driver.pipeline import compile_plan, resolve_target
from kiln.errors import (
    ArgumentError,
    CompilerError,
    ExecutionError,
    InternalError,
    KilnError,
    ResourceError,
    ShapeInferenceError,
)
from kiln.ir.graph import Graph
from kiln.ir.types import TensorType
from kiln.lower.target import Target
from kiln.passes import specialize
from kiln.passes.specialize import input_dims
from kiln.runtime.executable import Executable, WeightStore
from kiln.runtime.model import Model
from kiln.runtime.plan import Plan

log = logging.getLogger("kiln")

WORTH_CACHING_S = 0.5  # a plan is stored when compiling it took this long...
WORTH_CACHING_BYTES = 1 << 20  # ...or the model's weights are this big
SMALL_INPUT = 16  # elements: inputs this small may be frozen when shapes depend on their values
VALUE_VARIANTS = 16  # at most this many value specializations per model, then the reference
MAX_VARIANTS = 16  # compiled bindings of the symbolic dims kept at once (KILN_MAX_VARIANTS)
MAX_VARIANT_MB = 2048  # and the arenas they may hold together (KILN_MAX_VARIANT_MB)


def freeze_inputs(graph: Graph, values: dict[str, np.ndarray]) -> Graph:
    """``graph`` with the named inputs turned into constants of the given values."""
    frozen = {v: np.asarray(values[v.name]) for v in graph.inputs if v.name in values}
    return graph.with_(inputs=[v for v in graph.inputs if v not in frozen], constants={**graph.constants, **frozen})


def _limit(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        return default


def _note(err: BaseException, prefix: str) -> str:
    """The text of the first note compilation attached to ``err`` under ``prefix`` ('' if none)."""
    return next((n.removeprefix(prefix) for n in getattr(err, "__notes__", []) if n.startswith(prefix)), "")


class NativeModel(Model):
    """A model compiled for a registered target (``cpu`` by default). Symbolic input dims are
    bound at run time; each new binding compiles once (builds are cached on disk across
    processes)."""

    target = "cpu"

    def __init__(
        self,
        graph: Graph | None,
        options: CompileOptions | None = None,
        dims: dict[str, int] | None = None,
        prebuilt: dict | None = None,
        compile_now: bool = True,
        source_file: tuple[str, str] | None = None,
        cache_key: str | None = None,
        max_variants: int | None = None,
        max_variant_bytes: int | None = None,
        signature: Graph | None = None,
        graph_loader: Callable[[], tuple[Graph, bool]] | None = None,
        target: Target | str | None = None,
        parallelism: Threading | None = None,
        streams: int | None = None,
        ahead: list[dict[str, int]] | None = None,
    ) -> None:
        super().__init__(graph, signature, streams)
        self.parallelism = parallelism or Threading()  # how its parallel loops run (kiln's pool)
        self.accuracy: Any = None  # reduced precision: the AccuracyReport against fp32 (kiln.quantize)
        # a loaded artifact's bindings compiled ahead (its libraries came with it); None otherwise
        self.ahead = ahead
        self.compiled_for = resolve_target(target)  # what the code is for (cpu:avx2 on an AVX-512 machine...)
        self.target = self.compiled_for.name
        self.options = options or CompileOptions.from_env()
        # a model compiled before may start from its signature alone: the source graph (all the
        # weights) is loaded only when a new binding must compile (``graph_loader``)
        self._graph_loader = graph_loader
        self.prebuilt = prebuilt or {}
        # (path, SHA-256 of its bytes when imported) of an ONNX file the plan cache may remember
        self.source_file = source_file
        self._cache_key = cache_key
        # compiled variants, least recently used first; at most max_variants of them, and past
        # max_variant_bytes of arenas the oldest go (a variant comes back by compiling or from the
        # plan cache). Weights are shared by all of them (WeightStore).
        self._variants: OrderedDict[tuple, Executable] = OrderedDict()
        self.max_variants = max_variants or _limit("KILN_MAX_VARIANTS", MAX_VARIANTS)
        self.max_variant_bytes = max_variant_bytes or _limit("KILN_MAX_VARIANT_MB", MAX_VARIANT_MB) << 20
        self.weights = WeightStore()
        self.evicted = 0
        self.value_variants = 0  # compiled for small inputs' values (bounded: VALUE_VARIANTS)
        self._ran: dict[int, Executable] = {}  # the variants that have executed requests
        self._lock = threading.Lock()  # guards the variant table
        self._compiling = threading.Lock()  # one compile at a time
        self._graph_lock = threading.Lock()  # one load of the source graph
        static_inputs = all(isinstance(v.type, TensorType) and v.type.is_static for v in self.signature.inputs)
        if dims is not None:
            dims = check_dims(dims, self.signature)
        if compile_now and (dims is not None or static_inputs):
            self._variant(dict(dims or {}))  # compile ahead of the first run when shapes are known

    def _variant(self, dims: dict[str, int]) -> Executable:
        key = tuple(sorted(dims.items()))
        with self._lock:
            executable = self._variants.get(key)
            if executable is not None:
                self._variants.move_to_end(key)
                return executable
        with self._compiling:
            with self._lock:
                executable = self._variants.get(key)
            if executable is None:
                executable = Executable(self._plan(dims), weights=self.weights, parallelism=self.parallelism)
                self._remember(key, executable)
        return executable

    def _remember(self, key: tuple, executable: Executable) -> None:
        """Add a variant, then evict the least recently used past the count and byte bounds."""
        with self._lock:
            self._variants[key] = executable
            self._variants.move_to_end(key)
            while len(self._variants) > 1 and (
                len(self._variants) > self.max_variants
                or sum(e.plan.memory.arena_bytes for e in self._variants.values()) > self.max_variant_bytes
            ):
                _, old = self._variants.popitem(last=False)
                self._ran.pop(id(old), None)
                self.evicted += 1

    @property
    def cache_key(self) -> str:
        if self._cache_key is None:
            self._cache_key = plan_cache.entry_key(self.graph.digest, self.options, self.compiled_for)
        return self._cache_key

    def _plan(self, dims: dict[str, int]) -> Plan:
        """The plan for ``dims``: from the plan cache, else compiled (and stored when compiling took
        long enough to be worth the disk: big weights or seconds of work)."""
        if not (self.options.plan_cache and plan_cache.enabled()):
            return self._compile(dims)
        plan = plan_cache.load_plan(self.cache_key, dims)
        if plan is not None:
            return plan
        start = time.perf_counter()
        plan = self._compile(dims)
        weights = sum(a.nbytes for a in self.graph.constants.values())
        if time.perf_counter() - start >= WORTH_CACHING_S or weights >= WORTH_CACHING_BYTES:
            plan_cache.in_background(self._store, dims, plan)
        return plan

    def _compile(self, dims: dict[str, int]) -> Plan:
        """compile_plan; an error that is not a KilnError is a kiln bug: it becomes an
        InternalError naming the stage, with a reproducer written to disk."""
        if self.ahead is not None and dims not in self.ahead:
            log.warning(
                "compiling %s for dims %s: the artifact has code for %s only", self.target, dims, self.ahead or "none"
            )
        try:
            return compile_plan(specialize(self.graph, dims), self.compiled_for, self.options, prebuilt=self.prebuilt)
        except CompilerError as err:
            if self.ahead is not None and "no C compiler" in str(err):
                raise CompilerError(
                    f"this model has no compiled code for dims {dims} (the artifact has {self.ahead or 'none'}) and "
                    f"there is no C compiler to build it: {err}. Compile the artifact with these sizes "
                    "(kiln compile --dim NAME=1,8,...) or install a C compiler"
                ) from None
            raise
        except KilnError:
            raise
        except MemoryError as err:
            raise ResourceError(f"out of memory while compiling for dims {dims}: {err}") from None
        except Exception as err:
            from kiln.driver import repro

            stage = _note(err, "kiln stage: ") or "compile"
            try:
                path: object = repro.write(self.graph, self.options, dims, err, stage, self.compiled_for)
                hint = f"a reproducer is in {path}; replay it with: python -m kiln.driver.repro {path}"
            except Exception as write_error:  # never hide the original error
                hint = f"(writing a reproducer failed too: {write_error})"
            node = _note(err, "kiln node: ")
            where = f" of node {node}" if node else ""
            raise InternalError(f"kiln bug during {stage}{where}: {type(err).__name__}: {err}\n{hint}") from err

    def _store(self, dims: dict[str, int], plan: Plan) -> None:
        plan_cache.store_plan(self.cache_key, dims, plan)
        if self.source_file is not None:
            plan_cache.store_graph(self.cache_key, self.graph)
            plan_cache.remember_file(*self.source_file, self.cache_key, self.options, self.compiled_for)

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            with self._graph_lock:
                if self._graph is None:
                    assert self._graph_loader is not None
                    graph, cached = self._graph_loader()
                    if not cached:  # imported again (the cached copy was damaged): key it by itself,
                        self._cache_key = None  # and the file may have changed: do not remember it
                        self.source_file = None
                    self._graph = graph
        return self._graph

    def derive(self, graph: Graph) -> NativeModel:
        return NativeModel(
            graph,
            self.options,
            max_variants=self.max_variants,
            target=self.compiled_for,
            parallelism=self.parallelism,
            streams=self.streams,
        )

    def prepare(self, feeds: dict[str, Any]) -> None:
        """Compile the variant these inputs need now, instead of on the first run."""
        self._variant(input_dims(self.signature, feeds))

    def prepare_dims(self, dims: dict[str, int]) -> None:
        """Compile the variant for this binding of the symbolic dims now (``save`` keeps it)."""
        self._variant(check_dims(dims, self.signature))

    def _execute(self, inputs: list[Any]) -> list[Any]:
        dims = input_dims(self.signature, dict(zip(self.input_names, inputs)))
        executable = self._variant(dims)
        if not executable.plan.is_native:
            # Shapes or attributes that depend on small inputs' values: specialize on them.
            candidate = self._value_variant(dims, inputs)
            if candidate is not None and (candidate.plan.is_native or not candidate.plan.whole_graph_reason):
                executable = candidate
        self._ran.setdefault(id(executable), executable)
        return executable.run(inputs)

    def _value_variant(self, dims: dict[str, int], inputs: list[Any]) -> Executable | None:
        """Shapes that depend on small inputs' values: compile for these values (bounded)."""
        small = {
            name: np.asarray(array)
            for name, array in zip(self.input_names, inputs)
            if isinstance(array, np.ndarray) and array.size <= SMALL_INPUT and array.dtype.kind in "iub"
        }
        if not small:
            return None
        key = (*sorted(dims.items()), *((n, a.dtype.str, a.shape, a.tobytes()) for n, a in sorted(small.items())))
        with self._lock:
            executable = self._variants.get(key)
        if executable is None:
            with self._compiling:
                if self.value_variants >= VALUE_VARIANTS:
                    return None
                keep = [i for i, name in enumerate(self.input_names) if name not in small]
                try:
                    graph = freeze_inputs(specialize(self.graph, dims), small)
                    plan = compile_plan(graph, self.compiled_for, self.options)
                except ShapeInferenceError as err:  # these inputs' values make no valid shape: the run's error
                    raise ExecutionError(str(err)) from None
                executable = Executable(plan, keep, self.weights, self.parallelism)
                self.value_variants += 1
                self._remember(key, executable)
        return executable

    @property
    def precision(self) -> str:
        """What matrix products and convolutions compute in (``fp32`` or ``bf16``; ``auto`` was
        resolved when the model compiled)."""
        return self.options.precision

    @property
    def plans(self) -> list[Plan]:
        with self._lock:
            return [v.plan for v in self._variants.values()]

    @property
    def is_native(self) -> bool | None:
        """True when every variant that has run (or, before any run, every compiled variant) ran
        with no host fallback; None before anything compiled."""
        plans = [e.plan for e in self._ran.values()] or self.plans
        return None if not plans else all(p.is_native for p in plans)

    def save(self, path: str) -> Any:
        """Write a ``.kiln`` artifact (IR, weights, native libraries); ``kiln.load`` reads it."""
        return save(self, path)


MAX_DIM = (1 << 31) - 1  # a bound dim: far past any tensor a machine holds, far below index overflow


def check_dims(dims: Any, signature: Graph) -> dict[str, int]:
    """``dims`` as a binding of ``signature``'s symbolic input dims: names it has, sizes that are
    integers in 0..MAX_DIM. Raises ArgumentError naming the first that is not."""
    if not isinstance(dims, dict):
        raise ArgumentError(f"dims must be a dict of symbolic dim name -> size, got {type(dims).__name__}")
    symbols = sorted({d for v in signature.inputs for d in getattr(v.type, "shape", None) or () if isinstance(d, str)})
    checked: dict[str, int] = {}
    for name, size in dims.items():
        if not isinstance(name, str) or name not in symbols:
            raise ArgumentError(
                f"dims: {name!r} is not a symbolic input dim of this model (its dims: {', '.join(symbols) or 'none'})"
            )
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 <= int(size) <= MAX_DIM:
            raise ArgumentError(f"dims: {name}={size!r} is not a size (an integer in 0..{MAX_DIM})")
        checked[name] = int(size)
    return checked
