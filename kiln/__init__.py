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
    generation: bool | None = None,
    size_classes: dict[str, Any] | None = None,
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
    weights per channel, activations per tensor from ``calibration``: input dicts or an ``.npz``,
    random inputs when None (``kiln compile --calibrate DIR`` reads image folders);
    ``calibration_method`` minmax | percentile | entropy). An int8 model's ``accuracy`` reports rel. L2 and top-1 agreement against fp32 on
    ``evaluation`` (default: the last fifth of the calibration data, kept out of calibration);
    ``max_accuracy_drop`` (1 - top-1 agreement, or rel. L2 without class scores) keeps the most
    sensitive layers in fp32 until the drop fits.
    ``generation``: ``model`` is a decode step compiled for ``kiln.generate``; its logits are
    computed at each row's last position only ([batch, 1, vocab]: a prompt's step skips the head's
    product for every other position). ``size_classes``: a sample-parallel dim's sizes compiled as
    one step each (``{"batch": "1,4"}``; default: the target's, 1 and 8, inside the dim's range;
    ``model.declare``), compiled with the rest.
    Raises UnsupportedModelError listing every unsupported construct, ModelLoadError for unreadable
    files, and KilnError (TargetError) for an unknown target.
    """
    from kiln.backends import Threading
    from kiln.driver.compile import Calibration, Request, compile_model, options_for

    return compile_model(
        Request(
            model,
            target,
            example_inputs,
            dynamic_shapes,
            options_for(options, opt_level, precision, generation),
            dims,
            Threading.of(threads, spin),
            streams,
            Calibration(calibration, calibration_method, evaluation, max_accuracy_drop),
            size_classes,
        )
    )


def load(
    path: Any, rebuild: bool = False, threads: int = 0, spin: int | None = None, streams: int | None = None
) -> Any:
    """Load a ``.kiln`` artifact written by ``model.save(path)``; raises ArtifactError if the file
    is corrupt, foreign, or from a newer kiln. An artifact carries native code: trust it like an
    executable, or pass ``rebuild=True`` to generate the code again from its IR instead."""
    from kiln.driver.loading import load as load_artifact

    return load_artifact(path, rebuild=rebuild, threads=threads, spin=spin, streams=streams)


def emit_c(
    model: Any,
    folder: Any,
    dims: dict[str, int] | None = None,
    batch: tuple[str, int, int] | None = None,
    length: tuple[str, int, int] | None = None,
    extents: dict[str, tuple[int, int]] | None = None,
) -> Any:
    """Write ``model`` (a ``kiln.compile`` result for the cpu target) as a C library into ``folder``
    (``kiln compile --emit c``): kiln.h, libkiln_model.so and .a, the weights file, an example. ``dims``
    binds the symbolic dims; ``batch`` = (symbol, low, high) lets a sample-parallel dim take any size
    in [low, high]; ``length`` = (symbol, low, high) a paddable dim any length in [low, high] (one
    plan whose kernels take the length at run time, or its compiled classes); ``extents`` =
    {symbol: (low, high)} dims the kernels take at run time through the dims vector (an image's
    height and width). Returns what was written (``.line()`` says it)."""
    from kiln.driver.emit_c import emit_c as emit

    return emit(model, folder, dims, batch, length, extents)


def generate(model: Any, input_ids: Any, max_new_tokens: int, **sampling: Any) -> Any:
    """Generate text with ``model``, a compiled decode step (``kiln.driver.generation``): the prompt
    ``input_ids`` [batch, tokens] and the tokens after it, [batch, tokens + generated]. Keywords:
    ``temperature`` (0: greedy), ``top_k``, ``top_p``, ``seed``, ``stop_tokens``."""
    from kiln.driver.generation import generate as run

    return run(model, input_ids, max_new_tokens, **sampling)


def generate_stream(model: Any, input_ids: Any, max_new_tokens: int, **sampling: Any) -> Any:
    """``generate`` as an iterator of each step's new token ids ([batch]), as each is drawn."""
    from kiln.driver.generation import stream

    return stream(model, input_ids, max_new_tokens, **sampling)


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
    "emit_c",
    "generate",
    "generate_stream",
    "load",
    "targets",
]
