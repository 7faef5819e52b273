"""The ``cpu`` target: kernels rendered as C11 + OpenMP (``c.py``) with kiln's hand-written
drivers (``gemm.c``, ``winograd.c``, ``attention.c``), built by the machine's C compiler
(``toolchain.py``) and loaded with ctypes. ``cpu`` is this machine at its best ISA (built with
-march=native); ``cpu:<isa>`` builds one ISA's code path for any CPU that has it (so an AVX-512
machine tests its AVX2 path too)."""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from kiln.backends.cpu import c_unit, features, toolchain
from kiln.backends.cpu.c_unit import emit_c
from kiln.backends.cpu.native_api import NativeApi
from kiln.backends.cpu.scratch import engine_scratch
from kiln.backends.cpu.target import CpuTarget
from kiln.backends.cpu.toolchain import ISAS
from kiln.backends.cpu.toolchain import compiler_flags as compiler_flags
from kiln.backends.registry import (
    Backend,
    BuildOptions,
    Loaded,
    Placement,
    Section,
    Threading,
    library_runner,
)
from kiln.errors import CompilerError, KilnError
from kiln.lower.engine import WEIGHT_FORMATS
from kiln.lower.kir import Buffer, Kernel
from kiln.lower.target import Target, TargetError


@lru_cache(maxsize=1)
def host() -> CpuTarget:
    """This machine: its best ISA (read once from /proc/cpuinfo) and the cores this process may use."""
    flags = features.cpu_flags()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    if "avx512f" in flags:
        isa = "avx512"
    elif "avx2" in flags:
        isa = "avx2"
    elif "asimd" in flags or platform.machine() in ("aarch64", "arm64"):
        isa = "neon"
    else:
        isa = "generic"
    return CpuTarget(
        isa=isa,
        simd_bytes=ISAS[isa][0],
        threads=cores,
        caches=features.caches(),
        native=True,
        int8_levels=features.int8_levels(isa, native=True),
        features=features.isa_features(),
    )


def runnable_isas(isa: str | None = None) -> tuple[str, ...]:
    """The ISAs whose code runs on a CPU of ``isa`` (default: this machine's), best first."""
    isa = isa or host().isa
    order = {"avx512": ("avx512", "avx2", "generic"), "avx2": ("avx2", "generic")}
    return order.get(isa, (isa, "generic") if isa != "generic" else ("generic",))


def isa_target(isa: str) -> CpuTarget:
    """``cpu:<isa>``: that ISA's code path, for any CPU that runs it (TargetError otherwise)."""
    if isa not in ISAS:
        raise TargetError(f"unknown target 'cpu:{isa}'; the cpu target's ISAs: {', '.join(ISAS)}")
    if isa not in runnable_isas():
        raise TargetError(
            f"target 'cpu:{isa}' cannot run on this machine (its CPU offers {', '.join(runnable_isas())})"
        )
    here = host()
    return CpuTarget(isa=isa, simd_bytes=ISAS[isa][0], threads=here.threads, caches=here.caches, spec=f"cpu:{isa}")


