"""What lowering knows of a target: the capability record every backend describes itself with.

A ``Target`` is plain data (it is part of every cache key through its ``repr``): which backend
renders, builds and loads the kernels, the vector width and cores the loop nests are shaped
for, and the engines (kiln's hand-written drivers: the matrix-multiply engine, Winograd
transforms, attention) kernels may call. Which targets exist, and how a name such as
``cpu:avx2`` becomes a ``Target``, is the backend registry's business (``kiln.backends``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import KilnError
from kiln.ir.types import DType

ENGINES = ("attention", "gemm", "winograd")  # a sorted tuple: repr(Target) is part of cache keys


class TargetError(KilnError):
    """An unknown target, or one this machine cannot run."""


@dataclass(frozen=True)
class Target:
    """One target at one variant (``cpu`` is the host at its best ISA, ``cpu:avx2`` the AVX2 code
    path on any machine that runs it)."""

    backend: str  # the registered backend that renders, builds and loads kernels ("cpu")
    isa: str  # the instruction set the loop nests are shaped for: avx512 | avx2 | neon | generic
    vector_bytes: int
    cores: int
    native: bool = True  # built for this very machine (the C backend: -march=native)
    engines: tuple[str, ...] = ENGINES  # the drivers kernels may call (sorted)
    spec: str = ""  # the name it was asked for ("cpu", "cpu:avx2"); defaults to the backend's name
    int8_max: int = 127  # largest quantized activation its int8 code may use (255 needs VNNI: gemm_int8.c)
    # instruction-set extensions its native code may use (cpu: the host's, which -march=native
    # enables): part of every cache key, recorded in artifacts, checked where they load
    features: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec or self.backend

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
