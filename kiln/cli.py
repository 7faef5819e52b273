"""The ``kiln`` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kiln.errors import KilnError

console = Console(stderr=True)
out = Console()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kiln")
def main() -> None:
    """kiln: an ML compiler for ONNX and PyTorch models, with a benchmark harness.

    \b
    Examples:
      kiln conformance                       # ONNX backend node suite on the reference target
      kiln conformance --filter 'conv|pool'  # a subset, by regex on the case name
      kiln zoo list                          # built-in models
      kiln zoo check resnet50                # export, import, run, compare with onnxruntime
      kiln show model.onnx                   # print a model as kiln IR
    """


@main.command()
@click.option("--target", default="reference", show_default=True, help="kiln target to test.")
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
def zoo_list() -> None:
    """List the built-in models."""
    from kiln import zoo as models

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


def _split(values: tuple[str, ...]) -> list[str]:
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


@main.group(invoke_without_command=True)
@click.option(
    "--models",
    "-m",
    multiple=True,
    help="Zoo names or .onnx paths, comma-separated or repeated. [default: resnet50,vgg19,bert-base,gpt2]",
)
@click.option(
    "--backends",
    "-b",
    multiple=True,
    help="Backends, comma-separated or repeated. [default: every known backend; missing ones are reported as such]",
)
@click.option(
    "--scenario", "-s", "scenarios", multiple=True, help="single-stream, offline, server. [default: single-stream]"
)
@click.option("--batch", "batches", multiple=True, type=int, help="Batch size(s). [default: 1]")
@click.option(
    "--threads", "-t", type=int, default=2, show_default=True, help="Threads every backend may use (CPU-pinned)."
)
@click.option("--duration", "-d", type=float, default=3.0, show_default=True, help="Seconds of measurement per job.")
@click.option(
    "--min-iterations", type=int, default=5, show_default=True, help="At least this many measured runs per job."
)
@click.option("--warmup", type=int, default=2, show_default=True, help="Unmeasured runs before measuring.")
@click.option("--inflight", type=int, default=2, show_default=True, help="Requests in flight (offline, server).")
@click.option(
    "--rate", type=float, default=None, help="Server scenario arrival rate per s [default: 70% of measured capacity]."
)
@click.option("--seq", type=int, default=None, help="Sequence length for bert-base and gpt2. [default: 128]")
@click.option(
    "--timeout", type=float, default=900.0, show_default=True, help="Seconds before a job's worker is killed."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports/bench"),
    show_default=True,
    help="Reports land in OUT/<run id>/ (and OUT/latest).",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="SQLite results database. [default: OUT/results.db]",
)
@click.option(
    "--dataset",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Labelled image folder (DIR/<class>/<image>) for top-1 accuracy of classifiers.",
)
@click.option("--dataset-limit", type=int, default=None, help="Use at most this many dataset images.")
@click.option("--plugin", "plugins", multiple=True, help="Python module to import first (may register backends).")
@click.option("--no-agreement", is_flag=True, help="Skip comparing outputs with kiln's reference interpreter.")
@click.pass_context
def bench(ctx: click.Context, **options) -> None:  # type: ignore[no-untyped-def]
    """Benchmark kiln and its peers side by side (kiln bench with no arguments: the four seed
    models, batch 1, single-stream, every backend).

    \b
    Examples:
      kiln bench
      kiln bench -m resnet50 -b onnxruntime,openvino --batch 1 --batch 8 -s offline
      kiln bench -m model.onnx -b kiln,onnxruntime --duration 10
      kiln bench compare RUN_A RUN_B
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = options
        return
    from kiln.bench.runner import run_bench

    config = _bench_config(options)
    out: Path = options["out"]
    db: Path = options["db"] or out / "results.db"
    records_done = 0

    def progress(message: str, record) -> None:  # type: ignore[no-untyped-def]
        nonlocal records_done
        if record is not None:
            records_done += 1
            status = record["status"]
            colour = "green" if status == "ok" else "yellow" if status == "unavailable" else "red"
            console.print(f"[{colour}]{records_done:>3}[/] {message}", highlight=False)
        else:
            console.print(f"    {message}", highlight=False, style="dim")

    total = len(config.models) * len(config.batches) * len(config.backends) * len(config.scenarios)
    console.print(f"kiln bench: {total} job(s), {config.threads} thread(s), {config.duration:g} s each")
    run = run_bench(config, out / ".work", progress)
    _write_bench(run, out, db)
    if run["interrupted"]:
        sys.exit(130)


