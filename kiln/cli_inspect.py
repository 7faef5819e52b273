"""``kiln explain`` (with ``--profile``), ``kiln check`` and ``kiln diff``: looking inside a model's
compilation."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from kiln.cli_support import console, import_bound, out, parse_dims, precision_option
from kiln.lower.kir import kernel_precision


@click.command()
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
    help="Print what a stage produced (repeatable; 'all' for every stage): a graph stage (import, specialize, "
    "fold, decompose, passes or any single pass by name) prints the IR; lower the kernel IR; plan-memory the "
    "arena's placements; render the generated source; build the library's path; load the runners.",
)
@click.option(
    "--target",
    default="cpu",
    show_default=True,
    help="The target to compile for (any registered target: `kiln targets` lists them).",
)
@precision_option("int8 calibrates (min-max) on the zoo model's example inputs, else random ones.")
@click.option("--disable", multiple=True, help="Skip this pass or algorithm (winograd) (repeatable).")
@click.option(
    "--kernels/--no-kernels",
    default=True,
    show_default=True,
    help="Lower, render and build: show the kernels, the fallbacks, the memory plan and the generated source.",
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
@click.option(
    "--json", "as_json", is_flag=True, help="Print the stages, ops, refusals, plan and printed stages as JSON."
)
@click.option(
    "--arch",
    "arches",
    multiple=True,
    type=click.Choice(["sm_80", "sm_86", "sm_89", "sm_90"]),
    help="gpu targets: compile every kernel ahead for this NVIDIA architecture (no GPU needed) and show its "
    "registers, spills and shared memory (repeatable).",
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
    target: str,
    precision: str,
    as_json: bool,
    arches: tuple[str, ...],
) -> None:
    """Show what kiln does to MODEL (an .onnx path or a zoo name), stage by stage of the very
    pipeline a compile runs (import, specialize, fold, decompose, passes, lower, plan-memory,
    render, build, load): node counts and timing per stage, the IR after any stage, the fusions
    refused and why, the kernels and host fallbacks (with reasons), the memory plan and the path
    of the generated source."""
    import collections
    import time

    from kiln.backends import parse
    from kiln.driver.options import CompileOptions
    from kiln.driver.pipeline import PRINTABLE, STAGES, compile_variant, load
    from kiln.ir.graph import Graph

    unknown = set(print_after) - set(PRINTABLE) - {"all"}
    if unknown:
        raise click.BadParameter(
            f"unknown stage(s) {sorted(unknown)}; stages: {', '.join(STAGES)}; or a pass: "
            f"{', '.join(p for p in PRINTABLE if p not in STAGES)}",
            param_hint="--print-after",
        )
    compiled_for = parse(target)
    from kiln.driver.pipeline import resolve_precision

    options = CompileOptions.from_env(level=level, disabled=frozenset(disable), plan_cache=False)
    options = options.with_(precision=resolve_precision(precision, compiled_for))
    graph, binding = import_bound(model, dims)
    if options.precision == "int8":
        from kiln import zoo
        from kiln.passes.specialize import specialize
        from kiln.driver.quantize import calibrate, samples_from

        if model in zoo.MODELS:
            samples = [zoo.example_inputs(model, seed=seed) for seed in range(1, 11)]
        else:
            samples = samples_from(None, specialize(graph, binding))
        quantization = calibrate(specialize(graph, binding), compiled_for, options, samples, "minmax")
        options = options.with_(quantization=quantization)
    wanted = set(print_after)
    table = Table(
        title=f"{model}: the pipeline at -O{level}, {options.precision}, for {compiled_for.name} (dims {binding or 'static'})"
    )
    for column in ("stage", "nodes", "constants", "ms"):
        table.add_column(column)
    clock = [time.perf_counter()]
    seen: dict[str, object] = {"import": graph}
    last = [graph]
    report: dict = {
        "model": model,
        "target": compiled_for.name,
        "level": level,
        "precision": options.precision,
        "dims": binding,
        "stages": [],
    }
    printed: dict[str, str] = {}

    def observe(stage: str, result: object) -> None:
        now = time.perf_counter()
        elapsed = f"{(now - clock[0]) * 1e3:.0f}"
        clock[0] = now
        row = {"stage": stage, "ms": float(elapsed)}
        if isinstance(result, Graph):
            if stage == "fuse":
                seen["before fuse"] = last[0]
            last[0] = result
            table.add_row(stage, str(len(result.nodes)), str(len(result.constants)), elapsed)
            row.update(nodes=len(result.nodes), constants=len(result.constants))
        else:
            table.add_row(stage, "", "", elapsed)
        report["stages"].append(row)
        seen[stage] = result
        if stage in wanted or "all" in wanted:
            text = _stage_text(stage, result)
            printed[stage] = text
            if not as_json:
                out.print(f"# after {stage}", markup=False, highlight=False)
                out.print(text, markup=False, highlight=False)

    observe("import", graph)
    plan = None
    if kernels:
        plan = compile_variant(graph, binding, compiled_for, options, observe=observe)
        if plan.target is not None and not plan.whole_graph_reason:
            from kiln.lower.target import TargetError

            try:
                executable = load(plan)
            except TargetError as err:  # compiled for hardware this machine lacks (gpu without a CUDA device)
                report["not_loaded"] = str(err)
                if not as_json:
                    out.print(f"[yellow]not loaded:[/] {escape(str(err))}")
            else:
                observe("load", executable)
    else:  # the graph stages only
        from kiln.driver.pipeline import graph_stages

        graph_stages(graph, binding, compiled_for, options, observe)
    before = collections.Counter(n.op for n in graph.nodes)
    optimized = seen.get("passes", last[0])
    after_ops = collections.Counter(n.op for n in optimized.nodes)  # type: ignore[attr-defined]
    report["ops"] = {op: [before.get(op, 0), after_ops.get(op, 0)] for op in sorted(set(before) | set(after_ops))}
    refusals = _refusals(seen["before fuse"]) if "before fuse" in seen else []
    report["fusion_refused"] = [{"node": r.node, "would_join": r.candidate, "reason": r.reason} for r in refusals]
    report["printed"] = printed
    if plan is not None:
        report["plan"] = _plan_summary(plan)
    if plan is not None and plan.target is not None and plan.target.backend == "gpu" and plan.source:
        report["gpu"] = _gpu_kernels(plan, arches, quiet=as_json)
    elif arches:
        raise click.BadParameter(
            "--arch compiles a gpu target's kernels: use it with --target gpu", param_hint="--arch"
        )
    if as_json:
        click.echo(json.dumps(report, indent=1, default=str))
        return
    out.print(table)
    ops = Table(title="ops imported -> after the passes")
    for column in ("op", "imported", "optimized"):
        ops.add_column(column)
    for op, (imported, kept) in report["ops"].items():
        ops.add_row(escape(op), str(imported), str(kept))
    out.print(ops)
    if "before fuse" in seen:
        _explain_refusals(refusals)
    if plan is not None:
        _explain_plan(plan)
    if "gpu" in report:
        _explain_gpu(report["gpu"])
    if profile and compiled_for.backend == "gpu":
        _explain_transfers(model, seen["specialize"], binding, runs, compiled_for, options)
    elif profile:
        _explain_profile(model, seen["specialize"], binding, runs, top, compiled_for, options)


def _stage_text(stage: str, result: object) -> str:
    """What ``--print-after STAGE`` shows of a stage's result."""
    from kiln.ir.graph import Graph
    from kiln.ir.printer import print_graph
    from kiln.lower.kir_printer import print_kernel
    from kiln.lower.memory import MemoryPlan

    if isinstance(result, Graph):
        text = print_graph(result)
    elif stage == "lower":
        text = "\n".join(
            print_kernel(k) if hasattr(k, "body") else f"fallback {step.node.label}: {step.reason}"  # type: ignore[union-attr]
            for step in result  # type: ignore[attr-defined]
            for k in (step.kernels if hasattr(step, "kernels") else [step])
        )
    elif isinstance(result, MemoryPlan):
        lines = [result.describe()]
        for buffer, offset in sorted(result.offsets.items(), key=lambda item: item[1]):
            start, end = result.lifetimes.get(buffer, (0, 0))
            lines.append(f"  {buffer.name}: offset {offset}, {buffer.nbytes} bytes, steps {start}..{end}")
        text = "\n".join(lines)
    elif stage == "load":
        text = f"{len(result.runners)} segment runner(s) loaded"  # type: ignore[attr-defined]
    elif stage == "verify":
        text = "\n".join(result) or "the kernel IR holds its invariants (checked with KILN_DEBUG=1 only)"  # type: ignore[arg-type]
    else:
        text = str(result) if result else "(nothing: no native segment)"
    return text


