"""A compiled model as a C library with a small, stable header (``kiln compile MODEL --emit c -o
DIR``, ``kiln.emit_c``): run it from C or C++ with no Python, NumPy or compiler on the machine.

The folder holds:

- ``kiln.h``: the API (``kiln/backends/cpu/kiln.h``: load, describe, contexts, ``kiln_infer`` on
  DLPack tensors, statuses and messages);
- ``libkiln_model.so``: the plan's library, the very file the Python runtime loads for it: its
  generated code with its tables (``kiln_tables``: slots, arena offsets, the weights', inputs' and
  outputs' buffers), kiln's engine, thread pool and the C API (``capi.c``) over those tables;
- ``libkiln_model.a``: the same as one static library (the plan's unit and the engine object:
  link with ``-lpthread -lm``);
- ``model.kw``: the tensors' descriptions (names, dtypes, dims, ranges) and the weights, packed as
  the plan reads them, each 64-byte aligned, after a header (magic, ABI version, count, data
  bytes, CRC-32, the plan's id, each weight's bytes): the library maps it read-only, so processes
  share its pages, and refuses a truncated, damaged or foreign one (every slot and byte count in
  it is checked against the library's own tables);
- ``main.c``: an example that loads the model, runs it once on zeros and prints each output's first
  values; ``README.txt``: how to build and run it;
- ``src/``: the API's source (``capi.c``, ``kiln_plan.h``), to build it again (with sanitizers,
  say) into a program linked against ``libkiln_model.so``.

It takes one binding of the model's dims (``dims``) and up to two ranges: a sample-parallel batch
(``batch``: the plan of one sample, once per sample) and a run-time length (``length``: one plan for
every length, ``kiln.driver.emit_c_length``), together (a BERT's batch and sequence) or alone. A plan with host fallbacks (ops without native code)
cannot run without Python and is refused.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.backends.cpu import c_unit, toolchain
from kiln.driver.emit_c_classes import link_classes, weight_arrays
from kiln.driver.emit_c_dims import dims_bounds, dims_variant, dims_words
from kiln.driver.emit_c_length import length_variants, output_axes
from kiln.errors import ArgumentError, CompilerError, KilnError
from kiln.ir.types import DType, TensorType
from kiln.passes.batching import symbols

ABI_VERSION = 2  # 2: the descriptions in the weights file, the tables in the library
MAGIC = b"KILNWTS1"
HEAD = 104  # the header's fixed part: magic, ABI | count, data bytes, CRC-32, plan id, description words
ALIGN = 64
HERE = Path(__file__).resolve().parents[1] / "backends" / "cpu"
DLPACK = {  # kiln dtype -> DLPack (type code, bits)
    DType.FLOAT32: (2, 32),
    DType.FLOAT64: (2, 64),
    DType.FLOAT16: (2, 16),
    DType.BFLOAT16: (4, 16),
    DType.INT8: (0, 8),
    DType.INT16: (0, 16),
    DType.INT32: (0, 32),
    DType.INT64: (0, 64),
    DType.UINT8: (1, 8),
    DType.BOOL: (6, 8),
}


@dataclass
class Emitted:
    """What ``emit_c`` wrote: the folder, its files, the weights' bytes and the dims it runs."""

    folder: Path
    files: list[str]
    weight_bytes: int
    dims: dict[str, int]

    def line(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items()) or "static"
        return f"C library in {self.folder}: {', '.join(self.files)} ({self.weight_bytes / 1e6:.1f} MB of weights; dims {dims})"


