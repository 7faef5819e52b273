"""``.kiln`` artifacts: one zip file with the model's IR, its weights and the native libraries of
every compiled variant, so loading needs no ONNX file and no C compiler.

    meta.json      format, version, kiln version, target, -O level, the variants' dims
    graph.txt      the source graph in kiln's IR text form
    tensors.npz    the weights the text refers to
    lib/<key>.so   one native library per variant, keyed by the hash of its generated C
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError

FORMAT = "kiln-artifact"
VERSION = 1


class ArtifactError(KilnError):
    """The file is not a kiln artifact kiln can load (corrupt, foreign, or from a newer kiln)."""


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:24]


def save(model: Any, path: str | os.PathLike) -> Path:
    from kiln import __version__
    from kiln.ir.printer import print_graph, tensor_data

    path = Path(path)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "kiln": __version__,
        "target": model.target,
        "variants": [],
    }
    libraries: dict[str, Path] = {}
    if model.target == "cpu":
        meta["opt_level"] = model.level
        for key, executable in model._variants.items():
            if all(isinstance(v, int) for _, v in key) and executable.keep is None:
                meta["variants"].append(dict(key))
                if executable.plan.library is not None:
                    libraries[source_key(executable.plan.source)] = executable.plan.library
    tensors = io.BytesIO()
    data = tensor_data(model.graph)
    np.savez(tensors, **{f"t{i}": a for i, a in enumerate(data.values())})
    meta["tensor_names"] = list(data)
    partial = path.with_name(path.name + ".partial")
    # text is deflated; weights and libraries are stored as they are (float data barely
    # compresses, and inflating hundreds of MB would dominate load time)
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("meta.json", json.dumps(meta, indent=1), compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("graph.txt", print_graph(model.graph), compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("tensors.npz", tensors.getvalue())
        for key, library in libraries.items():
            archive.write(library, f"lib/{key}.so")
    os.replace(partial, path)
    return path


def load(path: str | os.PathLike) -> Any:
    from kiln.ir.parser import ParseError, parse_graph
    from kiln.runtime.model import ReferenceModel

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file")
    try:
        archive = zipfile.ZipFile(path)
        meta = json.loads(archive.read("meta.json"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as err:
        raise ArtifactError(f"{path}: not a kiln artifact (corrupt or foreign file: {err})") from None
    if meta.get("format") != FORMAT:
        raise ArtifactError(f"{path}: not a kiln artifact (format {meta.get('format')!r})")
    if meta.get("version", 0) > VERSION:
        raise ArtifactError(f"{path}: artifact version {meta['version']} is newer than this kiln reads ({VERSION})")
    try:
        with np.load(io.BytesIO(archive.read("tensors.npz")), allow_pickle=True) as npz:
            data = {name: npz[f"t{i}"] for i, name in enumerate(meta["tensor_names"])}
        graph = parse_graph(archive.read("graph.txt").decode(), data)
    except (KeyError, ParseError, ValueError) as err:
        raise ArtifactError(f"{path}: damaged artifact ({err})") from None
    if meta["target"] == "reference":
        return ReferenceModel(graph)
    if meta["target"] != "cpu":
        raise ArtifactError(f"{path}: unknown target {meta['target']!r}")
    from kiln.runtime.native import NativeModel

    folder = Path(tempfile.mkdtemp(prefix="kiln-artifact-"))
    prebuilt = {}
    for name in archive.namelist():
        if name.startswith("lib/") and name.endswith(".so"):
            target = folder / Path(name).name
            target.write_bytes(archive.read(name))
            prebuilt[Path(name).stem] = target
    model = NativeModel(graph, level=meta.get("opt_level", 2), prebuilt=prebuilt, compile_now=False)
    for dims in meta["variants"]:
        model._variant(dims)
    return model
