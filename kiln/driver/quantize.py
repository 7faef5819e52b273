"""int8 post-training quantization and the accuracy of reduced precision against fp32.

``kiln.compile(model, precision="int8", calibration=...)`` comes here:

1. the calibration data (``samples_from``: input dicts or an ``.npz``; the CLI reads image folders
   and the zoo's inputs into dicts before they come here) is split into a calibration slice and a
   disjoint evaluation slice;
2. ``calibrate`` runs the fp32 compile of the model over the calibration slice with the inputs of
   every quantizable product (MatMul with constant weights, Conv) exposed as outputs, and turns
   their statistics into per-tensor ranges: ``minmax``, ``percentile`` (99.99th of |x| tails) or
   ``entropy`` (the clipping whose 8-bit histogram is closest in KL divergence);
3. the int8 compile quantizes weights per output channel (symmetric) and activations per tensor
   with those ranges (``kiln.lower.gemm_lowering``);
4. ``measure`` compares it with the fp32 compile on the evaluation slice (relative L2 of every
   output, top-1 agreement of class scores); with ``max_accuracy_drop``, the layers whose
   quantization noise is largest are kept in fp32, more each round, until the drop fits
   (mixed precision), and the report names them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kiln.arrays import ArrayFileError, load_npz
from kiln.driver.options import Quantization
from kiln.driver.pipeline import compile_plan, optimized
from kiln.errors import KilnError
from kiln.ir.graph import Graph, Value
from kiln.ir.types import DType, TensorType, random_tensor
from kiln.ops.registry import has_trait
from kiln.passes.layout import range_key
from kiln.runtime.executable import Executable

METHODS = ("minmax", "percentile", "entropy")
PERCENTILE = 99.99  # of each tail, for ``percentile``
BINS = 2048  # histogram bins for ``percentile`` and ``entropy``
RANDOM_SAMPLES = 8  # calibration samples made up when none are given

log = logging.getLogger("kiln")


@dataclass
class AccuracyReport:
    """A reduced-precision model against the fp32 compile of the same model, on ``samples``
    evaluation inputs disjoint from the calibration data."""

    precision: str
    samples: int
    rel_l2: float  # the worst output's relative L2 error over all samples
    max_abs: float
    top1: float | None  # agreement of the argmax of class scores (a first output [batch, classes])
    kept_fp32: list[str] = field(default_factory=list)  # layers left in fp32 (mixed precision)
    layers: int = 0  # quantizable layers (int8)
    method: str = ""

    def drop(self) -> float:
        """The accuracy cost the budget is checked against: 1 - top-1 agreement for class
        scores, else the relative L2."""
        return 1.0 - self.top1 if self.top1 is not None else self.rel_l2

    def line(self) -> str:
        text = f"{self.precision} vs fp32 on {self.samples} evaluation sample(s): rel. L2 {self.rel_l2:.2e}"
        if self.top1 is not None:
            text += f", top-1 agreement {self.top1:.1%}"
        if self.precision == "int8":
            text += f"; {self.layers - len(self.kept_fp32)}/{self.layers} layers int8 ({self.method} calibration)"
            if self.kept_fp32:
                text += f", kept in fp32: {', '.join(self.kept_fp32)}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "samples": self.samples,
            "rel_l2": self.rel_l2,
            "max_abs": self.max_abs,
            "top1_agreement": self.top1,
            "kept_fp32": list(self.kept_fp32),
            "layers": self.layers,
            "method": self.method,
        }


# -- data --------------------------------------------------------------------------------------------


def samples_from(data: Any, graph: Graph, count: int = RANDOM_SAMPLES, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Input dicts from calibration data: None (random inputs, ``count`` of them: fine for
    timing, not representative), one dict, an iterable of dicts, or an ``.npz`` (each input's
    array, with a leading axis of samples when its rank exceeds the input's). Image folders are
    the caller's to read (``kiln compile --calibrate DIR``)."""
    inputs = [v for v in graph.inputs if isinstance(v.type, TensorType)]
    if data is None:
        rng = np.random.default_rng(seed)
        return [
            {
                v.name: random_tensor(v.type.dtype, [d if isinstance(d, int) else 1 for d in v.type.shape], rng)
                for v in inputs
            }  # type: ignore[union-attr]
            for _ in range(count)
        ]
    if isinstance(data, Mapping):
        return [dict(data)]
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if path.is_dir():
            raise KilnError(
                f"calibration data {path} is a folder: read its images into input dicts first "
                "(kiln compile --calibrate DIR does)"
            )
        if path.suffix == ".npz" and path.is_file():
            return _npz_samples(path, inputs)
        raise KilnError(f"calibration data {path}: expected an .npz file")
    if isinstance(data, Iterable):
        samples = [dict(item) for item in data]
        if not samples:
            raise KilnError("calibration data is empty")
        return samples
    raise KilnError(f"calibration data must be input dicts, an .npz or an image folder, got {type(data).__name__}")


