"""A C library that runs every length of a dim in a declared range (``kiln.emit_c(..., length=(dim,
low, high))``, ``kiln compile --emit c --dim seq=1..128``): the plans the Python runtime runs for it.

A dim whose kernels cannot take the length at run time compiles padded lengths (``classes``): the
library then holds one plan per class a length of the range pads to (their units renamed, one
library, ``kiln.driver.emit_c_classes``), and a run pads its tensors to its class, passes the valid
length and cuts the outputs back, as ``kiln.driver.sizes.Padder`` does.

A paddable dim (``kiln.passes.padding``) whose kernels take the length at run time
(``kiln.driver.extents``) has one plan for the whole range: the padded graph lowered at the
capacity (the range's end), its valid length a last input, its arena a ``GrowingLayout`` (every
buffer's bytes a polynomial of the length, the offsets formulas of them: the plan's tables in its
library, kiln.backends.cpu.c_tables). The C API (capi.c) lays the arena out per call, passes the length, pads tensors shorter than the floor with zeros and cuts
the outputs back: what ``kiln.driver.sizes.Padder`` does in Python.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import ArgumentError


def length_variants(model: Any, dims: dict[str, int], symbol: str, low: int, high: int) -> tuple[list[tuple[Any, int]], Any]:  # fmt: skip
    """(the executables of ``model``'s padded plans for ``symbol`` in [low, high], each with the
    length it was compiled at (0: one plan whose kernels take the length at run time), its Padder),
    or ArgumentError saying why the dim pads in neither way in this model."""
    if not 1 <= low <= high:
        raise ArgumentError(f"{symbol}={low}..{high}: a range of sizes from 1 up")
    if not hasattr(model, "declare") or not hasattr(model, "padder"):
        raise ArgumentError("--emit c takes a model compiled for the cpu target")
    model.declare({symbol: (low, high)})
    padder = model.padder()
    if padder is None or padder.symbol != symbol:
        raise ArgumentError(
            f"{symbol} is neither proven sample-parallel nor paddable in this model (kiln explain --dim "
            f"{symbol}={low}..{high} says why): the C library runs one size of it"
        )
    if not padder.samples:  # compiled lengths: the classes a length of the range pads to
        classes = [c for c in padder.classes if padder.class_for(low) <= c <= padder.class_for(high)]
        return [(model.padded().variant({**dims, symbol: c}), c) for c in classes], padder
    executable = model.padded().variant({**dims, symbol: padder.classes[0]})
    if executable.plan.memory.growing is None:
        raise ArgumentError(
            f"{symbol}: the plan for its range has no run-time layout: the C library runs one size of it"
        )
    return [(executable, 0)], padder


def output_axes(padder: Any) -> list[int]:
    """Each output's length axis (-1: none); an output cut along two (a [length, length] map) is not
    in C yet."""
    axes = []
    for position, cut in enumerate(padder.padding.outputs):
        if len(cut) > 1:
            raise ArgumentError(f"output {position} has the length in {len(cut)} dims {list(cut)}: not in C yet")
        axes.append(cut[0] if cut else -1)
    return axes
