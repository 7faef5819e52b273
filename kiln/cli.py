"""The ``kiln`` command line."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from kiln.arrays import ArrayFileError, load_npy
from kiln.cli_bench import bench
from kiln.cli_inspect import check, diff_command, explain
from kiln.cli_support import (
    calibration_data,
    configure_logging,
    console,
    dim_bindings,
    import_bound,
    out,
    precision_option,
)
from kiln.errors import KilnError
from kiln.version import __version__


class _Ordered(click.Group):
    """Commands in the order a user meets them (compile, run, bench first), not alphabetical."""

    ORDER = ("compile", "run", "bench", "explain", "check", "diff", "targets", "conformance", "zoo", "show")

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (self.ORDER.index(n) if n in self.ORDER else len(self.ORDER), n))


@click.group(cls=_Ordered, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(version=__version__, prog_name="kiln")
@click.option("-v", "--verbose", count=True, help="Say what kiln is doing (-vv: debugging detail).")
@click.option("-q", "--quiet", is_flag=True, help="Errors only: no progress notes or warnings.")
def main(verbose: int, quiet: bool) -> None:
    """kiln: an ML compiler for ONNX and PyTorch models, with a benchmark harness.

    Exit codes: 0 success; 1 a failure (a failed check, a divergence, no bench job succeeded, a
    regression in bench compare, a run that failed); 2 a usage error or input kiln cannot read.

    \b
    Examples:
      kiln compile model.onnx -o model.kiln --dim batch=1,8   # native code, two sizes ahead
      kiln run model.kiln                    # run it once on random inputs
      kiln bench                             # kiln and its peers on the default models
      kiln conformance                       # ONNX backend node suite on the reference target
      kiln conformance --filter 'conv|pool'  # a subset, by regex on the case name
      kiln zoo list                          # built-in models
      kiln zoo check resnet50                # export, import, run, compare with onnxruntime
      kiln zoo arch llama falcon             # tiny dynamo exports of common architectures vs PyTorch
      kiln show model.onnx                   # print a model as kiln IR
    """
    configure_logging(verbose, quiet)


@main.command()
@click.option("--target", default="reference", show_default=True, help="kiln target to test (see `kiln targets`).")
@click.option(
    "--suite",
    "suites",
    multiple=True,
    default=("node",),
    show_default=True,
    help="ONNX test group(s): node, simple, pytorch-converted, pytorch-operator. Repeatable.",
)
@click.option("--filter", "name_filter", default=None, help="Only cases whose name matches this regex.")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the full report here."
)
@click.option("--jobs", "-j", type=int, default=None, help="Worker processes (default: CPU count).")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds per case before it is killed.")
@click.option(
    "--baseline",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Fail (exit 1) if the pass count falls below this file's.",
)
@click.option("--show-failures/--no-show-failures", default=True, show_default=True, help="List failing cases.")
def conformance(
    target: str,
    suites: tuple[str, ...],
    name_filter: str | None,
    json_path: Path | None,
    jobs: int | None,
    timeout: float,
    baseline: Path | None,
    show_failures: bool,
) -> None:
    """Run the ONNX backend conformance suite; each case isolated in a worker process."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from kiln.conformance.runner import load_cases, run_conformance

    try:
        cases = load_cases(suites, name_filter)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    if not cases:
        raise click.ClickException(f"no cases match filter {name_filter!r}")
    console.print(f"running {len(cases)} case(s) from {', '.join(suites)} on target [bold]{target}[/]")
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[passed]} passed"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("conformance", total=len(cases), passed=0)
        passed = 0

        def tick(result) -> None:  # type: ignore[no-untyped-def]
            nonlocal passed
            passed += result.status == "pass"
            bar.update(task, advance=1, passed=passed)

        report = run_conformance(cases, target=target, jobs=jobs, timeout=timeout, progress=tick)
    _print_report(report, show_failures)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.to_json(), indent=1))
        console.print(f"report written to {json_path}")
    if baseline:
        floor = json.loads(baseline.read_text())
        key = "+".join(suites)
        entry = floor.get(target, {}).get(key, {})
        required = entry.get("passed")
        if required is None:
            raise click.ClickException(f"{baseline} has no baseline for target {target!r}, suite {key!r}")
        if report.passed < required:
            console.print(f"[red]FAILED[/]: {report.passed} passed, below the baseline of {required} ({baseline})")
            sys.exit(1)
        if "native" in entry and (report.native or 0) < entry["native"]:
            console.print(
                f"[red]FAILED[/]: native rate {report.native} below the baseline of {entry['native']} ({baseline})"
            )
            sys.exit(1)
        console.print(f"baseline held: {report.passed} passed >= {required}")


