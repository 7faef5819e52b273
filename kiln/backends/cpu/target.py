"""The cpu target's kind: a CPU's ISA, SIMD width, the threads this process may use, its caches."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.lower.target import Target


@dataclass(frozen=True)
class Caches:
    """Data cache sizes in bytes, per core for L1/L2, shared L3 (0: unknown)."""

    l1d: int = 0
    l2: int = 0
    l3: int = 0


@dataclass(frozen=True, kw_only=True)
class CpuTarget(Target):
    """A CPU: ``cpu`` is the host at its best ISA, ``cpu:avx2`` the AVX2 code path on any machine
    that runs it."""

    backend: str = "cpu"
    isa: str  # the instruction set the loop nests are shaped for: avx512 | avx2 | neon | generic
    simd_bytes: int  # its vector registers' width
    threads: int = 1  # the CPUs this process may use
    caches: Caches = Caches()
    int8_levels: int = 127  # largest quantized activation (255 needs VNNI: gemm_int8.c)

    @property
    def vector_bytes(self) -> int:
        return self.simd_bytes

    @property
    def cores(self) -> int:
        return self.threads

    @property
    def int8_max(self) -> int:
        return self.int8_levels

    @property
    def gemm_rows(self) -> int:
        """As many rows as the vector registers hold as accumulators, leaving room for the B
        vectors and a broadcast."""
        return 6 if self.isa == "avx2" else 8  # AVX2: 16 registers; AVX-512 and NEON: 32

    @property
    def summary(self) -> str:
        return self.isa
