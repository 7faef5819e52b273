"""The ``cpu`` target's model (and every compiling target's): native code for every node that has
a lowering, host fallbacks for the rest, one specialization per binding of the model's symbolic
input dims. What runs is decided here; compiling is ``kiln.driver.variants``' business, running a
plan the runtime's (``kiln.runtime.executable``)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
from typing import Any

import numpy as np

from kiln.backends import Threading, backend
from kiln.driver import extents, laid, plan_cache, routes, spatial
from kiln.driver.artifact import save
from kiln.driver.model import Model
from kiln.driver.ragged import Ragged
from kiln.driver.sizes import (
    MAX_CLASS,
    MAX_DIM,
    Chunking,
    Padder,
    check_capacity,
    check_dims,
    declared_ranges,
    default_classes,
    padded_classes,
    parse_classes,
    parse_padded_classes,
    parse_range,
)
from kiln.driver.variants import Compilation, Limits, Source, Variants
from kiln.errors import ArgumentError, InputError, KilnError
from kiln.ir.graph import Graph
from kiln.ir.types import TensorType
from kiln.memory import return_freed
from kiln.passes.batching import Parallel, sample_parallel, symbols
from kiln.passes.padding import Padding, pad, paddable
from kiln.passes.specialize import bind_type, input_dims, specialize
from kiln.runtime.executable import Executable, WeightStore
from kiln.runtime.plan import Plan

log = logging.getLogger("kiln")

SMALL_INPUT = 16  # elements: inputs this small may be frozen when shapes depend on their values
VALUE_VARIANTS = 16  # at most this many value specializations per model, then the reference
VECTORS = 4096  # bindings whose dims vector and shapes are remembered (a binding costs milliseconds)


class NativeModel(Model):
    """A model compiled for a registered target (``cpu`` by default). Symbolic input dims are
    bound at run time; each new binding compiles once (builds are cached on disk across
    processes)."""

    target = "cpu"

    def __init__(
        self,
        compilation: Compilation,
        parallelism: Threading | None = None,
        streams: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        super().__init__(None, compilation.signature, streams)  # (the graph is the compilation's)
        self.compilation = compilation
        self.parallelism = parallelism or Threading()  # how its parallel loops run (kiln's pool)
        self.accuracy: Any = None  # reduced precision: the AccuracyReport against fp32 (kiln.driver.quantize)
        self.compiled_for = compilation.target
        self.target = self.compiled_for.name
        self.options = compilation.options
        # compiled variants; weights are shared by all of them (WeightStore)
        self.variants = Variants(limits or Limits())
        self._weights: WeightStore | None = None  # made with the first variant: the runtime's, after compiling
        self.value_variants = 0  # compiled for small inputs' values (bounded: VALUE_VARIANTS)
        self._ran: dict[int, Executable] = {}  # the variants that have executed requests
        self._compiling = threading.Lock()  # one compile at a time
        self._static = self.shapes_known  # no symbolic input dim: one binding, {} (skips reading dims)
        self._last: tuple[tuple, Executable] | None = None
        self.ranges: dict[str, tuple[int, int]] = {}  # declared ranges of symbolic dims, checked every run
        self.size_classes: dict[str, tuple[int, ...]] = {}  # a sample-parallel dim's compiled sizes
        self._chunking: Chunking | bool | None = False  # False: not decided yet
        self.proven: dict[str, Parallel | Exception] | None = None  # the batching proof, where not the graph's
        self._parallel: tuple[tuple, dict] | None = None  # (the dims bound before it, the graph's proof)
        self._padder: Padder | bool | None = False  # a paddable dim's classes (False: not decided yet)
        self.padded_model: NativeModel | None = None  # the padded graph's model (runs at the classes)
        self.bound_in_analysis: dict[str, int] = {}  # dims bound before the batching analysis
        self.extent: Padder | None = None  # a padded graph whose kernels take its length at run time
        self.run_time_refused: dict[str, str] = {}  # why a dim's kernels cannot take it at run time
        # ranged dims that neither chunk nor pad, taken by the kernels at run time (kiln.driver.spatial):
        # the model of the graph with the dims vector as an input, and on it, the route
        self.dims_model: NativeModel | None = None
        self.spatial: spatial.RunTimeDims | None = None
        self._shapes: dict[tuple, tuple] = {}  # per binding run: (dims vector, inputs' laid shapes, outputs')
        self._laid = laid.LaidInputs()  # the buffers inputs are laid out in, kept between calls
        self.route: routes.Route | None = None  # how the last run was served (kiln.driver.routes)
        self.routes_taken: dict[str, int] = {}  # runs served by each route
        self._ragged: Any = None  # requests of different lengths as one batch (kiln.driver.ragged)

    @property
    def shapes_known(self) -> bool:
        """Every input's shape is static (one variant serves every run)."""
        return all(isinstance(v.type, TensorType) and v.type.is_static for v in self.signature.inputs)

    @property
    def weights(self) -> WeightStore:
        """The weights every variant shares (the runtime's store, made when the first one loads)."""
        if self._weights is None:
            self._weights = WeightStore()
        return self._weights

    @property
    def evicted(self) -> int:
        return self.variants.evicted

    @property
    def max_variants(self) -> int:
        return self.variants.limits.count

    @property
    def graph(self) -> Graph:
        return self.compilation.graph

    @property
    def cache_key(self) -> str:
        return self.compilation.cache_key

    def variant(self, dims: dict[str, int]) -> Executable:
        """The variant for ``dims``, compiled now if it is not kept (a size class or spatial capacity
        maps to its one variant)."""
        if self.extent is not None and self.extent.symbol in dims:  # one variant serves every length
            dims = {**dims, self.extent.symbol: self.extent.classes[0]}
        if self.spatial is not None:  # one variant serves every size of the ranged dims
            dims = {**dims, **self.spatial.capacity}
        key = tuple(sorted(dims.items()))
        last = self._last  # the most recently used variant: already last in the LRU order
        if last is not None and last[0] == key:
            return last[1]
        executable = self.variants.get(key)
        if executable is not None:
            self._last = (key, executable)
            return executable
        with self._compiling:
            executable = self.variants.get(key)
            if executable is None:
                plan = self.compilation.plan(dims)  # the driver's work ends here; the runtime loads it
                executable = Executable(plan, weights=self.weights, parallelism=self.parallelism)
                self._keep(key, executable)
        return executable

    def _keep(self, key: tuple, executable: Executable) -> None:
        for old in self.variants.add(key, executable):
            self._ran.pop(id(old), None)
        self._last = (key, executable)

    def derive(self, graph: Graph) -> NativeModel:
        compilation = Compilation(Source(graph), self.compiled_for, self.options)
        model = NativeModel(compilation, self.parallelism, self.streams, self.variants.limits)
        model.ranges, model.size_classes = dict(self.ranges), dict(self.size_classes)  # the same contract
        return model.compile_ahead()

    def compile_ahead(self, dims: dict[str, int] | None = None, classes: dict[str, Any] | None = None) -> NativeModel:
        """This model with the variant for ``dims`` compiled now (with no dims: the one variant,
        when every input shape is static), so the first run only runs; ``classes``: size classes
        declared with ``dims``' ranges (``declare``)."""
        ranges = declared_ranges(dims)
        if ranges or classes:  # dims={"batch": (1, 64)}: a declared range
            bound = check_dims({k: v for k, v in (dims or {}).items() if k not in ranges}, self.signature)
            return self.declare(ranges, classes, ahead=bound)
        if dims is not None:
            self.prepare_dims(dims)
        elif self.shapes_known:
            self.variant({})
        if not self._static and self.compilation.source.graph is not None:
            chunking = self.chunking()  # decided now (milliseconds on a large graph), not on the first run
            for symbol in sorted(symbols(self.signature)):
                if symbol in self.ranges:
                    continue
                how = (
                    f"any size runs from size classes {', '.join(map(str, chunking.classes))}"
                    if chunking is not None and chunking.symbol == symbol
                    else "each new size compiles on first use"
                )
                log.info("%s: no range declared (dims={%r: (LOW, HIGH)} bounds it); %s", symbol, symbol, how)
        plan_cache.wait()  # its stores written now, not behind the caller's timed or served runs
        return self

    def prepare(self, feeds: dict[str, Any]) -> None:
        """Compile the variant these inputs need now, instead of on the first run."""
        self.variant(input_dims(self.signature, feeds))

    def prepare_dims(self, dims: dict[str, int]) -> None:
        """Compile the variant for this binding of the symbolic dims now (``save`` keeps it)."""
        self.variant(check_dims(dims, self.signature))

    def prepare_many(self, bindings: list[dict[str, int]]) -> None:
        """Compile several bindings now, at once: one's C compile (a process of its own) runs
        while the next is lowered, so two size classes cost little more than one on two cores."""
        missing = [check_dims(dims, self.signature) for dims in bindings]
        missing = [dims for dims in missing if self.variants.get(tuple(sorted(dims.items()))) is None]
        workers = min(len(missing), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
        if workers < 2:
            for dims in missing:
                self.variant(dims)
            return
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="kiln-compile") as pool:
            plans = list(pool.map(self.compilation.plan, missing))
        with self._compiling:
            for dims, plan in zip(missing, plans):
                key = tuple(sorted(dims.items()))
                if self.variants.get(key) is None:
                    self._keep(key, Executable(plan, weights=self.weights, parallelism=self.parallelism))

    def executables(self) -> list[Executable]:
        """The compiled variants kept now (least recently used first; a padded dim's, or the
        run-time dims', after)."""
        own = [executable for _, executable in self.variants.items()]
        derived = [m for m in (self.padded_model, self.dims_model) if m is not None]
        return own + [executable for model in derived for executable in model.executables()]

    def bindings(self) -> list[tuple[dict[str, int], Plan]]:
        """(dims, plan) of each kept variant compiled for a binding of the symbolic dims alone (not
        for small inputs' values): what an artifact saves."""
        return [
            (dict(key), executable.plan)
            for key, executable in self.variants.items()
            if all(isinstance(v, int) for _, v in key) and executable.keep is None
        ]

    def sample_parallel(self) -> dict[str, Parallel | Exception]:
        """For each symbolic input dim: how it is sample-parallel, or why not (kiln.passes.batching).
        Found once (per dims bound before it): a later question (``kiln.driver.routes``) must not
        read back the source graph, every weight, that the compile let go."""
        if self.proven is not None:
            return self.proven
        key = tuple(sorted(self.bound_in_analysis.items()))
        if self._parallel is None or self._parallel[0] != key:
            graph = self.graph
            if self.bound_in_analysis:  # a padded graph: its length is a class at every run
                graph = specialize(graph, self.bound_in_analysis)
            self._parallel = (key, sample_parallel(graph))
        return self._parallel[1]  # type: ignore[return-value]

    def chunking(self) -> Chunking | None:
        """How runs at any size of the first sample-parallel dim run on its size classes (None:
        no dim is, or every input shape is static)."""
        if self._chunking is False:
            chosen = None
            if not self._static and "size-classes" not in self.options.disabled:
                for symbol, found in self.sample_parallel().items():
                    if isinstance(found, Parallel):
                        bounds = self.ranges.get(symbol, (1, MAX_DIM))
                        classes = self.size_classes.get(symbol) or default_classes(
                            bounds, backend(self.target).batch_classes
                        )
                        if self.compilation.ahead is not None:  # a loaded artifact: the sizes it has
                            classes = tuple(sorted({b[symbol] for b in self.compilation.ahead if b.get(symbol)}))
                        chosen = Chunking(found, classes) if 1 in classes else None
                        break
            self._chunking = chosen
        return self._chunking  # type: ignore[return-value]

    def padder(self) -> Padder | None:
        """How runs at any length of a paddable dim run at its compiled lengths (None: no dim
        with a declared range that is not the chunked one pads; see ``kiln.passes.padding``)."""
        if self._padder is False:
            chosen = None
            if self.ranges and not self._static and "size-classes" not in self.options.disabled:
                chunked = self.chunking()  # (only with a declared range: a graph read from the plan cache stays unread)
                for symbol, (low, high) in self.ranges.items():
                    if (chunked is not None and chunked.symbol == symbol) or high > MAX_CLASS:
                        continue
                    found = paddable(self.graph, symbol, low, high)
                    if isinstance(found, Padding):
                        given = self.size_classes.get(symbol)
                        lengths = None
                        if not given and symbol not in self.run_time_refused and self._run_time_length():
                            lengths = extents.samples(low, high)
                        classes = (high,) if lengths else given or padded_classes((low, high))
                        chosen = Padder(found, classes, lengths or ())
                        break
                    log.info("%s does not pad (%s)", symbol, found)
            self._padder = chosen
        return self._padder  # type: ignore[return-value]

    def _run_time_length(self) -> bool:
        """Whether a padded dim's kernels may take the length at run time (the cpu target's C
        renderer prints run-time sizes; ``--disable run-time-length`` compiles padded lengths)."""
        return self.compiled_for.backend == "cpu" and "run-time-length" not in self.options.disabled

    def use_padded(self, padder: Padder, prebuilt: dict, ahead: list[dict[str, int]]) -> None:
        """A loaded artifact's padded dim: the lengths it holds, their code prebuilt."""
        self._padder = padder
        self.padded_model = None
        self.padded(prebuilt, ahead)

    def release_source(self, loader: Any) -> None:
        """Let go of the source graph and the graphs made of it (the variants hold packed weights);
        ``loader()`` -> (graph, True) brings it back if a binding not compiled yet must compile."""
        self.compilation.release(loader)
        self.signature = self._check.signature = self.compilation.signature
        if self.padded_model is not None:
            padding = self.padder().padding  # type: ignore[union-attr]
            self.padded_model.release_source(lambda: (pad(self.graph, padding), True))
        if self.dims_model is not None:
            route = self.dims_model.spatial  # type: ignore[union-attr]
            self.dims_model.release_source(
                lambda: (spatial.with_dims_input(self.graph, route.names, route.copies), True)
            )

    def padded(self, prebuilt: dict | None = None, ahead: list[dict[str, int]] | None = None) -> NativeModel:
        """The model of the padded graph (its own variants, chunking and weights' store)."""
        padder = self.padder()
        assert padder is not None
        if self.padded_model is None:
            graph = pad(self.graph, padder.padding)
            compilation = Compilation(Source(graph), self.compiled_for, self.options, prebuilt=prebuilt, ahead=ahead)
            if padder.samples:  # the valid length is the padded graph's last input
                compilation.extents = extents.RunTimeLength(padder.symbol, padder.samples, graph.inputs[-1].name)
            self.padded_model = self.model_padded(compilation, padder.symbol, padder.classes[0])
            self.padded_model.extent = padder if padder.samples else None
        return self.padded_model

    def model_padded(self, compilation: Compilation, symbol: str, length: int) -> NativeModel:
        """The model of a padded graph of this one (``compilation``): this model's contract but for
        the padded ``symbol``, which is a compiled length at every run (analysed at ``length``)."""
        model = NativeModel(compilation, self.parallelism, self.streams, self.variants.limits)
        model.ranges = {k: v for k, v in self.ranges.items() if k != symbol}
        model.bound_in_analysis = {symbol: length}
        model.size_classes = {k: v for k, v in self.size_classes.items() if k != symbol}
        return model

    def declare(
        self, ranges: dict[str, Any], classes: dict[str, Any] | None = None, ahead: dict[str, int] | None = None
    ) -> NativeModel:
        """Declare ranges of symbolic dims (checked on every run; InputError outside) and compile
        what serves them now: a sample-parallel dim's size classes (every size in its range then
        runs with no compile), a paddable dim's compiled lengths (each with each size class), other
        dims at their range's low end (``ahead`` binds them instead). A model that had let go of
        its source graph (``release_source``) lets go of it again once they are compiled."""
        source = self.compilation.source
        released = source.graph is None and source.loader is not None
        self._declare(ranges, classes, ahead)
        if released and self.compilation.source.graph is not None:
            self.release_source(self.compilation.source.loader)
            return_freed(collect=True)
        return self

    def _declare(self, ranges: dict[str, Any], classes: dict[str, Any] | None, ahead: dict[str, int] | None) -> None:
        names = set(symbols(self.signature))
        parsed = {}
        for name, value in ranges.items():
            if name not in names:
                listed = ", ".join(sorted(names)) or "none"
                raise ArgumentError(f"dims: {name!r} is not a symbolic input dim of this model (its dims: {listed})")
            parsed[name] = parse_range(name, value)
        self.ranges.update(parsed)
        self._chunking, self._padder, self.padded_model = False, False, None
        chunking, padder = self.chunking(), self.padder()  # which dims chunk or pad (classes: below)
        for name, value in (classes or {}).items():
            bounds = self.ranges.get(name, (1, MAX_DIM))
            if chunking is not None and name == chunking.symbol:
                self.size_classes[name] = parse_classes(name, value, bounds)
            elif padder is not None and name == padder.symbol:
                self.size_classes[name] = parse_padded_classes(name, value, bounds)
            else:
                raise ArgumentError(
                    f"size classes of {name}: {name} is neither sample-parallel nor paddable in this model "
                    "(kiln explain --dim says why; a padded dim needs a declared range); it compiles per size"
                )
        if classes:
            self._chunking, self._padder = False, False
            chunking, padder = self.chunking(), self.padder()
        base = {name: low for name, (low, _) in self.ranges.items()}
        base.update(ahead or {})
        sizes: list[dict[str, int]] = [{}]  # the chunked dim's classes inside its range
        if chunking is not None:
            high = self.ranges.get(chunking.symbol, (1, MAX_DIM))[1]
            # (a range of 0..0 has no class inside it: its one size is the class)
            sizes = [{chunking.symbol: size} for size in chunking.classes if size <= high] or [{chunking.symbol: high}]
        # ranged dims beside a padded one (a decode step's past, new): all at run time first
        beside = {n for n, (lo, hi) in self.ranges.items() if lo != hi} - {getattr(chunking, "symbol", "")}
        self._padder = None if padder is None or beside - {padder.symbol} else padder
        if not self._padder and self._prepare_spatial(chunking, base, sizes, names):
            return
        self._padder = padder
        if padder is not None:  # each compiled length with each class
            if set(base) | {padder.symbol} | set(sizes[0]) >= names:
                try:
                    self._prepare_padded(padder, base, sizes)
                except extents.NotAffine as err:  # the lowering varies otherwise: compiled lengths
                    padder = self.compiled_lengths(padder, err)
                    self._prepare_padded(padder, base, sizes)
        elif chunking is not None and chunking.symbol in names:
            self.prepare_many([{**base, **size} for size in sizes])
        elif base and set(base) >= names:
            self.prepare_dims(base)

    def _prepare_spatial(
        self, chunking: Chunking | None, base: dict[str, int], sizes: list[dict[str, int]], names: set[str]
    ) -> bool:
        """Ranged dims that neither chunk nor pad (an image's height and width): one compile whose
        kernels take them at run time (``kiln.driver.spatial``), with each size class of the
        chunked dim. False (said why) where the route does not apply or the kernels refuse."""
        chunked = {chunking.symbol} if chunking is not None else set()  # (a range of one size is fixed)
        ranged = [name for name, (low, high) in self.ranges.items() if name not in chunked and low != high]
        if (
            not ranged
            or not set(self.ranges) | chunked >= names
            or self.compiled_for.backend != "cpu"
            or "run-time-dims" in self.options.disabled
        ):
            return False
        ranges = {name: self.ranges[name] for name in ranged}
        try:
            fixed = {**{k: v for k, v in base.items() if k not in ranges}, **sizes[0]}
            others = [{**fixed, **size} for size in sizes[1:]]  # (the other size classes: their capacities too)
            route = spatial.route_for(self.graph, ranges, fixed, names, others)
            for copies in (True, False):  # sizes read as data from the dims vector, else folded per binding
                route = dataclasses.replace(route, copies=copies)
                try:
                    model = self.dims_model_for(route)
                    model.prepare_many([{**base, **size, **route.capacity} for size in sizes])
                    break
                except (extents.NotAffine, KilnError) as err:
                    if not copies or not spatial.reads_sizes_as_data(self.graph, route.names):
                        raise
                    # (the copies compute with what has no native lowering here: an integer Div on the host)
                    log.info("%s: sizes from the dims vector refused (%s); folding them", ", ".join(ranged), err)
        except (extents.NotAffine, KilnError) as err:
            log.info("%s: kernels cannot take the sizes at run time (%s); each size compiles", ", ".join(ranged), err)
            for name in ranged:
                self.run_time_refused[name] = str(err)
            return False
        check_capacity(model.bindings(), ranges)
        log.info("%s: kernels take the sizes at run time (one compile serves the ranges %s)", ", ".join(ranged), ranges)
        self.dims_model = model
        return True

    def dims_model_for(
        self, route: spatial.RunTimeDims, prebuilt: dict | None = None, ahead: list[dict[str, int]] | None = None
    ) -> NativeModel:
        """The model of the graph with the dims vector as its last input, on ``route``."""
        graph = spatial.with_dims_input(self.graph, route.names, route.copies)
        compilation = Compilation(Source(graph), self.compiled_for, self.options, prebuilt=prebuilt, ahead=ahead)
        compilation.spatial = route
        model = NativeModel(compilation, self.parallelism, self.streams, self.variants.limits)
        model.spatial = route
        # the source graph's proof, the dims vector whole in every chunk: the graph read by the kernels
        # computes sizes from the vector, and the copies hold per sample what the shapes they replace do
        model.proven = {
            name: dataclasses.replace(found, inputs=(*found.inputs, None)) if isinstance(found, Parallel) else found
            for name, found in self.sample_parallel().items()
        }
        model.ranges, model.size_classes = dict(self.ranges), dict(self.size_classes)
        model._padder = None  # its ranged dims are the kernels' (they do not pad)
        return model

    def compiled_lengths(self, padder: Padder, err: extents.NotAffine) -> Padder:
        """The padded dim's kernels cannot take the length at run time (``err`` says why): from now on
        it runs at compiled lengths, and ``run_time_refused`` says why."""
        log.info("%s: kernels cannot take the length at run time (%s); compiling lengths", padder.symbol, err)
        self.run_time_refused[padder.symbol] = str(err)
        self._padder, self.padded_model = False, None
        chosen = self.padder()
        assert chosen is not None and not chosen.samples
        return chosen

    def _prepare_padded(self, padder: Padder, base: dict[str, int], sizes: list[dict[str, int]]) -> None:
        """Compile the padded graph's model at each of its lengths with each size class."""
        wanted = [{**base, padder.symbol: length, **size} for length in padder.classes for size in sizes]
        self.padded().prepare_many(wanted)

    def ragged(self) -> Any:
        """Requests of different lengths as one batch (``kiln.driver.ragged``; ``NotRagged`` why not)."""
        if self._ragged is None:
            self._ragged = Ragged(self)
        return self._ragged

    def _execute(self, inputs: list[Any]) -> list[Any]:
        return routes.serve(self, inputs)  # the route chooser: kiln.driver.routes

    def execute(self, inputs: list[Any]) -> list[Any]:
        """Run positional inputs by the chooser's route (a derived model's runs: padded, run-time dims)."""
        return routes.serve(self, inputs, name_binding=False)

    @property
    def static(self) -> bool:
        """No symbolic input dim: one binding, {} (a run reads no dims)."""
        return self._static

    def ran_too(self, derived: NativeModel) -> None:
        """The variants a derived model (padded, run-time dims) ran count as this model's."""
        self._ran.update(derived._ran)

    def note_ran(self, executable: Executable) -> None:
        self._ran.setdefault(id(executable), executable)

    def has_variant(self, dims: dict[str, int]) -> bool:
        """Whether the variant for exactly ``dims`` is compiled (a run there compiles nothing)."""
        key = tuple(sorted(dims.items()))
        last = self._last
        return (last is not None and last[0] == key) or self.variants.get(key) is not None

    def run_executable(self, executable: Executable, inputs: list[Any]) -> list[Any]:
        """Run; a padded graph whose kernels take the length at run time gets its inputs laid out
        at their length in the capacity's shapes, and gives its outputs back at that length (the
        same for dims taken at run time, with the dims vector as the last input)."""
        if self.spatial is not None:
            return self._run_spatial(executable, inputs)
        padder = self.extent
        if padder is None:
            return executable.run(inputs)
        capacity = padder.classes[0]
        axes = padder.padding.inputs
        length = next((np.shape(a)[x] for a, x in zip(inputs, axes) if x is not None), capacity)
        if length == capacity:
            return executable.run(inputs)
        compacted = [extents.compact(a, x, capacity) for a, x in zip(inputs, axes)] + list(inputs[len(axes) :])
        outputs = executable.run(compacted)
        return [extents.expand(o, x, length) for o, x in zip(outputs, padder.padding.outputs)]

    def _run_spatial(self, executable: Executable, inputs: list[Any]) -> list[Any]:
        dims = input_dims(self.signature, dict(zip(self.input_names, inputs)))
        key = tuple(sorted(dims.items()))
        found = self._shapes.get(key)  # a decode loop calls at each binding many times: its shapes once
        if found is None:
            vector = self.dims_vector(dims)
            capacity = {**dims, **self.spatial.capacity}  # type: ignore[union-attr]
            sizes = dict(zip(self.spatial.names, vector.tolist()))  # type: ignore[union-attr]
            laid_shapes = [bind_type(v.type, capacity).shape for v in self.signature.inputs[: len(inputs)]]  # type: ignore[union-attr]
            out_shapes = [bind_type(v.type, sizes).shape for v in self.signature.outputs]  # type: ignore[union-attr]
            while len(self._shapes) >= VECTORS:
                self._shapes.pop(next(iter(self._shapes)))
            found = self._shapes[key] = (vector, laid_shapes, out_shapes)
        vector, laid_shapes, out_shapes = found
        return self._laid.run(executable, list(inputs), laid_shapes, vector, out_shapes)

    def dims_vector(self, dims: dict[str, int]) -> np.ndarray:
        """The dims vector at ``dims`` (its program's, else the graph's shapes specialized there;
        a run remembers it per binding); an InputError when the model has no shapes there (a
        kernel larger than a small image)."""
        assert self.spatial is not None
        program = self.spatial.program
        vector = program(dims) if program is not None else None
        if vector is None:
            try:
                vector = spatial.dim_values(self.compilation.shapes_graph, self.spatial.names, dims)
            except KilnError as err:
                raise InputError(f"the model has no shapes at dims {dims}: {err}") from None
        return vector

    def value_variant(self, dims: dict[str, int], inputs: list[Any]) -> Executable | None:
        """Shapes that depend on small inputs' values: compile for these values (bounded)."""
        small = {
            name: np.asarray(array)
            for name, array in zip(self.input_names, inputs)
            if isinstance(array, np.ndarray) and array.size <= SMALL_INPUT and array.dtype.kind in "iub"
        }
        if not small:
            return None
        key = (*sorted(dims.items()), *((n, a.dtype.str, a.shape, a.tobytes()) for n, a in sorted(small.items())))
        self._last = None  # the LRU order moves: the next lookup goes through the table
        executable = self.variants.get(key)
        if executable is None:
            with self._compiling:
                if self.value_variants >= VALUE_VARIANTS:
                    return None
                keep = [i for i, name in enumerate(self.input_names) if name not in small]
                plan = self.compilation.value_plan(dims, small)
                executable = Executable(plan, keep, self.weights, self.parallelism)
                self.value_variants += 1
                self._keep(key, executable)
        return executable

    @property
    def precision(self) -> str:
        """What matrix products and convolutions compute in (``fp32`` or ``bf16``; ``auto`` was
        resolved when the model compiled)."""
        return self.options.precision

    @property
    def plans(self) -> list[Plan]:
        return [e.plan for e in self.executables()]

    @property
    def is_native(self) -> bool | None:
        """True when every variant that has run (or, before any run, every compiled variant) ran
        with no host fallback; None before anything compiled."""
        plans = [e.plan for e in self._ran.values()] or self.plans
        return None if not plans else all(p.is_native for p in plans)

    def save(self, path: str) -> Any:
        """Write a ``.kiln`` artifact (IR, weights, native libraries); ``kiln.load`` reads it."""
        return save(self, path)
