"""The ``gpu`` target: kernels rendered as Triton (``render.py``), run on a CUDA device, or on the
CPU by Triton's interpreter (``gpu:interpret``, for tests on machines without a GPU), and compiled
ahead for an NVIDIA architecture without one (``ahead.py``: registers, spills, shared memory).
The same graph passes and lowering as the cpu target; the engines it renders are the matrix
product (``tl.dot`` tiles, convolutions as implicit GEMM) and attention (flash attention); Winograd
is the CPU's. No vendor library is called: every kernel is kiln's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.backends.gpu.module import render_module, source_file
from kiln.backends.gpu.render import Launch
from kiln.backends.gpu.runtime import (
    DevicePlan,
    SegmentRunner,
    cuda_missing,
    module,
    traffic,
    transfer_times,
    triton_missing,
)
from kiln.backends.gpu.target import GpuTarget
from kiln.backends.registry import Backend, BuildOptions, Loaded, Section, Threading
from kiln.backends.registry import SegmentRunner as Runner
from kiln.lower.engine import WEIGHT_FORMATS
from kiln.lower.kir import Buffer, Kernel
from kiln.lower.target import Target, TargetError

ENGINES = ("attention", "gemm")  # sorted; no Winograd: convolutions are implicit GEMMs here


class GpuBackend(Backend):
    name = "gpu"
    # one launch per kernel for the whole batch up to 128 (an H100's 132 SMs are not busy at batch 8:
    # ResNet-50 at 32 ran as four chunks of 8, 1.6x torch.compile, docs/gpu/2026-11-27-h100-run1.md)
    batch_classes = (1, 8, 32, 128)

    def describe(self, variant: str) -> Target:
        if variant not in ("", "interpret"):
            raise TargetError(
                f"unknown target 'gpu:{variant}'; the gpu target's variants: {', '.join(self.variants())}"
            )
        missing = triton_missing()
        if missing:
            raise TargetError(f"target 'gpu{':' + variant if variant else ''}' needs Triton: {missing}")
        spec = f"gpu:{variant}" if variant else ""
        return GpuTarget(arch="interpret" if variant else "cuda", engines=ENGINES, spec=spec)

    def variants(self) -> list[str]:
        return ["gpu", "gpu:interpret"]

    def render(
        self, segments: Sequence[Sequence[Kernel]], table: dict[Buffer, int], options: BuildOptions, target: Target
    ) -> str:
        return render_module(segments, table)

    def identity(self, target: Target, debug: bool = False) -> tuple[str, ...]:
        import triton

        return ("triton", triton.__version__)

    def available(self) -> str:
        return triton_missing()

    def runnable(self, target: Target) -> str:
        missing = triton_missing()
        if missing or target.interpret:
            return missing
        reason = cuda_missing()
        return f"{reason}: compiles (kiln explain --target gpu --arch sm_90); runs as gpu:interpret" if reason else ""

    def precisions(self, target: Target) -> dict[str, str]:
        only = "the gpu target computes in fp32 only (its products use IEEE fp32 tl.dot, not TF32)"
        return {"fp32": "", "bf16": only, "int8": only, **dict.fromkeys(WEIGHT_FORMATS, only)}

    def load(self, plan: Any, target: Target, parallelism: Threading) -> Loaded:
        segments = [s for s in plan.steps if hasattr(s, "kernels")]
        if not segments:
            return Loaded([])
        interpret = target.interpret
        if not interpret:
            missing = cuda_missing()
            if missing:
                raise TargetError(
                    f"target 'gpu' cannot run here: {missing}. The same kernels run on the CPU in Triton's "
                    "interpreter with target='gpu:interpret'; `kiln explain MODEL --target gpu --arch sm_90` "
                    "compiles them ahead for a GPU without one"
                )
        namespace = module(plan.source, interpret)
        launches = {int(k): [Launch.of(v) for v in vs] for k, vs in namespace["LAUNCHES"].items()}
        state = DevicePlan(plan, "cpu" if interpret else "cuda")
        slots = {slot: buffer for buffer, slot in plan.table.items()}
        status = slots.get(0)
        runners: list[Runner] = []
        for number, (upload, download) in enumerate(traffic(plan)):
            mine = launches.get(number, [])
            uses_status = any(0 in launch.slots for launch in mine)
            runners.append(
                SegmentRunner(state, mine, namespace, slots, upload, download, status if uses_status else None)
            )
        return Loaded(runners)  # launches from Python: no native entry

    def artifact_meta(self, target: Target) -> dict[str, Any]:
        return {}

    def ahead_arches(self) -> tuple[str, ...]:
        from kiln.backends.gpu.ahead import ARCHES

        return tuple(ARCHES)

    def explain(self, plan: Any, arches: tuple[str, ...], progress: Callable[[str], Any]) -> list[Section]:
        from kiln.backends.gpu.explain import kernel_report, kernel_section

        return [kernel_section(kernel_report(plan, arches, progress))] if plan.source else []

    def run_profile(self, executable: Any, target: Target) -> Section:
        from kiln.backends.gpu.explain import transfer_section

        return transfer_section(executable, target)


__all__ = ["GpuBackend", "source_file", "transfer_times"]
