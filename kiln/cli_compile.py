"""``kiln compile``: a model to a ``.kiln`` artifact (with ``--tune``: its kernels tuned first)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from kiln.cli_support import (
    calibration_data,
    console,
    dim_bindings,
    dim_option,
    import_bound,
    out,
    precision_option,
    split_ranges,
    target_option,
)


def _calibration(precision: str, calibration, model: str, graph, fixed_point: bool = False):  # type: ignore[no-untyped-def]
    """int8's (and the fpga target's fixed point's) calibration data: --calibrate's, else the zoo
    model's example inputs, else random."""
    from kiln import zoo

    if precision != "int8" and not fixed_point:
        return calibration
    if calibration is None and model in zoo.MODELS:
        out.print(f"calibrating on 10 example inputs of {model} (random data: pass --calibrate for real data)")
        return [zoo.example_inputs(model, seed=seed) for seed in range(10)]
    if calibration is None:
        what = "fixed-point widths" if fixed_point else "int8 model"
        out.print(f"calibrating on random inputs: pass --calibrate with real data for a meaningful {what}")
        return None
    return calibration_data(calibration, graph)


def _size_classes(items: tuple[str, ...]) -> dict[str, str]:
    """--size-classes NAME=SIZE,SIZE,... items by name (the sizes are checked when declared)."""
    classes = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=SIZE,SIZE,..., got {item!r}", param_hint="--size-classes")
        classes[name] = value
    return classes


def _say_ranges(compiled) -> None:  # type: ignore[no-untyped-def]
    """What the declared ranges mean for this model: which dims run every size without a compile."""
    from kiln.driver.routes import dim_routes

    for symbol, (_, text) in dim_routes(compiled).items():
        out.print(f"{symbol} {text}")


