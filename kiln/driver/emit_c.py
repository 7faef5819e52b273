"""A compiled model as a C library with a small, stable header (``kiln compile MODEL --emit c -o
DIR``, ``kiln.emit_c``): run it from C or C++ with no Python, NumPy or compiler on the machine.

The folder holds:

- ``kiln.h``: the API (``kiln/backends/cpu/kiln.h``: load, describe, contexts, ``kiln_infer`` on
  DLPack tensors, statuses and messages);
- ``libkiln_model.so``: the API over this model's plan (``kiln/backends/cpu/capi.c`` compiled with
  the plan's tables: buffer slots, arena offsets, inputs and outputs), linked to
- ``libkiln_plan.so``: the plan's generated code with kiln's engine and thread pool (the library
  the Python runtime loads for the same plan), found beside it (rpath ``$ORIGIN``);
- ``libkiln_model.a``: the same as one static library (the API, the plan's unit, the engine:
  link with ``-lpthread -lm``);
- ``model.kw``: the weights, packed as the plan reads them, each 64-byte aligned after a header
  (magic, ABI version, count, data bytes, CRC-32, the model's id, each weight's bytes): the library
  maps it read-only, so processes share its pages, and refuses a truncated, damaged or foreign one;
- ``main.c``: an example that loads the model, runs it once on zeros and prints each output's first
  values; ``README.txt``: how to build and run it;
- ``src/``: the API library's source (``capi.c`` and this model's ``kiln_model_tables.h``), to build
  it again (with sanitizers, say) against ``libkiln_plan.so``.

It takes one binding of the model's dims (``dims``) and at most one range: a sample-parallel batch
(``batch``: the plan of one sample, once per sample) or a run-time length (``length``: one plan for
every length, ``kiln.driver.emit_c_length``). A plan with host fallbacks (ops without native code)
cannot run without Python and is refused.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.backends.cpu import c_unit, toolchain
from kiln.driver.emit_c_length import length_tables, length_variant, no_length, output_axes
from kiln.errors import ArgumentError, KilnError
from kiln.ir.types import DType, TensorType
from kiln.passes.batching import symbols

ABI_VERSION = 1
MAGIC = b"KILNWTS1"
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
ISA_FLAGS = {"avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"), "avx2": ("avx2", "fma")}


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
) -> Emitted:
    """Write ``model`` (a ``kiln.compile`` result for the cpu target) as a C library into ``folder``
    (made if absent; files of these names in it are replaced, nothing else is touched). ``dims``
    binds the symbolic dims; ``batch`` = (symbol, low, high): a sample-parallel dim the library runs
    at any size in [low, high], one sample at a time on the plan of size 1 (its axis 0 in every
    input and output); ``length`` = (symbol, low, high): a paddable dim whose kernels take the
    length at run time, any length in [low, high] on one plan."""
    dims = dict(dims or {})
    axes, padder = None, None
    if batch is not None and length is not None:
        raise ArgumentError("the C library takes one range: a sample-parallel batch or a run-time length")
    if batch is not None:
        axes = _batch_axes(model, *batch)
        dims[batch[0]] = 1
    unbound = sorted(set(symbols(model.signature)) - set(dims) - ({length[0]} if length else set()))
    if unbound:
        raise ArgumentError(f"--emit c runs one size: bind {', '.join(unbound)} (--dim {unbound[0]}=N)")
    if not hasattr(model, "variant"):
        raise ArgumentError("--emit c takes a model compiled for the cpu target")
    if length is not None:
        executable, padder = length_variant(model, dims, *length)
        axes = (tuple(a if a is not None else -1 for a in padder.padding.inputs), tuple(output_axes(padder)))
    else:
        executable = model.variant(dims)
    plan = executable.plan
    _check(plan, executable, padder is not None)
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ArgumentError(f"{folder} is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    constants = [(buffer, np.ascontiguousarray(array).reshape(-1)) for buffer, array in plan.constants.items()]
    sizes, data_bytes, crc = _weights_layout(constants)
    extra = length_tables(plan, padder, length[1], length[2]) if length is not None else no_length()
    tables = _batch_range(batch) + extra + _tables(plan, constants, sizes, axes, padder is not None)
    model_id = hashlib.sha256(tables.encode() + crc.to_bytes(8, "little")).hexdigest()
    header = _weights_header(sizes, data_bytes, crc, model_id)
    with tempfile.TemporaryDirectory(prefix="kiln-emit-") as scratch:
        build = Path(scratch)
        (build / "kiln_model_tables.h").write_text(_id_define(model_id) + _cpu_checks(plan.target) + tables)
        shutil.copyfile(HERE / "kiln.h", build / "kiln.h")
        shutil.copyfile(HERE / "capi.c", build / "capi.c")
        plan_library = build / "libkiln_plan.so"
        shutil.copyfile(plan.library, plan_library)
        _link(build, plan_library)
        names = ["libkiln_plan.so", "libkiln_model.so", "kiln.h"]
        if _archive(build, plan):
            names.append("libkiln_model.a")
        for name in names:
            _replace(folder / name, (build / name).read_bytes())
        source = folder / "src"
        if source.is_symlink() or (source.exists() and not source.is_dir()):
            raise ArgumentError(f"{source} exists and is not a folder")
        source.mkdir(exist_ok=True)
        for name in ("capi.c", "kiln_model_tables.h"):  # the API library's source (a sanitized or static build)
            _replace(source / name, (build / name).read_bytes())
    _write_weights(folder / "model.kw", header, constants)
    _replace(folder / "main.c", (HERE / "capi_example.c").read_bytes())
    _replace(folder / "README.txt", _readme(plan, len(plan.inputs) - int(padder is not None)).encode())
    files = ["kiln.h", "libkiln_model.so", "libkiln_plan.so", "model.kw", "main.c", "README.txt", "src/"]
    if (folder / "libkiln_model.a").exists():
        files.insert(2, "libkiln_model.a")
    for ranged in (batch, length):
        if ranged is not None:
            dims[ranged[0]] = f"{ranged[1]}..{ranged[2]}"  # type: ignore[assignment]
    return Emitted(folder, files, data_bytes, dims)


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


def _weights_layout(constants: list[tuple[Any, np.ndarray]]) -> tuple[list[int], int, int]:
    """(each weight's bytes, the data's bytes with the 64-byte padding, its CRC-32), read in place."""
    sizes, at, crc = [], 0, 0
    for _, array in constants:
        raw = memoryview(array.view(np.uint8))
        pad = -(at + len(raw)) % ALIGN
        crc = zlib.crc32(b"\0" * pad, zlib.crc32(raw, crc))
        sizes.append(len(raw))
        at += len(raw) + pad
    return sizes, at, crc


def _weights_header(sizes: list[int], data_bytes: int, crc: int, model_id: str) -> bytes:
    head = MAGIC + (ABI_VERSION | (len(sizes) << 32)).to_bytes(8, "little")
    head += data_bytes.to_bytes(8, "little") + crc.to_bytes(8, "little") + model_id.encode()
    head += b"".join(size.to_bytes(8, "little") for size in sizes)
    return head + b"\0" * (-len(head) % ALIGN)


def _write_weights(path: Path, header: bytes, constants: list[tuple[Any, np.ndarray]]) -> None:
    """The weights file written whole, streamed from the arrays (no copy of them in memory)."""
    temporary = _temporary(path)
    with open(temporary, "wb") as out:
        out.write(header)
        at = 0
        for _, array in constants:
            raw = memoryview(array.view(np.uint8))
            out.write(raw)
            pad = -(at + len(raw)) % ALIGN
            out.write(b"\0" * pad)
            at += len(raw) + pad
    temporary.replace(path)


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


def _batch_range(batch: tuple[str, int, int] | None) -> str:
    low, high = (batch[1], batch[2]) if batch is not None else (1, 1)
    return f"#define KILN_BATCH_MIN {low}\n#define KILN_BATCH_MAX {high}\n"


def _tables(plan: Any, constants: list[tuple[Any, np.ndarray]], sizes: list[int], axes: Any = None, lengths: bool = False) -> str:  # fmt: skip
    """The plan's buffer table as C: slots, weights, arena offsets, inputs and outputs. ``axes``:
    each input's and output's sample-parallel flag, or with ``lengths`` its run-time length axis
    (-1: none; the plan's last input, the valid length, is the library's own)."""
    table = plan.table
    growing = plan.memory.growing if lengths else None
    arena_bytes = growing.at(growing.capacity)[1] if growing is not None else int(plan.memory.arena_bytes)
    lines = [f"#define KILN_SLOTS {len(table)}", f"#define KILN_ARENA_BYTES {int(arena_bytes)}"]
    lines.append(f"#define KILN_CONSTANTS {len(constants)}")
    slots = [str(table[buffer]) for buffer, _ in constants] or ["0"]
    lines.append(f"static const int64_t kiln_constant_slots[] = {{{', '.join(slots)}}};")
    lines.append(f"static const uint64_t kiln_constant_bytes[] = {{{', '.join(str(s) for s in sizes) or '0'}}};")
    arena = [(table[b], int(offset)) for b, offset in plan.memory.offsets.items() if b in table]
    lines.append(f"#define KILN_ARENA_SLOTS {len(arena)}")
    pairs = ", ".join(f"{{{slot}, {offset}}}" for slot, offset in arena) or "{0, 0}"
    lines.append(f"static const int64_t kiln_arena_slots[][2] = {{{pairs}}};")
    weight_index = {buffer: i for i, (buffer, _) in enumerate(constants)}
    flags_in, flags_out = axes or ((False,) * len(plan.inputs), (False,) * len(plan.outputs))
    user_inputs = list(zip(plan.graph.inputs, plan.inputs))[: len(plan.inputs) - int(lengths)]
    inputs = [
        _io(value, buffer, table[buffer], 0, 0, *((False, flag) if lengths else (flag, -1)))
        for (value, buffer), flag in zip(user_inputs, flags_in)
    ]
    outputs = []
    for value, buffer, flag in zip(plan.graph.outputs, plan.outputs, flags_out):
        if buffer in weight_index:
            source, where = 2, weight_index[buffer]
        elif buffer in plan.inputs:
            source, where = 3, plan.inputs.index(buffer)
        elif buffer in plan.memory.offsets:  # (a run-time layout: its position in the growing order)
            source, where = 1, growing.order.index(buffer) if growing is not None else int(plan.memory.offsets[buffer])
        else:
            source, where = 0, 0
        outputs.append(
            _io(value, buffer, table.get(buffer, 0), source, where, *((False, flag) if lengths else (flag, -1)))
        )
    lines.append(f"#define KILN_INPUTS {len(inputs)}")
    lines.append(f"static const kiln_io kiln_inputs[] = {{{', '.join(inputs) or '{0}'}}};")
    lines.append(f"#define KILN_OUTPUTS {len(outputs)}")
    lines.append(f"static const kiln_io kiln_outputs[] = {{{', '.join(outputs) or '{0}'}}};")
    labels = dict(getattr(plan, "kernel_labels", {}) or {})
    count = max(labels, default=0) + 1
    texts = ", ".join(_c_string(str(labels.get(i, "?"))) for i in range(count))
    lines.append(f"#define KILN_LABELS {count}")
    lines.append(f"static const char *const kiln_kernel_labels[] = {{{texts}}};")
    return "\n".join(lines) + "\n"


def _io(value: Any, buffer: Any, slot: int, source: int, where: int, batched: bool = False, axis: int = -1) -> str:
    vtype = value.type
    if not isinstance(vtype, TensorType) or vtype.shape is None or not vtype.is_static:
        raise KilnError(f"{value.name}: no static shape in the plan (kiln bug)")
    if vtype.dtype not in DLPACK:
        raise ArgumentError(f"{value.name}: dtype {vtype.dtype.name} has no C API type yet")
    code, bits = DLPACK[vtype.dtype]
    shape = [int(d) for d in vtype.shape]
    dims = "(const int64_t[]){" + (", ".join(str(d) for d in shape) or "0") + "}"
    elements = int(np.prod(shape)) if shape else 1
    if batched and (not shape or shape[0] != 1):
        raise KilnError(f"{value.name}: the sample-parallel dim is not its axis 0 of size 1 (kiln bug)")
    fields = f"{code}, {bits}, {len(shape)}, {dims}, {slot}, {source}, {where}, {elements}, {int(batched)}"
    if batched:  # described as -1 on axis 0, within [KILN_BATCH_MIN, KILN_BATCH_MAX]
        rest = "".join(f", {d}" for d in shape[1:])
        fields += f", (const int64_t[]){{-1{rest}}}, (const int64_t[]){{KILN_BATCH_MIN{rest}}}"
        fields += f", (const int64_t[]){{KILN_BATCH_MAX{rest}}}"
    elif axis >= 0:  # a run-time length: -1 on its axis, within [KILN_LENGTH_MIN, KILN_LENGTH_MAX]

        def with_axis(text: str) -> str:
            return "(const int64_t[]){" + ", ".join(text if d == axis else str(n) for d, n in enumerate(shape)) + "}"

        fields += f", {with_axis('-1')}, {with_axis('KILN_LENGTH_MIN')}, {with_axis('KILN_LENGTH_MAX')}"
    else:
        fields += f", {dims}, {dims}, {dims}"
    return f"{{{_c_string(value.name)}, {fields}, {axis}}}"


def _c_string(text: str) -> str:
    """``text`` as a C string literal (every byte outside printable ASCII escaped)."""
    body = "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\?' else f"\\{b:03o}" for b in text.encode("utf-8"))
    return f'"{body}"'


def _id_define(model_id: str) -> str:
    return f'static const char KILN_MODEL_ID[65] = "{model_id}";\n'


def _cpu_checks(target: Any) -> str:
    """KILN_CPU_OK(): the instruction sets the plan's code was built for, checked at load."""
    if target.native:
        needed = sorted({CPU_FLAGS[f] for f in target.features if f in CPU_FLAGS})
    else:
        needed = list(ISA_FLAGS.get(target.isa, ()))
    test = " && ".join(f'__builtin_cpu_supports("{name}")' for name in needed) or "1"
    vnni = int(target.isa == "avx512" or (target.native and target.isa == "avx2"))
    return (
        f"#define KILN_CPU_OK() (__builtin_cpu_init(), ({test}))\n"
        f'#define KILN_CPU_NEEDS "{", ".join(needed) or "nothing"}"\n'
        f"#define KILN_INT8_VNNI {vnni}\n"
    )


