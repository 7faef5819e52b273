"""``.kiln`` artifacts: one zip file with the model's IR, its weights and the build products of
every compiled variant, so loading needs no ONNX file and no C compiler.

    manifest.json  the SHA-256 of every other member: checked before anything is read
    meta.json      format, version, kiln version, target, -O level, the variants' dims
    graph.txt      the source graph in kiln's IR text form
    tensors.npz    the numeric weights the text refers to (plain .npy members: no pickle)
    strings.json   string tensors the text refers to
    build/<key>/<n><suffix>   the files the target's build made of each variant's source (the
                   cpu target: one shared library), keyed by the hash of that source, numbered
                   in the order the backend returned them (version 2 wrote lib/<key>.so)

Trust model: everything but ``build/`` (``lib/``) is data, parsed without running code (JSON, kiln's IR text,
``np.load(allow_pickle=False)``). The libraries are native code: loading an artifact with them is
trusting it like an executable. ``load(path, rebuild=True)`` ignores them and generates the code
again from the IR (that needs a C compiler). The manifest detects damage, not forgery: a file
from someone you do not trust should be loaded with ``rebuild=True``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from kiln import integrity
from kiln.arrays import ArrayFileError, NotSequential, load_npz, stream_npz
from kiln.backends import backend
from kiln.errors import KilnError
from kiln.ir.parser import ParseError, parse_graph
from kiln.ir.printer import print_graph, tensor_data
from kiln.memory import aligned_copy, drop_mapped_pages, empty_aligned
from kiln.output_files import OutputPathError, check_output_file
from kiln.version import __version__

FORMAT = "kiln-artifact"
VERSION = 4  # 4: each library holds its plan's tables and kiln's C API, the one path its runs take
OLDEST = 2  # 3: build/<key>/<n><suffix>; 2: lib/<key>.so (their code is built again: its sources' keys differ)
# Size budgets, checked against the zip's directory before anything is inflated or allocated.
# kiln deflates only its text members (JSON, the IR text): they shrink 3-20x, never 1000x.
MAX_INFLATION = 50  # a deflated member may not claim more than this ratio of its stored size...
INFLATION_FLOOR = 1 << 20  # ...beyond a first MiB any member may claim
MAX_MEMBERS = 4096
CHUNK = 1 << 22  # bytes read from a member at a time (never the whole member twice in memory)
MAX_VARIANTS = 256  # compiled bindings an artifact may list (each is loaded when it is)
MAX_DIM = (1 << 31) - 1  # a variant's dim: a size kiln's int64 index arithmetic holds many times over
JSON_DEPTH = 64  # kiln's JSON nests 4 levels; a deeper file is not kiln's


class ArtifactError(KilnError):
    """The file is not a kiln artifact kiln can load (corrupt, foreign, or from a newer kiln)."""


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:24]


def save(model: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    compilation = getattr(model, "compilation", None)  # a model that let go of its source graph reads it back,
    released = compilation is not None and compilation.source.graph is None and compilation.source.loader is not None
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "kiln": __version__,
        "target": model.target,
        "variants": [],
        "defaults": [v.name for v in model.graph.defaults],
    }
    built: dict[str, tuple[Path, ...]] = {}
    if model.target != "reference":
        # what the target needs to reopen it (cpu: the ISA its libraries run on)
        meta.update(backend(model.compiled_for.backend).artifact_meta(model.compiled_for))
        meta["opt_level"] = model.options.level
        meta["precision"] = model.options.precision  # bf16 / int8 plans compile again only so
        if model.options.precision == "int8":
            q = model.options.quantization
            meta["quantization"] = {"ranges": [list(r) for r in q.ranges], "keep": sorted(q.keep), "method": q.method}
        meta["ranges"] = {name: list(bounds) for name, bounds in model.ranges.items()}
        meta["size_classes"] = {name: list(sizes) for name, sizes in model.size_classes.items()}
        for dims, plan in model.bindings():
            meta["variants"].append(dims)
            if plan.products:
                built[source_key(plan.source)] = plan.products
        padded = getattr(model, "padded_model", None)
        if padded is not None:  # a padded dim's compiled lengths (the padded graph is made again at load)
            meta["padded_variants"] = []
            if padded.extent is not None:  # its kernels take the length at run time (the lengths lowered)
                meta["run_time_length"] = list(padded.extent.samples)
            for dims, plan in padded.bindings():
                meta["padded_variants"].append(dims)
                if plan.products:
                    built[source_key(plan.source)] = plan.products
        _run_time_dims_meta(model, meta, built)
    try:  # a new file or a regular one replaced: never a link, a device, a FIFO or a folder (-o /dev/null)
        check_output_file(path, "artifact")
    except OutputPathError as err:
        raise ArtifactError(str(err)) from None
    graph = model.graph
    data = tensor_data(graph)
    strings = json.dumps({name: _strings_to_json(a) for name, a in data.items() if a.dtype == object}).encode()
    members: dict[str, bytes | memoryview] = {
        "meta.json": b"",
        "graph.txt": print_graph(graph).encode(),
        "strings.json": strings,
    }
    for key, products in built.items():
        for number, product in enumerate(products):
            members[f"build/{key}/{number}{Path(product).suffix}"] = Path(product).read_bytes()
    # the weights' .npz goes through a temporary file beside the artifact, never a buffer in memory
    # (a big model's weights were held three times while it was saved)
    numeric = {name: a for name, a in data.items() if a.dtype != object}
    meta["tensor_names"] = list(numeric)
    members["meta.json"] = json.dumps(meta, indent=1).encode()
    manifest = {"sha256": {name: hashlib.sha256(content).hexdigest() for name, content in members.items()}}
    try:
        with tempfile.TemporaryFile(dir=path.parent) as weights:
            _write_npz(weights, list(numeric.values()))
            weights.seek(0)
            hasher = hashlib.sha256()
            while piece := weights.read(CHUNK):
                hasher.update(piece)
            manifest["sha256"]["tensors.npz"] = hasher.hexdigest()
            _write_archive(path, manifest, members, weights)
    except OSError as err:
        raise ArtifactError(f"{path}: cannot write the artifact: {err.strerror or err}") from None
    finally:
        del graph, data, numeric
        if released:  # and lets go of it again once saved
            compilation.release(compilation.source.loader)
    return path


def _write_npz(file: Any, arrays: list[np.ndarray]) -> None:
    """``arrays`` as ``np.savez`` writes them (members ``t0.npy``, ``t1.npy``... stored, in order),
    one at a time: an array read back from the plan cache (a released source graph, file-mapped)
    lets its pages go once written, so saving a big model does not hold its weights twice."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for number, array in enumerate(arrays):
            with archive.open(f"t{number}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
            drop_mapped_pages(array)


def _write_archive(path: Path, manifest: dict, members: dict[str, bytes | memoryview], weights: Any) -> None:
    """The artifact written under a name of its own beside ``path``, then renamed into place."""
    # written beside it under a name of its own (never one someone else could have planted), then renamed
    try:
        handle, partial_name = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".partial", dir=path.parent)
    except OSError as err:
        raise ArtifactError(f"{path}: cannot write the artifact: {err.strerror or err}") from None
    os.close(handle)
    partial = Path(partial_name)
    # text is deflated; weights and libraries are stored as they are (float data barely
    # compresses, and inflating hundreds of MB would dominate load time)
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr("manifest.json", json.dumps(manifest, indent=1), compress_type=zipfile.ZIP_DEFLATED)
            for name, content in members.items():
                deflate = name.endswith((".json", ".txt"))
                archive.writestr(name, content, compress_type=zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED)
            weights.seek(0)
            with archive.open("tensors.npz", "w", force_zip64=True) as member:
                while piece := weights.read(CHUNK):
                    member.write(piece)
        os.chmod(partial, 0o644 & ~_umask())  # mkstemp made it 0600: an artifact is as readable as any file
        os.replace(partial, path)
    except OSError as err:
        Path(partial).unlink(missing_ok=True)
        raise ArtifactError(f"{path}: cannot write the artifact: {err.strerror or err}") from None


