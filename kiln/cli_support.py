"""What the ``kiln`` command line's modules share: the consoles and argument helpers."""

from __future__ import annotations

import click
from rich.console import Console

console = Console(stderr=True)  # progress and notes
out = Console()  # results


def split_values(values: tuple[str, ...]) -> list[str]:
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def parse_dims(items: tuple[str, ...]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise click.BadParameter(f"expected NAME=INT, got {item!r}", param_hint="--dim")
        dims[name] = int(value)
    return dims


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
