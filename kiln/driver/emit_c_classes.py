"""A C library of several plans: a padded length's compiled classes (``kiln.driver.emit_c_length``).
Each class's unit is compiled with its exported names renamed (``kiln_run`` -> ``kiln_run_c1``,
``kiln_tables``, ``kiln_segment_N``), and a small unit lists their tables (``kiln_classes``,
``kiln_class_count``), which kiln's C API (``capi.c``) reads instead of one plan's ``kiln_tables``;
one engine object serves them all. The weights every class packs alike are one array of the file."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from kiln.backends.cpu import c_unit, toolchain
from kiln.backends.cpu.c_tables import HEADER
from kiln.errors import ArgumentError, KilnError


def weight_arrays(plans: list[Any], slots_of: Any) -> tuple[list[np.ndarray], list[list[int]]]:
    """The distinct weight arrays of ``plans`` (equal bytes stored once) and, per plan, which array
    each of its weights is (its weights in the order its tables list them: ``slots_of(plan)``)."""
    arrays: list[np.ndarray] = []
    found: dict[tuple[int, str, bytes], int] = {}
    maps = []
    for plan in plans:
        by_slot = {plan.table[b]: np.ascontiguousarray(a).reshape(-1) for b, a in plan.constants.items()}
        if sorted(by_slot) != sorted(slots_of(plan)):
            raise KilnError("the plan's weights are not those its tables name (kiln bug)")
        indices = []
        for slot in slots_of(plan):
            array = by_slot[slot]
            raw = memoryview(array.view(np.uint8))
            key = (len(raw), array.dtype.str, hashlib.sha1(raw).digest())
            if key not in found:
                found[key] = len(arrays)
                arrays.append(array)
            indices.append(found[key])
        maps.append(indices)
    return arrays, maps


def unit_source(plan: Any) -> str:
    """The plan's own unit, or why a library of classes cannot be built without it."""
    if "kiln_library_plans" not in (plan.source or ""):
        raise ArgumentError("the padded classes' generated code is not at hand: compile the model again to emit its C library")  # fmt: skip
    return plan.source


def renamed(unit: str, number: int) -> str:
    """``unit`` with the names a plan's unit exports renamed for class ``number``."""
    segments = sorted({int(n) for n in re.findall(r"\bkiln_segment_(\d+)\b", unit)})
    names = ["kiln_run", "kiln_tables", "kiln_library_plans", "kiln_profile_seconds", *(f"kiln_segment_{n}" for n in segments)]  # fmt: skip
    return "".join(f"#define {name} {name}_c{number}\n" for name in names) + unit


def link_classes(build: Path, plans: list[Any], target: Any) -> None:
    """``libkiln_model.so`` and ``libkiln_model.a`` in ``build``: every class's unit (renamed), the
    class list and the engine object with the C API."""
    units = [unit_source(plan) for plan in plans]
    objects = [toolchain.object_file(renamed(unit, k), target) for k, unit in enumerate(units)]
    narrow: set[str] = set()
    for unit in units:
        narrow.update(c_unit.linked_engine(unit) or ())
    objects.append(toolchain.object_file(c_unit.engine_source(target, tuple(sorted(narrow))), target))
    listing = HEADER + "".join(f"extern const kiln_plan_tables kiln_tables_c{k};\n" for k in range(len(plans)))
    listing += "const kiln_plan_tables *const kiln_classes[] = {" + ", ".join(f"&kiln_tables_c{k}" for k in range(len(plans))) + "};\n"  # fmt: skip
    listing += f"const kiln_plan_tables *const *kiln_library_plans(int32_t *count) {{ *count = {len(plans)}; return kiln_classes; }}\n"
    objects.append(toolchain.object_file(listing, target))
    compiler = toolchain.find_compiler()[0]
    members = []
    for number, obj in enumerate(objects):  # distinct member names (the cache's are keys)
        member = build / f"kiln_{number}.o"
        shutil.copyfile(obj, member)
        members.append(str(member))
    command = [compiler, "-shared", "-pthread", *members, "-o", str(build / "libkiln_model.so"), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise KilnError(f"linking the C library of the padded classes failed (kiln bug):\n{result.stderr[-3000:]}")
    archiver = shutil.which("ar")
    if archiver is None:
        raise KilnError("building the static C API library needs ar (binutils), which is not on PATH")
    result = subprocess.run([archiver, "rcs", str(build / "libkiln_model.a"), *members], capture_output=True, text=True)
    if result.returncode != 0:
        raise KilnError(f"ar failed on the static C API library (kiln bug): {result.stderr[-2000:]}")
