"""A C library whose kernels take several dims at run time (``kiln.emit_c(..., extents={"h": (64,
224), "w": (64, 224)})``, ``kiln compile --emit c --dim h=64..224 --dim w=64..224``): the plan the
Python runtime runs for them (``kiln.driver.spatial``), its last input the dims vector.

The vector's entries are the graph's symbolic dims: those an input's dims give, and the others as
the program the runtime evaluates (``kiln.driver.dims_program``: a fitted step ``c0 + c *
prod((d_j + a) // s)`` or a dim named by its expression, ``(h+1)//2``), written for the library as
postfix words over earlier entries (CONST v, ENTRY j, ADD, SUB, MUL, FLOORDIV, MOD, MIN, MAX: data,
evaluated by capi.c with its stack, divisors and overflow checked). The library lays each input out
densely in a buffer of its capacity, runs, and reads each output back at its sizes, as
``kiln.driver.laid.LaidInputs`` does; sizes whose vector leaves the capacity or breaks an
equality every compiled binding had are refused (Python specializes the graph there)."""

from __future__ import annotations

from typing import Any

from kiln.driver.variants import Compilation, Source
from kiln.errors import ArgumentError
from kiln.ir import dims as sizes
from kiln.runtime.executable import Executable

CONST, ENTRY, ADD, SUB, MUL, FLOORDIV, MOD, MIN, MAX = range(1, 10)


def dims_variant(model: Any, dims: dict[str, int], extents: dict[str, tuple[int, int]]) -> tuple[Any, Any, Any]:
    """(the executable at the capacity, the route, the route's model's signature) for ``extents``,
    or ArgumentError saying why these dims do not reach the kernels at run time."""
    for name, (low, high) in extents.items():
        if not 1 <= low <= high:
            raise ArgumentError(f"{name}={low}..{high}: a range of sizes from 1 up")
    if not hasattr(model, "declare"):
        raise ArgumentError("--emit c takes a model compiled for the cpu target")
    model.declare(dict(extents))
    found = getattr(model, "dims_model", None)
    route = getattr(found, "spatial", None)
    if route is None or set(route.symbols) != set(extents):
        refused = getattr(model, "run_time_refused", {})
        why = "; ".join(f"{n}: {refused[n]}" for n in extents if n in refused) or "kiln explain says why"
        raise ArgumentError(
            f"{', '.join(extents)}: the kernels do not take these sizes at run time ({why}): the C library runs one size of them"
        )
    if route.program is None:
        raise ArgumentError(
            f"{', '.join(extents)}: the model's other sizes follow from these only by specializing its graph (Python): not in C"
        )
    binding = {**dims, **route.capacity}
    executable = found.variant(binding)
    if getattr(executable, "updates", None):  # (the library lays every input out densely: the cache too)
        options = found.options.with_(disabled=found.options.disabled | {"cache-in-place"})
        compilation = Compilation(Source(found.compilation.graph), found.compiled_for, options)
        compilation.spatial = route
        executable = Executable(compilation.plan(binding), weights=found.weights, parallelism=found.parallelism)
    return executable, route, found.signature


def dims_words(route: Any, signature: Any, inputs: int) -> list[int]:
    """The dims section of the descriptions (capi.c's kiln_read_dims)."""
    program = route.program
    names = list(program.names)
    steps = {index: (c0, c, factors) for index, c0, c, factors in program.steps}
    words = [len(names), *program.capacity]
    for index, name in enumerate(names):
        if index in program.inputs:
            code: list[int] = []
        elif index in program.named:
            code = _expression(sizes.parse(name), names)
        elif index in steps:
            code = _step(*steps[index])
        else:
            code = [CONST, -1]  # (a size no kernel keeps: its capacity is -1, it is never checked)
        words += [len(code), *code]
    words.append(len(program.equal))
    for group in program.equal:
        words += [len(group), *group]
    for value in [*signature.inputs[:inputs], *signature.outputs]:
        for dim in value.type.shape:
            if isinstance(dim, int):
                words.append(-1)
            elif str(dim) in names:
                words.append(names.index(str(dim)))
            else:
                raise ArgumentError(f"{value.name}: its dim {dim} is none of the sizes the kernels take: not in C")
    return words


def _step(c0: int, c: int, factors: Any) -> list[int]:
    code = [CONST, c0, CONST, c]
    for j, add, divisor in factors:
        code += [ENTRY, j, CONST, add, ADD, CONST, divisor, FLOORDIV, MUL]
    return [*code, ADD]


def _expression(expr: Any, names: list[str]) -> list[int]:
    code = [CONST, expr.constant]
    for atoms, coefficient in expr.terms:
        code += [CONST, coefficient]
        for atom in atoms:
            code += [*_atom(atom, names), MUL]
        code.append(ADD)
    return code


def _atom(atom: Any, names: list[str]) -> list[int]:
    if isinstance(atom, sizes.Sym):
        if atom.name not in names:
            raise ArgumentError(f"the size {atom.name} is not one the kernels take: not in C")
        return [ENTRY, names.index(atom.name)]
    if isinstance(atom, (sizes.Floor, sizes.Mod)):
        return [*_expression(atom.inner, names), CONST, atom.k, FLOORDIV if isinstance(atom, sizes.Floor) else MOD]
    code = _expression(atom.items[0], names)
    for item in atom.items[1:]:
        code += [*_expression(item, names), MIN if atom.lowest else MAX]
    return code


def dims_bounds(route: Any, signature: Any, inputs: int, extents: dict[str, tuple[int, int]]) -> list[list[Any]]:
    """Per tensor, per dim: None (fixed), or the (low, high) it is described with (-1 in its shape):
    a ranged dim's range, a size computed from them 1 up to its capacity."""
    names, capacity = list(route.program.names), route.program.capacity
    bounds = []
    for value in [*signature.inputs[:inputs], *signature.outputs]:
        row: list[Any] = []
        for dim in value.type.shape:
            if isinstance(dim, int):
                row.append(None)
            else:
                index = names.index(str(dim))
                row.append(extents.get(str(dim), (1, capacity[index])))
        bounds.append(row)
    return bounds