def _explain_profile(model: str, graph, binding: dict[str, int], runs: int, top: int, target, options) -> None:  # type: ignore[no-untyped-def]
    from kiln import zoo as models
    from kiln.driver.profile import matmul_peak, profile_graph

    feeds = models.example_inputs(model, batch=binding.get("batch", 1)) if model in models.MODELS else None
    with console.status("profiling (timers in every kernel)..."):
        result = profile_graph(graph, feeds, runs=runs, target=target, options=options)
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
            _kind(timed.kernel),
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
        entry = kinds.setdefault(_kind(timed.kernel), [0, 0.0, 0.0])
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


MAX_REFUSALS = 40


def _explain_transfers(model: str, graph, binding: dict[str, int], runs: int, target, options) -> None:  # type: ignore[no-untyped-def]
    """A gpu target's runs: time moving data host -> device, in kernels, and device -> host."""
    from kiln import zoo as models
    from kiln.backends.gpu import transfer_times
    from kiln.driver.pipeline import compile_plan
    from kiln.runtime.executable import Executable

    plan = compile_plan(graph, target, options)
    executable = Executable(plan)
    if models.MODELS.get(model) is not None:
        feeds = models.example_inputs(model, batch=binding.get("batch", 1))
    else:
        from kiln.driver.quantize import samples_from

        feeds = samples_from(None, graph)[0]
    inputs = [feeds[v.name] for v in plan.graph.inputs]
    with console.status(f"running {runs} time(s) on {target.name}..."):
        for _ in range(runs):
            executable.run(inputs)
    times = transfer_times(executable.runners)
    if times is None:
        out.print("no native segment: nothing ran on the device")
        return
    out.print(
        f"per run ({times['runs']} runs on {target.name}): host -> device {times['upload_ms']:.3f} ms, "
        f"kernels {times['compute_ms']:.3f} ms, device -> host {times['download_ms']:.3f} ms"
        + (" (Triton's interpreter on the CPU: kernel time is not a GPU's)" if target.interpret else "")
    )


