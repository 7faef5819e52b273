"""What lowering knows of a target: a kind (the backend that renders, builds and loads its kernels)
plus that kind's own typed attributes.

Every target says the few things the shared lowering shapes loop nests and constant panels by
(``vector_bytes``, ``cores``, the matrix-product tile ``gemm_rows`` x ``gemm_cols``, ``int8_max``)
and the engines (kiln's hand-written drivers: the matrix-multiply engine, Winograd transforms,
attention) its kernels may call. Each kind adds what is its own: a CPU its ISA, vector width,
cores and cache sizes; a GPU its architecture, warps and shared memory; an FPGA its part and
clock. Targets are plain frozen data: ``repr`` is part of every cache key. Which targets exist,
and how a name such as ``cpu:avx2`` becomes one, is the backend registry's business
(``kiln.backends``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import KilnError
from kiln.ir.types import DType

ENGINES = ("attention", "gemm", "winograd")  # a sorted tuple: repr(Target) is part of cache keys


class TargetError(KilnError):
    """An unknown target, or one this machine cannot run."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """What every target is. Subclasses (one per kind) add their attributes and answer the
    shaping questions lowering asks."""

    backend: str  # the registered backend that renders, builds and loads kernels ("cpu")
    spec: str = ""  # the name it was asked for ("cpu", "cpu:avx2"); defaults to the backend's name
    engines: tuple[str, ...] = ENGINES  # the drivers kernels may call (sorted)
    # instruction-set extensions its native code may use (cpu: the host's, which -march=native
    # enables): part of every cache key, recorded in artifacts, checked where they load
    features: tuple[str, ...] = ()
    native: bool = False  # built for this very machine (the C backend's -march=native)

    @property
    def name(self) -> str:
        return self.spec or self.backend

    @property
    def vector_bytes(self) -> int:
        """The width, in bytes, the innermost loops are shaped for."""
        raise NotImplementedError

    @property
    def cores(self) -> int:
        """Participants kiln's own parallel loops (and engines' scratch) are sized for (1: the
        target parallelizes otherwise, a GPU's launch grid)."""
        return 1

    @property
    def int8_max(self) -> int:
        """The largest quantized activation its int8 code may use."""
        return 127

    @property
    def gemm_rows(self) -> int:
        """Rows of the matrix-product micro-tile (constant operands are packed in panels of it)."""
        return 8

    @property
    def gemm_cols(self) -> int:
        return 2 * self.vector_bytes // 4

    @property
    def summary(self) -> str:
        """A few words on what the code is for (``kiln compile``'s line, ``kiln targets``)."""
        return self.name

    def lanes(self, dtype: DType) -> int:
        """SIMD lanes for ``dtype`` (1 when the target has no vector unit kiln uses)."""
        return max(1, self.vector_bytes // dtype.numpy.itemsize)


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


@dataclass(frozen=True, kw_only=True)
class GpuTarget(Target):
    """A GPU through Triton: a CUDA architecture (``sm_90``...), or Triton's interpreter on the
    CPU (``interpret``, for tests on machines without a GPU)."""

    backend: str = "gpu"
    arch: str = "cuda"  # "cuda" (the device's, read when loading), "sm_80"/"sm_90", or "interpret"
    warps: int = 4  # per program (Triton's num_warps)
    shared_memory: int = 0  # bytes per block the kernels may use (0: the device's, read when loading)
    # the loop nests' shapes are the renderer's business (lanes); this width and the product tile
    # only size the constant operands' panels, read through their layout by the kernels
    panel_bytes: int = 64

    @property
    def vector_bytes(self) -> int:
        return self.panel_bytes

    @property
    def interpret(self) -> bool:
        return self.arch == "interpret"

    @property
    def summary(self) -> str:
        return "Triton interpreter" if self.interpret else f"Triton, {self.arch}"
