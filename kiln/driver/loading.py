"""``kiln.load``: a ``.kiln`` artifact back into a runnable model, through the target registry."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from kiln import integrity
from kiln.backends import Threading, backend
from kiln.driver import extents, plan_cache, spatial
from kiln.driver.artifact import ArtifactError, build_products, read, sizes_meta, variants_meta
from kiln.driver.dims_program import DimsProgram
from kiln.driver.native import NativeModel
from kiln.driver.options import CompileOptions, Quantization
from kiln.driver.reference import ReferenceModel
from kiln.driver.sizes import Padder
from kiln.driver.variants import Compilation, Source
from kiln.errors import KilnError
from kiln.lower.target import TargetError
from kiln.memory import BIG, return_freed

log = logging.getLogger("kiln")


def load(
    path: str | os.PathLike,
    rebuild: bool = False,
    threads: int = 0,
    spin: int | None = None,
    streams: int | None = None,
) -> Any:
    """The model saved at ``path`` (see ``artifact.read``). With ``rebuild``, the artifact's native
    libraries are ignored and the code is generated again from its IR."""
    path = Path(path)
    identity = integrity.file_identity(path.stat()) if path.is_file() else ()  # (before it is read)
    meta, contents, graph = read(path)
    ranges, classes = sizes_meta(meta, graph, path)
    target, level, variants = meta["target"], meta["opt_level"], meta["variants"]
    try:
        found = backend(target)
        if not found.compiles:
            return ReferenceModel(graph)
        compiled_for = found.reopen(target, meta)
    except TargetError as err:
        raise ArtifactError(f"{path}: built for {target} ({meta.get('isa', '?')}): {err}") from None
    unfit = found.artifact_code_runs(meta)
    if unfit and not rebuild:  # its native code could die of SIGILL here: generate it again, or refuse
        reason = found.available()
        if reason:
            raise ArtifactError(
                f"{path}: {unfit}, and it cannot be rebuilt here ({reason}); load it on a CPU like the one "
                "that built it, or compile it for a baseline (kiln compile --target cpu:avx2)"
            )
        log.warning("%s: %s; generating its code again for this CPU", path, unfit)
        rebuild = True

    prebuilt, folder = _unpacked(contents) if not rebuild else ({}, None)
    q = meta["quantization"]
    quantization = Quantization(tuple(q["ranges"]), frozenset(q["keep"]), q["method"])
    try:
        options = CompileOptions.from_env(level=level, precision=meta["precision"], quantization=quantization)
    except KilnError as err:
        raise ArtifactError(f"{path}: {err}") from None
    parallelism = Threading.of(threads, spin)
    # the graph's signature without its weights: the model's compiled variants hold their packed
    # copies, and the graph is read again from the file only for a binding the artifact has no code for
    reader = _reader(path, identity)
    source = Source(graph, signature=graph.signature(), loader=reader)
    compilation = Compilation(source, compiled_for, options, prebuilt=prebuilt, ahead=variants)
    big = graph.constant_bytes() >= BIG  # a full collection costs ~1 s in a process holding millions of objects
    del graph
    model = NativeModel(compilation, parallelism, streams)
    if folder is not None:  # the libraries' folder lives as long as the model (loaded code stays mapped)
        weakref.finalize(model, shutil.rmtree, folder, ignore_errors=True)
    model.ranges, model.size_classes = ranges, classes
    model.chunking()  # decided at load, not on the first run
    derived = meta.get("padded_variants") or meta.get("run_time_dims")  # graphs made of the source next
    for number, dims in enumerate(variants):
        # the last compile of the source graph takes it: its weights go as their packed copies come
        source.consume = number == len(variants) - 1 and not derived
        model.prepare_dims(dims)
    source.consume = False
    _padded(model, meta, ranges, prebuilt, path)
    if meta.get("run_time_dims"):  # kernels that take ranged dims at run time: the route made again
        route, listed = _route(meta["run_time_dims"], model.graph, ranges, path)
        model.dims_model = model.dims_model_for(route, prebuilt, ahead=listed)
        try:
            for dims in listed:
                model.dims_model.prepare_dims(dims)
        except extents.NotAffine as err:  # kernels that do not lower apart at the file's sizes
            raise ArtifactError(f"{path}: damaged artifact (run-time dims: {err})") from None
    # the variants hold their packed weights: the source graph's are read again from the file only
    # if a binding the artifact has no code for must compile
    model.release_source(reader)
    plan_cache.wait()  # stores written now, not beside the first runs (on two cores: 2-3x slower)
    return_freed(collect=big)
    return model


def _unpacked(contents: Any) -> tuple[dict[str, tuple[Path, ...]], Path]:
    """The artifact's native libraries written into a folder of their own (it lives as long as the
    model: loaded code stays mapped)."""
    folder = Path(tempfile.mkdtemp(prefix="kiln-artifact-"))
    prebuilt = {}
    for key, files in build_products(contents).items():
        (folder / key).mkdir()
        for file, content in files:
            (folder / key / file).write_bytes(content)
        prebuilt[key] = tuple(folder / key / file for file, _ in files)
    return prebuilt, folder


def _reader(path: Path, identity: tuple[int, ...]) -> Any:
    """The artifact's source graph read again, if the file is the one loaded."""

    def read_again() -> tuple[Any, bool]:
        try:
            same = integrity.file_identity(path.stat()) == identity
        except OSError:
            same = False
        if not same:
            raise ArtifactError(
                f"{path}: the artifact changed or went away since it was loaded, and a binding it has no code "
                "for must compile from its graph; load it again (or declare the sizes when compiling)"
            )
        return read(path)[2], True

    return read_again