def _gpu_kernels(plan, arches: tuple[str, ...], quiet: bool) -> dict:  # type: ignore[no-untyped-def]
    """The gpu target's kernel functions: launches, grid, blocks, and per architecture asked
    (compiled ahead, no GPU needed) registers, spills and shared memory."""
    from kiln.backends.gpu import source_file
    from kiln.backends.gpu.ahead import compile_ahead
    from kiln.backends.gpu.render import Launch
    from kiln.backends.gpu.runtime import module

    path = source_file(plan.source)
    namespace = module(plan.source, interpret=plan.target.interpret)
    launches = [Launch.of(fields) for segment in namespace["LAUNCHES"].values() for fields in segment]
    functions: dict[str, dict] = {}
    for launch in launches:
        entry = functions.setdefault(
            launch.function,
            {
                "function": launch.function,
                "kind": launch.kind,
                "kernels": [],
                "grid": list(launch.grid),
                "blocks": dict(launch.constants),
                "num_warps": launch.num_warps,
                "num_stages": launch.num_stages,
                "arch": {},
            },
        )
        entry["kernels"].append(launch.kernel)
    for arch in arches:
        with console.status(f"compiling {len(functions)} Triton kernels for {arch}...") if not quiet else _null():
            for found in compile_ahead(plan.source, arch):
                functions[found.function]["arch"][arch] = {
                    "registers": found.registers,
                    "spill_bytes": found.spill_bytes,
                    "stack_bytes": found.stack_bytes,
                    "shared_bytes": found.shared_bytes,
                    "error": found.error,
                }
    return {
        "source": str(path),
        "launches": len(launches),
        "functions": list(functions.values()),
        "arches": list(arches),
    }


def _null():  # type: ignore[no-untyped-def]
    import contextlib

    return contextlib.nullcontext()


def _explain_gpu(found: dict) -> None:
    arches = found["arches"]
    table = Table(title=f"Triton kernels: {len(found['functions'])} functions, {found['launches']} launches")
    for column in ("function", "kind", "launches", "grid", "blocks", "warps/stages"):
        table.add_column(column, overflow="fold")
    for arch in arches:
        table.add_column(f"{arch} regs / spill B / smem B", overflow="fold")
    for entry in found["functions"]:
        cells = []
        for arch in arches:
            usage = entry["arch"][arch]
            if usage["error"]:
                cells.append(f"[red]does not compile: {escape(usage['error'])}[/]")
            else:
                spill = usage["spill_bytes"]
                cells.append(
                    f"{usage['registers']} / {'[red]' + str(spill) + '[/]' if spill else 0} / {usage['shared_bytes']}"
                )
        kernels = entry["kernels"]
        table.add_row(
            entry["function"],
            entry["kind"],
            str(len(kernels)),
            "x".join(map(str, entry["grid"])),
            ", ".join(f"{k}={v}" for k, v in entry["blocks"].items()),
            f"{entry['num_warps']}/{entry['num_stages']}",
            *cells,
        )
    out.print(table)
    out.print(f"Triton source: {found['source']}")