def _npz_samples(path: Path, inputs: list[Value]) -> list[dict[str, np.ndarray]]:
    try:
        arrays = load_npz(path)
    except (ArrayFileError, OSError) as err:
        raise KilnError(f"calibration data {path}: {err}") from None
    missing = [v.name for v in inputs if v.name not in arrays]
    if missing:
        raise KilnError(
            f"calibration data {path}: no array for input(s) {', '.join(missing)} (has {', '.join(arrays)})"
        )
    counts = set()
    for v in inputs:
        rank = len(v.type.shape)  # type: ignore[union-attr]
        if arrays[v.name].ndim == rank:
            arrays[v.name] = arrays[v.name][None]
        elif arrays[v.name].ndim != rank + 1:
            raise KilnError(f"calibration data {path}: {v.name} has rank {arrays[v.name].ndim}, the input {rank}")
        counts.add(arrays[v.name].shape[0])
    if len(counts) != 1:
        raise KilnError(f"calibration data {path}: the inputs have different sample counts {sorted(counts)}")
    return [{v.name: arrays[v.name][i] for v in inputs} for i in range(counts.pop())]


def split(samples: list[dict[str, np.ndarray]]) -> tuple[list[dict], list[dict]]:
    """(calibration, evaluation): the last fifth (at least one sample) evaluates; a single
    sample calibrates, and a made-up random one evaluates."""
    if len(samples) == 1:
        return samples, []
    held = max(1, len(samples) // 5)
    return samples[:-held], samples[-held:]


# -- what gets quantized -------------------------------------------------------------------------------


def quantizable(graph: Graph) -> list[tuple[str, Value, str]]:
    """(node name, the float activations it quantizes, the name their range goes by:
    ``kiln.passes.layout.range_key``) for every product the int8 path takes: MatMul of float
    activations by constant weights, single-group Conv (or kiln::ConvNHWC) with constant weights
    (also as the anchor of a fused epilogue)."""
    found: list[tuple[str, Value, str]] = []
    for node in graph.nodes:
        op, domain, inputs, attrs = node.op, node.domain, list(node.inputs), node.attrs
        if node.attrs.get("kind") == "epilogue" and "body" in node.attrs:
            body = node.attrs["body"]
            anchor = body.nodes[0]
            bindings = dict(zip(body.inputs, node.inputs))
            op, domain, attrs = anchor.op, anchor.domain, anchor.attrs
            inputs = [None if v is None else bindings.get(v, v) for v in anchor.inputs]
        if (domain, op) == ("kiln", "ConvNHWC"):
            domain = ""  # the channels-last form of a Conv (its int8 path is the same)
        if domain or not has_trait(op, "", "anchor") or len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
            continue
        x, w = inputs[0], inputs[1]
        if x in graph.constants or w not in graph.constants:
            continue
        if not isinstance(x.type, TensorType) or x.type.dtype is not DType.FLOAT32:
            continue
        if op == "Conv" and int(attrs.get("group", 1)) != 1:
            continue
        found.append((node.name, x, range_key(attrs, x)))
    return found


# -- calibration ---------------------------------------------------------------------------------------


def calibrate(graph: Graph, target: Any, options: Any, samples: list[dict[str, np.ndarray]], method: str) -> Any:
    """The ``Quantization`` (activation ranges by value name) of ``graph`` (dims bound) from
    ``samples`` run through its fp32 compile with the quantized activations exposed."""
    if method not in METHODS:
        raise KilnError(f"calibration method {method!r}: one of {', '.join(METHODS)}")
    watched: list[Value] = []
    keys: dict[Value, str] = {}

    def expose(optimized: Graph) -> Graph:
        found = quantizable(optimized)
        keys.update((value, key) for _, value, key in found)
        watched.extend(dict.fromkeys(value for _, value, _ in found))
        return optimized.with_(outputs=list(dict.fromkeys([*optimized.outputs, *watched])))

    plan = compile_plan(graph, target, options.with_(precision="fp32", plan_cache=False), expose=expose)
    executable = Executable(plan)
    positions = {value: plan.graph.outputs.index(value) for value in watched}

    def activations() -> Iterable[dict[Value, np.ndarray]]:
        for feeds in samples:
            results = executable.run([np.asarray(feeds[v.name]) for v in plan.graph.inputs])
            yield {value: np.asarray(results[i], np.float32) for value, i in positions.items()}

    lows = {v: np.inf for v in watched}
    highs = {v: -np.inf for v in watched}
    for values in activations():
        for value, array in values.items():
            finite = array[np.isfinite(array)]
            if finite.size:
                lows[value] = min(lows[value], float(finite.min()))
                highs[value] = max(highs[value], float(finite.max()))
    ranges = {v: (lows[v], highs[v]) for v in watched if np.isfinite(lows[v])}
    if method != "minmax":
        histograms = {v: np.zeros(BINS, np.int64) for v in ranges}
        for values in activations():
            for value, array in values.items():
                if value in histograms:
                    lo, hi = ranges[value]
                    histograms[value] += np.histogram(array[np.isfinite(array)], BINS, (lo, hi))[0]
        ranges = {v: clip_range(method, ranges[v], histograms[v], target) for v in ranges}
    return Quantization(ranges=tuple((keys[v], float(lo), float(hi)) for v, (lo, hi) in ranges.items()), method=method)


def clip_range(method: str, extent: tuple[float, float], histogram: np.ndarray, target: Any) -> tuple[float, float]:
    """The range ``method`` keeps of a histogram over ``extent``."""
    lo, hi = extent
    if hi <= lo or histogram.sum() == 0:
        return extent
    width = (hi - lo) / len(histogram)
    cumulative = np.cumsum(histogram) / histogram.sum()
    if method == "percentile":
        tail = (100.0 - PERCENTILE) / 100.0
        first = int(np.searchsorted(cumulative, tail))
        last = int(np.searchsorted(cumulative, 1.0 - tail))
        return lo + first * width if lo < 0 else lo, lo + (last + 1) * width
    return _entropy_clip(lo, hi, histogram, target.int8_max + 1)


def _entropy_clip(lo: float, hi: float, histogram: np.ndarray, levels: int) -> tuple[float, float]:
    """The upper clip (TensorRT's entropy calibration, on the histogram from ``lo``) whose
    ``levels``-level quantization diverges least (KL) from the distribution it clips."""
    bins = len(histogram)
    best, best_end = np.inf, bins
    for end in range(levels, bins + 1, max(1, (bins - levels) // 128)):
        reference = histogram[:end].astype(np.float64).copy()
        reference[end - 1] += histogram[end:].sum()  # the clipped tail lands on the last bin
        if reference.sum() == 0:
            continue
        # merge into `levels` groups, spread each back over its nonzero bins
        groups = np.array_split(np.arange(end), levels)
        candidate = np.zeros(end)
        for group in groups:
            counts = histogram[group].astype(np.float64)
            nonzero = counts > 0
            if nonzero.any():
                candidate[group[nonzero]] = counts.sum() / nonzero.sum()
        p = reference / reference.sum()
        q = candidate / max(candidate.sum(), 1e-30)
        mask = p > 0
        divergence = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if divergence < best:
            best, best_end = divergence, end
    width = (hi - lo) / bins
    return lo, lo + best_end * width


# -- accuracy ------------------------------------------------------------------------------------------


def measure(reference: Any, model: Any, samples: list[dict[str, np.ndarray]], precision: str) -> AccuracyReport:
    """``model`` against ``reference`` (the fp32 compile) on ``samples``."""
    worst, max_abs, agree, total = 0.0, 0.0, 0, 0
    classes = True
    for feeds in samples:
        want = reference.run(feeds)
        got = model.run(feeds)
        for name, expected in want.items():
            expected64 = np.asarray(expected, np.float64)
            actual64 = np.asarray(got[name], np.float64)
            norm = float(np.linalg.norm(expected64))
            worst = max(worst, float(np.linalg.norm(actual64 - expected64)) / (norm if norm > 0 else 1.0))
            if expected64.size:
                max_abs = max(max_abs, float(np.max(np.abs(actual64 - expected64))))
        first = np.asarray(next(iter(want.values())))
        if first.ndim != 2 or first.shape[-1] < 2 or not np.issubdtype(first.dtype, np.floating):
            classes = False
            continue
        flat_want = first.reshape(-1, first.shape[-1]).argmax(axis=1)
        flat_got = np.asarray(next(iter(got.values()))).reshape(-1, first.shape[-1]).argmax(axis=1)
        agree += int(np.sum(flat_want == flat_got))
        total += flat_want.size
    top1 = agree / total if classes and total else None
    return AccuracyReport(precision, len(samples), worst, max_abs, top1)


def noise_ranking(graph: Graph, quantization: Any, target: Any) -> list[str]:
    """Quantizable layers, noisiest first: the rounding noise of the activations' step
    (range / levels) relative to the range, times the weights' (largest / 127 relative to
    their RMS). A cheap proxy of each layer's sensitivity, from the calibration alone."""
    ranges = {name: (lo, hi) for name, lo, hi in quantization.ranges}
    scores = []
    for node_name, _, key in quantizable(graph):
        if key not in ranges:
            continue
        lo, hi = ranges[key]
        weights = None
        for node in graph.nodes:
            if node.name == node_name:
                candidates = [v for v in node.inputs if v is not None and v in graph.constants]
                weights = np.asarray(graph.constants[candidates[0]], np.float64) if candidates else None
        activation = (max(hi, 0.0) - min(lo, 0.0)) / target.int8_max
        spread = max(abs(lo), abs(hi), 1e-12)
        weight_noise = 0.0
        if weights is not None and weights.size:
            rms = float(np.sqrt(np.mean(weights**2))) or 1.0
            weight_noise = float(np.abs(weights).max()) / 127.0 / rms
        scores.append((activation / spread + weight_noise, node_name))
    return [name for _, name in sorted(scores, reverse=True)]


def quantize_model(
    graph: Graph,
    target: Any,
    options: Any,
    calibration: Any,
    method: str,
    max_accuracy_drop: float | None,
    evaluation: Any,
    build: Callable[[Any], Any],
    specialize_for: Callable[[dict[str, np.ndarray]], Graph],
) -> tuple[Any, AccuracyReport]:
    """The int8 model (``build(options)``) and its accuracy report. ``specialize_for(feeds)``
    binds the graph's symbolic dims to a sample's."""
    samples = samples_from(calibration, graph)
    calibrating, evaluating = split(samples)
    if evaluation is not None:
        evaluating = samples_from(evaluation, graph)
    if not evaluating:  # one calibration sample: evaluate on made-up inputs of its shapes
        evaluating = [{k: random_tensor_like(v, seed) for k, v in calibrating[0].items()} for seed in range(1, 1 + 2)]
    bound = specialize_for(calibrating[0])
    quantization = calibrate(bound, target, options, calibrating, method)
    layers = quantizable(_optimized(bound, target, options))
    reference = build(options.with_(precision="fp32"))
    model = build(options.with_(precision="int8", quantization=quantization))
    report = measure(reference, model, evaluating, "int8")
    report.layers, report.method = len(layers), method
    if max_accuracy_drop is not None and report.drop() > max_accuracy_drop:
        ranking = noise_ranking(_optimized(bound, target, options), quantization, target)
        count = 1
        while report.drop() > max_accuracy_drop and count <= len(ranking):
            keep = frozenset(ranking[:count])
            log.info("kiln: int8 drop %.4f above %.4f: %d layer(s) in fp32", report.drop(), max_accuracy_drop, count)
            mixed = replace(quantization, keep=keep)
            model = build(options.with_(precision="int8", quantization=mixed))
            report = measure(reference, model, evaluating, "int8")
            report.layers, report.method, report.kept_fp32 = len(layers), method, sorted(keep)
            count = count * 2 if count < len(ranking) else count + 1
    log.info("kiln: %s", report.line())
    return model, report


def random_tensor_like(array: np.ndarray, seed: int) -> np.ndarray:
    """Random data of ``array``'s shape and kind (an evaluation input made up)."""
    rng = np.random.default_rng(seed)
    return random_tensor(DType.from_numpy(np.asarray(array).dtype), list(np.shape(array)), rng)


def _optimized(graph: Graph, target: Any, options: Any) -> Graph:
    return optimized(graph, target, options.with_(precision="fp32"))