@click.command("compile")
@click.argument("model")
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(path_type=Path),
    required=True,
    help="The .kiln artifact to write; with --target fpga:..., the folder of the Vitis HLS project; with "
    "--emit c, the folder of the C library.",
)
@click.option(
    "--emit",
    type=click.Choice(["artifact", "c"]),
    default="artifact",
    show_default=True,
    help="c: the model as a C library in the folder -o names (kiln.h, libkiln_model.so, the weights file "
    "model.kw, an example main.c): it runs without Python, NumPy or a compiler; one size (--dim binds every "
    "symbolic dim; default 1).",
)
@click.option("-O", "level", type=click.IntRange(0, 3), default=2, show_default=True, help="Optimization level.")
@dim_option(
    "Bind a symbolic dim, e.g. --dim batch=8; a list compiles each size ahead, e.g. --dim batch=1,8,32 "
    "(saved in the artifact: it needs no compiler for them); a range declares the sizes the model serves, "
    "e.g. --dim batch=1..64 (checked every run; a sample-parallel dim runs every size in it from its size "
    "classes, with no compiler). [default: every symbol = 1]"
)
@click.option(
    "--size-classes",
    "size_classes",
    multiple=True,
    metavar="NAME=SIZES",
    help="The sizes compiled for a sample-parallel dim (a run at another size is chunks of these), e.g. "
    "--size-classes batch=1,4,16; 1 must be one. [default: 1 and 8, those inside the range]. A dim that "
    "pads (a sequence length, with a declared range): its compiled lengths, e.g. --size-classes seq=32,128,384, "
    "the largest at least the range's end [default: powers of two from 16, and the range's end]",
)
@click.option(
    "--tune",
    "tune_budget",
    default=None,
    metavar="DURATION",
    help="Autotune the matrix-multiply and convolution kernels first, within this wall-clock budget "
    "(e.g. 90s, 5m, 1h). Results are kept in the tuning database: a second compile does no tuning.",
)
@click.option("--retune", is_flag=True, help="With --tune: measure kernels already in the tuning database again.")
@click.option(
    "--cluster",
    default=None,
    metavar="ADDRESS",
    help="With --tune: measure the candidates on a Ray cluster's nodes of the target's hardware class "
    "(its ISA; narrowed with --on), each measurement holding its node alone.",
)
@click.option(
    "--on", "selectors", multiple=True, metavar="KEY=VALUE", help="With --cluster: only nodes matching (cpu=EPYC...)."
)
@target_option(
    "cpu",
    "cpu: this machine's best ISA (-march=native); cpu:avx512, cpu:avx2, cpu:generic: code for any CPU "
    "with that ISA (an AVX2 artifact built on an AVX-512 server)",
)
@precision_option("int8 calibrates with --calibrate; the accuracy against fp32 is measured and printed.")
@click.option(
    "--calibrate",
    "calibration",
    default=None,
    metavar="DATA",
    help="int8 calibration data: an .npz (each input's array, samples along a leading axis) or a folder of "
    "images (image models). The last fifth evaluates the accuracy. [default: the zoo model's example inputs, "
    "else random inputs, which calibrate poorly]",
)
@click.option(
    "--calibration-method",
    type=click.Choice(["minmax", "percentile", "entropy"]),
    default="minmax",
    show_default=True,
    help="How activation ranges come from the calibration data.",
)
@click.option(
    "--max-accuracy-drop",
    type=click.FloatRange(0),
    default=None,
    help="int8: keep the most sensitive layers in fp32 until the drop vs fp32 (1 - top-1 agreement for class "
    "scores, else relative L2) is at most this.",
)
def compile_command(
    model: str,
    output: Path,
    emit: str,
    level: int,
    dims: tuple[str, ...],
    size_classes: tuple[str, ...],
    tune_budget: str | None,
    retune: bool,
    cluster: str | None,
    selectors: tuple[str, ...],
    target: str,
    precision: str,
    calibration: str | None,
    calibration_method: str,
    max_accuracy_drop: float | None,
) -> None:
    """Compile MODEL (.onnx path or zoo name) to native code and save it as a .kiln artifact."""
    import time

    import kiln

    if cluster is not None and tune_budget is None:
        raise click.UsageError("--cluster measures tuning candidates: give --tune DURATION too")
    ranges, dims = split_ranges(dims)
    classes = _size_classes(size_classes)
    graph, binding = import_bound(model, dims)
    bindings = dim_bindings(graph, dims)
    if tune_budget is not None:
        measurer = _cluster_measurer(cluster, target, selectors) if cluster else None
        for each in bindings:
            _tune(graph, each, level, _parse_duration(tune_budget), retune, target, measurer)
    start = time.perf_counter()
    fpga = _fpga_output(target, tune_budget, output, emit, bool(len(ranges) > 2 or classes or len(bindings) > 1))
    calibration = _calibration(precision, calibration, model, graph, fixed_point=fpga)
    what = f"{len(bindings)} binding(s) of " if len(bindings) > 1 else ""
    with console.status(f"compiling {what}{model} for {target} ({precision}, -O{level})..."):
        compiled = kiln.compile(
            graph,
            target=target,
            opt_level=level,
            dims=bindings[0],
            precision=precision,
            calibration=calibration,
            calibration_method=calibration_method,
            max_accuracy_drop=max_accuracy_drop,
        )
        for number, each in enumerate(bindings[1:], 2):  # every size asked for is compiled ahead and saved
            console.print(f"compiled binding {number - 1}/{len(bindings)}; compiling {each}")
            compiled.prepare_dims(each)
        if ranges or classes:
            compiled.declare(ranges, classes, ahead=bindings[0])
    if ranges or classes or not compiled.shapes_known:  # what sizes the artifact serves, and how
        _say_ranges(compiled)
    seconds = time.perf_counter() - start
    plan = compiled.plans[-1] if len(bindings) == 1 else compiled.plans[0]
    if fpga:
        _fpga_project(compiled, output, model, graph, calibration, seconds)
        return
    if emit == "c":
        _emit_c(compiled, output, bindings[0], ranges)
        return
    compiled.save(output)
    if len(bindings) > 1:
        out.print(f"compiled ahead for {len(bindings)} bindings: " + "; ".join(str(b) for b in bindings))
    kernels = sum(len(step.kernels) for step in plan.steps if hasattr(step, "kernels"))
    ranged = {name: f"{low}..{high}" for name, (low, high) in getattr(compiled, "ranges", {}).items()}
    binding = {**binding, **ranged} if binding else binding
    out.print(
        f"compiled {model} for {compiled.target} ({compiled.compiled_for.summary}, {compiled.precision}) in {seconds:.1f} s (-O{level}, dims {binding or 'static'}): {kernels} kernels, {len(plan.fallbacks)} host fallback(s)"
    )
    for fallback in plan.fallbacks:
        out.print(f"  fallback {fallback.node.label}: {fallback.reason}", highlight=False)
    out.print(f"memory plan: {plan.memory.describe()}")
    if compiled.precision != "fp32":
        _say_accuracy(compiled, model, graph)
    out.print(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB)")