def _refusals(graph):  # type: ignore[no-untyped-def]
    """Why the fusion pass left nodes apart (fuse records a reason for every refusal)."""
    from kiln.passes.fuse import Refusal, fuse

    refusals: list[Refusal] = []
    fuse(graph, refusals)
    return refusals


def _kind(kernel) -> str:  # type: ignore[no-untyped-def]
    """A kernel's kind, with its precision when it is not float32 (``matmul+epilogue int8``)."""
    precision = kernel_precision(kernel)
    return kernel.kind if precision == "fp32" else f"{kernel.kind} {precision}"


def _plan_summary(plan) -> dict:  # type: ignore[no-untyped-def]
    from kiln.runtime.plan import Fallback

    steps = []
    for step in plan.steps:
        if isinstance(step, Fallback):
            steps.append({"fallback": step.node.label, "op": step.node.op, "reason": step.reason})
            continue
        for kernel in step.kernels:
            schedule = kernel.schedule
            steps.append(
                {
                    "kernel": kernel.name,
                    "segment": step.number,
                    "kind": kernel.kind,
                    "precision": kernel_precision(kernel),
                    "computes": kernel.sources,
                    "parallel": schedule.parallel,
                    "vectorize": schedule.vectorize,
                    "tuning": kernel.tuning,
                }
            )
    return {
        "whole_graph_reason": plan.whole_graph_reason,
        "steps": steps,
        "native": plan.is_native,
        "memory": {"arena_bytes": plan.memory.arena_bytes, "described": plan.memory.describe()},
        "source": str(plan.library.with_suffix(".c")) if plan.library is not None else None,
        "library": str(plan.library) if plan.library is not None else None,
        "kernels": sum(len(s.kernels) for s in plan.steps if not isinstance(s, Fallback)),
    }


def _explain_refusals(refusals) -> None:  # type: ignore[no-untyped-def]
    if not refusals:
        out.print("fusion: nothing refused")
        return
    table = Table(title=f"fusion refused ({len(refusals)}; first {min(len(refusals), MAX_REFUSALS)})")
    for column in ("node", "would join", "reason"):
        table.add_column(column, overflow="fold")
    for refusal in refusals[:MAX_REFUSALS]:
        table.add_row(escape(refusal.node), escape(refusal.candidate), escape(refusal.reason))
    out.print(table)


def _explain_plan(plan) -> None:  # type: ignore[no-untyped-def]
    from kiln.runtime.plan import Fallback

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
                _kind(kernel),
                escape("; ".join(kernel.sources)),
                ", ".join(p for p in parts if p) or "serial",
            )
    out.print(table)
    native = "no host fallback" if plan.is_native else f"{len(plan.fallbacks)} host fallback(s)"
    out.print(f"{sum(len(s.kernels) for s in plan.steps if not isinstance(s, Fallback))} kernels, {native}")
    out.print(f"memory plan: {plan.memory.describe()}")
    if plan.library is not None:
        out.print(f"generated source: {plan.library.with_suffix('.c')}")
        out.print(f"shared library: {plan.library}")


@click.command()
@click.argument("model")
@click.option("--dim", "dims", multiple=True, help="Bind a symbolic dim for the fallback check, e.g. --dim batch=8.")
@click.option("--strict", is_flag=True, help="Also exit 1 when a node would run as a host fallback on the cpu target.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON (same exit codes).")
def check(model: str, dims: tuple[str, ...], strict: bool, as_json: bool) -> None:
    """Check MODEL (an .onnx path or a zoo name) before compiling: every unsupported construct (op,
    opset, attribute, dtype) with its node's name, all at once; the symbolic dims kiln specializes
    and which node first reads each; nodes whose output shapes depend on data; and the nodes that
    would run as host fallbacks on the cpu target. Exit code 0: compiles (natively unless listed);
    1: the model cannot be compiled (or, with --strict, has host fallbacks)."""
    from kiln import zoo as models
    from kiln.driver.pipeline import compile_plan
    from kiln.errors import InvalidModelError, ModelLoadError, UnsupportedModelError
    from kiln.frontend.onnx import import_onnx
    from kiln.ir.types import TensorType
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


@click.command("diff")
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
