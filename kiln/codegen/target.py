"""What the host CPU can do, for codegen decisions (vector width, cores) and cache keys."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache

from kiln.ir.types import DType


@dataclass(frozen=True)
class Target:
    isa: str  # avx512 | avx2 | neon | generic
    vector_bytes: int
    cores: int

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
