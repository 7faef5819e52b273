"""A C library that runs every length of a dim in a declared range (``kiln.emit_c(..., length=(dim,
low, high))``, ``kiln compile --emit c --dim seq=1..128``): the plan the Python runtime runs for it.

A paddable dim (``kiln.passes.padding``) whose kernels take the length at run time
(``kiln.driver.extents``) has one plan for the whole range: the padded graph lowered at the
capacity (the range's end), its valid length a last input, its arena a ``GrowingLayout`` (every
buffer's bytes a polynomial of the length, the offsets formulas of them). The C API (capi.c) lays
the arena out per call, passes the length, pads tensors shorter than the floor with zeros and cuts
the outputs back: what ``kiln.driver.sizes.Padder`` does in Python.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import ArgumentError


def length_variant(model: Any, dims: dict[str, int], symbol: str, low: int, high: int) -> tuple[Any, Any]:
    """(the executable of ``model``'s padded plan for ``symbol`` in [low, high], its Padder), or
    ArgumentError saying why the dim has no run-time length in this model."""
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
    if not padder.samples:
        why = getattr(model, "run_time_refused", {}).get(symbol, "kiln explain says why")
        raise ArgumentError(
            f"{symbol}'s kernels do not take the length at run time in this model ({why}; it compiles padded "
            "lengths instead, not in C yet): the C library runs one size of it"
        )
    executable = model.padded().variant({**dims, symbol: padder.classes[0]})
    if executable.plan.memory.growing is None:
        raise ArgumentError(
            f"{symbol}: the plan for its range has no run-time layout: the C library runs one size of it"
        )
    return executable, padder


def output_axes(padder: Any) -> list[int]:
    """Each output's length axis (-1: none); an output cut along two (a [length, length] map) is not
    in C yet."""
    axes = []
    for position, cut in enumerate(padder.padding.outputs):
        if len(cut) > 1:
            raise ArgumentError(f"output {position} has the length in {len(cut)} dims {list(cut)}: not in C yet")
        axes.append(cut[0] if cut else -1)
    return axes


def length_tables(plan: Any, padder: Any, low: int, high: int) -> str:
    """The run-time length's defines and the growing layout as C tables."""
    growing = plan.memory.growing
    table = plan.table
    lines = [
        "#define KILN_LENGTH 1",
        f"#define KILN_LENGTH_MIN {low}",
        f"#define KILN_LENGTH_MAX {high}",
        f"#define KILN_LENGTH_FLOOR {max(growing.floor, low)}",
        f"#define KILN_LENGTH_CAPACITY {growing.capacity}",
        f"#define KILN_VALID_SLOT {table[growing.valid]}",
        f"#define KILN_GROWING {len(growing.order)}",
    ]
    below_at, below = [0], []
    for i, under in enumerate(growing.below):
        if any(j >= i for j in under):
            raise ArgumentError("the run-time layout is not in offset order (kiln bug)")
        below.extend(under)
        below_at.append(len(below))
    slots = ", ".join(str(table[b]) for b in growing.order) or "0"
    sizes = ", ".join(f"{{{c0}, {c1}, {c2}}}" for c0, c1, c2 in growing.sizes) or "{0, 0, 0}"
    lines.append(f"static const int64_t kiln_growing_slots[] = {{{slots}}};")
    lines.append(f"static const int64_t kiln_growing_sizes[][3] = {{{sizes}}};")
    lines.append(f"static const int32_t kiln_growing_below_at[] = {{{', '.join(map(str, below_at))}}};")
    lines.append(f"static const int32_t kiln_growing_below[] = {{{', '.join(map(str, below)) or '0'}}};")
    lines += _constant_tables(table, growing.constants)
    return "\n".join(lines) + "\n"


def _constant_tables(table: dict, constants: tuple) -> list[str]:
    """The integer constants whose values follow the length (``GrowingLayout.constants``): each
    one's slot, element bits and its elements' (c0, c1, c2), written per call at the run's length."""
    at, terms = [0], []
    for _, coefficients in constants:
        terms.extend(coefficients)
        at.append(len(terms))
    slots = ", ".join(str(table[b]) for b, _ in constants) or "0"
    bits = ", ".join(str(b.dtype.numpy.itemsize * 8) for b, _ in constants) or "0"
    rows = ", ".join(f"{{{c0}, {c1}, {c2}}}" for c0, c1, c2 in terms) or "{0, 0, 0}"
    return [
        f"#define KILN_LENGTH_CONSTANTS {len(constants)}",
        f"static const int64_t kiln_length_constant_slots[] = {{{slots}}};",
        f"static const int32_t kiln_length_constant_bits[] = {{{bits}}};",
        f"static const int32_t kiln_length_constant_at[] = {{{', '.join(map(str, at))}}};",
        f"static const int64_t kiln_length_constant_terms[][3] = {{{rows}}};",
    ]


def no_length() -> str:
    """The defines of a library without a run-time length (capi.c's length code compiled out)."""
    return (
        "#define KILN_LENGTH 0\n#define KILN_LENGTH_MIN 1\n#define KILN_LENGTH_MAX 1\n#define KILN_LENGTH_FLOOR 1\n"
        "#define KILN_LENGTH_CAPACITY 1\n#define KILN_VALID_SLOT 0\n#define KILN_GROWING 0\n"
        "static const int64_t kiln_growing_slots[] = {0};\nstatic const int64_t kiln_growing_sizes[][3] = {{0, 0, 0}};\n"
        "static const int32_t kiln_growing_below_at[] = {0};\nstatic const int32_t kiln_growing_below[] = {0};\n"
        + "\n".join(_constant_tables({}, ()))
        + "\n"
    )
