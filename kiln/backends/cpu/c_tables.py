"""A plan's tables written into its own unit (``kiln_tables``, ``kiln_plan.h``): the buffer table's
size, each buffer's bytes, the weights', inputs' and outputs' slots, the arena's offsets (as
formulas of a run-time length where it grows with one), the node each status code names and the
instructions the code needs. kiln's C API (``capi.c``, in the engine object every plan's library
links) reads them: the Python runtime and a C program run a plan through the same code, and a
weights file only names the plan it was written for (``id``), never says where anything lives."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.backends.registry import Placement
from kiln.lower.kir import Buffer

HEADER = (Path(__file__).parent / "kiln_plan.h").read_text()
# /proc/cpuinfo flag -> GCC's __builtin_cpu_supports name: what a -march=native library may use
CPU_FLAGS = {
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "bmi1": "bmi",
    "bmi2": "bmi2",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512cd": "avx512cd",
    "avx512_vnni": "avx512vnni",
    "avx512_bf16": "avx512bf16",
    "avx512vbmi": "avx512vbmi",
    "avx512ifma": "avx512ifma",
}
CPU_BITS = tuple(CPU_FLAGS.values())  # bit i of cpu_needs: capi.c's kiln_cpu_flag(i) (the same order)
ISA_FLAGS = {"avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"), "avx2": ("avx2", "fma")}


def cpu_needs(target: Any) -> list[str]:
    """The ``__builtin_cpu_supports`` names of the instructions ``target``'s code was built for."""
    if target.native:
        return sorted({CPU_FLAGS[f] for f in target.features if f in CPU_FLAGS})
    return list(ISA_FLAGS.get(target.isa, ()))


def _array(ctype: str, name: str, rows: Sequence[Any], width: int = 0) -> str:
    """A static C array (at least one element: C has no empty arrays)."""
    if width:
        body = (
            ", ".join("{" + ", ".join(str(int(v)) for v in row) + "}" for row in rows)
            or "{" + "0, " * (width - 1) + "0}"
        )
        return f"static const {ctype} {name}[][{width}] = {{{body}}};"
    return f"static const {ctype} {name}[] = {{{', '.join(str(int(v)) for v in rows) or '0'}}};"


def tables_source(unit: str, placement: Placement, table: dict[Buffer, int], target: Any) -> str:
    """The C text that defines ``kiln_tables`` for the unit ``unit`` (appended to it; its id is
    the unit's SHA-256). Numbers only: no name of the model's reaches the source (a weights file
    carries the tensors' and nodes' names, as data)."""
    memory = placement.memory
    growing = memory.growing
    slot_bytes = [0] * len(table)
    for buffer, slot in table.items():
        slot_bytes[slot] = int(buffer.nbytes)
    arena = [(table[b], int(offset)) for b, offset in memory.offsets.items() if b in table]
    arena_bytes = growing.at(growing.capacity)[1] if growing is not None else int(memory.arena_bytes)
    lines = [
        _array("int64_t", "kiln_t_slot_bytes", slot_bytes),
        _array("int64_t", "kiln_t_constants", sorted(table[b] for b in placement.constants)),
        _array("int64_t", "kiln_t_arena", arena, 2),
        _array("int64_t", "kiln_t_inputs", [table[b] for b in placement.inputs]),
        _array("int64_t", "kiln_t_outputs", [table.get(b, 0) for b in placement.outputs]),
    ]
    length = _length_tables(growing, table) if growing is not None else None
    lines += length[0] if length else []
    needs = cpu_needs(target)
    mask = sum(1 << CPU_BITS.index(name) for name in needs if name in CPU_BITS)
    vnni = int(target.isa == "avx512" or (target.native and target.isa == "avx2"))
    unit_id = hashlib.sha256(unit.encode()).hexdigest()
    length_fields = length[1] if length else "0, 0, 0, 0, 0, kiln_t_none, kiln_t_none3, kiln_t_none32, kiln_t_none32, 0, kiln_t_none, kiln_t_none32, kiln_t_none32, kiln_t_none3"  # fmt: skip
    lines += [
        "static const int64_t kiln_t_none[] = {0};",
        "static const int64_t kiln_t_none3[][3] = {{0, 0, 0}};",
        "static const int32_t kiln_t_none32[] = {0};",
        "const kiln_plan_tables kiln_tables = {",
        f'  KILN_PLAN_TABLES_VERSION, "{unit_id}", {len(table)}, kiln_t_slot_bytes, {arena_bytes},',
        f"  {len(placement.constants)}, kiln_t_constants, {len(arena)}, kiln_t_arena,",
        f"  {len(placement.inputs)}, kiln_t_inputs, {len(placement.outputs)}, kiln_t_outputs,",
        f"  {length_fields},",
        f"  {mask}u, {vnni}, kiln_run}};",
    ]
    lines += [
        "const kiln_plan_tables *const *kiln_library_plans(int32_t *count) {",
        "  static const kiln_plan_tables *const one[1] = {&kiln_tables};",
        "  *count = 1;",
        "  return one;",
        "}",
    ]
    return HEADER + "\n" + "\n".join(lines) + "\n"


# a unit without tables (kiln's own tests of pieces of the C renderer): a library of no plan
NO_TABLES = HEADER + "const kiln_plan_tables *const *kiln_library_plans(int32_t *count) { *count = 0; return 0; }\n"


def _length_tables(growing: Any, table: dict[Buffer, int]) -> tuple[list[str], str]:
    """The run-time length's arrays and its fields of kiln_tables."""
    below_at, below = [0], []
    for i, under in enumerate(growing.below):
        if any(j >= i for j in under):
            raise ValueError("the run-time layout is not in offset order (kiln bug)")
        below.extend(under)
        below_at.append(len(below))
    at, terms = [0], []
    for _, coefficients in growing.constants:
        terms.extend(coefficients)
        at.append(len(terms))
    lines = [
        _array("int64_t", "kiln_t_growing_slots", [table[b] for b in growing.order]),
        _array("int64_t", "kiln_t_growing_sizes", growing.sizes, 3),
        _array("int32_t", "kiln_t_below_at", below_at),
        _array("int32_t", "kiln_t_below", below),
        _array("int64_t", "kiln_t_lc_slots", [table[b] for b, _ in growing.constants]),
        _array("int32_t", "kiln_t_lc_bits", [b.dtype.numpy.itemsize * 8 for b, _ in growing.constants]),
        _array("int32_t", "kiln_t_lc_at", at),
        _array("int64_t", "kiln_t_lc_terms", terms, 3),
    ]
    fields = (
        f"1, {table[growing.valid]}, {growing.floor}, {growing.capacity}, {len(growing.order)}, kiln_t_growing_slots, "
        f"kiln_t_growing_sizes, kiln_t_below_at, kiln_t_below, {len(growing.constants)}, kiln_t_lc_slots, "
        "kiln_t_lc_bits, kiln_t_lc_at, kiln_t_lc_terms"
    )
    return lines, fields
