"""The ``kiln`` command line."""

from __future__ import annotations

import io
import json
import sys
import traceback
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from kiln.arrays import ArrayFileError, load_npy
from kiln.cli_bench import bench
from kiln.cli_check import check, diff_command
from kiln.cli_compile import compile_command
from kiln.cli_generate import generate_command
from kiln.cli_inspect import explain
from kiln.cli_serve import serve
from kiln.cli_study import study
from kiln.cli_support import configure_logging, console, json_option, out, output_option, target_option
from kiln.errors import KilnError
from kiln.output_files import write_output_file
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
@target_option("reference", "The target to test")
@click.option(
    "--suite",
    "suites",
    multiple=True,
    default=("node",),
    show_default=True,
    help="ONNX test group(s): node, simple, pytorch-converted, pytorch-operator. Repeatable.",
)
@click.option("--filter", "name_filter", default=None, help="Only cases whose name matches this regex.")
@output_option("Write the full report (JSON) to this file.")
@json_option("the full report")
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
    output: Path | None,
    as_json: bool,
    jobs: int | None,
    timeout: float,
    baseline: Path | None,
    show_failures: bool,
) -> None:
    """Run the ONNX backend conformance suite; each case isolated in a worker process."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from kiln.conformance.runner import fixed_point_target, load_cases, makes_sense_in_fixed_point, run_conformance

    try:
        cases = load_cases(suites, name_filter)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    if not cases:
        raise click.ClickException(f"no cases match filter {name_filter!r}")
    if fixed_point_target(target):
        kept = [c for c in cases if makes_sense_in_fixed_point(c)]
        console.print(
            f"{target} computes in fixed point: {len(cases) - len(kept)} case(s) with non-float32 or non-finite "
            "tensors not run; each case calibrated on its inputs, compared within 256 steps of its output format"
        )
        cases = kept
        if not cases:
            raise click.ClickException("none of the matching cases makes sense in fixed point")
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
    if not as_json:
        _print_report(report, show_failures)
    if output:
        write_output_file(output, json.dumps(report.to_json(), indent=1), "conformance report")
        console.print(f"report written to {output}")
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
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
@json_option("the list")
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
@target_option("reference", "The target to run on")
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
@target_option("cpu", "The target to run on")
@click.option(
    "--tolerance", type=float, default=1e-4, show_default=True, help="Max relative L2 error vs eager PyTorch."
)
@json_option("the results (same exit code)")
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


@main.command("targets")
@json_option("the list")
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
@output_option("Write the outputs to this .npz.")
@target_option("cpu", "Target when ARTIFACT is an .onnx file")
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
        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.asarray(v) for k, v in results.items()})
        write_output_file(output, buffer.getvalue(), "outputs file")
        out.print(f"wrote {output}")


@main.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
def show(model: str) -> None:
    """Import MODEL (.onnx) and print it as kiln IR (weights appear by reference)."""
    from kiln.frontend.onnx import import_onnx
    from kiln.ir.printer import print_graph

    out.print(print_graph(import_onnx(model)), markup=False, highlight=False)


for _command in (compile_command, bench, study, explain, check, diff_command, serve, generate_command):
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