def _run_time_dims_meta(model: Any, meta: dict[str, Any], built: dict[str, tuple[Path, ...]]) -> None:
    """Kernels that take ranged dims at run time (kiln.driver.spatial): the route and its variants."""
    dims_model = getattr(model, "dims_model", None)
    if dims_model is None:
        return
    route = dims_model.spatial
    found: dict[str, Any] = {
        "names": list(route.names),
        "ranged": [list(r) for r in route.ranged],
        "samples": [list(sample) for sample in route.samples],
        "copies": route.copies,
        "variants": [],
    }
    if route.program is not None:
        found["program"] = route.program.as_meta()
    for dims, plan in dims_model.bindings():
        found["variants"].append(dims)
        if plan.products:
            built[source_key(plan.source)] = plan.products
    meta["run_time_dims"] = found


def pack_tensors(data: dict[str, np.ndarray]) -> tuple[memoryview, bytes, list[str]]:
    """Named arrays as files that load without pickle: numeric ones as an .npz of plain .npy
    members (``t0``, ``t1``... in the order of the returned names), string ones as JSON."""
    numeric = {name: a for name, a in data.items() if a.dtype != object}
    buffer = io.BytesIO()
    np.savez(buffer, **{f"t{i}": a for i, a in enumerate(numeric.values())})
    strings = {name: _strings_to_json(a) for name, a in data.items() if a.dtype == object}
    # (the buffer's own bytes, not a copy of them: a big model's weights are not held three times)
    return buffer.getbuffer(), json.dumps(strings).encode(), list(numeric)