def _emit_c(compiled, output: Path, dims: dict, ranges: dict) -> None:  # type: ignore[no-untyped-def]
    """The C library's folder: one size, and ranges: a sample-parallel batch (--dim batch=1..64) and
    a paddable length (--dim seq=1..128), together or alone; or dims the kernels take at run time
    through the dims vector (--dim h=64..224 --dim w=64..224), every other dim bound."""
    from kiln.driver.emit_c import emit_c
    from kiln.driver.sizes import parse_range
    from kiln.passes.batching import Parallel

    parsed = {name: parse_range(name, value) for name, value in ranges.items()}
    batch = next(((n, *r) for n, r in parsed.items() if isinstance(compiled.sample_parallel().get(n), Parallel)), None)
    rest = {n: r for n, r in parsed.items() if batch is None or n != batch[0]}
    route = getattr(getattr(compiled, "dims_model", None), "spatial", None)
    if route is not None and rest and set(rest) <= set(route.symbols):  # the kernels take them through the dims vector
        emitted = emit_c(compiled, output, dims, None, None, rest) if batch is None else None
        if emitted is None:
            raise click.UsageError(
                f"--emit c: {', '.join(rest)} run through the dims vector: bind {batch[0]} with --dim"
            )  # type: ignore[index]
    elif len(rest) > 1:
        raise click.UsageError(
            f"--emit c takes one sample-parallel batch range and one length range: {', '.join(rest)} given"
        )
    else:
        length = next(((n, *r) for n, r in rest.items()), None)
        emitted = emit_c(compiled, output, dims, batch, length)
    out.print(emitted.line(), highlight=False)


def _say_accuracy(compiled, model: str, graph) -> None:  # type: ignore[no-untyped-def]
    """A reduced-precision model's accuracy against fp32 (bf16: measured here on the zoo's inputs,
    else random ones)."""
    from kiln import zoo
    from kiln.driver.compile import accuracy_against_fp32
    from kiln.driver.quantize import samples_from
    from kiln.errors import KilnError

    report = compiled.accuracy
    if report is None:
        if model in zoo.MODELS:
            samples = [zoo.example_inputs(model, seed=seed) for seed in (1, 2)]
        else:
            samples = samples_from(None, graph, count=2, seed=1)
        try:
            report = accuracy_against_fp32(compiled, samples)
        except KilnError as err:  # random inputs a model cannot run (a decode step: total = past + new)
            out.print(f"accuracy against fp32: not measured, random inputs do not run this model ({err})")
            return
    out.print(f"accuracy: {report.line()}", highlight=False)


def _fpga_output(target: str, tune_budget: str | None, output: Path, emit: str, sized: bool) -> bool:
    """Whether the compile writes an fpga project (a folder) rather than a .kiln file (or, with
    --emit c, a C library's folder: one size, ``sized`` saying more were asked for)."""
    if emit == "c":
        if sized or target.split(":")[0] != "cpu":
            raise click.UsageError(
                "--emit c builds one size for a cpu target (and up to two ranges: a sample-parallel batch, --dim "
                "batch=1..64, and a run-time length, --dim seq=1..128): "
                "bind the other dims to one size with --dim"
            )
        return False
    fpga = target.startswith("fpga")
    if fpga and tune_budget is not None:
        raise click.UsageError("--tune measures CPU kernels; the fpga target's schedule comes from its reuse factor")
    if not fpga and output.is_dir():
        raise click.BadParameter(f"{output} is a folder: give the .kiln file to write", param_hint="-o")
    return fpga


