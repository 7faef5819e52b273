"""kiln: an ML compiler. ``kiln.compile(model)`` -> a model with ``run``, ``__call__`` and ``submit``."""

from __future__ import annotations

from typing import Any

from kiln.errors import (
    ExecutionError,
    InputError,
    InvalidModelError,
    KilnError,
    ModelLoadError,
    ShapeInferenceError,
    UnsupportedModelError,
)
from kiln.version import __version__


def targets() -> list[str]:
    """Every target name ``compile`` accepts (the registry's: cpu, cpu:<isa>, reference, plugins)."""
    from kiln.backends import names

    return names()


def compile(  # shadows the builtin on purpose: the name the architecture promises
    model: Any,
    target: str = "cpu",
    example_inputs: Any = None,
    opt_level: int | None = None,
    dims: dict[str, int] | None = None,
    options: Any = None,
    threads: int = 0,
    spin: int | None = None,
    streams: int | None = None,
    precision: str | None = None,
    calibration: Any = None,
    calibration_method: str = "minmax",
    max_accuracy_drop: float | None = None,
    evaluation: Any = None,
    dynamic_shapes: Any = None,
) -> Any:
    """Compile ``model`` (ONNX path/bytes/ModelProto, kiln Graph, or torch module + example inputs).

    Returns a model object with ``run(dict) -> dict``, ``__call__`` and ``submit -> Future``.
    ``target`` is a registered target (``kiln.targets()``): ``cpu`` compiles to native code for this
    machine, ``cpu:avx2`` one ISA's code path, ``reference`` runs the reference interpreter.
    ``options`` is a ``kiln.driver.options.CompileOptions`` (default: ``CompileOptions.from_env()``,
    the KILN_* overrides read once); ``opt_level`` (0..3) overrides its level. ``dims`` binds
    symbolic input dims ahead of time, otherwise each new binding compiles on first use.
    ``threads``: participants in each parallel loop (0: every CPU this process may use); ``spin``:
    how long (pause instructions) a waiting thread spins before it sleeps (0: at once; lower it
    when other processes share the cores); ``streams``: requests ``submit`` runs at once.
    ``precision`` of matrix products and convolutions: ``fp32`` (default), ``bf16`` (operands
    rounded to bfloat16, float32 sums: AMX or AVX512_BF16), or ``auto`` (bf16 where the CPU has
    it, else fp32; the model's ``precision`` says which), or ``int8`` (post-training quantization:
    weights per channel, activations per tensor from ``calibration``: input dicts, an ``.npz`` or
    an image folder, random inputs when None; ``calibration_method`` minmax | percentile |
    entropy). An int8 model's ``accuracy`` reports rel. L2 and top-1 agreement against fp32 on
    ``evaluation`` (default: the last fifth of the calibration data, kept out of calibration);
    ``max_accuracy_drop`` (1 - top-1 agreement, or rel. L2 without class scores) keeps the most
    sensitive layers in fp32 until the drop fits.
    Raises UnsupportedModelError listing every unsupported construct, ModelLoadError for unreadable
    files, and KilnError (TargetError) for an unknown target.
    """
    from kiln.backends import Threading, backend, parse
    from kiln.driver import plan_cache
    from kiln.driver.native import NativeModel
    from kiln.driver.options import CompileOptions
    from kiln.driver.reference import ReferenceModel
    from kiln.frontend import to_graph

    if not isinstance(target, str):
        raise KilnError(f"a target is named by a string (such as 'cpu'), got {type(target).__name__}")
    if options is None:
        options = CompileOptions.from_env(level=opt_level)
    elif opt_level is not None:
        options = options.with_(level=opt_level)
    if precision is not None:
        options = options.with_(precision=precision)
    if not backend(target).compiles:
        if options.precision == "bf16":
            raise KilnError(
                f"precision bf16 is not available for target {target}: it computes in fp32 only"
            )  # unknown names: the registry's error lists every target
        return ReferenceModel(to_graph(model, example_inputs, dynamic_shapes))
    compiled_for = parse(target)
    if options.precision != "fp32":  # "auto" resolved here, so cache keys name what was compiled
        from kiln.driver.pipeline import resolve_precision

        options = options.with_(precision=resolve_precision(options.precision, compiled_for))
    parallelism = Threading.of(threads, spin)
    path = _onnx_file(model, example_inputs)
    # the file's bytes are hashed before it is read: a cache entry is keyed by what was imported
    # (int8 calibrates first: its plans are keyed by the ranges, known only after calibration)
    caching = options.plan_cache and plan_cache.enabled() and options.precision != "int8"
    source_file = (path, plan_cache.file_digest(path)) if path is not None and caching else None
    if source_file is not None:  # compiled before? then even the import is skipped
        key = plan_cache.file_entry(source_file[0], options, compiled_for, digest=source_file[1])
        signature = plan_cache.load_signature(key) if key is not None else None
        if key is not None and signature is not None:

            def source_graph(key: str = key) -> tuple[Any, bool]:  # only when a new binding compiles
                graph = plan_cache.load_graph(key)
                return (graph, True) if graph is not None else (to_graph(model, example_inputs, dynamic_shapes), False)

            return NativeModel(
                None,
                options,
                dims=dims,
                source_file=source_file,
                cache_key=key,
                signature=signature,
                graph_loader=source_graph,
                target=compiled_for,
                parallelism=parallelism,
                streams=streams,
            )
    graph = to_graph(model, example_inputs, dynamic_shapes)
    if options.precision == "int8" and (calibration is not None or not options.quantization.ranges):
        # (options that already carry ranges, kiln.quantize's own compiles, build directly)
        from kiln.passes.specialize import input_dims, specialize
        from kiln.quantize import quantize_model

        def build(chosen: Any) -> Any:
            return NativeModel(graph, chosen, dims=dims, target=compiled_for, parallelism=parallelism, streams=streams)

        quantized, report = quantize_model(
            graph,
            compiled_for,
            options,
            calibration,
            calibration_method,
            max_accuracy_drop,
            evaluation,
            build,
            lambda feeds: specialize(graph, input_dims(graph, feeds)),
        )
        quantized.accuracy = report
        return quantized
    return NativeModel(
        graph,
        options,
        dims=dims,
        source_file=source_file,
        target=compiled_for,
        parallelism=parallelism,
        streams=streams,
    )


def _onnx_file(model: Any, example_inputs: Any) -> str | None:
    import os

    if example_inputs is None and isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        return os.fspath(model)
    return None


def load(
    path: Any, rebuild: bool = False, threads: int = 0, spin: int | None = None, streams: int | None = None
) -> Any:
    """Load a ``.kiln`` artifact written by ``model.save(path)``; raises ArtifactError if the file
    is corrupt, foreign, or from a newer kiln. An artifact carries native code: trust it like an
    executable, or pass ``rebuild=True`` to generate the code again from its IR instead."""
    from kiln.driver.loading import load as load_artifact

    return load_artifact(path, rebuild=rebuild, threads=threads, spin=spin, streams=streams)


__all__ = [
    "ExecutionError",
    "InputError",
    "InvalidModelError",
    "KilnError",
    "ModelLoadError",
    "ShapeInferenceError",
    "UnsupportedModelError",
    "__version__",
    "compile",
    "load",
    "targets",
]
