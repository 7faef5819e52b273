"""kiln itself, on any of its targets (``kiln`` is the default target; ``kiln-<target>`` names one)."""

from __future__ import annotations

from typing import Any

import numpy as np

import kiln
from kiln.bench.backends.base import Backend, Session


class _KilnSession(Session):
    def __init__(self, model: Any) -> None:
        self.model = model

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.model.run(feeds).values())

    def close(self) -> None:
        self.model.close()


class KilnBackend(Backend):
    name = "kiln"
    target = kiln.TARGETS[0]

    def version(self) -> str:
        return kiln.__version__

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "target": self.target}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        self.artifact = kiln.compile(str(model.onnx_path), target=self.target)

    def load(self) -> Session:
        # The reference target has no separate artifact to load: load time is ~0 by construction.
        return _KilnSession(self.artifact)


def kiln_target_backend(target: str) -> type[KilnBackend]:
    return type(f"Kiln{target.title()}Backend", (KilnBackend,), {"name": f"kiln-{target}", "target": target})
