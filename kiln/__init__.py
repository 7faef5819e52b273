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

__version__ = "0.1.0"

# the first is the default; cpu:<isa> builds one ISA's code path (cpu:avx2...); "kir" runs the kernel IR on
# its NumPy interpreter (no C, no engines: slow, a third target for tests)
TARGETS = ("cpu", "reference")


def compile(  # shadows the builtin on purpose: the name the architecture promises
    model: Any, target: str = "cpu", example_inputs: Any = None, opt_level: int = 2, dims: dict[str, int] | None = None
) -> Any:
    """Compile ``model`` (ONNX path/bytes/ModelProto, kiln Graph, or torch module + example inputs).

    Returns a model object with ``run(dict) -> dict``, ``__call__`` and ``submit -> Future``.
    ``target="cpu"`` compiles to native code (``opt_level`` 0..3; ``dims`` binds symbolic input
    dims ahead of time, otherwise each new binding compiles on first use).
    Raises UnsupportedModelError listing every unsupported construct, ModelLoadError for unreadable
    files, and KilnError for an unknown target.
    """
    from kiln.frontend import to_graph
    from kiln.runtime.model import ReferenceModel

    if not isinstance(target, str):
        raise KilnError(f"a target is named by a string (such as 'cpu'), got {type(target).__name__}")
    if target != "reference":  # every other name is Target.parse's to accept or refuse, listing them
        from kiln.codegen.target import Target
        from kiln.runtime import plan_cache
        from kiln.runtime.native import NativeModel

        cpu = Target.parse(target)

        path = _onnx_file(model, example_inputs)
        # the file's bytes are hashed before it is read: a cache entry is keyed by what was imported
        source_file = (path, plan_cache.file_digest(path)) if path is not None and plan_cache.enabled() else None
        if source_file is not None:  # compiled before? then even the import is skipped
            key = plan_cache.file_entry(source_file[0], opt_level, digest=source_file[1], target=cpu)
            signature = plan_cache.load_signature(key) if key is not None else None
            if key is not None and signature is not None:

                def source_graph(key: str = key) -> tuple[Any, bool]:  # only when a new binding compiles
                    graph = plan_cache.load_graph(key)
                    return (graph, True) if graph is not None else (to_graph(model, example_inputs), False)

                return NativeModel(
                    None,
                    level=opt_level,
                    dims=dims,
                    source_file=source_file,
                    cache_key=key,
                    signature=signature,
                    graph_loader=source_graph,
                    cpu=cpu,
                )
        graph = to_graph(model, example_inputs)
        return NativeModel(graph, level=opt_level, dims=dims, source_file=source_file, cpu=cpu)
    return ReferenceModel(to_graph(model, example_inputs))


def _onnx_file(model: Any, example_inputs: Any) -> str | None:
    import os

    if example_inputs is None and isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        return os.fspath(model)
    return None


def load(path: Any, rebuild: bool = False) -> Any:
    """Load a ``.kiln`` artifact written by ``model.save(path)``; raises ArtifactError if the file
    is corrupt, foreign, or from a newer kiln. An artifact carries native code: trust it like an
    executable, or pass ``rebuild=True`` to generate the code again from its IR instead."""
    from kiln.runtime.artifact import load as load_artifact

    return load_artifact(path, rebuild=rebuild)


__all__ = [
    "ExecutionError",
    "InputError",
    "InvalidModelError",
    "KilnError",
    "ModelLoadError",
    "ShapeInferenceError",
    "UnsupportedModelError",
    "compile",
    "load",
]