def unpack_tensors(numeric: bytes | bytearray, strings: bytes, names: list[str]) -> dict[str, np.ndarray]:
    """``pack_tensors`` reversed; raises ValueError (never runs code) for anything else."""
    arrays = load_npz(numeric)  # every header checked against its bytes before anything is allocated
    # each copied into its own 64-byte-aligned buffer (the engine's weight views need no copies of
    # their own, and each is freed with its last view), the member's bytes then let go of
    return _named(
        {f"t{i}": aligned_copy(arrays[f"t{i}"]) for i in range(len(names)) if f"t{i}" in arrays}, strings, names
    )


def _named(arrays: dict[str, np.ndarray], strings: bytes, names: list[str]) -> dict[str, np.ndarray]:
    """The arrays by their tensors' names (member ``t<i>`` is ``names[i]``), the strings added."""
    missing = [f"t{i}" for i in range(len(names)) if f"t{i}" not in arrays]
    if missing or len(arrays) != len(names):
        raise ValueError(f"the weights' members {sorted(arrays)[:5]} are not the {len(names)} its meta names")
    data = {str(name): arrays[f"t{i}"] for i, name in enumerate(names)}
    data.update({str(name): _strings_from_json(entry) for name, entry in json.loads(strings or b"{}").items()})
    return data


def _strings_to_json(array: np.ndarray) -> dict[str, Any]:
    items = [
        {"b64": base64.b64encode(item).decode()} if isinstance(item, bytes) else str(item)
        for item in array.reshape(-1).tolist()
    ]
    return {"shape": list(array.shape), "items": items}


def _strings_from_json(entry: Any) -> np.ndarray:
    items = [base64.b64decode(item["b64"]) if isinstance(item, dict) else str(item) for item in entry["items"]]
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape([int(d) for d in entry["shape"]])


def _json(data: bytes, name: str, path: Path) -> Any:
    """A member's JSON, refused before parsing when it nests deeper than kiln's ever does (the
    parser recurses: 200,000 levels would be a RecursionError, not an answer)."""
    if data.count(b"[") + data.count(b"{") > JSON_DEPTH:  # fewer brackets cannot nest deeper
        _check_depth(data, name, path)
    try:
        return json.loads(data, parse_constant=_non_finite, parse_float=_finite)
    except (ValueError, RecursionError) as err:
        raise ArtifactError(f"{path}: damaged artifact ({name} is not JSON: {err})") from None


def _non_finite(text: str) -> float:
    raise ValueError(f"{text} is no JSON number (kiln never writes one)")


