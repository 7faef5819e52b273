"""What the host CPU can do, for codegen decisions (vector width, cores) and cache keys."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache

from kiln.errors import KilnError
from kiln.ir.types import DType

ISAS = {  # name -> (vector bytes, the compiler's -march for code that must run on any such CPU)
    "avx512": (64, "x86-64-v4"),
    "avx2": (32, "x86-64-v3"),
    "neon": (16, "armv8-a"),
    "generic": (16, ""),
}


ENGINES = ("attention", "gemm", "winograd")  # a sorted tuple: repr(Target) is part of cache keys


class TargetError(KilnError):
    """An unknown target, or one this machine cannot run."""


@dataclass(frozen=True)
class Target:
    """The ``cpu`` target at one ISA. ``Target.host()`` is this machine at its best ISA; ``cpu:avx2``
    builds the AVX2 code path on an AVX-512 machine too (tests exercise every path a machine has)."""

    isa: str  # avx512 | avx2 | neon | generic
    vector_bytes: int
    cores: int
    native: bool = True  # built with -march=native (the host's own target), else for any CPU of the ISA
    # the C drivers kernels may call: the matrix-multiply engine, Winograd transforms, attention
    engines: tuple[str, ...] = ENGINES
    interpreted: bool = False  # no C at all: kernels run on the kernel-IR interpreter (tests)

    @property
    def name(self) -> str:
        if self.interpreted:
            return "kir"
        return "cpu" if self.native else f"cpu:{self.isa}"

    def compiler_flags(self) -> tuple[str, ...]:
        """How C for this target is compiled: -march=native on the host's own target; otherwise the
        ISA's baseline (so cpu:avx2 code on an AVX-512 machine really is AVX2 code), tuned here."""
        if self.native:
            return ("-march=native",)
        march = ISAS[self.isa][1]
        return (f"-march={march}", "-mtune=native") if march else ()

    @staticmethod
    def parse(spec: str) -> Target:
        """``cpu`` (this machine) or ``cpu:<isa>``; TargetError when unknown or not runnable here."""
        host = Target.host()
        if spec == "cpu":
            return host
        if spec == "kir":  # the kernel-IR interpreter: loop nests only, no C (slow: for tests)
            return Target("generic", 16, 1, native=False, engines=(), interpreted=True)
        kind, _, isa = spec.partition(":")
        if kind != "cpu" or isa not in ISAS:
            raise TargetError(
                f"unknown target {spec!r}; available targets: cpu, {', '.join('cpu:' + i for i in ISAS)}, kir (interpreted), reference"
            )
        if isa not in host.runnable_isas():
            raise TargetError(
                f"target {spec!r} cannot run on this machine (its CPU offers {', '.join(host.runnable_isas())})"
            )
        return Target(isa, ISAS[isa][0], host.cores, native=False)

    def runnable_isas(self) -> tuple[str, ...]:
        """The ISAs whose code runs on this (host) target, best first."""
        order = {"avx512": ("avx512", "avx2", "generic"), "avx2": ("avx2", "generic")}
        return order.get(self.isa, (self.isa, "generic") if self.isa != "generic" else ("generic",))

    @property
    def gemm_rows(self) -> int:
        """Rows of the matrix-multiply micro-tile (its columns are two vectors): as many as the
        vector registers hold as accumulators, leaving room for the B vectors and a broadcast."""
        return 6 if self.isa == "avx2" else 8  # AVX2: 16 registers; AVX-512 and NEON: 32

    @property
    def gemm_cols(self) -> int:
        return 2 * self.vector_bytes // 4

    def lanes(self, dtype: DType) -> int:
        """SIMD lanes for ``dtype`` (1 when the target has no vector unit kiln uses)."""
        return max(1, self.vector_bytes // dtype.numpy.itemsize)

    @staticmethod
    @lru_cache(maxsize=1)
    def host() -> Target:
        flags: set[str] = set()
        try:
            with open("/proc/cpuinfo") as handle:
                for line in handle:
                    if line.startswith(("flags", "Features")):
                        flags = set(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
        if "avx512f" in flags:
            return Target("avx512", 64, cores)
        if "avx2" in flags:
            return Target("avx2", 32, cores)
        if "asimd" in flags or platform.machine() in ("aarch64", "arm64"):
            return Target("neon", 16, cores)
        return Target("generic", 16, cores)