def _print_report(report, show_failures: bool) -> None:  # type: ignore[no-untyped-def]
    counts = report.counts()
    if show_failures:
        failures = [r for r in report.results if r.status != "pass"]
        if failures:
            table = Table(title="cases that did not pass", show_lines=False)
            for column in ("case", "status", "message"):
                table.add_column(column, overflow="fold")
            for result in failures:
                first_line = (result.message.strip().splitlines() or [""])[0][:160]
                table.add_row(result.name, result.status, first_line)
            out.print(table)
        per_op = [(op, row) for op, row in report.per_op().items() if row["passed"] < row["cases"]]
        if per_op:
            table = Table(title="ops in cases that did not pass")
            for column in ("op", "cases", "passed"):
                table.add_column(column)
            for op, row in per_op:
                table.add_row(op, str(row["cases"]), str(row["passed"]))
            out.print(table)
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    out.print(
        f"[bold]{report.passed}/{report.total} passed ({100 * report.rate:.1f}%)[/] on target {report.target} ({summary})"
    )


@main.group()
def zoo() -> None:
    """Built-in models: list them, export them to ONNX, check them against onnxruntime."""


@zoo.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def zoo_list(as_json: bool) -> None:
    """List the built-in models."""
    from kiln import zoo as models

    if as_json:
        rows = [
            {"name": name, "description": model.description, "default": name in models.DEFAULT_MODELS}
            for name, model in models.MODELS.items()
        ]
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(title="kiln zoo")
    table.add_column("name")
    table.add_column("description")
    table.add_column("default", justify="center")
    for name, model in models.MODELS.items():
        table.add_row(name, model.description, "yes" if name in models.DEFAULT_MODELS else "")
    out.print(table)


def _model_names(names: tuple[str, ...]) -> list[str]:
    from kiln import zoo as models

    chosen = list(names) or list(models.DEFAULT_MODELS)
    unknown = [n for n in chosen if n not in models.MODELS]
    if unknown:
        raise click.BadParameter(f"unknown model(s) {unknown}; available: {', '.join(models.MODELS)}")
    return chosen


@zoo.command("export")
@click.argument("names", nargs=-1)
def zoo_export(names: tuple[str, ...]) -> None:
    """Export NAMES (default: the four seed models) to ONNX and print the cached paths."""
    from kiln import zoo as models

    for name in _model_names(names):
        out.print(f"{name}: {models.onnx_path(name, progress=console.print)}")


@zoo.command("check")
@click.argument("names", nargs=-1)
@click.option("--target", default="reference", show_default=True)
@click.option("--tolerance", type=float, default=1e-4, show_default=True, help="Max relative L2 error vs onnxruntime.")
def zoo_check(names: tuple[str, ...], target: str, tolerance: float) -> None:
    """Import NAMES, run them on kiln, and compare with onnxruntime (exit 1 on a mismatch)."""
    from kiln.zoo.check import check_model

    table = Table(title=f"zoo models on kiln {target} vs onnxruntime")
    for column in ("model", "import s", "run s", "rel L2", "max abs", "result"):
        table.add_column(column)
    failed = False
    for name in _model_names(names):
        result = check_model(name, target=target, progress=console.print)
        ok = result.relative_l2 is not None and result.relative_l2 <= tolerance
        failed |= not ok
        table.add_row(
            name,
            f"{result.import_seconds:.1f}",
            f"{result.run_seconds:.1f}",
            "n/a" if result.relative_l2 is None else f"{result.relative_l2:.2e}",
            "n/a" if result.max_abs is None else f"{result.max_abs:.2e}",
            "[green]match[/]" if ok else f"[red]{result.note or 'MISMATCH'}[/]",
        )
    out.print(table)
    if failed:
        sys.exit(1)