def _link(build: Path, plan_library: Path) -> None:
    compiler = toolchain.find_compiler()[0]
    command = [compiler, "-std=c11", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
               "-I", str(build), str(build / "capi.c"), "-o", str(build / "libkiln_model.so"),
               "-L", str(build), "-l:" + plan_library.name, "-Wl,-rpath,$ORIGIN", "-Wl,--no-undefined"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise KilnError(f"building the C API library failed (kiln bug):\n{result.stderr[-3000:]}")


def _archive(build: Path, plan: Any) -> bool:
    """``libkiln_model.a``: the API, the plan's unit and its engine object (the same source and
    flags as the shared libraries); False where the plan's unit source is not at hand (a plan
    read from an artifact)."""
    unit_path = plan.library.with_suffix(".c")
    if not unit_path.is_file():
        return False
    unit = unit_path.read_text()
    objects = [toolchain.object_file(unit, plan.target)]
    narrow = c_unit.linked_engine(unit)
    if narrow is not None:  # (None: a debug build, whose unit holds the engines)
        objects.append(toolchain.object_file(c_unit.engine_source(plan.target, narrow), plan.target))
    compiler = toolchain.find_compiler()[0]
    capi = build / "capi.o"
    command = [compiler, "-std=c11", "-O2", "-fPIC", "-c", "-I", str(build), str(build / "capi.c"), "-o", str(capi)]
    result = subprocess.run(command, capture_output=True, text=True)
    archiver = shutil.which("ar")
    if result.returncode != 0 or archiver is None:
        raise KilnError(f"building the static C API library failed (kiln bug): {result.stderr[-2000:] or 'no ar'}")
    members = []
    for number, obj in enumerate([capi, *objects]):  # distinct member names (the cache's are keys)
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