def _padded(model: Any, meta: dict[str, Any], ranges: dict[str, tuple[int, int]], prebuilt: dict, path: Path) -> None:
    """A padded dim's compiled lengths: the padded graph made again, its code the artifact's; the
    lengths and the run-time length's samples checked against the declared range."""
    padded = meta.get("padded_variants") or []
    if not padded:
        return
    padder = model.padder()
    lengths = tuple(sorted({dims.get(padder.symbol, 0) for dims in padded})) if padder is not None else ()
    high = ranges.get(padder.symbol, (0, 0))[1] if padder is not None else 0
    if padder is None or not lengths or lengths[-1] < high:
        raise ArtifactError(f"{path}: damaged artifact (padded variants {str(padded)[:80]} for no paddable dim)")
    low = ranges.get(padder.symbol, (0, 0))[0]
    if any(type(n) is not int or not low <= n <= high for n in lengths):
        raise ArtifactError(f"{path}: damaged artifact (padded lengths {str(lengths)[:80]} outside {low}..{high})")
    lowered = meta.get("run_time_length") or ()  # the kernels take the length at run time
    # the lengths lowered are the ones a compile chooses for the range, never the file's own
    if lowered and (lowered != list(extents.samples(low, high) or ()) or len(lengths) != 1):
        raise ArtifactError(f"{path}: damaged artifact (run-time length lowered at {str(lowered)[:80]})")
    model.use_padded(Padder(padder.padding, lengths, tuple(lowered)), prebuilt, padded)
    try:
        for dims in padded:
            model.padded().prepare_dims(dims)
    except extents.NotAffine as err:
        raise ArtifactError(f"{path}: damaged artifact (run-time length: {err})") from None


def _route(found: Any, graph: Any, ranges: dict[str, tuple[int, int]], path: Path) -> tuple[Any, list[dict[str, int]]]:
    """meta.json's run-time dims, checked: the graph's own dims in its order, ranges it declares,
    sizes lowered inside them (the capacity first), variants binding its dims."""
    damaged = ArtifactError(f"{path}: damaged artifact (run-time dims {str(found)[:80]})")
    if not isinstance(found, dict):
        raise damaged
    names, ranged, samples = found.get("names"), found.get("ranged"), found.get("samples")
    if names != list(spatial.graph_symbols(graph)) or not isinstance(ranged, list) or not isinstance(samples, list):
        raise damaged
    if not ranged or any(not isinstance(r, list) or len(r) != 3 or ranges.get(r[0]) != tuple(r[1:]) for r in ranged):
        raise damaged
    width = len(ranged)
    if not 4 <= len(samples) <= 4 + spatial.EXTRA_SAMPLES or any(
        not isinstance(row, list)
        or len(row) != width
        or any(type(n) is not int or not low <= n <= high for n, (_, low, high) in zip(row, ranged))
        for row in samples
    ):
        raise damaged
    if samples[0] != [high for _, _, high in ranged] or len({tuple(row) for row in samples}) != len(samples):
        raise damaged
    copies = found.get("copies", False)  # (an artifact from before sizes were read at run time: none)
    if not isinstance(copies, bool):
        raise damaged
    rows = tuple(tuple(row) for row in samples)
    route = spatial.RunTimeDims(tuple(names), tuple(tuple(r) for r in ranged), rows, copies=copies)
    listed = variants_meta(found.get("variants", []), graph, path)
    # the file's samples and program are checked against the graph, never believed: the first
    # samples are the ones a compile chooses, and the program is fitted again from the graph's own
    # dims at them (its capacity the graph's size at the capacity, not the file's)
    at_capacity = [v for v in listed if all(v.get(s) == c for s, c in route.capacity.items())]
    outside = [{k: v for k, v in binding.items() if k not in route.symbols} for binding in at_capacity]
    for fixed in outside:  # the compile's own binding of the other dims is one of these (the first, as saved)
        checked = _checked_route(found, graph, route, fixed, outside)
        if checked is not None:
            return checked, listed
    raise damaged


def _checked_route(found: dict, graph: Any, route: Any, fixed: dict[str, int], others: list[dict[str, int]]) -> Any:
    """``route`` with its program fitted again from the graph at ``fixed`` and ``others`` (the
    variants' bindings of the other dims) (None where the file's samples are not the ones a compile
    chooses with ``fixed``, or its program differs from the graph's). A program saved before the
    size classes were fitted (no ``fixed`` entries) is checked as fitted at ``fixed`` alone."""
    names = route.names
    try:
        chosen = spatial.generic_samples(graph, names, {s: (low, high) for s, low, high in route.ranged}, fixed)
        if chosen is None or route.samples[: len(chosen)] != chosen:
            return None
        if found.get("program") is None:
            return route
        claimed = DimsProgram.from_meta(found["program"], tuple(names), spatial.strides_of(graph))
        inputs = {d for v in graph.inputs for d in (getattr(v.type, "shape", None) or ()) if isinstance(d, str)}
        earlier = isinstance(found["program"], dict) and "fixed" not in found["program"]
        rebuilt = spatial.with_program(graph, route, fixed, inputs, () if earlier else others)
        if earlier and rebuilt.program is not None:  # (its fixed entries the graph's: a call elsewhere specializes)
            claimed = dataclasses.replace(claimed, fixed=rebuilt.program.fixed)
    except (ValueError, KilnError, extents.NotAffine):
        return None
    return rebuilt if rebuilt.program == claimed else None