def _bench_config(options: dict):  # type: ignore[no-untyped-def]
    from kiln import zoo as models
    from kiln.bench.backends import DEFAULT_BACKENDS
    from kiln.bench.runner import BenchConfig

    return BenchConfig(
        models=_split(options["models"]) or list(models.DEFAULT_MODELS),
        backends=_split(options["backends"]) or list(DEFAULT_BACKENDS),
        scenarios=_split(options["scenarios"]) or ["single-stream"],
        batches=list(options["batches"]) or [1],
        threads=options["threads"],
        duration=options["duration"],
        min_iterations=options["min_iterations"],
        warmup=options["warmup"],
        inflight=options["inflight"],
        rate=options["rate"],
        seq=options["seq"],
        timeout=options["timeout"],
        dataset=options["dataset"],
        dataset_limit=options["dataset_limit"],
        plugins=list(options["plugins"]),
        agreement=not options["no_agreement"],
    )


def _write_bench(run: dict, out: Path, db: Path) -> None:
    from kiln.bench import report, store

    run_dir = out / run["run_id"]
    paths = report.write_all(run, run_dir)
    latest = out / "latest"
    if latest.is_symlink() or not latest.exists():
        latest.unlink(missing_ok=True)
        latest.symlink_to(run["run_id"])
    out_console = Console(width=250)
    out_console.print(report.terminal_table(run))
    for line in report.notes(run):
        console.print(f"[yellow]note:[/] {line}", highlight=False)
    try:
        store.save_run(db, run)
        console.print(f"stored as run {run['run_id']} in {db}")
    except store.CorruptDatabase as err:
        console.print(f"[red]warning:[/] {err}; results are in {run_dir}", highlight=False)
    for kind, path in paths.items():
        console.print(f"{kind}: {path}")


@bench.command("compare")
@click.argument("before")
@click.argument("after")
@click.pass_context
def bench_compare(ctx: click.Context, before: str, after: str) -> None:
    """Changes between two stored runs, flagging those beyond the noise band."""
    from kiln.bench import store

    options = ctx.obj or {}
    db: Path = options.get("db") or (options.get("out") or Path("reports/bench")) / "results.db"
    if not db.exists():
        raise click.ClickException(f"no results database at {db}")
    rows = store.compare(store.load_records(db, before), store.load_records(db, after))
    table = Table(title=f"{before} -> {after}")
    for column in (
        "model",
        "backend",
        "batch",
        "scenario",
        "metric",
        "before",
        "after",
        "change",
        "noise band",
        "verdict",
    ):
        table.add_column(column)
    for row in rows:
        colour = {"faster": "green", "slower": "red"}.get(row["verdict"], "white")
        table.add_row(
            row["model"],
            row["backend"],
            str(row["batch"]),
            row["scenario"],
            row["metric"],
            f"{row['before']:.2f}",
            f"{row['after']:.2f}",
            f"{row['change']:+.1%}",
            f"±{row['noise_band']:.0%}",
            f"[{colour}]{row['verdict']}[/]",
        )
    Console(width=200).print(table)
    if not rows:
        console.print("no comparable records (different models/backends, or failed runs)")


@bench.command("runs")
@click.pass_context
def bench_runs(ctx: click.Context) -> None:
    """List the runs stored in the results database."""
    from kiln.bench import store

    options = ctx.obj or {}
    db: Path = options.get("db") or (options.get("out") or Path("reports/bench")) / "results.db"
    if not db.exists():
        raise click.ClickException(f"no results database at {db}")
    for run_id, created, count in store.list_runs(db):
        out.print(f"{run_id}  {created}  {count} record(s)")