class CpuBackend(Backend):
    name = "cpu"
    reads_placement = True  # its code holds the plan's tables (the C API's: c_tables)
    kernel_timers = True

    def describe(self, variant: str) -> Target:
        return host() if not variant else isa_target(variant)

    def variants(self) -> list[str]:
        return ["cpu", *(f"cpu:{isa}" for isa in ISAS)]

    def render(  # type: ignore[override]
        self,
        segments: Sequence[Sequence[Kernel]],
        table: dict[Buffer, int],
        options: BuildOptions,
        target: Target,
        placement: Placement | None = None,
    ) -> str:
        return emit_c(segments, table, target, profile=options.profile, checked=options.debug, placement=placement)

    def build(self, source: str, target: Target, options: BuildOptions) -> tuple[Path, ...]:
        if options.debug and not toolchain.sanitizer_loaded():
            # a library built with AddressSanitizer kills a process whose ASan runtime is not first
            raise KilnError(
                "KILN_DEBUG builds generated code with AddressSanitizer, whose runtime must be loaded first: "
                "run with LD_PRELOAD=$(gcc -print-file-name=libasan.so) (or unset KILN_DEBUG)"
            )
        # one shared library; a unit that declares the engines links their object (built once per target)
        narrow = c_unit.linked_engine(source)
        engine = c_unit.engine_source(target, narrow, options.debug) if narrow is not None else None
        return (toolchain.build(source, target, debug=options.debug, engine=engine),)

    def explain(self, plan: Any, arches: tuple[str, ...], progress: Any) -> list[Section]:
        sections = []
        target = plan.target
        if isinstance(target, CpuTarget):  # what the engine's blocking was derived from
            caches, blocking = target.caches, target.blocking
            facts = {
                "isa": target.isa,
                "tile": f"{target.gemm_rows}x{target.gemm_cols}",
                "l1d": caches.l1d,
                "l2": caches.l2,
                "l3": caches.l3,
                "kc": blocking.kc,
                "a_block_bytes": blocking.a_block * 4,
                "blocking_source": blocking.source,
            }
            notes = [
                f"{target.name} ({target.isa}): caches L1d {caches.l1d >> 10} KiB, L2 {caches.l2 >> 10} KiB, "
                f"L3 {caches.l3 >> 10} KiB; products in {target.gemm_rows}x{target.gemm_cols} tiles, "
                f"default blocks {blocking.text}"
            ]
            sections.append(Section("engine", "engine", [], [], notes, facts))
        if plan.library is None:
            return sections
        source, library = plan.library.with_suffix(".c"), plan.library
        notes = [f"generated source: {source}", f"shared library: {library}"]
        return [*sections, Section("build", "build", [], [], notes, {"source": str(source), "library": str(library)})]

    def scratch(self, kernels: Sequence[Kernel], target: Target) -> tuple[int, int]:
        assert isinstance(target, CpuTarget)
        return engine_scratch(kernels, target.gemm_rows, target.gemm_cols, target.blocking.kc)

    def identity(self, target: Target, debug: bool = False) -> tuple[str, ...]:
        try:
            compiler = toolchain.find_compiler()
        except CompilerError:  # a loaded artifact runs its own libraries: no compiler needed
            compiler = ("no C compiler", "")
        return (*compiler, *toolchain.flags(target, debug))

    def artifact_meta(self, target: Target) -> dict[str, Any]:
        # its libraries run only where this ISA does, and native ones (-march=native) only where
        # every extension of the building CPU is present
        return {"isa": target.isa, "cpu_features": list(target.features) if target.native else []}

    def artifact_code_runs(self, meta: dict[str, Any]) -> str:
        needed = meta.get("cpu_features") or []
        if not isinstance(needed, list) or not all(isinstance(f, str) for f in needed):
            return "its cpu_features field is not a list of names"
        missing = sorted(set(needed) - features.cpu_flags())
        if missing:
            return f"its code was built for a CPU with {', '.join(missing)}, which this CPU lacks"
        return ""

    def reopen(self, spec: str, meta: dict[str, Any]) -> Target:
        isa = str(meta.get("isa", host().isa))
        if spec == "cpu" and isa == host().isa:
            return host()  # built for a machine like this one (-march=native)
        return isa_target(isa)  # refused (TargetError) where this CPU lacks the ISA

    def available(self) -> str:
        try:
            toolchain.find_compiler()
        except KilnError as err:
            return str(err)
        return ""

    def precisions(self, target: Target) -> dict[str, str]:
        bf16 = ""
        if target.isa != "avx512":
            bf16 = f"the {target.name} target ({target.isa}) has no bf16 path; bf16 runs on the avx512 targets"
        elif not features.precision_paths()["bf16"]:
            bf16 = "this CPU has no bf16 instructions (neither AMX-BF16 nor AVX512_BF16)"
        int8 = ""
        if target.isa not in ("avx512", "avx2"):
            int8 = f"the {target.name} target ({target.isa}) has no int8 path; int8 runs on the avx512 and avx2 targets"
        a8 = int8
        if not a8:
            mode, path = features.int8_path(target.isa, target.native)
            if mode < features.INT8_PATHS["avx-vnni"]:
                a8 = (f"the {target.name} target's int8 code runs {path} here; the -a8 formats need VNNI or "
                      "AMX-INT8 (their bytes would saturate AVX2's VPMADDUBSW)")  # fmt: skip
        # (the weight-only paths, gemm_w8.c and gemm_w4.c: plain vector code, every ISA; their
        # "-bf16" and "-a8" forms run a prompt's rows through the bf16 or int8 path's kernels)
        prompt = {"": "", "bf16": bf16, "int8": a8}
        return {"fp32": "", "bf16": bf16, "int8": int8, **{f: prompt[w[3]] for f, w in WEIGHT_FORMATS.items()}}

    def load(self, plan: Any, target: Target, parallelism: Threading) -> Loaded:
        segments = [s for s in plan.steps if hasattr(s, "kernels")]
        if not segments:
            return Loaded([])
        if plan.library is None:
            raise KilnError("a plan with native segments lacks its library (kiln bug)")
        try:
            library = ctypes.CDLL(str(plan.library))
        except OSError as err:
            raise KilnError(f"cannot load the native library {plan.library}: {err}") from None
        share_pool(library, plan.library)
        # the library's loops: their participants, how long the pool's waiting threads spin
        library.kiln_set_threads.argtypes = [ctypes.c_int]
        library.kiln_set_threads(parallelism.threads)
        library.kiln_set_spin.argtypes = [ctypes.c_long]
        library.kiln_set_spin(parallelism.spin)
        if hasattr(library, "kiln_pool_start"):  # (absent from libraries of older artifacts)
            library.kiln_pool_start()  # the workers start now, not in the first inference
        if hasattr(library, "kiln_set_bf16"):  # the plan has bf16 products: the best path this CPU grants
            library.kiln_set_bf16.argtypes = [ctypes.c_int]
            library.kiln_set_bf16.restype = ctypes.c_int
            library.kiln_set_bf16(features.bf16_path()[0])
        if hasattr(library, "kiln_set_int8"):  # int8 products: the best path this CPU grants the target's code
            library.kiln_set_int8.argtypes = [ctypes.c_int]
            library.kiln_set_int8.restype = ctypes.c_int
            library.kiln_set_int8(features.int8_path(target.isa, target.native)[0])
        runners = []
        for step in segments:
            try:
                function = getattr(library, f"kiln_segment_{step.number}")
            except AttributeError:
                raise KilnError(f"the native library {plan.library} lacks segment {step.number}") from None
            function.argtypes = [ctypes.c_void_p]
            function.restype = ctypes.c_int
            runners.append(library_runner(function))
        try:  # the plan runs through kiln's C API, the library's own (capi.c)
            api = NativeApi(library, plan.library)
        except AttributeError:
            raise KilnError(f"the native library {plan.library} lacks kiln's C API (built by another kiln)") from None
        return Loaded(runners, api)


_POOL_LOCK = threading.Lock()
_POOL: list[Any] = []  # [the library whose thread pool the process uses, its pool's address]


def share_pool(library: Any, path: Path) -> None:
    """Run ``library``'s parallel loops on the process's one thread pool: the first library loaded
    lends its own (kept loaded for the process's life); every later one adopts it. Libraries of
    artifacts saved before the pool was shared, or by a kiln whose pool interface differs, keep
    their own."""
    if not hasattr(library, "kiln_pool_adopt"):
        return
    library.kiln_pool_share.restype = ctypes.c_void_p
    library.kiln_pool_adopt.argtypes = [ctypes.c_void_p]
    library.kiln_pool_adopt.restype = ctypes.c_int
    with _POOL_LOCK:
        if not _POOL:
            _POOL.extend([library, library.kiln_pool_share()])
        elif not library.kiln_pool_adopt(_POOL[1]):  # another pool interface (an artifact of another kiln)
            logging.getLogger("kiln").info("%s keeps its own thread pool (another pool interface version)", path)
