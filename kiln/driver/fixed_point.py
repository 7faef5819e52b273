"""Fixed-point compiles (the fpga target): every tensor's range from calibration, then the
accuracy of the chosen widths against fp32.

``kiln.compile(model, target="fpga:vitis", calibration=...)`` comes here:

1. the calibration samples (as for int8: input dicts, an ``.npz``, None for random inputs) are
   split into a calibration and an evaluation slice;
2. ``tensor_ranges`` runs the model's fp32 compile on this machine's CPU with every tensor that
   survives the graph passes made an output, and keeps each one's min and max: the fpga
   design's integer bits (``kiln.backends.fpga.formats``);
3. the fpga compile is measured against the fp32 compile on the evaluation slice; with
   ``max_accuracy_drop``, the bit budget grows two bits at a time (up to 32) until it fits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.backends.fpga.fixed import with_infinities
from kiln.driver.options import CompileOptions, Quantization
from kiln.driver.pipeline import compile_plan
from kiln.driver.quantize import AccuracyReport, measure, samples_from, split
from kiln.ir.graph import Graph, Value
from kiln.ir.types import TensorType
from kiln.passes.fuse import unfuse
from kiln.runtime.executable import Executable

MAX_BITS = 32
log = logging.getLogger("kiln")


def tensor_ranges(graph: Graph, samples: list[dict[str, np.ndarray]]) -> Quantization:
    """Every surviving tensor's (min, max) over ``samples``, by name, from the fp32 model run on
    this machine's CPU (the inputs' straight from the samples)."""
    watched: list[Value] = []

    def expose(optimized: Graph) -> Graph:
        # the fpga target has no attention engine: its attention groups run op by op, so their
        # inner tensors (scores, probabilities) are buffers there and need ranges too
        optimized = unfuse(optimized, lambda node: node.attrs.get("kind") != "attention")
        values = [v for n in optimized.nodes for v in n.outputs if v is not None and isinstance(v.type, TensorType)]
        watched.extend(v for v in dict.fromkeys(values) if v.type.dtype.is_float)  # type: ignore[union-attr]
        return optimized.with_(outputs=list(dict.fromkeys([*optimized.outputs, *watched])))

    plan = compile_plan(graph, "cpu", CompileOptions(plan_cache=False), expose=expose)
    executable = Executable(plan)
    positions = {value.name: plan.graph.outputs.index(value) for value in watched}
    lows: dict[str, float] = {}
    highs: dict[str, float] = {}
    infinite: dict[str, set[int]] = {}  # the signs of the infinities a tensor held (a mask's -inf)

    def note(name: str, array: np.ndarray) -> None:
        array = np.asarray(array)
        if array.dtype.kind != "f":
            return
        finite = array[np.isfinite(array)]
        if finite.size:
            lows[name] = min(lows.get(name, np.inf), float(finite.min()))
            highs[name] = max(highs.get(name, -np.inf), float(finite.max()))
        if np.isneginf(array).any():
            infinite.setdefault(name, set()).add(-1)
        if np.isposinf(array).any():
            infinite.setdefault(name, set()).add(1)

    for feeds in samples:
        results = executable.run([np.asarray(feeds[v.name]) for v in plan.graph.inputs])
        for name, i in positions.items():
            note(name, results[i])
        for name, array in feeds.items():
            note(name, array)
    for name, signs in infinite.items():
        lows[name], highs[name] = with_infinities(lows.get(name, 0.0), highs.get(name, 0.0), signs)
    return Quantization(ranges=tuple((n, lows[n], highs[n]) for n in lows), method="minmax")


def fixed_point_model(
    graph: Graph,
    target: Any,
    options: Any,
    calibration: Any,
    evaluation: Any,
    max_accuracy_drop: float | None,
    build: Callable[[Any, Any], Any],
    reference: Callable[[], Any],
    specialize_for: Callable[[dict[str, np.ndarray]], Graph],
) -> tuple[Any, AccuracyReport]:
    """The fpga model (``build(target, options)``) and its accuracy against fp32 (``reference()``)."""
    samples = samples_from(calibration, graph)
    calibrating, evaluating = split(samples)
    if evaluation is not None:
        evaluating = samples_from(evaluation, graph)
    if not evaluating:  # too few samples to hold some out: measured on what calibrated it (random
        # stand-ins would be meaningless for inputs that are shapes or scales)
        log.info("kiln: one calibration sample: the accuracy is measured on it, not on held-out data")
        evaluating = calibrating
    ranges = tensor_ranges(specialize_for(calibrating[0]), calibrating)
    chosen = options.with_(quantization=ranges)
    fp32 = reference()
    model = build(target, chosen)
    report = _report(measure(fp32, model, evaluating, f"fixed<{target.bits}>"))
    while max_accuracy_drop is not None and report.drop() > max_accuracy_drop and target.bits + 2 <= MAX_BITS:
        log.info("kiln: %d-bit drop %.4f above %.4f: 2 more bits", target.bits, report.drop(), max_accuracy_drop)
        target = target.with_bits(target.bits + 2)
        model = build(target, chosen)
        report = _report(measure(fp32, model, evaluating, f"fixed<{target.bits}>"))
    if max_accuracy_drop is not None and report.drop() <= max_accuracy_drop:
        model, report = _per_layer(
            model, report, target, lambda t: build(t, chosen), fp32, evaluating, max_accuracy_drop
        )
    log.info("kiln: %s", report.line())
    return model, report


MIN_BITS = 6  # the narrowest a layer's budget goes
MAX_TRIALS = 24  # compiles the per-layer search may spend


def _per_layer(model, report, target, build, fp32, evaluating, budget):  # type: ignore[no-untyped-def]
    """The per-layer bit budget: each layer's output narrowed 2 bits at a time, largest tensors
    first, while the drop stays within ``budget`` (at most ``MAX_TRIALS`` compiles). The
    report's precision names the widths that differ from the model's."""
    layers = sorted(
        {
            (facts.names.get(b, b.name), b.size)
            for _, d, facts in design_of(model)
            for kd in d.kernels
            for b in kd.kernel.writes
            if b in d.formats
        },
        key=lambda item: -item[1],
    )
    widths: dict[str, int] = {}
    trials = 0
    for name, _ in layers:
        while trials < MAX_TRIALS and widths.get(name, target.bits) - 2 >= MIN_BITS:
            trial = {**widths, name: widths.get(name, target.bits) - 2}
            trials += 1
            candidate = build(target.with_widths(trial))
            measured = _report(measure(fp32, candidate, evaluating, _label(target.bits, trial)))
            if measured.drop() > budget:
                break
            widths, model, report = trial, candidate, measured
    log.info("kiln: per-layer budget after %d trial compile(s): %s", trials, report.precision)
    return model, report


def _label(bits: int, widths: dict[str, int]) -> str:
    narrower = ", ".join(f"{name} {w}" for name, w in sorted(widths.items()))
    return f"fixed<{bits}>" + (f" (narrower: {narrower})" if narrower else "")


def _report(report: AccuracyReport) -> AccuracyReport:
    report.method = "minmax"
    return report


TOLERANCE_STEPS = 256  # of the output format's last bit: 8 of 16 bits for the error budget


def output_tolerance(model: Any) -> float:
    """The absolute tolerance of a compiled fpga ``model`` against fp32: ``TOLERANCE_STEPS``
    steps of its coarsest output format (what the shared tests and conformance allow)."""
    steps = [d.formats[b].step for _, d, f in design_of(model) for b in f.outputs if b in d.formats]
    return TOLERANCE_STEPS * max(steps, default=0.0)


def design_of(model: Any) -> list[tuple[Any, Any, Any]]:
    """(plan, Design, PlanFacts) of each plan of a compiled fpga ``model`` (a ``NativeModel``)."""
    from kiln.backends import backend
    from kiln.driver.pipeline import plan_facts

    found = []
    for plan in model.plans:
        facts = plan_facts(plan, model.options.quantization)
        segments = [s.kernels for s in plan.steps if hasattr(s, "kernels")]
        if not segments:  # every node on the host: no design
            continue
        found.append((plan, backend("fpga").design(segments, facts, plan.target), facts))  # type: ignore[attr-defined]
    return found


def _input_names(model: Any, plan: Any) -> list[str]:
    """The user's names of the plan's inputs, in order (the plan's own may be renamed)."""
    return list(getattr(model, "input_names", [v.name for v in plan.graph.inputs]))


def reference_run(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``model`` (one plan, no fallbacks) run by the fixed-point reference in Python integers:
    what its C simulation must equal bit for bit."""
    from kiln.backends.fpga.reference import floats, quantized, run_design

    ((plan, design, facts),) = design_of(model)
    memory: dict[Any, np.ndarray] = {}
    for name, buffer in zip(_input_names(model, plan), facts.inputs, strict=True):
        array = np.asarray(feeds[name])
        fmt = design.formats.get(buffer)
        memory[buffer] = quantized(array, fmt) if fmt is not None else np.array(array.reshape(-1), dtype=object)
    for buffer, array in facts.constants.items():
        fmt = design.formats.get(buffer)
        memory[buffer] = quantized(array, fmt) if fmt is not None else np.array(array.reshape(-1), dtype=object)
    for kd in design.kernels:
        for buffer in kd.kernel.writes:
            memory.setdefault(buffer, np.zeros(buffer.size, dtype=object))
    run_design(design, memory)
    results = {}
    names = list(getattr(model, "output_names", [v.name for v in plan.graph.outputs]))  # the user's, in order
    for name, value, buffer in zip(names, plan.graph.outputs, facts.outputs, strict=True):
        fmt = design.formats.get(buffer)
        shape = tuple(int(d) for d in value.type.shape)
        values = floats(memory[buffer], fmt) if fmt is not None else np.array(list(memory[buffer]))
        results[name] = values.reshape(shape)
    return results


def write_fpga_project(model: Any, folder: Any, feeds: dict[str, np.ndarray]) -> list[Any]:
    """The Vitis HLS project of a compiled fpga ``model`` under ``folder``: sources, a testbench
    whose expected outputs are the fixed-point reference's on ``feeds``, the Tcl script, the
    estimates. A plan with host fallbacks has no single design: a clear error."""
    from pathlib import Path

    from kiln.backends.fpga.estimate import estimate
    from kiln.backends.fpga.project import write_project
    from kiln.errors import KilnError

    ((plan, design, facts),) = design_of(model)
    if plan.fallbacks:
        names = ", ".join(f.node.label for f in plan.fallbacks)
        raise KilnError(f"the fpga design cannot include {names} (it runs on the host): no project is written")
    expected = reference_run(model, feeds)
    inputs = [np.asarray(feeds[name]) for name in _input_names(model, plan)]
    outputs = list(expected.values())  # in the plan's output order
    found = estimate(design, facts, plan.target)
    return write_project(Path(folder), plan.source, design, facts, plan.target, found, inputs, outputs)
