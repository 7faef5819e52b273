"""What lowering knows of a target: a kind (the backend that renders, builds and loads its kernels)
plus that kind's own typed attributes.

Every target says the few things the shared lowering shapes loop nests and constant panels by
(``vector_bytes``, ``cores``, the matrix-product tile ``gemm_rows`` x ``gemm_cols``, ``int8_max``)
and the engines (kiln's hand-written drivers: the matrix-multiply engine, Winograd transforms,
attention) its kernels may call, and how a loop nest runs when nothing was tuned
(``default_schedule``). Each kind is defined by its backend with what is its own: a CPU its ISA,
vector width, cores and cache sizes (``kiln.backends.cpu.target``); a GPU its architecture, warps
and shared memory (``kiln.backends.gpu.target``); an FPGA its part and clock. Targets are plain
frozen data: ``repr`` is part of every cache key. Which targets exist, and how a name such as
``cpu:avx2`` becomes one, is the backend registry's business (``kiln.backends``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import KilnError
from kiln.ir.sized import size_product
from kiln.ir.types import DType
from kiln.lower.kir import Index, Schedule

ENGINES = ("attention", "gemm", "winograd")  # a sorted tuple: repr(Target) is part of cache keys
PARALLEL_MIN = 32 * 1024  # elements: below this a parallel region costs more than it saves


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
    def float_to_int(self) -> str:
        """What its native code gives for a float -> int32/int64 cast of NaN or of a value out of
        range, when it is what kiln's reference (NumPy on this kind of CPU) gives: "x86" (the
        integer indefinite, the type's minimum); "" where unknown (such casts run on the reference)."""
        return ""

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
    def layouts(self) -> tuple[str, ...]:
        """Activation layouts besides NCHW its kernels run natively (``kiln.passes.layout`` may
        put a region of the graph in one of them)."""
        return ()

    @property
    def pixel_major(self) -> bool:
        """Whether its convolutions and poolings loop output pixel by output pixel, every channel
        and tap of one pixel inside (an HLS pipeline taking a pixel per initiation interval, as a
        stream of pixels arrives), rather than plane by plane as caches and SIMD want."""
        return False

    @property
    def summary(self) -> str:
        """A few words on what the code is for (``kiln compile``'s line, ``kiln targets``)."""
        return self.name

    def lanes(self, dtype: DType) -> int:
        """SIMD lanes for ``dtype`` (1 when the target has no vector unit kiln uses)."""
        return max(1, self.vector_bytes // dtype.numpy.itemsize)

    def default_schedule(self, shape: tuple[int, ...], indices: list[Index], dtype: DType) -> Schedule:
        """How a loop nest over ``shape`` (loops ``indices``, outermost first) runs when nothing
        was tuned: here the outermost loop across cores when there are several and the work is
        large enough, the innermost loop vectorized when it spans at least one SIMD register. A
        kind of target with other habits overrides it."""
        if not indices:
            return Schedule()
        total = size_product(shape)
        parallel = indices[0].name if self.cores > 1 and total >= PARALLEL_MIN and shape[0] > 1 else None
        wide_enough = shape[-1] >= self.lanes(dtype)
        vectorize = indices[-1].name if wide_enough and (parallel != indices[-1].name or len(indices) == 1) else None
        return Schedule(parallel=parallel, vectorize=vectorize)