@zoo.command("arch")
@click.argument("names", nargs=-1)
@click.option("--target", default="cpu", show_default=True)
@click.option(
    "--tolerance", type=float, default=1e-4, show_default=True, help="Max relative L2 error vs eager PyTorch."
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON (same exit code).")
def zoo_arch(names: tuple[str, ...], target: str, tolerance: float, as_json: bool) -> None:
    """Tiny random-weight versions of common architectures (BERT, GPT-2, Llama, Falcon, ViT, Swin,
    ConvNeXt, wav2vec2, ...; `kiln zoo arch --json` lists them all), exported with the dynamo
    exporter (opset 18): compile each for TARGET, list its host fallbacks and attention kernels,
    and compare with eager PyTorch. Exit 1 when one falls back or mismatches. Needs the zoo
    extra (torch, transformers, onnxscript)."""
    import numpy as np

    import kiln
    from kiln.zoo import architectures

    chosen = list(names) or list(architectures.ARCHITECTURES)
    unknown = [n for n in chosen if n not in architectures.ARCHITECTURES]
    if unknown:
        raise click.BadParameter(
            f"unknown architecture(s) {unknown}; available: {', '.join(architectures.ARCHITECTURES)}"
        )
    rows, failed = [], False
    for name in chosen:
        arch = architectures.get(name)
        path = architectures.export(name, progress=console.print)
        feeds = architectures.inputs(name)
        compiled = kiln.compile(str(path), target=target)
        got = np.asarray(next(iter(compiled.run(feeds).values())), np.float64)
        want = architectures.eager(name, feeds).astype(np.float64)
        error = float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))
        fallbacks = [f"{f.node.op} ({f.reason})" for p in compiled.plans for f in p.fallbacks]
        kinds = [k.kind for p in compiled.plans for s in p.steps for k in getattr(s, "kernels", [])]
        ok = not fallbacks and error <= tolerance
        failed |= not ok
        rows.append(
            {"name": name, "family": arch.family, "model": arch.model_class, "relative_l2": error,
             "fallbacks": fallbacks, "kernels": len(kinds), "attention_kernels": kinds.count("attention"), "ok": ok}
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        table = Table(title=f"architectures (dynamo exports, opset 18) on kiln {target} vs eager PyTorch")
        for column in ("name", "family", "kernels", "attention", "rel L2", "host fallbacks", "result"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                row["name"], row["family"], str(row["kernels"]), str(row["attention_kernels"]),
                f"{row['relative_l2']:.2e}", escape("; ".join(row["fallbacks"])) or "none",
                "[green]ok[/]" if row["ok"] else "[red]FAIL[/]",
            )  # fmt: skip
        out.print(table)
    if failed:
        sys.exit(1)


@main.command("compile")
@click.argument("model")
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The .kiln artifact to write.",
)
@click.option("-O", "level", type=click.IntRange(0, 3), default=2, show_default=True, help="Optimization level.")
@click.option(
    "--dim",
    "dims",
    multiple=True,
    help="Bind a symbolic dim, e.g. --dim batch=8; a list compiles each size ahead, e.g. --dim batch=1,8,32 "
    "(saved in the artifact: it needs no compiler for them). [default: every symbol = 1]",
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
@click.option(
    "--target",
    default="cpu",
    show_default=True,
    help="cpu: this machine's best ISA (-march=native); cpu:avx512, cpu:avx2, cpu:generic: code for any CPU "
    "with that ISA (an AVX2 artifact built on an AVX-512 server); `kiln targets` lists every target.",
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
    level: int,
    dims: tuple[str, ...],
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
    from kiln import zoo

    if cluster is not None and tune_budget is None:
        raise click.UsageError("--cluster measures tuning candidates: give --tune DURATION too")
    graph, binding = import_bound(model, dims)
    bindings = dim_bindings(graph, dims)
    if tune_budget is not None:
        measurer = _cluster_measurer(cluster, target, selectors) if cluster else None
        for each in bindings:
            _tune(graph, each, level, _parse_duration(tune_budget), retune, target, measurer)
    start = time.perf_counter()
    if precision == "int8" and calibration is None and model in zoo.MODELS:
        calibration = [zoo.example_inputs(model, seed=seed) for seed in range(10)]
        out.print(f"calibrating on 10 example inputs of {model} (random data: pass --calibrate for real data)")
    elif precision == "int8" and calibration is None:
        out.print("calibrating on random inputs: pass --calibrate with real data for a meaningful int8 model")
    elif precision == "int8":
        calibration = calibration_data(calibration, graph)
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
    for each in bindings[1:]:  # every size asked for is compiled ahead and saved with the model
        compiled.prepare_dims(each)
    seconds = time.perf_counter() - start
    plan = compiled.plans[-1] if len(bindings) == 1 else compiled.plans[0]
    compiled.save(output)
    if len(bindings) > 1:
        out.print(f"compiled ahead for {len(bindings)} bindings: " + "; ".join(str(b) for b in bindings))
    kernels = sum(len(step.kernels) for step in plan.steps if hasattr(step, "kernels"))
    out.print(
        f"compiled {model} for {compiled.target} ({compiled.compiled_for.summary}, {compiled.precision}) in {seconds:.1f} s (-O{level}, dims {binding or 'static'}): {kernels} kernels, {len(plan.fallbacks)} host fallback(s)"
    )
    for fallback in plan.fallbacks:
        out.print(f"  fallback {fallback.node.label}: {fallback.reason}", highlight=False)
    out.print(f"memory plan: {plan.memory.describe()}")
    if compiled.precision != "fp32":
        from kiln.driver.compile import accuracy_against_fp32
        from kiln.driver.quantize import samples_from

        report = compiled.accuracy
        if report is None:  # bf16: against the fp32 compile on the zoo's inputs, else random ones
            if model in zoo.MODELS:
                samples = [zoo.example_inputs(model, seed=seed) for seed in (1, 2)]
            else:
                samples = samples_from(None, graph, count=2, seed=1)
            report = accuracy_against_fp32(compiled, samples)
        out.print(f"accuracy: {report.line()}", highlight=False)
    out.print(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB)")


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


@main.command("targets")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def targets_command(as_json: bool) -> None:
    """List the targets kiln can compile for (``--target`` of compile, explain, run, conformance):
    each with its backend, the ISA and vector width its kernels are shaped for, the engines it
    has, and whether this machine can run it (and if not, why)."""
    from kiln.backends import backend, names, parse

    rows = []
    for name in names():
        found = backend(name)
        row: dict = {"target": name, "backend": found.name, "compiles": found.compiles}
        if found.compiles:
            try:
                target = parse(name)
            except KilnError as err:
                row.update(runs_here=False, reason=str(err))
            else:
                missing = found.runnable(target)
                row.update(
                    isa=target.summary,
                    vector_bytes=target.vector_bytes,
                    cores=target.cores,
                    engines=list(target.engines),
                    runs_here=not missing,
                    reason=missing,
                )
        else:
            row.update(runs_here=True, reason="", engines=[])
        rows.append(row)
    from kiln.backends.cpu import features

    paths = features.precision_paths()
    amx_granted, amx_reason = features.request_amx()
    for row in rows:  # what the machine offers the cpu targets for reduced precision (issue: bf16/int8)
        if row["backend"] == "cpu":
            row["reduced_precision"] = {"bf16": paths["bf16"], "int8": paths["int8"], "amx": amx_granted or amx_reason}
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(title="kiln targets")
    for column in ("target", "isa", "vector", "engines", "here"):
        table.add_column(column, overflow="fold")
    for row in rows:
        here = "yes" if row["runs_here"] else f"[yellow]no[/]: {escape(row['reason'])}"
        vector = f"{row['vector_bytes']} B" if "vector_bytes" in row else "-"
        isa = row.get("isa", "-" if row["compiles"] else "(interpreter)")
        table.add_row(row["target"], isa, vector, ", ".join(row.get("engines", [])) or "-", here)
    out.print(table)
    out.print(
        f"this CPU's reduced-precision hardware: bf16 {', '.join(paths['bf16']) or 'none (would be emulated)'}; "
        f"int8 {', '.join(paths['int8']) or 'none'}; AMX permission: "
        + ("granted" if amx_granted is True else escape(str(amx_reason)))
    )


@main.command("run")
@click.argument("artifact")
@click.option("--input", "inputs", multiple=True, help="NAME=FILE.npy (repeatable). Inputs not given are random.")
@click.option(
    "--output", "output", type=click.Path(dir_okay=False, path_type=Path), help="Write the outputs to this .npz."
)
@click.option(
    "--target", default="cpu", show_default=True, help="Target when ARTIFACT is an .onnx file (see `kiln targets`)."
)
@click.option(
    "--threads",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Threads in each parallel loop (0: every CPU this process may use).",
)
def run_command(artifact: str, inputs: tuple[str, ...], output: Path | None, target: str, threads: int) -> None:
    """Run a .kiln artifact (or an .onnx model) once and summarize its outputs."""
    import time

    import numpy as np

    import kiln
    from kiln.ir.types import TensorType, random_tensor

    if artifact.endswith(".kiln"):
        model = kiln.load(artifact, threads=threads)
    else:
        model = kiln.compile(artifact, target=target, threads=threads)
    feeds: dict[str, np.ndarray] = {}
    for item in inputs:
        name, _, file = item.partition("=")
        if not file:
            raise click.BadParameter(f"expected NAME=FILE.npy, got {item!r}", param_hint="--input")
        try:
            feeds[name] = load_npy(file)
        except ArrayFileError as err:
            raise click.BadParameter(str(err), param_hint="--input") from None
        except OSError as err:
            raise click.BadParameter(f"{file}: cannot be read ({err.strerror or err})", param_hint="--input") from None
    rng = np.random.default_rng(0)
    for value in model.graph.inputs:
        if value.name in feeds or not isinstance(value.type, TensorType) or value.type.shape is None:
            continue
        shape = [d if isinstance(d, int) else 1 for d in value.type.shape]
        feeds[value.name] = random_tensor(value.type.dtype, shape, rng)
        console.print(f"input {value.name!r}: random {value.type.dtype.short}{shape}")
    start = time.perf_counter()
    results = model.run(feeds)
    out.print(f"ran in {(time.perf_counter() - start) * 1e3:.1f} ms")
    for name, array in results.items():
        array = np.asarray(array)
        stats = (
            f"min {array.min():.4g} max {array.max():.4g} mean {array.astype(np.float64).mean():.4g}"
            if array.size and array.dtype.kind in "fiub"
            else ""
        )
        out.print(f"  {name}: {array.dtype}{list(array.shape)} {stats}", highlight=False)
    if output:
        np.savez(output, **{k: np.asarray(v) for k, v in results.items()})
        out.print(f"wrote {output}")


@main.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
def show(model: str) -> None:
    """Import MODEL (.onnx) and print it as kiln IR (weights appear by reference)."""
    from kiln.frontend.onnx import import_onnx
    from kiln.ir.printer import print_graph

    out.print(print_graph(import_onnx(model)), markup=False, highlight=False)


for _command in (bench, explain, check, diff_command):
    main.add_command(_command)


FAILURES = ("ExecutionError", "ResourceError", "InternalError", "CompilerError")  # the rest: bad input


def run() -> None:
    """Entry point: no traceback for users. ``error: ...`` on stderr, exit 2 for a problem with
    what was asked (usage, a model or artifact kiln cannot read, a missing or unwritable file) and
    1 when kiln failed doing it (a run that failed, out of memory or disk, a kiln bug).
    ``KILN_DEBUG=1`` shows the traceback as well."""
    import os

    debug = os.environ.get("KILN_DEBUG", "0") not in ("0", "", "false", "no")
    try:
        main(standalone_mode=True)
    except KilnError as err:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {err}", err=True)  # unwrapped, so scripts can grep it
        sys.exit(1 if type(err).__name__ in FAILURES else 2)
    except OSError as err:
        if debug:
            traceback.print_exc()
        where = f"{err.filename}: " if err.filename else ""
        click.echo(f"error: {where}{err.strerror or err}", err=True)
        sys.exit(2)
    except Exception as err:
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (KILN_DEBUG=1 shows the traceback)"
        click.echo(f"error: kiln bug: {type(err).__name__}: {err}{hint}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
