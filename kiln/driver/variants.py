"""How each binding of a model's symbolic dims becomes a plan (``Compilation``), and the compiled
variants a model keeps (``Variants``: least recently used first, bounded by count and arena bytes).

The driver compiles here and hands the runtime finished plans (``kiln.runtime.executable``); the
runtime never compiles. Plans come from the plan cache when an earlier process compiled them, a
compile that fails of a kiln bug writes a reproducer (``kiln.driver.repro``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.driver import extents, plan_cache, spatial
from kiln.driver.dims_vector import shapes_only
from kiln.driver.options import CompileOptions
from kiln.driver.pipeline import compile_plan
from kiln.errors import CompilerError, ExecutionError, InternalError, KilnError, ResourceError, ShapeInferenceError
from kiln.ir.graph import Graph
from kiln.lower.target import Target
from kiln.memory import return_freed
from kiln.passes import specialize
from kiln.runtime.executable import Executable
from kiln.runtime.plan import Plan

log = logging.getLogger("kiln")
_COMPILED = [0]  # plans compiled by this process (not read from the plan cache)


def plans_compiled() -> int:
    """How many plans this process has compiled so far (a benchmark's "compiles during run")."""
    return _COMPILED[0]


WORTH_CACHING_S = 0.5  # a plan is stored when compiling it took this long...
WORTH_CACHING_BYTES = 1 << 20  # ...or the model's weights are this big
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


@dataclass
class Source:
    """Where a model's graph comes from. A model compiled before may start from its signature
    alone: the source graph (all the weights) is loaded only when a new binding must compile."""

    graph: Graph | None
    signature: Graph | None = None  # inputs and outputs (default: the graph's)
    loader: Callable[[], tuple[Graph, bool]] | None = None  # -> (graph, came from the plan cache)
    file: tuple[str, str] | None = None  # (path, SHA-256 when imported) of an ONNX file the cache may remember
    cache_key: str | None = None
    # the next compile takes the graph and lets go of its weights as it packs them (``loader``
    # reads it again if another binding must compile): a loaded artifact's last variant
    consume: bool = False


class Compilation:
    """Compiles bindings of one model's symbolic dims for one target with one set of options."""

    def __init__(
        self,
        source: Source,
        target: Target,
        options: CompileOptions,
        prebuilt: dict[str, tuple[Path, ...]] | None = None,
        ahead: list[dict[str, int]] | None = None,
    ) -> None:
        self.source = source
        self.signature = source.signature if source.signature is not None else source.graph
        assert self.signature is not None
        self.target = target  # what the code is for (cpu:avx2 on an AVX-512 machine...)
        self.options = options
        self.prebuilt = prebuilt or {}  # source key -> the build products a loaded artifact brought
        self.ahead = ahead  # a loaded artifact's bindings compiled ahead; None otherwise
        # the capacity's binding compiles with kernels that take the length at run time
        self.extents: extents.RunTimeLength | None = None
        # the capacity's binding compiles with kernels that take the ranged dims at run time
        self.spatial: spatial.RunTimeDims | None = None
        self._graph_lock = threading.Lock()
        self._shapes: Graph | None = None  # the released graph's weightless copy (shapes_graph)

    @property
    def graph(self) -> Graph:
        if self.source.graph is None:
            with self._graph_lock:
                if self.source.graph is None:
                    assert self.source.loader is not None
                    graph, cached = self.source.loader()
                    if not cached:  # imported again (the cached copy was damaged): key it by itself,
                        self.source.cache_key = None  # and the file may have changed: do not remember it
                        self.source.file = None
                    self.source.graph = graph
        return self.source.graph

    def _hand_over(self) -> Graph:
        """The source graph for a compile; the compile's own (no longer held here) when it may be
        consumed: its weights are then freed as their packed copies are made."""
        graph = self.graph
        if self.source.consume and self.source.loader is not None:
            with self._graph_lock:
                self.source.graph, self.source.consume = None, False
        return graph

    def release(self, loader: Callable[[], tuple[Graph, bool]]) -> None:
        """Let go of the source graph (every weight) once the bindings asked for are compiled:
        ``loader`` brings it back if another must compile. The signature stays, and the graph
        for shapes without its weights (``shapes_graph``)."""
        with self._graph_lock:
            if self.source.graph is not None:
                self._shapes = shapes_only(self.source.graph)
                self.signature = self.source.signature = self.signature.signature()
                self.source.loader, self.source.graph = loader, None

    @property
    def shapes_graph(self) -> Graph:
        """The source graph for computing shapes: the graph itself while it is held, else its
        weightless copy kept when it was let go (``dims_vector.shapes_only``), else read again."""
        if self.source.graph is None and self._shapes is not None:
            return self._shapes
        return self.graph

    @property
    def cache_key(self) -> str:
        if self.source.cache_key is None:
            graph = self.graph
            # the digest ignores names; an entry's source graph and signature are read back by
            # models of the same file or graph, so the names a caller feeds are part of its key
            names = [[v.name for v in values] for values in (graph.inputs, graph.outputs, graph.defaults)]
            digest = f"{graph.digest}/names {names}"
            if self.extents is not None:  # another program than the lengths' own: its own entry
                digest = f"{digest}/run-time {self.extents.symbol} {self.extents.lengths}"
            if self.spatial is not None:
                digest = f"{digest}/run-time dims {self.spatial.ranged} {self.spatial.samples}"
            self.source.cache_key = plan_cache.entry_key(digest, self.options, self.target)
        return self.source.cache_key

    def plan(self, dims: dict[str, int]) -> Plan:
        """The plan for ``dims``: from the plan cache, else compiled (and stored when compiling took
        long enough to be worth the disk: big weights or seconds of work)."""
        if not (self.options.plan_cache and plan_cache.enabled()):
            return self.compile(dims)
        key = self.cache_key
        if self.source.consume and self.source.loader is not None and plan_cache.has_plan(key, dims):
            # a loaded artifact's last binding is in the cache: its weights will be the plan's packed
            # ones, so the source graph's go before the plan's are mapped (read again if it is damaged)
            self._hand_over()
            return_freed()
        plan = plan_cache.load_plan(key, dims)
        if plan is not None:
            return plan
        start = time.perf_counter()
        weights = self.graph.constant_bytes()
        plan = self.compile(dims)
        if time.perf_counter() - start >= WORTH_CACHING_S or weights >= WORTH_CACHING_BYTES:
            plan_cache.in_background(self._store, dims, plan)
        return plan

    def compile(self, dims: dict[str, int]) -> Plan:
        """compile_plan; an error that is not a KilnError is a kiln bug: it becomes an
        InternalError naming the stage, with a reproducer written to disk."""
        _COMPILED[0] += 1
        if self.ahead is not None and dims not in self.ahead:
            log.warning(
                "compiling %s for dims %s: the artifact has code for %s only",
                self.target.name,
                dims,
                self.ahead or "none",
            )
        try:
            route = self.spatial
            if route is not None and all(dims.get(k) == v for k, v in route.capacity.items()):
                bound = {k: v for k, v in dims.items() if k not in route.capacity}
                return spatial.compile_with_run_time_dims(
                    self.graph, bound, route, self.target, self.options, self.prebuilt
                )
            length = self.extents
            if length is not None and dims.get(length.symbol) == length.lengths[0]:
                bound = {k: v for k, v in dims.items() if k != length.symbol}
                return extents.compile_with_run_time_length(
                    self.graph, bound, length, self.target, self.options, self.prebuilt
                )
            return compile_plan(
                self._hand_over(), self.target, self.options, prebuilt=self.prebuilt, dims=dims, first="specialize"
            )
        except CompilerError as err:
            if self.ahead is not None and "no C compiler" in str(err):
                raise CompilerError(
                    f"this model has no compiled code for dims {dims} (the artifact has {self.ahead or 'none'}) and "
                    f"there is no C compiler to build it: {err}. Compile the artifact with these sizes "
                    "(kiln compile --dim NAME=1,8,...) or install a C compiler"
                ) from None
            raise
        except KilnError as err:
            raise _at_binding(err, dims) from None
        except extents.NotAffine:
            raise
        except MemoryError as err:
            raise ResourceError(f"out of memory while compiling for dims {dims}: {err}") from None
        except Exception as err:
            raise self._bug(err, dims) from err

    def value_plan(self, dims: dict[str, int], values: dict[str, np.ndarray]) -> Plan:
        """The plan for ``dims`` with the small inputs ``values`` frozen as constants (shapes that
        depend on them become static); these values' shape error is the run's ExecutionError."""
        try:
            return compile_plan(freeze_inputs(specialize(self.graph, dims), values), self.target, self.options)
        except ShapeInferenceError as err:
            raise ExecutionError(str(err)) from None

    def _bug(self, err: Exception, dims: dict[str, int]) -> InternalError:
        from kiln.driver import repro

        stage = _note(err, "kiln stage: ") or "compile"
        try:
            path: object = repro.write(self.graph, self.options, dims, err, stage, self.target)
            hint = f"a reproducer is in {path}; replay it with: python -m kiln.driver.repro {path}"
        except Exception as write_error:  # never hide the original error
            hint = f"(writing a reproducer failed too: {write_error})"
        node = _note(err, "kiln node: ")
        where = f" of node {node}" if node else ""
        return InternalError(f"kiln bug during {stage}{where}: {type(err).__name__}: {err}\n{hint}")

    def _store(self, dims: dict[str, int], plan: Plan) -> None:
        plan_cache.store_plan(self.cache_key, dims, plan)
        if self.source.file is not None:
            plan_cache.store_graph(self.cache_key, self.graph)
            plan_cache.remember_file(*self.source.file, self.cache_key, self.options, self.target)


def _at_binding(err: KilnError, dims: dict[str, int]) -> KilnError:
    """``err`` naming the binding it came from (one size of a model may fail where others run:
    mBART's export at batch 1), unless its message already does."""
    where = ", ".join(f"{name}={size}" for name, size in sorted(dims.items()))
    if where and err.args and isinstance(err.args[0], str) and where not in err.args[0]:
        err.args = (f"{err.args[0]} (compiling for {where})", *err.args[1:])
    return err


@dataclass(frozen=True)
class Limits:
    """At most ``count`` compiled variants kept, their arenas at most ``arena_bytes`` together
    (past either, the least recently used go; a variant comes back from the plan cache)."""

    count: int = 0  # 0: KILN_MAX_VARIANTS, else MAX_VARIANTS
    arena_bytes: int = 0  # 0: KILN_MAX_VARIANT_MB, else MAX_VARIANT_MB

    def resolved(self) -> Limits:
        return Limits(
            self.count or _limit("KILN_MAX_VARIANTS", MAX_VARIANTS),
            self.arena_bytes or _limit("KILN_MAX_VARIANT_MB", MAX_VARIANT_MB) << 20,
        )


class Variants:
    """A model's compiled variants by key, least recently used first, within ``limits``."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits.resolved()
        self._table: OrderedDict[tuple, Executable] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted = 0

    def get(self, key: tuple) -> Executable | None:
        with self._lock:
            executable = self._table.get(key)
            if executable is not None:
                self._table.move_to_end(key)
            return executable

    def add(self, key: tuple, executable: Executable) -> list[Executable]:
        """Keep ``executable`` under ``key``; returns the variants evicted to stay within bounds."""
        gone = []
        with self._lock:
            self._table[key] = executable
            self._table.move_to_end(key)
            while len(self._table) > 1 and (
                len(self._table) > self.limits.count
                or sum(e.plan.memory.arena_bytes for e in self._table.values()) > self.limits.arena_bytes
            ):
                gone.append(self._table.popitem(last=False)[1])
                self.evicted += 1
        return gone

    def items(self) -> Iterator[tuple[tuple, Executable]]:
        with self._lock:
            return iter(list(self._table.items()))

    def __len__(self) -> int:
        return len(self._table)
