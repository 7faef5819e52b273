"""The models a server holds: a model repository folder, or one model file.

A repository is ``REPO/NAME/VERSION/model.kiln`` (or ``model.onnx``, compiled once when it loads,
through kiln's plan cache); a single ``MODEL.kiln`` or ``MODEL.onnx`` is the repository of one
model named after the file, version ``1``. Only regular files inside the repository are opened
(a symlink that leaves it, a device, a folder named ``model.kiln``: not a model). A ``.kiln``
artifact carries native code: it is loaded as it is only when the server was told to trust the
repository (``trust``); otherwise its code is generated again from its IR (``kiln.load(...,
rebuild=True)``).

A model that fails to load is kept with its error (reported not ready); the others serve.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.errors import ArgumentError, KilnError
from kiln.ir.types import TensorType
from kiln.serve.protocol import datatype_of

log = logging.getLogger("kiln.serve")

FILES = ("model.kiln", "model.onnx")
MAX_BATCH = 8  # an ONNX file's symbolic batch is compiled for 1..MAX_BATCH unless told otherwise


@dataclass
class Loaded:
    """One version of one model: the kiln model, or why it could not be loaded."""

    name: str
    version: str
    path: Path
    model: Any = None
    error: str | None = None
    loaded_at: float = field(default_factory=time.time)

    @property
    def ready(self) -> bool:
        return self.model is not None

    def metadata(self) -> dict[str, Any]:
        """The protocol's model metadata: inputs and outputs with -1 for a symbolic dim, and kiln's
        declared ranges of those dims (``parameters.ranges``)."""
        document: dict[str, Any] = {"name": self.name, "versions": [self.version], "platform": "kiln"}
        if self.model is None:
            document["parameters"] = {"error": self.error}
            return document
        signature = self.model.signature
        document["inputs"] = [_tensor(v) for v in signature.inputs]
        document["outputs"] = [_tensor(v) for v in signature.outputs]
        ranges = getattr(self.model, "ranges", {}) or {}
        document["parameters"] = {"ranges": {k: list(v) for k, v in ranges.items()}}
        return document


def _tensor(value: Any) -> dict[str, Any]:
    kind = value.type
    if not isinstance(kind, TensorType):
        return {"name": value.name, "datatype": "BYTES", "shape": [-1]}
    shape = [d if isinstance(d, int) else -1 for d in kind.shape] if kind.shape is not None else [-1]
    return {"name": value.name, "datatype": datatype_of(kind.dtype.numpy), "shape": shape}


def _regular_inside(path: Path, root: Path) -> bool:
    """Whether ``path`` is a regular file (not a symlink) whose real place is inside ``root``."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode):
        return False
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


class Repository:
    """The models found under ``root`` (a folder or one model file), loaded on demand."""

    def __init__(
        self,
        root: str | os.PathLike,
        trust: bool = False,
        max_batch: int = MAX_BATCH,
        threads: int = 0,
        spin: int | None = None,
        runtime: str = "kiln",
        dims: dict[str, str] | None = None,
    ):
        self.root = Path(root)
        self.dims = dict(dims or {})  # declared ranges for .onnx files compiled at load (those they have)
        self.trust, self.max_batch, self.threads, self.spin = trust, max_batch, threads, spin
        self.runtime = runtime  # "kiln", or "onnxruntime": a peer behind the same server (kiln.serve.peer)
        if not self.root.exists():
            raise ArgumentError(f"no model repository or model file at {self.root}")
        if self.root.is_file() and self.root.suffix not in (".kiln", ".onnx"):
            raise ArgumentError(f"{self.root}: a model file is a .kiln artifact or an .onnx file")
        self.loaded: dict[str, Loaded] = {}  # by model name: the version serving
        self._lock = threading.Lock()

    def found(self) -> dict[str, dict[str, Path]]:
        """Each model's versions' files (name -> version -> path), as on disk now."""
        if self.root.is_file():
            return {self.root.stem: {"1": self.root}}
        models: dict[str, dict[str, Path]] = {}
        for folder in sorted(self.root.iterdir()):
            if folder.is_symlink() or not folder.is_dir() or folder.name.startswith("."):
                continue
            versions = {}
            for version in folder.iterdir():
                if version.is_symlink() or not version.is_dir() or not version.name.isdigit():
                    continue
                for name in FILES:
                    if _regular_inside(version / name, self.root):
                        versions[version.name] = version / name
                        break
            if versions:
                models[folder.name] = versions
        return models

    def index(self) -> list[dict[str, Any]]:
        """The repository extension's index: every model found, its state."""
        found = self.found()
        rows = []
        for name in sorted(set(found) | set(self.loaded)):
            versions = found.get(name, {})
            current = self.loaded.get(name)
            for version in sorted(versions, key=int) or ([current.version] if current else []):
                row = {"name": name, "version": version, "state": "UNAVAILABLE"}
                if current is not None and current.version == version:
                    row["state"] = "READY" if current.ready else "UNAVAILABLE"
                    if current.error:
                        row["reason"] = current.error
                rows.append(row)
        return rows

    def load(self, name: str) -> Loaded:
        """Load (or load again) ``name``'s newest version; the one serving keeps serving until
        the new one is ready, and stays if the new one fails."""
        versions = self.found().get(name)
        if not versions:
            raise ArgumentError(f"no model {name!r} in the repository")
        version = max(versions, key=int)
        entry = Loaded(name, version, versions[version])
        try:
            entry.model = self._open(entry.path)
        except KilnError as err:
            entry.error = f"{type(err).__name__}: {err}"
            log.error("model %s version %s failed to load: %s", name, version, entry.error)
        with self._lock:
            current = self.loaded.get(name)
            if entry.ready or current is None or not current.ready:
                self.loaded[name] = entry
        return entry

    def unload(self, name: str) -> None:
        with self._lock:
            if self.loaded.pop(name, None) is None:
                raise ArgumentError(f"model {name!r} is not loaded")

    def load_all(self) -> None:
        for name in self.found():
            self.load(name)

    def _open(self, path: Path) -> Any:
        import kiln

        if self.runtime == "onnxruntime":
            from kiln.serve.peer import OnnxRuntimeModel

            if path.suffix != ".onnx":
                raise ArgumentError(f"{path.name}: onnxruntime serves .onnx files only")
            return OnnxRuntimeModel(str(path), self.threads)
        if path.suffix == ".kiln":
            return kiln.load(str(path), rebuild=not self.trust, threads=self.threads, spin=self.spin)
        dims = _batch_range(path, self.max_batch, self.dims)
        return kiln.compile(str(path), dims=dims or None, threads=self.threads, spin=self.spin)


def _batch_range(path: Path, max_batch: int, declared: dict[str, str]) -> dict[str, str]:
    """An ONNX file's ranges: its batch, the one symbolic dim that is the first axis of its inputs
    that have one (the others static), compiled for 1..max_batch (its size classes: the batcher
    joins requests up to them), and the ``declared`` ranges of the dims it has."""
    from kiln.frontend.onnx import import_onnx
    from kiln.passes.op_axes import symbols

    graph = import_onnx(str(path))
    firsts = set()
    for value in graph.inputs:
        shape = value.type.shape if isinstance(value.type, TensorType) else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            firsts.add(shape[0] if shape else None)
    found = {k: v for k, v in declared.items() if k in set(symbols(graph))}
    if len(firsts) == 1 and isinstance(next(iter(firsts)), str):
        return {next(iter(firsts)): f"1..{max_batch}", **found}
    return found
