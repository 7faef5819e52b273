"""kiln itself, on any of its targets (``kiln`` is the default target; ``kiln-<target>`` names one)."""

from __future__ import annotations

import os
import tempfile
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
    target = "cpu"

    def version(self) -> str:
        return kiln.__version__

    def config(self) -> dict[str, Any]:
        return {"threads": self.threads, "target": self.target}

    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        compiled = kiln.compile(str(model.onnx_path), target=self.target)
        if self.target == "cpu":
            compiled.prepare(example)  # compile for the example's dims here, not on the first run
            # compile = build the artifact; load = read it back, as a deployment would
            handle, path = tempfile.mkstemp(suffix=".kiln")
            os.close(handle)
            try:
                compiled.save(path)
            except BaseException:
                os.unlink(path)
                raise
            self.artifact = path
        else:
            self.artifact = compiled

    def load(self) -> Session:
        if self.target == "cpu":
            try:
                return _KilnSession(kiln.load(self.artifact, threads=self.threads))
            finally:  # the loaded model holds what it needs: the file goes (a bench run once left 1.6 GB)
                os.unlink(self.artifact)
        return _KilnSession(self.artifact)  # the reference has no artifact: load time is ~0


class KilnReferenceBackend(KilnBackend):
    """kiln's reference interpreter: the oracle, exact and slow."""

    name = "kiln-reference"
    target = "reference"
