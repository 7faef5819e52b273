"""A third target that exists only in the tests: ``kir`` runs the lowered kernels on the kernel-IR
interpreter (no renderer, no compiler, no engines: matrix products stay loop nests, attention falls
back to the host). It is registered through the public registry, exactly as a new target would be:
nothing in ``kiln/`` knows about it. If it passes the shared compiled-vs-reference cases, the
pipeline really is target-neutral."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.backends import Backend, register
from kiln.lower.kir import Buffer
from kiln.lower.kir_interpreter import run_kernel
from kiln.lower.target import Target, TargetError

NAME = "kir"


class KirBackend(Backend):
    name = NAME

    def describe(self, variant: str) -> Target:
        if variant:
            raise TargetError(f"target {NAME!r} has no variants, got {NAME}:{variant}")
        # the loop nests are shaped for a 16-byte vector (they run element by element anyway)
        return Target(NAME, "generic", 16, 1, native=False, engines=())

    def load(self, plan: Any, target: Target) -> list:
        def runner_for(kernels: list) -> Any:
            def run(table: Any, views: dict[Buffer, np.ndarray], status: np.ndarray) -> None:
                for kernel in kernels:
                    run_kernel(kernel, views)

            return run

        return [runner_for(step.kernels) for step in plan.steps if hasattr(step, "kernels")]


def ensure_registered() -> None:
    from kiln.backends import names

    if NAME not in names():
        register(KirBackend())