def _finite(text: str) -> float:
    """A JSON number kiln could have written (1e400 parses as infinity: refused)."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range")
    return number


def _check_depth(data: bytes, name: str, path: Path) -> None:
    """Raises ArtifactError when ``data``'s arrays and objects nest deeper than JSON_DEPTH
    (brackets inside strings do not count)."""
    depth = 0
    inside_string = escaped = False
    for byte in data:
        if inside_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                inside_string = False
        elif byte == 0x22:
            inside_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > JSON_DEPTH:
                raise ArtifactError(f"{path}: damaged artifact ({name} nests deeper than {JSON_DEPTH} levels)")
        elif byte in (0x5D, 0x7D):
            depth -= 1


def _check_directory(archive: zipfile.ZipFile, path: Path) -> None:
    """The zip's own claims, before anything is read: a bounded number of members, stored ones
    as large as they are stored, deflated ones within MAX_INFLATION of their stored size, and
    nothing claiming more bytes than the file holds."""
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ArtifactError(f"{path}: damaged artifact ({len(infos)} members; kiln writes at most {MAX_MEMBERS})")
    size = path.stat().st_size
    stored = 0
    for info in infos:
        stored += info.compress_size
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise ArtifactError(
                f"{path}: damaged artifact ({info.filename} claims {info.file_size} bytes stored in {info.compress_size})"
            )
        if info.file_size > INFLATION_FLOOR + MAX_INFLATION * info.compress_size:
            raise ArtifactError(
                f"{path}: damaged artifact ({info.filename} claims to inflate to {info.file_size} bytes)"
            )
    if stored > size:
        raise ArtifactError(f"{path}: damaged artifact (its members claim {stored} bytes in a {size}-byte file)")


def _members(archive: zipfile.ZipFile, path: Path) -> tuple[dict[str, bytearray], dict[str, np.ndarray] | None]:
    """Every member, each checked against the manifest's SHA-256 before anything is parsed but the
    weights: ``tensors.npz`` is read straight into the arrays (hashed as it is read, its arrays used
    only once its digest matched), never into one member-sized buffer copied after (a model's weights
    were in memory twice while it loaded). Returns (members, the weights' arrays by member name; None
    when the .npz is not laid out as np.savez writes it: it is then a member like the others)."""
    manifest = _json(_read_member(archive, "manifest.json", path), "manifest.json", path)
    try:
        expected = dict(manifest["sha256"])
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in expected.items()):
            raise TypeError("names and digests must be strings")
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(f"{path}: damaged artifact (no readable manifest: {err})") from None
    names = [info.filename for info in archive.infolist() if not info.is_dir()]
    unlisted = sorted(set(names) - set(expected) - {"manifest.json"})
    if unlisted:
        raise ArtifactError(f"{path}: damaged artifact (members not in its manifest: {unlisted[:5]})")
    contents = {}
    arrays = None
    if "tensors.npz" in expected:
        arrays = _stream_tensors(archive, expected["tensors.npz"], path)
    for name, digest in expected.items():
        if name == "tensors.npz" and arrays is not None:
            continue
        content = _read_member(archive, name, path)
        if hashlib.sha256(content).hexdigest() != digest:
            raise ArtifactError(f"{path}: damaged artifact ({name} does not match its SHA-256 in the manifest)")
        contents[name] = content
    return contents, arrays


def _stream_tensors(archive: zipfile.ZipFile, digest: str, path: Path) -> dict[str, np.ndarray] | None:
    """The weights of member ``tensors.npz``, each in its own 64-byte-aligned buffer (None: not laid
    out as np.savez writes it). Raises ArtifactError for damage."""
    try:
        info = archive.getinfo("tensors.npz")
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        hasher = hashlib.sha256()
        with archive.open(info) as member:
            arrays = stream_npz(member, info.file_size, hasher, empty_aligned, "tensors.npz")
            if member.read(1):
                raise ArtifactError(f"{path}: damaged artifact (tensors.npz is not the size its entry claims)")
    except NotSequential:
        return None
    except KeyError:
        raise ArtifactError(f"{path}: damaged artifact (member tensors.npz is missing)") from None
    except ArrayFileError as err:
        raise ArtifactError(f"{path}: damaged artifact ({err})") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as err:
        raise ArtifactError(f"{path}: damaged artifact (tensors.npz: {err})") from None
    if hasher.hexdigest() != digest:
        raise ArtifactError(f"{path}: damaged artifact (tensors.npz does not match its SHA-256 in the manifest)")
    return arrays


def _read_member(archive: zipfile.ZipFile, name: str, path: Path) -> bytearray:
    try:
        info = archive.getinfo(name)
        if info.file_size > INFLATION_FLOOR + MAX_INFLATION * info.compress_size:
            raise ArtifactError(f"{path}: damaged artifact ({name} claims to inflate to {info.file_size} bytes)")
        data = bytearray(info.file_size)  # (a bytearray: the weights' arrays are views of it, writable)
        view, at = memoryview(data), 0
        with archive.open(info) as member:  # never more than the (checked) size it claims, in pieces
            while at < info.file_size and (piece := member.read(min(CHUNK, info.file_size - at))):
                view[at : at + len(piece)] = piece
                at += len(piece)
            if at != info.file_size or member.read(1):
                raise ArtifactError(f"{path}: damaged artifact ({name} is not the size its entry claims)")
        return data
    except KeyError:
        raise ArtifactError(f"{path}: damaged artifact (member {name} is missing)") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as err:
        raise ArtifactError(f"{path}: damaged artifact ({name}: {err})") from None


def read(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, bytearray], Any]:
    """(meta, members, graph) of the artifact at ``path``, every member checked against the
    manifest first; nothing is unpickled. Raises ArtifactError for a damaged, foreign or newer file."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: no such file")
    try:
        handle = integrity.open_regular(path, "artifact")
    except OSError as err:
        raise ArtifactError(f"{path}: cannot be read as an artifact ({err.strerror or err})") from None
    try:
        archive = zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, RecursionError) as err:
        handle.close()
        raise ArtifactError(f"{path}: not a kiln artifact (corrupt or foreign file: {err})") from None
    with handle, archive:
        _check_directory(archive, path)
        try:
            meta = _json(_read_member(archive, "meta.json", path), "meta.json", path)
        except ArtifactError as err:
            raise ArtifactError(f"{path}: not a kiln artifact (corrupt or foreign file: {err})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise ArtifactError(f"{path}: not a kiln artifact (format {found!r})")
        version = meta.get("version", 0)
        if not isinstance(version, int) or version > VERSION:
            raise ArtifactError(f"{path}: artifact version {version} is newer than this kiln reads ({VERSION})")
        if version < OLDEST:
            raise ArtifactError(f"{path}: artifact version {version} is from an older kiln; compile the model again")
        contents, streamed = _members(archive, path)
    try:
        _json(contents.get("strings.json", b"{}") or b"{}", "strings.json", path)  # depth-checked before use
        names = meta["tensor_names"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ArtifactError(f"{path}: damaged artifact (meta.json tensor_names is not a list of names)")
        if streamed is not None:
            data = _named(streamed, contents.get("strings.json", b""), names)
        else:
            data = unpack_tensors(contents.pop("tensors.npz"), contents.get("strings.json", b""), names)
        graph = parse_graph(contents["graph.txt"].decode(), data)
        by_name = {v.name: v for v in graph.constants}
        graph = graph.with_(defaults=tuple(by_name[str(name)] for name in meta.get("defaults", [])))
        meta["target"], meta["opt_level"] = str(meta["target"]), int(meta.get("opt_level", 2))
        meta["precision"] = str(meta.get("precision", "fp32"))
        q = meta.get("quantization") or {}
        meta["quantization"] = {
            "ranges": [(str(name), float(lo), float(hi)) for name, lo, hi in q.get("ranges", [])],
            "keep": [str(name) for name in q.get("keep", [])],
            "method": str(q.get("method", "minmax")),
        }
        meta["variants"] = variants_meta(meta.get("variants", []), graph, path)
        meta["padded_variants"] = variants_meta(meta.get("padded_variants", []), graph, path)
    except ArtifactError:
        raise
    except (
        KeyError,
        ParseError,
        ValueError,
        TypeError,
        AttributeError,
        OverflowError,
        OSError,
        zipfile.BadZipFile,
        RecursionError,
        UnicodeDecodeError,
        ArrayFileError,
    ) as err:
        raise ArtifactError(f"{path}: damaged artifact ({type(err).__name__}: {err})") from None
    except KilnError as err:  # a graph kiln's verifier or inference rejects
        raise ArtifactError(f"{path}: damaged artifact ({err})") from None
    return meta, contents, graph


def variants_meta(listed: Any, graph: Any, path: Path) -> list[dict[str, int]]:
    """meta.json's variants, each a binding of the graph's symbolic dims to sizes in range."""
    if not isinstance(listed, list):
        raise ArtifactError(f"{path}: damaged artifact (meta.json variants is not a list)")
    if len(listed) > MAX_VARIANTS:
        raise ArtifactError(f"{path}: damaged artifact ({len(listed)} variants listed; at most {MAX_VARIANTS})")
    symbols = {d for v in graph.inputs for d in getattr(v.type, "shape", None) or () if isinstance(d, str)}
    variants = []
    for dims in listed:
        if not isinstance(dims, dict) or set(dims) - symbols:
            raise ArtifactError(
                f"{path}: damaged artifact (variant {str(dims)[:80]} binds names that are not the graph's "
                f"symbolic dims {sorted(symbols)})"
            )
        for name, size in dims.items():
            if type(size) is not int or not 0 <= size <= MAX_DIM:
                raise ArtifactError(
                    f"{path}: damaged artifact (variant dim {name}={str(size)[:40]} is not a size in 0..{MAX_DIM})"
                )
        variants.append(dict(dims))
    return variants


def sizes_meta(meta: dict, graph: Any, path: Path) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, ...]]]:
    """meta.json's declared ranges and size classes (absent in older artifacts: none), checked."""
    from kiln.driver.sizes import parse_classes, parse_padded_classes, parse_range
    from kiln.passes.batching import symbols

    names = set(symbols(graph))
    ranges, classes = meta.get("ranges", {}), meta.get("size_classes", {})
    if not isinstance(ranges, dict) or not isinstance(classes, dict) or (set(ranges) | set(classes)) - names:
        raise ArtifactError(f"{path}: damaged artifact (ranges or size classes of names that are not symbolic dims)")
    try:
        parsed = {name: parse_range(name, value) for name, value in ranges.items()}
        chosen = {}
        for name, value in classes.items():
            bounds = parsed.get(name, (1, MAX_DIM))
            padded = isinstance(value, list) and 1 not in value and name in parsed  # a padded dim's lengths
            chosen[name] = (parse_padded_classes if padded else parse_classes)(name, value, bounds)
    except KilnError as err:
        raise ArtifactError(f"{path}: damaged artifact ({err})") from None
    return parsed, chosen


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def build_products(contents: dict[str, bytes]) -> dict[str, list[tuple[str, bytes]]]:
    """The artifact's build products by source key, each as (file name, bytes) in build order:
    ``build/<key>/<n><suffix>`` members (``lib/<key>.so`` in version 2). Names that do not fit
    (a key or number that is not alphanumeric, a path inside) are ignored, never written."""
    found: dict[str, list[tuple[int, str, bytes]]] = {}
    for name, content in contents.items():
        parts = name.split("/")
        if len(parts) == 2 and parts[0] == "lib" and parts[1].endswith(".so"):
            key, number, suffix = parts[1].removesuffix(".so"), "0", ".so"
        elif len(parts) == 3 and parts[0] == "build":
            key, (number, dot, suffix) = parts[1], parts[2].partition(".")
            suffix = dot + suffix
        else:
            continue
        if key.isalnum() and number.isdigit() and (not suffix or suffix[1:].isalnum()):
            found.setdefault(key, []).append((int(number), f"{number}{suffix}", content))
    return {key: [(file, content) for _, file, content in sorted(files)] for key, files in found.items()}
