"""The cpu target's kind: a CPU's ISA, SIMD width, the threads this process may use, its caches."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir.types import DType
from kiln.lower.target import Target


@dataclass(frozen=True)
class Caches:
    """Data cache sizes in bytes, per core for L1/L2, shared L3 (0: unknown)."""

    l1d: int = 0
    l2: int = 0
    l3: int = 0


@dataclass(frozen=True)
class Blocking:
    """The matrix-multiply engine's default cache blocks (the tuner's choices override them)."""

    kc: int  # reduction depth of a block: a packed B micro-panel (kc x NR floats) fills half of L1d
    a_block: int  # floats of an MC x KC block of A: half of L2 (so MC = a_block / kc, 96..1024 rows)
    source: str  # where the sizes came from

    @property
    def text(self) -> str:
        return f"kc {self.kc}, A block {self.a_block * 4 // 1024} KiB ({self.source})"


# what an unknown cache is taken to be: 32 KiB L1d, 512 KiB L2 (a small modern core)
_L1D, _L2 = 32 << 10, 512 << 10


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
    def layouts(self) -> tuple[str, ...]:
        return ("NHWC",) if self.lanes(DType.FLOAT32) >= 4 else ()  # channels-last kernels vectorize across channels

    @property
    def int8_max(self) -> int:
        return self.int8_levels

    @property
    def gemm_rows(self) -> int:
        """As many rows as the vector registers hold as accumulators, leaving room for the B
        vectors and a broadcast."""
        return 6 if self.isa == "avx2" else 8  # AVX2: 16 registers; AVX-512 and NEON: 32

    @property
    def blocking(self) -> Blocking:
        """Cache blocks from this machine's caches (sysfs), not from any one vendor's part: a B
        micro-panel in half of L1d, an A block in half of L2 (unknown caches: 32 KiB and 512 KiB)."""
        l1, l2 = self.caches.l1d or _L1D, self.caches.l2 or _L2
        panel_bytes = self.gemm_cols * 4
        kc = max(64, min(512, (l1 // 2 // panel_bytes) // 8 * 8))
        a_block = max(16384, min(1 << 20, l2 // 2 // 4))
        known = "L1d and L2 from sysfs" if self.caches.l1d and self.caches.l2 else "a cache size unknown: defaults"
        return Blocking(kc, a_block, known)

    @property
    def summary(self) -> str:
        return self.isa

    @property
    def float_to_int(self) -> str:
        return "x86" if self.isa in ("avx512", "avx2") else ""  # (cvttss2si's integer indefinite)
