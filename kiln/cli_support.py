"""What the ``kiln`` command line's modules share: the consoles and argument helpers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import click
from rich.console import Console

from kiln.lower.engine import WEIGHT_FORMATS
from kiln.output_files import OutputPathError, check_output_file

# Results go to stdout, progress and notes to stderr. In a terminal, tables fit its width; piped to
# a file or a program they are written at full width (rich's default there would wrap at 80).
FULL_WIDTH = 10_000
MAX_MEMORY_MB = 1 << 40  # --memory-limit: an address space in MB that RLIMIT_AS can hold (1 EiB)
console = Console(stderr=True)
out = Console()
if not out.is_terminal:
    out = Console(width=FULL_WIDTH)
if not console.is_terminal:
    console = Console(stderr=True, width=FULL_WIDTH)


def configure_logging(verbose: int, quiet: bool) -> None:
    """kiln's library logs to the ``kiln`` logger; the command line shows its warnings (``-q``:
    errors only and no progress notes; ``-v``: what kiln is doing; ``-vv``: debugging detail)."""
    import logging

    level = logging.ERROR if quiet else {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logger = logging.getLogger("kiln")
    logger.setLevel(level)
    if not any(getattr(h, "kiln_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("kiln: %(levelname)s: %(message)s"))
        handler.kiln_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    console.quiet = quiet
    out.quiet = quiet  # results too: --json output is written with click.echo, never silenced


def split_values(values: tuple[str, ...]) -> list[str]:
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def parse_dims(items: tuple[str, ...]) -> dict[str, int]:
    """--dim NAME=INT items -> {name: int} (the first value of a NAME=1,8,32 list)."""
    return {name: values[0] for name, values in parse_dim_lists(items).items()}


def split_ranges(items: tuple[str, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
    """--dim items -> (the ranges NAME=LOW..HIGH by name, the other items)."""
    ranges = {}
    rest = []
    for item in items:
        name, _, value = item.partition("=")
        if ".." in value:
            if not name:
                raise click.BadParameter(f"expected NAME=LOW..HIGH, got {item!r}", param_hint="--dim")
            ranges[name] = value
        else:
            rest.append(item)
    return ranges, tuple(rest)


def parse_dim_lists(items: tuple[str, ...]) -> dict[str, list[int]]:
    """--dim NAME=INT[,INT...] items -> {name: [ints]} (``batch=1,8,32``: three sizes)."""
    dims: dict[str, list[int]] = {}
    for item in items:
        name, _, value = item.partition("=")
        values = value.split(",")
        if not name or not all(v.isdigit() for v in values):
            raise click.BadParameter(f"expected NAME=INT or NAME=INT,INT,..., got {item!r}", param_hint="--dim")
        dims[name] = [int(v) for v in values]
    return dims


def dim_bindings(graph, items: tuple[str, ...]) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    """Every binding of the graph's input symbols the --dim lists ask for (their product; a symbol
    not given is 1)."""
    import itertools

    from kiln.ir.types import TensorType

    lists = parse_dim_lists(items)
    for value in graph.inputs:
        if isinstance(value.type, TensorType) and value.type.shape:
            for d in value.type.shape:
                if isinstance(d, str):
                    lists.setdefault(d, [1])
    names = sorted(lists)
    return [dict(zip(names, combo)) for combo in itertools.product(*(lists[n] for n in names))]


def import_bound(model: str, dims: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """MODEL (a zoo name or an .onnx path) imported, and its input symbols bound: --dim values,
    every other symbol 1."""
    from kiln import zoo as models
    from kiln.frontend.onnx import import_onnx
    from kiln.ir.types import TensorType

    path = str(models.onnx_path(model, progress=console.print)) if model in models.MODELS else model
    graph = import_onnx(path)
    binding = parse_dims(dims)
    for value in graph.inputs:
        if isinstance(value.type, TensorType) and value.type.shape:
            binding.update({d: binding.get(d, 1) for d in value.type.shape if isinstance(d, str)})
    return graph, binding


def precision_option(what: str):  # type: ignore[no-untyped-def]
    """The --precision option of the commands that compile (``what``: what they do with it)."""
    return click.option(
        "--precision",
        type=click.Choice(["fp32", "bf16", "int8", *WEIGHT_FORMATS, "auto"]),
        default="fp32",
        show_default=True,
        help="Precision of matrix products and convolutions: bf16 rounds their operands to bfloat16 and sums in "
        "float32 (AMX-BF16 or AVX512_BF16); int8 quantizes weights per channel and activations per tensor "
        "(calibrated); int8-weights stores the constant weights of matrix products as int8 per output column "
        "and computes in float32 (no calibration: a quarter of the bytes a memory-bound decode step reads); "
        "int4-weights as 4-bit codes with a scale per group of 32 k-steps (-g128: of 128; -asym: an offset "
        f"per group too); auto picks bf16 where the CPU has it. {what}",
    )


def calibration_data(data: str | None, graph):  # type: ignore[no-untyped-def]
    """``--calibrate``'s data for the driver: an image folder read into input dicts (resized to
    the model's single static square NCHW input, ImageNet-normalized); an ``.npz`` or None as
    given (the driver reads those)."""
    if data is None:
        return None
    path = Path(data)
    if not path.is_dir():
        if path.suffix != ".npz" or not path.is_file():
            raise click.UsageError(f"--calibrate {data}: expected an .npz file or a folder of images")
        return data
    from kiln.bench.dataset import load_images
    from kiln.ir.types import TensorType

    inputs = [v for v in graph.inputs if isinstance(v.type, TensorType)]
    images = [v for v in inputs if v.type.shape is not None and len(v.type.shape) == 4]
    if len(inputs) != 1 or not images:
        raise click.UsageError(f"--calibrate {data}: image folders calibrate models with one NCHW image input")
    value = images[0]
    height, width = value.type.shape[2], value.type.shape[3]
    if not isinstance(height, int) or not isinstance(width, int) or height != width:
        raise click.UsageError(f"--calibrate {data}: the input {value.name} needs a static square size")
    return [{value.name: image[None]} for image in load_images(data, height)]


# -- the options several commands share: declared once, meaning one thing everywhere ---------------


def target_option(default: str = "cpu", what: str = "The target to compile for"):  # type: ignore[no-untyped-def]
    """``--target NAME``: a registered target."""
    return click.option(
        "--target",
        default=default,
        show_default=True,
        help=f"{what} (any registered target: `kiln targets` lists them).",
    )


def dim_option(what: str = "Bind a symbolic dim, e.g. --dim batch=1 (repeatable)."):  # type: ignore[no-untyped-def]
    """``--dim NAME=INT``, repeatable (``what`` says what the command does with it)."""
    return click.option("--dim", "dims", multiple=True, help=what)


def json_option(what: str):  # type: ignore[no-untyped-def]
    """``--json``: the command's result as JSON on stdout instead of tables (a switch on every command)."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print {what} as JSON on stdout.")


