"""The C translation unit of a plan: the preludes its kernels need (pool, engines, formats), one
function per distinct kernel text (``Templates``), one ``kiln_segment_N`` per native segment and
the ``kiln_run`` entry that runs them all from one call (``emit_entry``). The statements of each
kernel are ``c.py``'s."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from kiln.backends.cpu import winograd_c
from kiln.backends.cpu.c import (
    CHECKED,
    DEBUG_PRELUDE,
    PRELUDE,
    PROFILE_PRELUDE,
    emit_kernel,
    generated_names,
    helper_functions,
    kernel_buffers,
)
from kiln.backends.cpu.c_engines import narrow_products
from kiln.backends.cpu.c_tables import HEADER as PLAN_HEADER
from kiln.backends.cpu.c_tables import NO_TABLES, tables_source
from kiln.backends.cpu.target import CpuTarget
from kiln.backends.registry import Placement
from kiln.lower.kir import Buffer, Kernel
from kiln.lower.kir_key import StructureKeys
from kiln.lower.target import Target
from kiln.source_text import c_comment


class Templates:
    """Kernels that differ only in their buffers (a transformer's twelve identical layers, a ResNet
    stage's blocks) share one function: each kernel's C is written against a local table of its
    buffers with every generated name made canonical, and equal texts are emitted once. GCC's
    time is most of a cold compile, and it falls with the code it is given (gpt2: 12x fewer
    kernel bodies)."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}  # canonical text -> function name
        self.parts: list[str] = []
        self.keys = StructureKeys()
        self.by_key: dict[int, str] = {}  # a kernel's structure (kir_key) -> its function's name

    def function_for(self, kernel: Kernel) -> tuple[str, list[Buffer]]:
        used = kernel_buffers(kernel)
        local = {b: i for i, b in enumerate(used)}
        if CHECKED.get():  # debug builds keep kiln's names: range-check messages name the buffer
            self.parts.append(emit_kernel(kernel, used, local, f"kiln_{kernel.name}"))
            return f"kiln_{kernel.name}", used
        key = self.keys.key(kernel, used)
        if key is not None and key in self.by_key:  # the same program as one written already
            return self.by_key[key], used
        name = self._written(kernel, used, local)
        if key is not None:
            self.by_key[key] = name
        return name, used

    def _written(self, kernel: Kernel, used: list[Buffer], local: dict[Buffer, int]) -> str:
        """The name of the function for ``kernel``'s canonical text, written if it is new."""
        text = emit_kernel(kernel, used, local, "KILN_TEMPLATE")
        helpers = [f.name for f in helper_functions(kernel.body)]
        names: dict[str, None] = {}
        generated_names([used, kernel.body], names)
        variables = [n for n in names if n not in helpers]
        mapping = {n: f"KILN_TEMPLATE_e{i}" for i, n in enumerate(dict.fromkeys(helpers))}
        mapping.update({n: f"v{i}" for i, n in enumerate(variables)})
        if mapping:
            # (not after "." or "->": a loop index named c is not the descriptor's field g.c)
            alternatives = "|".join(re.escape(n) for n in sorted(mapping, key=len, reverse=True))
            pattern = re.compile(r"(?<![.>])\b(" + alternatives + r")\b")
            text = pattern.sub(lambda m: mapping[m.group(1)], text)
        name = self.texts.get(text)
        if name is None:
            name = f"kiln_t{len(self.texts)}"
            self.texts[text] = name
            self.parts.append(text.replace("KILN_TEMPLATE", name))
        return name


def emit_segment(
    number: int,
    kernels: Sequence[Kernel],
    table: dict[Buffer, int],
    profile: dict[int, int] | None = None,
    templates: Templates | None = None,
) -> str:
    templates = templates or Templates()
    lines = [f"int kiln_segment_{number}(void **buffers) {{"]
    for kernel in kernels:
        name, used = templates.function_for(kernel)
        # which model nodes a kernel computes is in the plan's side table (kernel.sources), never
        # here: model text in generated code would be code the model's author wrote
        lines.append(f"  /* {c_comment(kernel.name)} ({c_comment(kernel.kind)}) */")
        lines.append("  {")
        if profile is not None:
            lines.append("    double kiln_started = kiln_now();")
        lines.append(
            f"    void *local[{max(len(used), 1)}] = {{{', '.join(f'buffers[{table[b]}]' for b in used) or '0'}}};"
        )
        lines.append(f"    {name}(local);")
        if profile is not None:
            lines.append(f"    kiln_profile_seconds[{profile[id(kernel)]}] += kiln_now() - kiln_started;")
        lines.append("  }")
    lines.append("  return 0;")
    lines.append("}")
    return "\n".join(lines)


def emit_entry(count: int) -> str:
    """``int kiln_run(void **buffers, kiln_host_fn host)``: the whole plan from one native call. It
    runs the segments in order and, when ``host`` is given, calls ``host(gap)`` before segment
    ``gap`` and once after the last (``gap`` = the segment count): the runtime runs the host
    fallbacks of that gap there. Returns 0, 1 when a kernel set the status word (the run stops at
    that segment's end), -1 when ``host`` failed (its error is the runtime's to raise)."""
    lines = [
        "typedef int (*kiln_host_fn)(int gap);",
        "int kiln_run(void **buffers, kiln_host_fn host) {",
        "  const volatile int32_t *status = (const volatile int32_t *)buffers[0];",
    ]
    for number in range(count):
        lines.append(f"  if (host && host({number})) return -1;")
        lines.append(f"  kiln_segment_{number}(buffers);")
        lines.append("  if (*status) return 1;")
    lines.append(f"  if (host && host({count})) return -1;")
    lines.append("  return 0;")
    lines.append("}")
    return "\n".join(lines)


HERE = Path(__file__).parent
API = (HERE / "gemm_api.h").read_text()
NARROW_PARTS = ("amx.c", "gemm_lowp.c")  # then gemm_<precision>.c of each reduced precision
WEIGHT_ONLY = {"w8", "w4"}  # the weight-only int8 and int4 paths (gemm_w8.c, gemm_w4.c)


def gemm_prelude(target: Target) -> str:
    """The matrix-multiply engine, configured for the target's vector width and tile rows."""
    assert isinstance(target, CpuTarget), "the cpu renderer's target is a CpuTarget"
    blocking = target.blocking
    return (
        f"#define KILN_VB {target.vector_bytes}\n#define KILN_MR {target.gemm_rows}\n"
        f"#define KILN_KC {blocking.kc}\n#define KILN_A_BLOCK {blocking.a_block}\n{API}\n{(HERE / 'gemm.c').read_text()}\n{(HERE / 'gemm_rows.c').read_text()}\n"
    )


def engine_source(target: Target, narrow: Sequence[str] = (), checked: bool = False) -> str:
    """The engine object's translation unit: the thread pool, the matrix-multiply engine, the
    Winograd transforms, attention, and the reduced-precision paths ``narrow`` (``bf16``,
    ``int8``: only plans with such products link them, so an fp32 library holds no code for
    instructions its target lacks), compiled once per target, paths, compiler and flags and
    linked into each model's library (``toolchain.build``): a model's own unit holds only its
    kernels, and the engines' second or so of compile time is paid once. ``checked``: the
    engines check every operand index against its buffer (KILN_DEBUG: debug builds)."""
    parts = ['#define KILN_ENGINE __attribute__((visibility("hidden")))', PRELUDE, POOL]
    parts += [DEBUG_PRELUDE] if checked else []
    parts.append(gemm_prelude(target))
    if set(narrow) - WEIGHT_ONLY:  # (the weight-only paths are plain vector code: no AMX, no packers of their own)
        parts += [(HERE / part).read_text() for part in NARROW_PARTS]
    parts += [(HERE / f"gemm_{p}.c").read_text() for p in sorted(narrow)]
    parts += [winograd_c.c_source(), (HERE / "attention.c").read_text()]
    # kiln's C API over the plan's tables (kiln_tables, in the unit): the code the Python runtime
    # and a C program both run a plan through
    parts += [(HERE / "kiln.h").read_text(), PLAN_HEADER, (HERE / "capi.c").read_text()]
    return "\n\n".join(parts) + "\n"


def linked_engine(source: str) -> tuple[str, ...] | None:
    """The reduced-precision paths of the engine object a unit links (``engine_source``), or None
    for a unit that links none (a debug build: the engines are in the unit)."""
    found = re.search(r'^#define KILN_ENGINE_LINKED "([a-z0-9,]*)"$', source, re.MULTILINE)
    if found is None:
        return None
    paths = tuple(p for p in found.group(1).split(",") if p)
    if not set(paths) <= {"bf16", "int8", "wbf16", "wa8", *WEIGHT_ONLY}:
        raise ValueError(f"unknown engine paths {paths} in a generated unit")
    return paths


# what a model's unit declares of the engine object it links (engine_source)
ENGINE_DECLARATIONS = f"""#define KILN_ENGINE __attribute__((visibility("hidden")))
typedef void (*kiln_body)(void *ctx, int64_t begin, int64_t end, int worker);
KILN_ENGINE void kiln_parallel_for(int64_t begin, int64_t end, int64_t grain, int max_workers, kiln_body body, void *ctx);
typedef struct {{ void **buffers; int64_t index[8]; }} kiln_loop_ctx;
{API}
KILN_ENGINE void kiln_gemm_bf16_run(const kiln_gemm *g);
KILN_ENGINE void kiln_gemm_int8_run(const kiln_gemm *g);
KILN_ENGINE void kiln_gemm_w8_run(const kiln_gemm *g);
KILN_ENGINE void kiln_gemm_w4_run(const kiln_gemm *g);
KILN_ENGINE int kiln_gemm_wbf16_run(const kiln_gemm *g, int bits);
KILN_ENGINE int kiln_gemm_wa8_run(const kiln_gemm *g, int bits);
KILN_ENGINE void kiln_gemm_wide_run(const kiln_gemm *g);
KILN_ENGINE void kiln_winograd_in(int m, const float *x, float *v, int64_t N, int64_t C, int64_t H, int64_t W, int64_t PT,
                                  int64_t PL, int64_t TH, int64_t TW);
KILN_ENGINE void kiln_winograd_out(int m, const float *mm, float *y, const float *bias, int64_t N, int64_t O, int64_t OH,
                                   int64_t OW, int64_t TH, int64_t TW, int tile_major, const kiln_gemm *g);
KILN_ENGINE void kiln_attention(int64_t BH, int64_t LQ, int64_t LK, int64_t D, int64_t DV,
                                const float *q, int64_t q_size, int64_t q_n1, int64_t q_s0, int64_t q_s1, int64_t q_rs, int64_t q_cs,
                                const float *kt, int64_t k_size, int64_t k_n1, int64_t k_s0, int64_t k_s1, int64_t k_rs, int64_t k_cs,
                                const float *v, int64_t v_size, int64_t v_n1, int64_t v_s0, int64_t v_s1, int64_t v_rs, int64_t v_cs,
                                float *out, int64_t o_size, int64_t o_n1, int64_t o_s0, int64_t o_s1, int64_t o_rs, int64_t o_cs,
                                float *scratch, float *rows, int64_t threads, int safe, const kiln_gemm *ctx,
                                void (*product)(const kiln_gemm *));
"""


# kiln's thread pool (pool.c) and the context an outlined parallel loop receives: the segment's
# buffer table and the indices of the loops around it
POOL = (
    (Path(__file__).parent / "pool.c").read_text()
    + """
typedef struct { void **buffers; int64_t index[8]; } kiln_loop_ctx;
"""
)


def emit_c(
    segments: Sequence[Sequence[Kernel]],
    table: dict[Buffer, int],
    target: Target,
    profile: bool = False,
    checked: bool = False,
    placement: Placement | None = None,
) -> str:
    """The whole translation unit for a model's native segments. With ``profile``, each kernel adds
    its wall time to ``double kiln_profile_seconds[i]`` (i: the kernel's position in the plan);
    ``checked`` range-checks every buffer index (debug builds). ``placement``: where the plan's
    buffers live, written as the unit's ``kiln_tables`` (the C API's; a unit without them is
    only a piece of one, for kiln's own tests)."""
    token = CHECKED.set(checked)
    try:
        unit = _emit_c(segments, table, target, profile, checked)
    finally:
        CHECKED.reset(token)
    if placement is None:
        return unit + "\n" + NO_TABLES
    return unit + "\n" + tables_source(unit, placement, table, target)


def _emit_c(segments, table, target, profile, checked):  # type: ignore[no-untyped-def]
    kernels = [k for kernels in segments for k in kernels]
    positions = {id(k): i for i, k in enumerate(kernels)} if profile else None
    parts = [PRELUDE + PROFILE_PRELUDE if profile else PRELUDE]
    if profile:
        parts.append(f"double kiln_profile_seconds[{max(len(kernels), 1)}];")
    narrow = sorted({p for k in kernels for p in narrow_products(k.body)})
    # the pool and the engines: the engine object, linked (compiled once per target, its paths and
    # flags; a debug build's with the engines' operand checks on, see engine_source)
    parts += [f'#define KILN_ENGINE_LINKED "{",".join(narrow)}"', ENGINE_DECLARATIONS]
    if checked:
        parts.append(DEBUG_PRELUDE)
    templates = Templates()
    segment_parts = [emit_segment(i, ks, table, positions, templates) for i, ks in enumerate(segments)]
    parts.extend(templates.parts)
    parts.extend(segment_parts)
    parts.append(emit_entry(len(segments)))
    return "\n\n".join(parts) + "\n"
