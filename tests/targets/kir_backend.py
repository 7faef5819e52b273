"""A third target that exists only in the tests: ``kir`` runs the lowered kernels on the kernel-IR
interpreter (no renderer, no compiler): loop nests element by element, engine calls (matrix
products, Winograd, attention) by their NumPy specification (``kiln.lower.kir_engines``);
``kir:loops`` declares no engines, so matrix products stay loop nests and attention falls back to
the host. It is registered through the public registry, exactly as a new target would be: nothing
in ``kiln/`` knows about it. If it passes the shared compiled-vs-reference cases, the pipeline
really is target-neutral."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.backends import Backend, Loaded, register
from kiln.lower.kir import Buffer
from kiln.lower.kir_interpreter import run_kernel
from kiln.lower.target import ENGINES, Target, TargetError

NAME = "kir"


@dataclass(frozen=True, kw_only=True)
class KirTarget(Target):
    """The kind of target this backend is: a 16-byte vector, one core (its own typed attributes
    would go here, as a cpu's ISA or a gpu's architecture do)."""

    backend: str = NAME

    @property
    def vector_bytes(self) -> int:
        return 16


class KirBackend(Backend):
    name = NAME

    def describe(self, variant: str) -> Target:
        if variant not in ("", "loops"):
            raise TargetError(f"unknown target '{NAME}:{variant}'; {NAME}'s variants: {', '.join(self.variants())}")
        # the loop nests are shaped for a 16-byte vector and an 8x8 engine tile (they run element
        # by element anyway: any shape would do)
        spec = f"{NAME}:{variant}" if variant else ""
        return KirTarget(engines=() if variant else ENGINES, spec=spec)

    def variants(self) -> list[str]:
        return [NAME, f"{NAME}:loops"]

    def load(self, plan: Any, target: Target, parallelism: Any) -> list:
        def runner_for(kernels: list) -> Any:
            def run(table: Any, views: dict[Buffer, np.ndarray], status: np.ndarray) -> None:
                for kernel in kernels:
                    run_kernel(kernel, views)

            return run

        return Loaded([runner_for(step.kernels) for step in plan.steps if hasattr(step, "kernels")])


def ensure_registered() -> None:
    from kiln.backends import names

    if NAME not in names():
        register(KirBackend())