def _parse_dims(items: tuple[str, ...]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise click.BadParameter(f"expected NAME=INT, got {item!r}", param_hint="--dim")
        dims[name] = int(value)
    return dims


def _import_bound(model: str, dims: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """MODEL (a zoo name or an .onnx path) imported, and its input symbols bound: --dim values,
    every other symbol 1."""
    from kiln import zoo as models
    from kiln.frontend.onnx import import_onnx
    from kiln.ir.types import TensorType

    path = str(models.onnx_path(model, progress=console.print)) if model in models.MODELS else model
    graph = import_onnx(path)
    binding = _parse_dims(dims)
    for value in graph.inputs:
        if isinstance(value.type, TensorType) and value.type.shape:
            binding.update({d: binding.get(d, 1) for d in value.type.shape if isinstance(d, str)})
    return graph, binding


@main.command()
@click.argument("model")
@click.option("-O", "level", type=click.IntRange(0, 3), default=2, show_default=True, help="Optimization level.")
@click.option(
    "--dim",
    "dims",
    multiple=True,
    help="Bind a symbolic dim, e.g. --dim batch=1 (repeatable). [default: every symbol of the inputs = 1]",
)
@click.option(
    "--print-after",
    "print_after",
    multiple=True,
    help="Print the IR after this pass (repeatable; 'all' for every stage).",
)
@click.option("--disable", multiple=True, help="Skip this pass (repeatable).")
@click.option(
    "--kernels/--no-kernels",
    default=True,
    show_default=True,
    help="Lower to kernels and show them, the fallbacks, the memory plan and the generated C.",
)
@click.option(
    "--profile",
    is_flag=True,
    help="Run the model with per-kernel timers: each kernel's time, GFLOP/s, % of the measured "
    "matrix-multiply peak and its schedule (inputs: the zoo's examples, else random).",
)
@click.option("--runs", type=click.IntRange(1), default=10, show_default=True, help="Timed runs for --profile.")
@click.option(
    "--top", type=click.IntRange(1), default=25, show_default=True, help="Kernels listed by --profile (slowest first)."
)
def explain(
    model: str,
    level: int,
    dims: tuple[str, ...],
    print_after: tuple[str, ...],
    disable: tuple[str, ...],
    kernels: bool,
    profile: bool,
    runs: int,
    top: int,
) -> None:
    """Show what kiln does to MODEL (an .onnx path or a zoo name): per-stage op counts and timing,
    the IR after any pass, the kernels and host fallbacks (with reasons), the memory plan and the
    path of the generated C."""
    import collections
    import time

    from kiln.passes import PASS_NAMES, optimize, specialize

    graph, binding = _import_bound(model, dims)
    unknown = set(print_after) - set(PASS_NAMES) - {"all"}
    if unknown:
        raise click.BadParameter(
            f"unknown pass(es) {sorted(unknown)}; passes: {', '.join(PASS_NAMES)}", param_hint="--print-after"
        )
    before = collections.Counter(n.op for n in graph.nodes)
    graph = specialize(graph, binding)
    table = Table(title=f"{model}: passes at -O{level} (dims {binding or 'static'})")
    for column in ("stage", "nodes", "constants", "ms"):
        table.add_column(column)
    table.add_row("import + specialize", str(len(graph.nodes)), str(len(graph.constants)), "")
    clock = [time.perf_counter()]

    def after(name: str, current) -> None:  # type: ignore[no-untyped-def]
        now = time.perf_counter()
        table.add_row(name, str(len(current.nodes)), str(len(current.constants)), f"{(now - clock[0]) * 1e3:.0f}")
        clock[0] = now
        if name in print_after or "all" in print_after:
            out.print(f"# IR after {name}", markup=False, highlight=False)
            out.print(str(current), markup=False, highlight=False)

    optimized = optimize(graph, level=level, disable=disable, after=after)
    out.print(table)
    after_ops = collections.Counter(n.op for n in optimized.nodes)
    ops = Table(title="ops before -> after")
    for column in ("op", "imported", "optimized"):
        ops.add_column(column)
    for op in sorted(set(before) | set(after_ops)):
        ops.add_row(escape(op), str(before.get(op, 0)), str(after_ops.get(op, 0)))
    out.print(ops)
    if kernels:
        _explain_kernels(optimized)
    if profile:
        _explain_profile(model, optimized, binding, runs, top)


def _explain_profile(model: str, graph, binding: dict[str, int], runs: int, top: int) -> None:  # type: ignore[no-untyped-def]
    from kiln import zoo as models
    from kiln.runtime.profile import matmul_peak, profile_graph

    feeds = models.example_inputs(model, batch=binding.get("batch", 1)) if model in models.MODELS else None
    with console.status("profiling (timers in every kernel)..."):
        result = profile_graph(graph, feeds, runs=runs)
    with console.status("measuring the matrix-multiply peak..."):
        peak = matmul_peak()
    total = sum(t.seconds for t in result.kernels)
    table = Table(
        title=f"profile: {runs} runs, median {result.run_seconds * 1e3:.2f} ms per run; matrix-multiply peak {peak:.0f} GFLOP/s (measured)"
    )
    for column in ("kernel", "kind", "computes", "ms", "%", "GFLOP/s", "% peak", "schedule"):
        table.add_column(column, overflow="fold")
    for timed in sorted(result.kernels, key=lambda t: -t.seconds)[:top]:
        rate = timed.gflops
        table.add_row(
            timed.kernel.name,
            timed.kernel.kind,
            escape("; ".join(timed.kernel.sources)),
            f"{timed.seconds * 1e3:.3f}",
            f"{100 * timed.seconds / total:.1f}" if total else "-",
            f"{rate:.1f}" if rate is not None else "-",
            f"{100 * rate / peak:.0f}" if rate is not None and peak else "-",
            timed.schedule,
        )
    out.print(table)
    kinds: dict[str, list[float]] = {}
    for timed in result.kernels:
        entry = kinds.setdefault(timed.kernel.kind, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += timed.seconds
        entry[2] += timed.kernel.flops
    summary = Table(title="by kind")
    for column in ("kind", "kernels", "ms", "%", "GFLOP/s"):
        summary.add_column(column)
    for kind, (count, seconds, flops) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        rate = f"{flops / seconds / 1e9:.1f}" if flops and seconds else "-"
        summary.add_row(
            kind, str(int(count)), f"{seconds * 1e3:.2f}", f"{100 * seconds / total:.1f}" if total else "-", rate
        )
    out.print(summary)
    out.print(
        f"kernels {total * 1e3:.2f} ms per run; outside kernels (runtime, fallbacks) {result.fallback_seconds * 1e3:.2f} ms"
    )


def _explain_kernels(graph) -> None:  # type: ignore[no-untyped-def]
    from kiln.compiler import Fallback, compile_plan

    plan = compile_plan(graph, level=0)  # already optimized
    if plan.whole_graph_reason:
        out.print(f"whole graph runs on the reference: {plan.whole_graph_reason}")
        return
    table = Table(title="execution plan: kernels and host fallbacks, in order")
    for column in ("step", "kind", "computes", "schedule / reason"):
        table.add_column(column, overflow="fold")
    for step in plan.steps:
        if isinstance(step, Fallback):
            table.add_row("fallback", step.node.op, escape(step.node.label), f"[yellow]{escape(step.reason)}[/]")
            continue
        for kernel in step.kernels:
            schedule = kernel.schedule
            parts = [
                f"parallel {schedule.parallel}" if schedule.parallel else "",
                f"simd {schedule.vectorize}" if schedule.vectorize else "",
            ]
            table.add_row(
                f"{kernel.name} (segment {step.number})",
                kernel.kind,
                escape("; ".join(kernel.sources)),
                ", ".join(p for p in parts if p) or "serial",
            )
    out.print(table)
    native = "no host fallback" if plan.is_native else f"{len(plan.fallbacks)} host fallback(s)"
    out.print(f"{sum(len(s.kernels) for s in plan.steps if not isinstance(s, Fallback))} kernels, {native}")
    out.print(f"memory plan: {plan.memory.describe()}")
    if plan.library is not None:
        out.print(f"generated C: {plan.library.with_suffix('.c')}")
        out.print(f"shared library: {plan.library}")


@main.command()
@click.argument("model")
@click.option("--dim", "dims", multiple=True, help="Bind a symbolic dim for the fallback check, e.g. --dim batch=8.")
@click.option("--strict", is_flag=True, help="Also exit 1 when a node would run as a host fallback on the cpu target.")
def check(model: str, dims: tuple[str, ...], strict: bool) -> None:
    """Check MODEL (an .onnx path or a zoo name) before compiling: every unsupported construct (op,
    opset, attribute, dtype) with its node's name, all at once; the symbolic dims kiln specializes
    and which node first reads each; nodes whose output shapes depend on data; and the nodes that
    would run as host fallbacks on the cpu target. Exit code 0: compiles (natively unless listed);
    1: the model cannot be compiled (or, with --strict, has host fallbacks)."""
    from kiln import zoo as models
    from kiln.compiler import compile_plan
    from kiln.errors import InvalidModelError, ModelLoadError, UnsupportedModelError
    from kiln.frontend.onnx import import_onnx
    from kiln.ir.types import TensorType
    from kiln.passes import specialize

    path = str(models.onnx_path(model, progress=console.print)) if model in models.MODELS else model
    try:
        graph = import_onnx(path)
    except UnsupportedModelError as err:
        out.print(f"[red]{len(err.problems)} unsupported construct(s)[/] in {escape(path)}:")
        for problem in err.problems:
            out.print(f"  - {escape(problem)}", highlight=False)
        raise SystemExit(1) from None
    except (InvalidModelError, ModelLoadError) as err:
        out.print(f"[red]cannot import[/] {escape(str(err))}", highlight=False)
        raise SystemExit(1) from None
    out.print(f"{escape(path)}: {len(graph.nodes)} nodes, every op supported")
    symbols: dict[str, str] = {}
    for value in graph.inputs:
        if isinstance(value.type, TensorType) and value.type.shape is not None:
            for axis, dim in enumerate(value.type.shape):
                if isinstance(dim, str):
                    symbols.setdefault(dim, f"input {value.name!r} axis {axis}")
    readers: dict[str, str] = {}
    for node in graph.nodes:
        for value in node.inputs:
            if value is not None and isinstance(value.type, TensorType) and value.type.shape is not None:
                for dim in value.type.shape:
                    if isinstance(dim, str) and dim in symbols:
                        readers.setdefault(dim, node.label)
    for symbol, where in symbols.items():
        out.print(
            f"dim {symbol!r} ({where}): specialized per binding (each new value compiles once); first read by {escape(readers.get(symbol, 'no node'))}",
            highlight=False,
        )
    dynamic = []
    for node in graph.nodes:
        for value in node.outputs:
            if isinstance(value.type, TensorType) and value.type.shape is not None:
                fresh = [d for d in value.type.shape if isinstance(d, str) and d not in symbols]
                if fresh:
                    dynamic.append((node.label, fresh))
                    break
    for label, fresh in dynamic[:20]:
        out.print(
            f"data-dependent shape {fresh} from {escape(label)}: kiln specializes on small integer inputs' values, else runs the graph on the reference",
            highlight=False,
        )
    binding = _parse_dims(dims)
    binding.update({s: binding.get(s, 1) for s in symbols})
    plan = compile_plan(specialize(graph, binding), build_library=False)
    if plan.whole_graph_reason:
        out.print(f"[yellow]runs on the reference, not natively:[/] {escape(plan.whole_graph_reason)}", highlight=False)
    for fallback in plan.fallbacks:
        out.print(f"[yellow]host fallback[/] {escape(fallback.node.label)}: {escape(fallback.reason)}", highlight=False)
    native = not plan.whole_graph_reason and not plan.fallbacks
    out.print("compiles natively on the cpu target" if native else f"{len(plan.fallbacks)} host fallback(s)")
    if strict and not native:
        raise SystemExit(1)


@main.command("diff")
@click.argument("model")
@click.option(
    "--input",
    "input_file",
    default=None,
    help="Inputs: an .npz by input name (or an .npy for one input). [default: random]",
)
@click.option("--dim", "dims", multiple=True, help="Bind a symbolic dim, e.g. --dim batch=1.")
@click.option(
    "--disable",
    multiple=True,
    help="Rerun without a pass (fuse, simplify, ...) or an algorithm (winograd) to bisect a difference (repeatable).",
)
@click.option(
    "--tolerance", type=float, default=1e-4, show_default=True, help="Relative L2 error beyond which a tensor diverges."
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="List every compared tensor, not only the worst and the first divergent ones.",
)
def diff_command(
    model: str,
    input_file: str | None,
    dims: tuple[str, ...],
    disable: tuple[str, ...],
    tolerance: float,
    show_all: bool,
) -> None:
    """Compare every intermediate tensor of the compiled MODEL with the reference interpreter and
    name the first node that diverges beyond tolerance (exit 1 if one does)."""
    from kiln.diff import diff, feeds_for
    from kiln.passes import specialize

    graph, binding = _import_bound(model, dims)
    graph = specialize(graph, binding)
    feeds = feeds_for(graph, input_file)
    with console.status("running the compiled model and the reference..."):
        report = diff(graph, feeds, set(disable), tolerance)
    table = Table(
        title=f"{model}: {len(report.tensors)} tensors compared ({report.unmatched} without a same-named reference value)"
    )
    for column in ("tensor", "produced by", "max abs", "median abs", "p99 abs", "max rel", "rel L2"):
        table.add_column(column, overflow="fold")
    worst = sorted(report.tensors, key=lambda t: -t.relative_l2)[:10]
    rows = report.tensors if show_all else [t for t in report.tensors if t in worst or t.beyond(tolerance)][:40]
    for t in rows:
        style = "red" if t.beyond(tolerance) else ""
        table.add_row(
            escape(t.name),
            escape(t.node),
            f"{t.max_abs:.2e}",
            f"{t.median_abs:.2e}",
            f"{t.p99_abs:.2e}",
            f"{t.max_rel:.2e}",
            f"[{style}]{t.relative_l2:.2e}[/]" if style else f"{t.relative_l2:.2e}",
        )
    out.print(table)
    first = report.first_divergence
    if first is None:
        out.print(f"no tensor diverges beyond relative L2 {tolerance:g}")
        return
    out.print(
        f"[red]first divergence:[/] {escape(first.name)} (relative L2 {first.relative_l2:.2e}), produced by {escape(first.node)}",
        highlight=False,
    )
    out.print("rerun with --disable fuse / --disable winograd / --disable simplify ... to bisect")
    raise SystemExit(1)


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
    "--dim", "dims", multiple=True, help="Bind a symbolic dim, e.g. --dim batch=8. [default: every symbol = 1]"
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
def compile_command(
    model: str, output: Path, level: int, dims: tuple[str, ...], tune_budget: str | None, retune: bool
) -> None:
    """Compile MODEL (.onnx path or zoo name) to native code and save it as a .kiln artifact."""
    import time

    import kiln

    graph, binding = _import_bound(model, dims)
    if tune_budget is not None:
        _tune(graph, binding, level, _parse_duration(tune_budget), retune)
    start = time.perf_counter()
    compiled = kiln.compile(graph, target="cpu", opt_level=level, dims=binding)
    seconds = time.perf_counter() - start
    plan = compiled.plans[0]
    compiled.save(output)
    kernels = sum(len(step.kernels) for step in plan.steps if hasattr(step, "kernels"))
    out.print(
        f"compiled {model} in {seconds:.1f} s (-O{level}, dims {binding or 'static'}): {kernels} kernels, {len(plan.fallbacks)} host fallback(s)"
    )
    for fallback in plan.fallbacks:
        out.print(f"  fallback {fallback.node.label}: {fallback.reason}", highlight=False)
    out.print(f"memory plan: {plan.memory.describe()}")
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


def _tune(graph, binding: dict[str, int], level: int, budget: float, retune: bool) -> None:  # type: ignore[no-untyped-def]
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from kiln import tune
    from kiln.passes import optimize, specialize

    optimized = optimize(specialize(graph, binding), level=level)
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

        outcomes = tune.tune(optimized, budget, report, retune=retune)
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


@main.command("run")
@click.argument("artifact")
@click.option("--input", "inputs", multiple=True, help="NAME=FILE.npy (repeatable). Inputs not given are random.")
@click.option(
    "--output", "output", type=click.Path(dir_okay=False, path_type=Path), help="Write the outputs to this .npz."
)
@click.option("--target", default="cpu", show_default=True, help="Target when ARTIFACT is an .onnx file.")
def run_command(artifact: str, inputs: tuple[str, ...], output: Path | None, target: str) -> None:
    """Run a .kiln artifact (or an .onnx model) once and summarize its outputs."""
    import time

    import numpy as np

    import kiln
    from kiln.bench.models import random_tensor
    from kiln.ir.types import TensorType

    model = kiln.load(artifact) if artifact.endswith(".kiln") else kiln.compile(artifact, target=target)
    feeds: dict[str, np.ndarray] = {}
    for item in inputs:
        name, _, file = item.partition("=")
        if not file:
            raise click.BadParameter(f"expected NAME=FILE.npy, got {item!r}", param_hint="--input")
        feeds[name] = np.load(file)
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

    out.print(str(import_onnx(model)), markup=False, highlight=False)


def run() -> None:
    """Entry point: kiln errors become one clear message and exit code 2, not a traceback."""
    try:
        main(standalone_mode=True)
    except KilnError as err:
        click.echo(f"error: {err}", err=True)  # unwrapped, so scripts can grep it
        sys.exit(2)


if __name__ == "__main__":
    run()