def _fpga_project(compiled, output: Path, model: str, graph, calibration, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """The Vitis HLS project of an fpga compile, its estimates and accuracy."""
    import json

    from kiln.driver.fixed_point import write_fpga_project
    from kiln.driver.quantize import samples_from

    samples = samples_from(calibration, graph, count=1, seed=1)
    written = write_fpga_project(compiled, output, samples[0])
    estimates = json.loads((output / "estimates.json").read_text())
    out.print(f"compiled {model} for {compiled.target} ({compiled.compiled_for.summary}) in {seconds:.1f} s")
    if compiled.accuracy is not None:
        out.print(f"accuracy: {compiled.accuracy.line()}", highlight=False)
    used = estimates["resources"]
    have = estimates["available"]
    out.print(
        f"ESTIMATES (kiln's model, not synthesis): latency {estimates['latency_cycles']:,} cycles "
        f"({estimates['latency_us']:.2f} us), interval {estimates['interval_cycles']:,} cycles; "
        + ", ".join(f"{k.upper()} {used[k]:,}/{have[k]:,}" for k in used),
        highlight=False,
    )
    out.print(f"wrote {len(written)} files to {output} (vitis_hls -f build_prj.tcl there)")


def _parse_duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a duration (examples: 90s, 5m, 1h, 300)", param_hint="--tune"
        ) from None


def _cluster_measurer(address: str, target: str, selectors: tuple[str, ...]):  # type: ignore[no-untyped-def]
    from kiln.bench import fleet

    reason = fleet.unavailable()
    if reason:
        raise click.ClickException(reason)
    from kiln.tune.remote import ClusterMeasurer

    try:
        measurer = ClusterMeasurer(address, target, selectors)
    except fleet.FleetError as err:
        raise click.ClickException(str(err)) from None
    out.print(f"measuring on {len(measurer.nodes)} node(s) of {measurer.label} at {address}", highlight=False)
    return measurer


def _tune(graph, binding: dict[str, int], level: int, budget: float, retune: bool, target: str, measurer=None) -> None:  # type: ignore[no-untyped-def]
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from kiln import tune
    from kiln.backends import parse
    from kiln.driver.options import CompileOptions
    from kiln.driver.pipeline import graph_stages

    # the graph the compile will lower: the pipeline's own graph stages, for this target
    optimized = graph_stages(graph, binding, parse(target), CompileOptions.from_env(level=level))
    tasks = tune.tasks_for(optimized)
    columns = [
        TextColumn("tuning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("kernels"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("best speed-up {task.fields[best]:.2f}x"),
    ]
    with Progress(*columns, console=console) as bar:
        task_id = bar.add_task("tune", total=len(tasks), best=1.0)

        def report(done: int, total: int, outcome, best: float) -> None:  # type: ignore[no-untyped-def]
            bar.update(task_id, completed=done, best=best)

        outcomes = tune.tune(optimized, budget, report, retune=retune, target=target, measurer=measurer)
    fresh = [o for o in outcomes if not o.cached]
    failures = sum(len(o.failures) for o in fresh)
    out.print(
        f"tuned {len(fresh)} kernel(s), {len(outcomes) - len(fresh)} from the tuning database, "
        f"{len(tasks) - len(outcomes)} left at the default (budget); {failures} candidate(s) failed and were skipped"
    )
    for outcome in sorted(fresh, key=lambda o: -o.speedup)[:10]:
        out.print(
            f"  {escape(outcome.task.label)}: {outcome.choice or 'default'} {outcome.speedup:.2f}x ({outcome.default_seconds * 1e3:.2f} -> {outcome.seconds * 1e3:.2f} ms)",
            highlight=False,
        )
