"""What the harness benchmarks: zoo models by name (with batch/seq parameters) or ONNX files."""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln import zoo
from kiln.errors import KilnError
from kiln.integrity import open_regular
from kiln.ir.types import random_tensor


@dataclass
class BenchModel:
    """A model at a given batch size; ``onnx_path`` exists once ``prepare`` has run."""

    name: str
    batch: int
    seq: int | None = None
    path: str | None = None  # an ONNX file given by the user
    batch_range: tuple[int, int] | None = None  # every query a batch drawn from it (``--variable-batch``)
    weights: str | None = None  # a zoo model's state_dict file (``--weights``): its export loads it
    digest: str | None = None  # a user's ONNX file by its contents (SHA-256): its identity, not its name

    def __post_init__(self) -> None:
        if self.batch_range is not None:  # (a list after a trip through a job's JSON)
            self.batch_range = (int(self.batch_range[0]), int(self.batch_range[1]))

    @property
    def label(self) -> str:
        """The model's name in rows, reports and keys: a user's file is its name and the start of its
        contents' digest (``m-3fa2b1c0``), so two files named alike never share a row or a reference."""
        if self.path is not None and self.digest:
            return f"{self.name}-{self.digest[:8]}"
        return self.name if self.seq is None or self.name not in ("bert-base", "gpt2") else f"{self.name}-s{self.seq}"

    @property
    def is_zoo(self) -> bool:
        return self.path is None

    @property
    def is_classifier(self) -> bool:
        return self.is_zoo and self.name in zoo.CLASSIFIERS

    def _overrides(self) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        if self.seq is not None and self.name in ("bert-base", "gpt2"):
            overrides["seq"] = self.seq
        return overrides

    @property
    def onnx_path(self) -> Path:
        if self.path is not None:
            return Path(self.path)
        return zoo.onnx_path(self.name, weights=self.weights, **self._overrides())

    def prepare(self, progress: Any = None) -> None:
        """Export the zoo model if it is not cached yet (done once, in the parent process)."""
        if self.is_zoo:
            zoo.onnx_path(self.name, progress=progress, weights=self.weights, **self._overrides())

    def inputs(self, seed: int = 0, batch: int | None = None) -> dict[str, np.ndarray]:
        batch = self.batch if batch is None else batch
        if self.is_zoo:
            return zoo.example_inputs(self.name, seed=seed, batch=batch, **self._overrides())
        return random_inputs_for(self.onnx_path, batch, seed)

    def torch_module(self) -> Any:
        if not self.is_zoo:
            return None
        model = zoo.get(self.name)
        module = model.build(zoo.options_for(self.name, **self._overrides()))
        if self.weights is not None:
            from kiln.zoo.weights import load_into

            load_into(module, self.weights)
            module.eval()
        return module


def resolve_model(name: str, batch: int, seq: int | None) -> BenchModel:
    """A zoo name or a path to an .onnx file; unknown names list the valid ones."""
    if name in zoo.MODELS:
        return BenchModel(name, batch, seq)
    if name.endswith(".onnx") or Path(name).exists():
        if not Path(name).is_file():
            raise KilnError(f"model file {name!r} does not exist")
        path = Path(name).resolve()
        return BenchModel(Path(name).stem, batch, None, path=str(path), digest=file_digest(path))
    raise KilnError(f"unknown model {name!r}; available: {', '.join(zoo.MODELS)} (or a path to an .onnx file)")


def file_digest(path: str | Path) -> str:
    """A model file's SHA-256, hashed once per process while its size and modification time hold.
    Only a regular file is read (a FIFO is refused at once, never waited on)."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise KilnError(f"model file {str(path)!r}: {err.strerror or err}") from None
    return _sha256(str(path), info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, modified: int) -> str:
    sha = hashlib.sha256()
    try:
        with open_regular(path, "model file") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
    except OSError as err:
        raise KilnError(f"model file {path!r}: {err.strerror or err}") from None
    return sha.hexdigest()


def random_inputs_for(path: Path, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Inputs for an arbitrary ONNX file: symbolic dims become ``batch`` (first) or 1."""
    import onnx

    from kiln.frontend.onnx import type_from_proto
    from kiln.ir.types import TensorType

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for info in model.graph.input:
        if info.name in initializers:
            continue
        value_type = type_from_proto(info.type, info.name)
        if not isinstance(value_type, TensorType) or value_type.shape is None:
            raise KilnError(f"{path}: input {info.name!r} has no tensor shape to generate data for")
        shape = [d if isinstance(d, int) else (batch if axis == 0 else 1) for axis, d in enumerate(value_type.shape)]
        feeds[info.name] = random_tensor(value_type.dtype, shape, rng)
    return feeds
