"""The driver's entry: a model (ONNX, torch, kiln Graph) to a runnable model for a target.

``kiln.compile`` is this function. It decides everything a compile decides before the runtime
sees a plan: the options and precision, the plan cache (a file compiled before skips even the
import), int8 calibration and its accuracy check, and which bindings compile ahead. The model it
returns compiles new bindings of symbolic dims through ``kiln.driver.variants``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from kiln.backends import Threading, backend, parse
from kiln.driver import plan_cache
from kiln.driver.fixed_point import fixed_point_model
from kiln.driver.native import NativeModel
from kiln.driver.options import CompileOptions
from kiln.driver.pipeline import resolve_precision
from kiln.driver.quantize import measure, quantize_model
from kiln.driver.reference import ReferenceModel
from kiln.driver.sizes import declared_ranges
from kiln.driver.variants import Compilation, Source
from kiln.errors import KilnError
from kiln.frontend import to_graph, to_graph_ranged
from kiln.lower.target import Target
from kiln.memory import BIG, return_freed
from kiln.passes.specialize import input_dims, specialize


@dataclass(frozen=True)
class Calibration:
    """int8's calibration: ``samples`` (input dicts, an ``.npz``, None for random inputs),
    ``method`` (minmax | percentile | entropy), ``evaluation`` data (default: the last fifth of
    the samples) and the accuracy budget ``max_drop`` that keeps the noisiest layers in fp32."""

    samples: Any = None
    method: str = "minmax"
    evaluation: Any = None
    max_drop: float | None = None


@dataclass(frozen=True)
class Request:
    """What ``kiln.compile`` was asked: the model and how to read it, the target, the options,
    the run-time settings and the dims to compile ahead."""

    model: Any
    target: str = "cpu"
    example_inputs: Any = None
    dynamic_shapes: Any = None
    options: CompileOptions = field(default_factory=CompileOptions)
    dims: dict[str, int] | None = None
    parallelism: Threading = field(default_factory=Threading)
    streams: int | None = None
    calibration: Calibration = field(default_factory=Calibration)
    classes: dict[str, Any] | None = None  # size classes declared with the ranges (``model.declare``)

    def graph(self) -> Any:
        return to_graph(self.model, self.example_inputs, self.dynamic_shapes)

    def imported(self) -> tuple[Any, dict[str, tuple[int, int]]]:
        """The graph, and the ranges the model itself declares (torch.export's Dim bounds)."""
        return to_graph_ranged(self.model, self.example_inputs, self.dynamic_shapes)


def options_for(options: CompileOptions | None, opt_level: int | None, precision: str | None, generation: bool | None = None) -> CompileOptions:  # fmt: skip
    """``options`` (default: the KILN_* overrides) with ``opt_level``, ``precision`` and
    ``generation`` applied."""
    if options is None:
        options = CompileOptions.from_env(level=opt_level)
    elif opt_level is not None:
        options = options.with_(level=opt_level)
    if generation is not None:
        options = options.with_(generation=bool(generation))
    return options if precision is None else options.with_(precision=precision)


def for_generation(graph: Any, options: CompileOptions) -> Any:
    """A decode step compiled for ``kiln.generate`` (``options.generation``): its logits at each
    row's last position only (``kiln.passes.last_position``); else ``graph`` as it is."""
    if not options.generation:
        return graph
    from types import SimpleNamespace

    from kiln.driver.generation import roles
    from kiln.passes.last_position import last_position

    return last_position(graph, roles(SimpleNamespace(signature=graph)).logits)


def compile_model(request: Request) -> Any:
    """The model ``request`` asks for (see ``kiln.compile``)."""
    if not isinstance(request.target, str):
        raise KilnError(f"a target is named by a string (such as 'cpu'), got {type(request.target).__name__}")
    options = request.options
    if not backend(request.target).compiles:  # unknown names: the registry's error lists every target
        if options.precision == "bf16":
            raise KilnError(f"precision bf16 is not available for target {request.target}: it computes in fp32 only")
        return ReferenceModel(for_generation(request.graph(), options))
    target = parse(request.target)
    if options.precision != "fp32":  # "auto" resolved here, so cache keys name what was compiled
        options = options.with_(precision=resolve_precision(options.precision, target))
    path = onnx_file(request.model, request.example_inputs)
    # the file's bytes are hashed before it is read: a cache entry is keyed by what was imported
    # (int8 calibrates first: its plans are keyed by the ranges, known only after calibration)
    # (the fpga target calibrates every tensor first: its plans too are keyed by the ranges)
    calibrates = options.precision == "int8" or (target.backend == "fpga" and not options.quantization.ranges)
    caching = options.plan_cache and plan_cache.enabled() and not calibrates
    source_file = (path, plan_cache.file_digest(path)) if path is not None and caching else None
    if source_file is not None:  # compiled before? then even the import is skipped
        cached = _from_plan_cache(request, source_file, target, options)
        if cached is not None:
            return cached
    graph, declared = request.imported()
    graph = for_generation(graph, options)
    if graph.constant_bytes() >= BIG:
        return_freed(collect=True)  # the parsed file's structures, freed, leave the RSS before the copies come
    if declared:  # the model's own ranges, under what the caller gave
        request = dataclasses.replace(request, dims={**{k: v for k, v in declared.items()}, **(request.dims or {})})
    if target.backend == "fpga" and not options.quantization.ranges:
        return _fixed_point(request, graph, target, options)
    if options.precision == "int8" and (request.calibration.samples is not None or not options.quantization.ranges):
        # (options that already carry ranges, the quantizer's own compiles, build directly)
        return _quantized(request, graph, target, options)
    model = _native(request, Source(graph, file=source_file), target, options)
    del graph  # the model's source holds it now: released below, its memory is returned (not kept here)
    if source_file is not None and not declared_ranges(request.dims):
        _consumed_from_cache(request, model)
    model = model.compile_ahead(request.dims, request.classes)
    key = model.compilation.source.cache_key
    if source_file is not None and key is not None and plan_cache.has_graph(key):
        # its variants hold their packed weights; the source graph comes back from the cache when
        # a new binding compiles
        model.release_source(_cached_graph(request, key, options))
        return_freed(collect=True)
    elif path is not None and model.compilation.source.graph is not None and model.dims_model is not None:
        # a model whose sizes run through one route's plans (declared ranges: a decode step's) keeps
        # no float32 copy of its weights beside their packed ones; the file, if unchanged, is read
        # again when a binding outside them must compile (a 1B decoder at int4: 7.8 GB held -> 3.1).
        # Without the plan cache too (its digest taken now: a file changed while it compiled, then
        # again, would pass for the one compiled)
        model.release_source(_reimported(request, source_file or (path, plan_cache.file_digest(path)), options))
        return_freed(collect=True)
    return model


def _reimported(request: Request, source_file: tuple[str, str], options: CompileOptions) -> Any:
    def source_graph() -> tuple[Any, bool]:  # only when a new binding compiles
        if plan_cache.file_digest(source_file[0]) != source_file[1]:
            raise KilnError(f"{source_file[0]} changed since this model was compiled from it: compile it again")
        return for_generation(request.graph(), options), True

    return source_graph


def _consumed_from_cache(request: Request, model: NativeModel) -> None:
    """A big model compiled from a file for one binding: its source graph is stored in the plan
    cache first, the imported one let go of, and the compile takes the cache's copy and frees each
    weight as its folded and packed copies replace it (the imported weights, their folded copies and
    the packed ones were all held at the lowering's peak: ResNet-50's 320 MB for 102 of weights)."""
    graph = model.compilation.source.graph
    if graph is None or graph.constant_bytes() < BIG:
        return
    key = model.compilation.cache_key
    try:
        plan_cache.store_graph(key, graph)
    except OSError:  # a full disk: compile from the imported graph as before
        return
    del graph
    if plan_cache.has_graph(key):
        model.release_source(_cached_graph(request, key, model.options))
        model.compilation.source.consume = True
        return_freed(collect=True)


def _cached_graph(request: Request, key: str, options: CompileOptions) -> Any:
    def source_graph() -> tuple[Any, bool]:  # only when a new binding compiles
        graph = plan_cache.load_graph(key)
        return (graph, True) if graph is not None else (for_generation(request.graph(), options), False)

    return source_graph


def _native(request: Request, source: Source, target: Target, options: CompileOptions) -> NativeModel:
    return NativeModel(Compilation(source, target, options), request.parallelism, request.streams)


def _from_plan_cache(
    request: Request, source_file: tuple[str, str], target: Target, options: CompileOptions
) -> NativeModel | None:
    """The model of a file compiled before, from its cached signature (None when not cached)."""
    key = plan_cache.file_entry(source_file[0], options, target, digest=source_file[1])
    signature = plan_cache.load_signature(key) if key is not None else None
    if key is None or signature is None:
        return None

    source = Source(
        None, signature=signature, loader=_cached_graph(request, key, options), file=source_file, cache_key=key
    )
    return _native(request, source, target, options).compile_ahead(request.dims, request.classes)


def _quantized(request: Request, graph: Any, target: Target, options: CompileOptions) -> NativeModel:
    """The int8 model, calibrated on the request's data, with its accuracy report against fp32."""
    calibration = request.calibration

    def build(chosen: CompileOptions) -> NativeModel:
        return _native(request, Source(graph), target, chosen).compile_ahead(request.dims, request.classes)

    quantized, report = quantize_model(
        graph,
        target,
        options,
        calibration.samples,
        calibration.method,
        calibration.max_drop,
        calibration.evaluation,
        build,
        lambda feeds: specialize(graph, input_dims(graph, feeds)),
    )
    quantized.accuracy = report
    return quantized


def _fixed_point(request: Request, graph: Any, target: Target, options: CompileOptions) -> NativeModel:
    """The fpga model: every tensor calibrated, the widths' accuracy against fp32 reported."""
    calibration = request.calibration

    def build(chosen_target: Target, chosen: CompileOptions) -> NativeModel:
        return _native(request, Source(graph), chosen_target, chosen).compile_ahead(request.dims, request.classes)

    def reference() -> NativeModel:
        return build(parse("cpu"), options)

    model, report = fixed_point_model(
        graph,
        target,
        options,
        calibration.samples,
        calibration.evaluation,
        calibration.max_drop,
        build,
        reference,
        lambda feeds: specialize(graph, input_dims(graph, feeds)),
    )
    model.accuracy = report
    return model


def onnx_file(model: Any, example_inputs: Any) -> str | None:
    """The path of the ONNX file ``model`` names (None for anything else)."""
    if example_inputs is None and isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        return os.fspath(model)
    return None


def accuracy_against_fp32(model: NativeModel, samples: list[dict[str, Any]]) -> Any:
    """A reduced-precision ``model`` against the fp32 compile of its graph for the same target,
    on ``samples`` (the caller's data: the zoo's example inputs, a data set...): an
    ``AccuracyReport``."""
    fp32 = model.options.with_(precision="fp32")
    reference = NativeModel(Compilation(Source(model.graph), model.compiled_for, fp32), model.parallelism)
    return measure(reference, model, samples, model.precision)
