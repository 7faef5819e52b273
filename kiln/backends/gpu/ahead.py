"""Compiling a plan's Triton kernels ahead for an NVIDIA architecture, with no GPU present.

``triton.compile`` lowers each kernel through Triton's MLIR pipeline to PTX and ``ptxas`` builds
the cubin for the architecture asked (sm_80, sm_90, ...); ``cuobjdump -res-usage`` (shipped with
Triton) reads back what the hardware would allocate: registers per thread, local memory (spills)
and shared memory. This is how the gpu target is checked on machines without a GPU: a kernel that
does not compile, or a matrix-product kernel that spills, is a failure.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kiln.backends.gpu.render import Launch
from kiln.backends.gpu.runtime import module, triton_missing
from kiln.errors import KilnError

ARCHES = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90}


@dataclass
class KernelReport:
    """One kernel compiled for one architecture."""

    function: str
    kernel: str
    kind: str
    grid: tuple[int, ...]
    blocks: dict[str, int]
    num_warps: int
    num_stages: int
    arch: str
    launches: int = 1  # launches of this function in the plan (a repeated layer's kernel is one function)
    registers: int = -1
    spill_bytes: int = -1  # local memory per thread: register spills (stack and local frames)
    stack_bytes: int = -1
    shared_bytes: int = -1
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["grid"] = list(self.grid)
        return found


def capability(arch: str) -> int:
    if arch not in ARCHES:
        raise KilnError(f"unknown GPU architecture {arch!r}; kiln compiles ahead for {', '.join(ARCHES)}")
    return ARCHES[arch]


def resource_usage(cubin: bytes, function: str) -> dict[str, int]:
    """REG / STACK / LOCAL / SHARED of ``function`` in a cubin, as cuobjdump reports them."""
    import triton.knobs as knobs

    with tempfile.TemporaryDirectory(prefix="kiln-cubin-") as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-res-usage", str(path)], capture_output=True, text=True, check=True
        ).stdout
    usage: dict[str, int] = {}
    section = out.split(f"Function {function}:", 1)[-1]
    for key in ("REG", "STACK", "SHARED", "LOCAL"):
        match = re.search(rf"\b{key}:(\d+)", section)
        if match:
            usage[key] = int(match.group(1))
    return usage


def compile_ahead(
    source: str, arch: str = "sm_90", progress: Callable[[str], None] | None = None
) -> list[KernelReport]:
    """Every kernel function of a rendered plan compiled for ``arch`` (no GPU needed): one report
    each, in order of first launch; a kernel that fails to compile has its error in the report."""
    missing = triton_missing()
    if missing:
        raise KilnError(missing)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", capability(arch), 32)
    namespace = module(source, interpret=False)
    reports = []
    every = [Launch.of(fields) for segment in namespace["LAUNCHES"].values() for fields in segment]
    uses: dict[str, int] = {}
    for launch in every:
        uses[launch.function] = uses.get(launch.function, 0) + 1
    launches = list({launch.function: launch for launch in reversed(every)}.values())[::-1]
    for number, launch in enumerate(launches):
        if progress:
            progress(f"compiling {launch.function} for {arch} ({number + 1}/{len(launches)})")
        report = KernelReport(
            launch.function,
            launch.kernel,
            launch.kind,
            launch.grid,
            dict(launch.constants),
            launch.num_warps,
            launch.num_stages,
            arch,
            launches=uses[launch.function],
        )
        try:
            ast = ASTSource(fn=namespace[launch.function], signature=launch.signature, constexprs=launch.constants)
            compiled = triton.compile(
                ast, target=target, options={"num_warps": launch.num_warps, "num_stages": launch.num_stages}
            )
            usage = resource_usage(compiled.asm["cubin"], compiled.metadata.name)
            report.registers = usage.get("REG", -1)
            # what ptxas could not keep in registers lands in local memory (the per-thread stack)
            report.stack_bytes = usage.get("STACK", -1)
            report.spill_bytes = usage.get("LOCAL", 0) + max(0, report.stack_bytes)
            # shared memory: what the kernel declares statically plus what Triton allocates at launch
            report.shared_bytes = max(usage.get("SHARED", 0), int(compiled.metadata.shared))
        except Exception as err:  # a kernel Triton cannot compile: reported, the others still compile
            report.error = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        reports.append(report)
    return reports