def emit_c(
    model: Any,
    folder: str | Path,
    dims: dict[str, int] | None = None,
    batch: tuple[str, int, int] | None = None,
    length: tuple[str, int, int] | None = None,
    extents: dict[str, tuple[int, int]] | None = None,
) -> Emitted:
    """Write ``model`` (a ``kiln.compile`` result for the cpu target) as a C library into ``folder``
    (made if absent; files of these names in it are replaced, nothing else is touched). ``dims``
    binds the symbolic dims; ``batch`` = (symbol, low, high): a sample-parallel dim the library runs
    at any size in [low, high], one sample at a time on the plan of size 1 (its axis 0 in every
    input and output); ``length`` = (symbol, low, high): a paddable dim, any length in [low, high]
    (one plan whose kernels take the length at run time, or its compiled classes); ``extents`` =
    {symbol: (low, high)}: dims the kernels take at run time through the dims vector (an image's
    height and width), every other dim bound."""
    dims = dict(dims or {})
    batched, padder = None, None
    if batch is not None and length is not None and batch[0] == length[0]:
        raise ArgumentError(f"{batch[0]} is given two ranges: a sample-parallel batch and a run-time length")
    if batch is not None:
        batched = _batch_axes(model, *batch)
        dims[batch[0]] = 1
    if extents and (batch is not None or length is not None):
        raise ArgumentError(
            "dims taken at run time through the dims vector take no other range: bind the rest with --dim"
        )
    unbound = sorted(
        set(symbols(model.signature)) - set(dims) - ({length[0]} if length else set()) - set(extents or ())
    )
    if unbound:
        raise ArgumentError(f"--emit c runs one size: bind {', '.join(unbound)} (--dim {unbound[0]}=N)")
    if not hasattr(model, "variant"):
        raise ArgumentError("--emit c takes a model compiled for the cpu target")
    lengths, vector = None, None
    if extents:
        executable, route, signature = dims_variant(model, dims, dict(extents))
        variants = [(executable, -1)]
        count = len(executable.plan.inputs) - 1
        vector = (dims_words(route, signature, count), dims_bounds(route, signature, count, dict(extents)))
    elif length is not None:
        variants, padder = length_variants(model, dims, *length)
        lengths = (tuple(a if a is not None else -1 for a in padder.padding.inputs), tuple(output_axes(padder)))
    else:
        variants = [(model.variant(dims), 0)]
    for executable, _ in variants:
        _check(executable.plan, executable, padder is not None)
    plans = [executable.plan for executable, _ in variants]
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ArgumentError(f"{folder} is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    arrays, maps = weight_arrays(plans, _compiled_constant_slots)
    ranges = (batch[1:] if batch else (1, 1)) + (length[1:] if length else (1, 1))
    classes = [(plan, class_length, indices) for plan, (_, class_length), indices in zip(plans, variants, maps)]
    words = _descriptions(classes, batched, lengths, ranges, vector)
    header, data_at = _weights_header([a.nbytes for a in arrays], words, _plan_id(plans[0]))
    _write_library(folder, plans)
    data_bytes = _write_weights(folder / "model.kw", header, data_at, arrays)
    _replace(folder / "main.c", (HERE / "capi_example.c").read_bytes())
    _replace(
        folder / "README.txt",
        _readme(plans[-1], len(plans[-1].inputs) - int(padder is not None or bool(extents))).encode(),
    )
    files = ["kiln.h", "libkiln_model.so", "model.kw", "main.c", "README.txt", "src/"]
    if (folder / "libkiln_model.a").exists():
        files.insert(2, "libkiln_model.a")
    for ranged in (batch, length, *((name, *bounds) for name, bounds in (extents or {}).items())):
        if ranged is not None:
            dims[ranged[0]] = f"{ranged[1]}..{ranged[2]}"  # type: ignore[assignment]
    return Emitted(folder, files, data_bytes, dims)


def _write_library(folder: Path, plans: list[Any]) -> None:
    """kiln.h, the library (the plan's own; several classes' linked into one) and its static twin,
    and the API's source in ``src/``."""
    with tempfile.TemporaryDirectory(prefix="kiln-emit-") as scratch:
        build = Path(scratch)
        shutil.copyfile(HERE / "kiln.h", build / "kiln.h")
        names = ["libkiln_model.so", "kiln.h"]
        if len(plans) > 1:
            link_classes(build, plans, plans[0].target)
            names.append("libkiln_model.a")
        else:
            shutil.copyfile(plans[0].library, build / "libkiln_model.so")
            if _archive(build, plans[0]):
                names.append("libkiln_model.a")
        for name in names:
            _replace(folder / name, (build / name).read_bytes())
    source = folder / "src"
    if source.is_symlink() or (source.exists() and not source.is_dir()):
        raise ArgumentError(f"{source} exists and is not a folder")
    source.mkdir(exist_ok=True)
    for name in ("capi.c", "kiln_plan.h"):  # the API's source (a sanitized build of a program)
        _replace(source / name, (HERE / name).read_bytes())


def _check(plan: Any, executable: Any, run_time_length: bool = False) -> None:
    target = plan.target
    if target is None or target.backend != "cpu":
        raise ArgumentError("--emit c takes a model compiled for the cpu target")
    if plan.library is None:
        raise ArgumentError("the model runs no native code (its outputs are its inputs or weights): nothing to build")
    if not plan.is_native or executable.interpreter is not None:
        ops = sorted({step.node.op for step in getattr(plan, "fallbacks", [])})
        raise ArgumentError(
            "the model needs host fallbacks (ops without native code"
            + (f": {', '.join(ops)}" if ops else "")
            + "), which run in Python: it cannot be a C library yet"
        )
    if (plan.memory.growing is not None and not run_time_length) or executable.keep is not None:
        raise ArgumentError("--emit c takes plans of fixed sizes (bind every dim with --dim)")


def _plan_id(plan: Any) -> str:
    """The id the plan's library names itself by (its unit's SHA-256, in ``kiln_tables``)."""
    found = re.search(r'kiln_tables = \{\n  KILN_PLAN_TABLES_VERSION, "([0-9a-f]{64})"', plan.source or "")
    if found is None:
        raise ArgumentError("the model's code has no C API tables (it was compiled by another kiln): compile it again")
    return found.group(1)


def _compiled_constant_slots(plan: Any) -> list[int]:
    """The weights' slots as the plan's tables list them (the order the library reads the file in)."""
    found = re.search(r"static const int64_t kiln_t_constants\[\] = \{([0-9, ]*)\};", plan.source or "")
    if found is None:
        raise ArgumentError("the model's code has no C API tables (it was compiled by another kiln): compile it again")
    count = len(plan.constants)
    return [int(v) for v in found.group(1).split(",")][:count] if count else []


def _weights_header(sizes: list[int], words: list[int], plan_id: str) -> tuple[bytes, int]:
    """The header up to the data (its data bytes and CRC-32 left zero: ``_write_weights`` writes
    them), and where the data starts."""
    head = MAGIC + (ABI_VERSION | (len(sizes) << 32)).to_bytes(8, "little") + bytes(16) + plan_id.encode()
    head += len(words).to_bytes(8, "little")
    head += b"".join(size.to_bytes(8, "little") for size in sizes)
    head += b"".join((w & (2**64 - 1)).to_bytes(8, "little") for w in words)
    head += b"\0" * (-len(head) % ALIGN)
    return head, len(head)


def _write_weights(path: Path, header: bytes, data_at: int, arrays: list[np.ndarray]) -> int:
    """The weights file written whole, streamed from the arrays (no copy of them in memory), its
    data bytes and CRC-32 (of everything after the header's fixed part) filled in; returns the
    data bytes."""
    temporary = _temporary(path)
    crc = zlib.crc32(header[HEAD:])
    at = 0
    with open(temporary, "wb") as out:
        out.write(header)
        for array in arrays:
            raw = memoryview(array.view(np.uint8))
            pad = b"\0" * (-(at + len(raw)) % ALIGN)
            out.write(raw)
            out.write(pad)
            crc = zlib.crc32(pad, zlib.crc32(raw, crc))
            at += len(raw) + len(pad)
        out.seek(16)
        out.write(at.to_bytes(8, "little") + crc.to_bytes(8, "little"))
    temporary.replace(path)
    return at


def _batch_axes(model: Any, symbol: str, low: int, high: int) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Which inputs and outputs carry the sample-parallel ``symbol`` (on axis 0), or why not."""
    from kiln.passes.batching import Parallel

    if not 1 <= low <= high:
        raise ArgumentError(f"{symbol}={low}..{high}: a range of sizes from 1 up")
    found = model.sample_parallel().get(symbol) if hasattr(model, "sample_parallel") else None
    if not isinstance(found, Parallel):
        raise ArgumentError(f"{symbol} is not proven sample-parallel ({found}): the C library runs one size of it")
    if found.guards:
        raise ArgumentError(f"{symbol}'s samples are whole only where {', '.join(found.guards)} hold: not in C yet")
    if any(axis not in (0, None) for axis in (*found.inputs, *found.outputs)) or None in found.outputs:
        raise ArgumentError(f"{symbol} is not axis 0 of every output (and input that carries it): not in C yet")
    return tuple(axis == 0 for axis in found.inputs), tuple(axis == 0 for axis in found.outputs)


def _descriptions(classes: list[tuple[Any, int, list[int]]], batched: Any, lengths: Any, ranges: tuple[int, ...], vector: Any = None) -> list[int]:  # fmt: skip
    """The descriptions the library reads from the weights file (capi.c's kiln_read_io): the batch
    and length ranges, the tensor and plan counts, then per plan (a padded length's classes, or
    the one plan) its class length (0: none), its id, which array each of its weights is, its
    tensors (name, dtype, dims, slot, batched flag, length axis, the dims kiln_model_input/output
    describe) and the node each of its status codes names. ``batched``: each input's and output's
    sample-parallel flag (axis 0); ``lengths``: each one's length axis (-1: none; a padded plan's
    last input, the valid length, is the library's own); ``vector``: run-time dims (their section,
    each tensor's dims' bounds; the plan's last input, the dims vector, is the library's own)."""
    plan = classes[0][0]
    count = len(plan.inputs) - int(lengths is not None or vector is not None)
    bounds = vector[1] if vector is not None else [None] * (count + len(plan.outputs))
    flags_in, flags_out = batched or ((False,) * count, (False,) * len(plan.outputs))
    axes_in, axes_out = lengths or ((-1,) * count, (-1,) * len(plan.outputs))
    words = [*ranges, count, len(plan.outputs), len(classes)]
    for plan, class_length, indices in classes:
        words += [
            class_length,
            *(int.from_bytes(_plan_id(plan).encode()[i : i + 8], "little") for i in range(0, 64, 8)),
        ]
        words += [len(indices), *indices]
        described = [
            *zip(plan.graph.inputs[:count], plan.inputs, flags_in, axes_in),
            *zip(plan.graph.outputs, plan.outputs, flags_out, axes_out),
        ]
        for (value, buffer, flag, axis), dim_bounds in zip(described, bounds):
            words += _description(value, plan.table[buffer], (flag, axis), ranges, dim_bounds)
        labels = dict(getattr(plan, "kernel_labels", {}) or {})  # the node each status code names
        words.append(max(labels, default=-1) + 1)
        for code in range(words[-1]):
            words += _text_words(str(labels.get(code, "?")))
    return words + (vector[0] if vector is not None else [0])


def _text_words(text: str) -> list[int]:
    """A name as words: its bytes, then its UTF-8 zero-padded to whole 8-byte words (one zero at least)."""
    raw = text.encode("utf-8")
    padded = raw + b"\0" * (8 - len(raw) % 8)
    return [len(raw), *(int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded), 8))]


def _description(value: Any, slot: int, flags: tuple[bool, int], ranges: tuple[int, ...], bounds: Any = None) -> list[int]:  # fmt: skip
    batched, axis = flags
    vtype = value.type
    if not isinstance(vtype, TensorType) or vtype.shape is None or not vtype.is_static:
        raise KilnError(f"{value.name}: no static shape in the plan (kiln bug)")
    if vtype.dtype not in DLPACK:
        raise ArgumentError(f"{value.name}: dtype {vtype.dtype.name} has no C API type yet")
    code, bits = DLPACK[vtype.dtype]
    shape = [int(d) for d in vtype.shape]
    if batched and (not shape or shape[0] != 1):
        raise KilnError(f"{value.name}: the sample-parallel dim is not its axis 0 of size 1 (kiln bug)")
    words = [*_text_words(value.name), code, bits, len(shape), slot, int(batched), int(axis)]
    shown, low, high = list(shape), list(shape), list(shape)
    if batched:  # described as -1 on axis 0, within the batch range
        shown[0], low[0], high[0] = -1, ranges[0], ranges[1]
    if axis >= 0:  # a run-time length: -1 on its axis, within the length range
        shown[axis], low[axis], high[axis] = -1, ranges[2], ranges[3]
    for d, bound in enumerate(bounds or ()):  # run-time dims: -1 within their bounds
        if bound is not None:
            shown[d], low[d], high[d] = -1, bound[0], bound[1]
    return words + shape + shown + low + high


def _archive(build: Path, plan: Any) -> bool:
    """``libkiln_model.a``: the plan's unit and its engine object with the API (the same source
    and flags as the shared library); False where the plan's unit source is not at hand."""
    unit = plan.source or ""
    if "kiln_library_plans" not in unit:
        return False
    try:
        objects = [toolchain.object_file(unit, plan.target)]
        narrow = c_unit.linked_engine(unit)
        if narrow is not None:  # (None: a debug build, whose unit holds the engines)
            objects.append(toolchain.object_file(c_unit.engine_source(plan.target, narrow), plan.target))
    except CompilerError:  # no compiler here (a model loaded from an artifact): the shared library only
        return False
    archiver = shutil.which("ar")
    if archiver is None:
        raise KilnError("building the static C API library needs ar (binutils), which is not on PATH")
    members = []
    for number, obj in enumerate(objects):  # distinct member names (the cache's are keys)
        member = build / f"kiln_{number}.o"
        shutil.copyfile(obj, member)
        members.append(str(member))
    result = subprocess.run([archiver, "rcs", str(build / "libkiln_model.a"), *members], capture_output=True, text=True)
    if result.returncode != 0:
        raise KilnError(f"ar failed on the static C API library (kiln bug): {result.stderr[-2000:]}")
    return True


def _replace(path: Path, content: bytes) -> None:
    """``path`` written whole."""
    temporary = _temporary(path)
    temporary.write_bytes(content)
    temporary.replace(path)


def _temporary(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place; refused where ``path`` is a link
    or anything but a regular file (kiln writes through neither)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ArgumentError(f"{path} exists and is not a regular file: kiln will not write through it")
    return path.with_name(f".{path.name}.kiln-tmp")


def _readme(plan: Any, count: int) -> str:
    names = ", ".join(v.name for v in plan.graph.inputs[:count])
    return f"""kiln: this model as a C library (kiln.h; ABI version {ABI_VERSION})

Build the example and run it (no Python, NumPy or kiln needed at run time; a C compiler only to build
your own program):

    cc -std=c99 -O2 main.c -I. -L. -lkiln_model -Wl,-rpath,'$ORIGIN' -o example
    ./example model.kw

or statically (the program then needs only model.kw beside it):

    cc -std=c99 -O2 main.c -I. libkiln_model.a -lpthread -lm -o example

Inputs: {names}. kiln.h says what the API promises (threads, allocation, errors). The code was
built for {plan.target.name} ({plan.target.isa}); on a CPU without those instructions
kiln_model_load returns KILN_ERROR_CPU.
"""
