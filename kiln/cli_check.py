"""``kiln check`` (will a model compile, and natively?) and ``kiln diff`` (where do two targets
first disagree?)."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from kiln.cli_support import console, dim_option, import_bound, json_option, out, parse_dims, split_ranges


@click.command()
@click.argument("model")
@dim_option(
    "Bind a symbolic dim for the fallback check, e.g. --dim batch=8; a range (--dim seq=1..128) checks "
    "the program kiln.compile makes for the ranges at their ends and middles instead."
)
@click.option(
    "--strict",
    is_flag=True,
    help="Also exit 1 when a node would run as a host fallback on the cpu target (with ranges: when a "
    "size compiles after kiln.compile returned or does not run natively).",
)
@click.option("--target", default="cpu", show_default=True, help="Target of the range check.")
@json_option("the findings (same exit codes)")
def check(model: str, dims: tuple[str, ...], strict: bool, target: str, as_json: bool) -> None:
    """Check MODEL (an .onnx path or a zoo name) before compiling: every unsupported construct (op,
    opset, attribute, dtype) with its node's name, all at once; the symbolic dims kiln specializes
    and which node first reads each; nodes whose output shapes depend on data; and the nodes that
    would run as host fallbacks on the cpu target. With ranges (--dim NAME=LOW..HIGH), the model
    compiled as kiln.compile(MODEL, dims=ranges) runs at each range's ends and middle against the
    reference interpreter, each size's route and answer reported. Exit code 0: compiles (natively
    unless listed); 1: the model cannot be compiled, or a size fails or disagrees (with --strict:
    host fallbacks; with ranges, a size that compiles after kiln.compile or runs off native code)."""
    from kiln import zoo as models
    from kiln.driver.pipeline import compile_plan
    from kiln.errors import InvalidModelError, ModelLoadError, UnsupportedModelError
    from kiln.frontend.onnx import import_onnx
    from kiln.passes import specialize

    found: dict = {"model": model, "unsupported": [], "dims": {}, "data_dependent": [], "fallbacks": []}

    def say(*args: object, **kwargs: object) -> None:
        if not as_json:
            out.print(*args, **kwargs)

    def finish(code: int) -> None:
        if as_json:
            found["compiles"] = not found["unsupported"] and "import_error" not in found
            click.echo(json.dumps(found, indent=1))
        if code:
            raise SystemExit(code)

    path = str(models.onnx_path(model, progress=console.print)) if model in models.MODELS else model
    try:
        graph = import_onnx(path)
    except UnsupportedModelError as err:
        say(f"[red]{len(err.problems)} unsupported construct(s)[/] in {escape(path)}:")
        for problem in err.problems:
            say(f"  - {escape(problem)}", highlight=False)
        found["unsupported"] = list(err.problems)
        finish(1)
        return
    except (InvalidModelError, ModelLoadError) as err:
        say(f"[red]cannot import[/] {escape(str(err))}", highlight=False)
        found["import_error"] = str(err)
        finish(1)
        return
    say(f"{escape(path)}: {len(graph.nodes)} nodes, every op supported")
    ranges, dims = split_ranges(dims)
    quiet = (lambda *args, **kwargs: None) if ranges else say  # the range check says how each dim runs
    symbols = _symbols(graph, found, quiet)
    _data_dependent(graph, symbols, found, quiet)
    if ranges:  # the program kiln.compile makes for the ranges, not one specialization
        from kiln.cli_check_ranges import check_ranges, exit_code

        report = check_ranges(path, ranges, parse_dims(dims), target)
        found["ranges"] = report
        _say_ranges(report, say)
        finish(exit_code(report, strict))
        return
    binding = parse_dims(dims)
    binding.update({s: binding.get(s, 1) for s in symbols})
    plan = compile_plan(specialize(graph, binding), build_library=False)
    if plan.whole_graph_reason:
        say(f"[yellow]runs on the reference, not natively:[/] {escape(plan.whole_graph_reason)}", highlight=False)
    for fallback in plan.fallbacks:
        say(f"[yellow]host fallback[/] {escape(fallback.node.label)}: {escape(fallback.reason)}", highlight=False)
    native = not plan.whole_graph_reason and not plan.fallbacks
    say("compiles natively on the cpu target" if native else f"{len(plan.fallbacks)} host fallback(s)")
    found["fallbacks"] = [{"node": f.node.label, "op": f.node.op, "reason": f.reason} for f in plan.fallbacks]
    found["whole_graph_reason"] = plan.whole_graph_reason
    found["native"] = native
    finish(1 if strict and not native else 0)


def _say_ranges(report: dict, say) -> None:  # type: ignore[no-untyped-def]
    if report.get("compile_error"):
        say(f"[red]kiln.compile at the ranges failed:[/] {escape(report['compile_error'])}", highlight=False)
        return
    table = Table(title=f"{report['target']} at the declared ranges (compiled in {report['compile_s']:.1f} s)")
    columns = ("dims", "verdict", "route", "compiled after kiln.compile", "native", "rel. L2 vs reference", "ms")
    for column in columns:
        table.add_column(column)
    for row in report["bindings"]:
        route = row.get("route")
        table.add_row(
            ", ".join(f"{k}={v}" for k, v in row["dims"].items()),
            row["verdict"] + (f": {escape(row['error'])}" if row.get("error") else ""),
            escape(f"{route['route']}: {route['detail']}") if route else "",
            str(row["compiled"]),
            "yes" if row["native"] else "no",
            f"{row['rel_l2']:.1e}",
            f"{1e3 * row['seconds']:.1f}" if "seconds" in row else "",
        )
    say(table)


def _symbols(graph, found: dict, say) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The graph's symbolic input dims (where each is, which node first reads it)."""
    from kiln.ir.types import TensorType

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
        found["dims"][symbol] = {"where": where, "first_read_by": readers.get(symbol)}
        say(
            f"dim {symbol!r} ({where}): specialized per binding (each new value compiles once); first read by {escape(readers.get(symbol, 'no node'))}",
            highlight=False,
        )
    return symbols


def _data_dependent(graph, symbols: dict[str, str], found: dict, say) -> None:  # type: ignore[no-untyped-def]
    """Nodes whose output shapes have dims that are not the inputs' (they depend on data)."""
    from kiln.ir.types import TensorType

    dynamic = []
    for node in graph.nodes:
        for value in node.outputs:
            if isinstance(value.type, TensorType) and value.type.shape is not None:
                fresh = [d for d in value.type.shape if isinstance(d, str) and d not in symbols]
                if fresh:
                    dynamic.append((node.label, fresh))
                    break
    found["data_dependent"] = [{"node": label, "dims": fresh} for label, fresh in dynamic]
    for label, fresh in dynamic[:20]:
        say(
            f"data-dependent shape {fresh} from {escape(label)}: kiln specializes on small integer inputs' values, else runs the graph on the reference",
            highlight=False,
        )


@click.command("diff")
@click.argument("model")
@click.option(
    "--input",
    "input_file",
    default=None,
    help="Inputs: an .npz by input name (or an .npy for one input). [default: random]",
)
@dim_option()
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

    graph, binding = import_bound(model, dims)
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
