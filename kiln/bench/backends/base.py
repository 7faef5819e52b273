"""The interface every benchmarked backend implements.

A backend turns a ``BenchModel`` into a ``Session`` in two timed steps, ``compile`` (produce an
artifact: an optimized model, a compiled blob, a traced graph) and ``load`` (make it runnable), so
compile time and load time are separate numbers. Backends that compile lazily on the first call
(torch.compile) make that call inside ``compile`` and say so in their config.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from typing import Any

import numpy as np


def module_exists(name: str) -> bool:
    """Whether ``name`` (possibly dotted) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package raises instead of returning None
        return False


class Unavailable(Exception):
    """The backend cannot run here (not installed, no GPU, cannot take this model): the reason."""


class Session(ABC):
    """A loaded model: ``run`` takes and returns numpy arrays and must be thread-safe."""

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...

    def close(self) -> None:  # noqa: B027 - optional hook; most sessions hold nothing to release
        """Release resources (optional)."""


class Backend(ABC):
    name: str = "abstract"
    #: Python modules the backend needs; availability checks their presence without importing.
    requires: tuple[str, ...] = ()
    #: True when the backend needs the model as a torch module rather than an ONNX file.
    needs_torch_module: bool = False
    #: Where inference runs: "cpu" (energy from RAPL) or "cuda" (energy from NVML).
    device: str = "cpu"

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.artifact: Any = None
        # a compile that depends on caches measures itself with them empty first (compile_figures);
        # False: only with the caches as they are (a study's later points of one model and backend)
        self.cold_compile = True

    def availability(self) -> str | None:
        """None when the backend can run here, else why not."""
        missing = [m for m in self.requires if not module_exists(m)]
        if missing:
            return f"not installed (needs {', '.join(missing)})"
        return None

    @abstractmethod
    def version(self) -> str: ...

    def config(self) -> dict[str, Any]:
        """The effective settings, printed next to every result."""
        return {"threads": self.threads}

    @abstractmethod
    def compile(self, model: Any, example: dict[str, np.ndarray]) -> None:
        """Produce the artifact (kept on ``self.artifact``); timed as compile time."""

    @abstractmethod
    def load(self) -> Session:
        """Make the artifact runnable; timed as load time."""

    def run_figures(self) -> dict[str, Any]:
        """What the backend measured about the runs themselves, read after the scenario (kiln's
        gpu target: host->device, kernel and device->host milliseconds per run, ``transfers``)."""
        return {}

    def compiled_count(self) -> int | None:
        """How many compiles the loaded model has done so far (kiln: its compiled variants), to
        show a run compiled nothing; None where the backend cannot tell."""
        return None

    def compile_figures(self) -> dict[str, Any]:
        """Compile times the backend measured itself (``compile_cold_s`` with nothing cached, which
        replaces the timed compile as ``compile_s``; ``compile_cached_s`` with its caches as they
        are), for backends whose compile time depends on a cache. Empty: the timed compile is it."""
        return {}