def output_file_value(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """An output path checked before any work: absent, a regular file, or (for a project) a real
    folder; a link, FIFO or device there is refused at once, never followed or written later."""
    if value is None:
        return value
    try:
        if not stat.S_ISDIR(os.lstat(value).st_mode):
            check_output_file(value, "output")
    except FileNotFoundError:
        pass
    except OutputPathError as err:
        raise click.BadParameter(str(err)) from None
    return value


def output_option(what: str, required: bool = False):  # type: ignore[no-untyped-def]
    """``-o/--output FILE``: where the command writes its result (the same name on every command)."""
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Path(dir_okay=False, path_type=Path),
        required=required,
        callback=output_file_value,
        help=what,
    )


def _dataset_value(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--dataset: 'digits' or a folder that exists."""
    if value is None or value == "digits":
        return value
    if not Path(value).is_dir():
        raise click.BadParameter(f"{value!r}: not a folder (give DIR/<class>/<image>, or 'digits')")
    return value


def dataset_option(help: str):  # type: ignore[no-untyped-def]
    """--dataset (kiln bench, kiln study): a labelled image folder or 'digits', checked."""
    return click.option("--dataset", type=str, default=None, callback=_dataset_value, help=help)


def _weights_value(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """--weights MODEL=FILE items -> {zoo model: the file's absolute path}, each a regular file."""
    from kiln.zoo import MODELS
    from kiln.zoo.weights import WeightsError, parse_weights

    try:
        return parse_weights(list(values), MODELS)
    except WeightsError as err:
        raise click.BadParameter(str(err)) from None


def weights_option(help: str):  # type: ignore[no-untyped-def]
    """--weights MODEL=FILE (kiln bench, kiln study), repeatable, parsed and checked."""
    return click.option("--weights", multiple=True, metavar="MODEL=FILE", callback=_weights_value, help=help)
