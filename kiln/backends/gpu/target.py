"""The gpu target's kind: a CUDA architecture (or Triton's interpreter), warps, shared memory."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.lower.target import Target


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
