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
    calls,
    comment,
    emit_kernel,
    generated_names,
    helper_functions,
    kernel_buffers,
)
from kiln.backends.cpu.c_engines import narrow_products
from kiln.backends.cpu.target import CpuTarget
from kiln.lower.kir import ENGINE_CALLS, AttentionSpec, Buffer, Kernel, WinogradInput, WinogradOutput
from kiln.lower.target import Target


class Templates:
    """Kernels that differ only in their buffers (a transformer's twelve identical layers, a ResNet
    stage's blocks) share one function: each kernel's C is written against a local table of its
    buffers with every generated name made canonical, and equal texts are emitted once. GCC's
    time is most of a cold compile, and it falls with the code it is given (gpt2: 12x fewer
    kernel bodies)."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}  # canonical text -> function name
        self.parts: list[str] = []

    def function_for(self, kernel: Kernel) -> tuple[str, list[Buffer]]:
        used = kernel_buffers(kernel)
        local = {b: i for i, b in enumerate(used)}
        if CHECKED.get():  # debug builds keep kiln's names: range-check messages name the buffer
            self.parts.append(emit_kernel(kernel, used, local, f"kiln_{kernel.name}"))
            return f"kiln_{kernel.name}", used
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
        return name, used


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
        lines.append(f"  /* {comment(kernel.name)} ({comment(kernel.kind)}) */")
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


def gemm_prelude(target: Target) -> str:
    """The matrix-multiply engine, configured for the target's vector width and tile rows."""
    engine = (Path(__file__).parent / "gemm.c").read_text()
    assert isinstance(target, CpuTarget), "the cpu renderer's target is a CpuTarget"
    blocking = target.blocking
    return (
        f"#define KILN_VB {target.vector_bytes}\n#define KILN_MR {target.gemm_rows}\n"
        f"#define KILN_KC {blocking.kc}\n#define KILN_A_BLOCK {blocking.a_block}\n{engine}\n"
    )


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
) -> str:
    """The whole translation unit for a model's native segments. With ``profile``, each kernel adds
    its wall time to ``double kiln_profile_seconds[i]`` (i: the kernel's position in the plan);
    ``checked`` range-checks every buffer index (debug builds)."""
    token = CHECKED.set(checked)
    try:
        return _emit_c(segments, table, target, profile, checked)
    finally:
        CHECKED.reset(token)


def _emit_c(segments, table, target, profile, checked):  # type: ignore[no-untyped-def]
    kernels = [k for kernels in segments for k in kernels]
    positions = {id(k): i for i, k in enumerate(kernels)} if profile else None
    parts = [PRELUDE + PROFILE_PRELUDE if profile else PRELUDE, POOL]
    if profile:
        parts.append(f"double kiln_profile_seconds[{max(len(kernels), 1)}];")
    if checked:
        parts.append(DEBUG_PRELUDE)
    if any(calls(k.body, ENGINE_CALLS) for k in kernels):  # every driver uses the kiln_gemm descriptor
        parts.append(gemm_prelude(target))
    narrow = {p for k in kernels for p in narrow_products(k.body)}
    if narrow:  # the reduced-precision paths: their shared driver, then each format
        for part in ("amx.c", "gemm_lowp.c", *(f"gemm_{p}.c" for p in sorted(narrow))):
            parts.append((Path(__file__).parent / part).read_text())
    if any(calls(k.body, (WinogradInput, WinogradOutput)) for k in kernels):
        parts.append(winograd_c.c_source())
    if any(calls(k.body, (AttentionSpec,)) for k in kernels):
        parts.append((Path(__file__).parent / "attention.c").read_text())
    templates = Templates()
    segment_parts = [emit_segment(i, ks, table, positions, templates) for i, ks in enumerate(segments)]
    parts.extend(templates.parts)
    parts.extend(segment_parts)
    parts.append(emit_entry(len(segments)))
    return "\n\n".join(parts) + "\n"
