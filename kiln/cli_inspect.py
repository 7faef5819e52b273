"""``kiln explain`` (with ``--profile``), ``kiln check`` and ``kiln diff``: looking inside a model's
compilation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from kiln.cli_sizes import dim_sizes, inside_ranges, run_time_kernels, show_sizes
from kiln.cli_support import (
    console,
    dim_option,
    import_bound,
    json_option,
    out,
    output_file_value,
    precision_option,
    split_ranges,
    target_option,
)
from kiln.lower.kir import engine_calls, kernel_precision
from kiln.output_files import write_output_file


@click.command()
@click.argument("model")
@click.option("-O", "level", type=click.IntRange(0, 3), default=2, show_default=True, help="Optimization level.")
@dim_option("Bind a symbolic dim, e.g. --dim batch=1 (repeatable). [default: every symbol of the inputs = 1]")
@click.option(
    "--print-after",
    "print_after",
    multiple=True,
    help="Print what a stage produced (repeatable; 'all' for every stage): a graph stage (import, specialize, "
    "fold, decompose, passes or any single pass by name) prints the IR; lower the kernel IR; plan-memory the "
    "arena's placements; render the generated source; build the library's path; load the runners.",
)
@target_option()
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
    "--trace",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    callback=output_file_value,
    help="Write one inference's kernels as a Chrome/Perfetto trace (JSON; open in ui.perfetto.dev). Implies --profile.",
)
@click.option(
    "--top", type=click.IntRange(1), default=25, show_default=True, help="Kernels listed by --profile (slowest first)."
)
@json_option("the stages, ops, refusals, plan and printed stages")
@click.option(
    "--arch",
    "arches",
    multiple=True,
    help="Targets that compile ahead (gpu: sm_80, sm_86, sm_89, sm_90): compile every kernel for this "
    "architecture without its hardware and show registers, spills and shared memory (repeatable).",
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
    trace: Path | None,
    top: int,
    target: str,
    precision: str,
    as_json: bool,
    arches: tuple[str, ...],
) -> None:
    """Show what kiln does to MODEL (an .onnx path or a zoo name), stage by stage of the very
    pipeline a compile runs (import, specialize, fold, decompose, passes, lower, plan-memory,
    render, build, load): node counts and timing per stage, the IR after any stage, the fusions
    refused and why, the kernels and host fallbacks (with reasons), the memory plan, what the
    target adds (the gpu target: its Triton kernels) and the generated source."""
    from kiln.backends import backend, parse

    _check_stages(print_after)
    compiled_for = parse(target)
    found = backend(compiled_for.backend)
    offered = found.ahead_arches()
    if arches and not set(arches) <= set(offered):
        can = f"it compiles ahead for {', '.join(offered)}" if offered else "it does not compile ahead"
        raise click.BadParameter(f"{', '.join(arches)} for target {compiled_for.name}: {can}", param_hint="--arch")
    ranges, dims = split_ranges(dims)
    graph, binding = import_bound(model, dims)
    sizes = dim_sizes(graph, ranges)
    binding.update(inside_ranges(sizes, dims))
    options = _explain_options(model, graph, binding, compiled_for, level, disable, precision)
    run_time_kernels(graph, sizes, binding, compiled_for, options, _progress(as_json))
    view = ExplainView(model, compiled_for, options, binding, set(print_after), as_json)
    plan = view.run(graph, kernels)
    sections = found.explain(plan, arches, _progress(as_json)) if plan is not None and plan.source else []
    report = view.summary(graph, plan, sections)
    report["sizes"] = sizes
    if as_json:
        click.echo(json.dumps(report, indent=1, default=str))
        return
    view.show(plan, sections)
    show_sizes(sizes)
    if profile or trace:
        _explain_profile(model, view.seen["specialize"], binding, (runs, top, trace), compiled_for, options)


def _check_stages(print_after: tuple[str, ...]) -> None:
    from kiln.driver.pipeline import PRINTABLE, STAGES

    unknown = set(print_after) - set(PRINTABLE) - {"all"}
    if unknown:
        raise click.BadParameter(
            f"unknown stage(s) {sorted(unknown)}; stages: import, {', '.join(STAGES)}; or a pass: "
            f"{', '.join(p for p in PRINTABLE if p not in STAGES and p != 'import')}",
            param_hint="--print-after",
        )


def _explain_options(model, graph, binding, target, level, disable, precision):  # type: ignore[no-untyped-def]
    """The compile options explain compiles with; int8 calibrated (min-max) on the zoo model's
    example inputs, else random ones."""
    from kiln.driver.options import CompileOptions
    from kiln.driver.pipeline import resolve_precision

    options = CompileOptions.from_env(level=level, disabled=frozenset(disable), plan_cache=False)
    options = options.with_(precision=resolve_precision(precision, target))
    if target.backend == "fpga":  # fixed point: every tensor's range
        from kiln import zoo
        from kiln.driver.fixed_point import tensor_ranges
        from kiln.driver.quantize import samples_from
        from kiln.passes.specialize import specialize

        bound = specialize(graph, binding)
        samples = (
            [zoo.example_inputs(model, seed=s) for s in range(1, 4)]
            if model in zoo.MODELS
            else samples_from(None, bound)
        )
        return options.with_(quantization=tensor_ranges(bound, samples))
    if options.precision == "int8":
        from kiln import zoo
        from kiln.driver.quantize import calibrate, samples_from
        from kiln.passes.specialize import specialize

        bound = specialize(graph, binding)
        if model in zoo.MODELS:
            samples = [zoo.example_inputs(model, seed=seed) for seed in range(1, 11)]
        else:
            samples = samples_from(None, bound)
        options = options.with_(quantization=calibrate(bound, target, options, samples, "minmax"))
    return options


def _progress(quiet: bool):  # type: ignore[no-untyped-def]
    """A ``progress(text)`` context manager: a spinner with the text, or nothing when quiet."""
    import contextlib

    return (lambda text: contextlib.nullcontext()) if quiet else (lambda text: console.status(text))


class ExplainView:
    """``kiln explain``'s account of one compile: a row per stage (nodes, constants, ms), what
    each stage produced, the stages asked for printed."""

    def __init__(self, model, target, options, binding, wanted: set[str], as_json: bool) -> None:  # type: ignore[no-untyped-def]
        import time

        self.model, self.target, self.options, self.binding = model, target, options, binding
        self.wanted, self.as_json = wanted, as_json
        title = f"{model}: the pipeline at -O{options.level}, {options.precision}, for {target.name}"
        self.table = Table(title=f"{title} (dims {binding or 'static'})")
        for column in ("stage", "nodes", "constants", "ms"):
            self.table.add_column(column)
        self.clock = time.perf_counter()
        self.seen: dict[str, object] = {}
        self.last: object = None
        self.rows: list[dict] = []
        self.printed: dict[str, str] = {}
        self.not_loaded = ""

    def observe(self, stage: str, result: object) -> None:
        import time

        from kiln.ir.graph import Graph

        now = time.perf_counter()
        elapsed = f"{(now - self.clock) * 1e3:.0f}"
        self.clock = now
        row: dict = {"stage": stage, "ms": float(elapsed)}
        if isinstance(result, Graph):
            if stage == "fuse":
                self.seen["before fuse"] = self.last
            if stage == "assign_layouts":
                self.seen["before assign_layouts"] = self.last
            self.last = result
            self.table.add_row(stage, str(len(result.nodes)), str(len(result.constants)), elapsed)
            row.update(nodes=len(result.nodes), constants=len(result.constants))
        else:
            self.table.add_row(stage, "", "", elapsed)
        self.rows.append(row)
        self.seen[stage] = result
        if stage in self.wanted or "all" in self.wanted:
            text = self.printed[stage] = _stage_text(stage, result)
            if not self.as_json:
                out.print(f"# after {stage}", markup=False, highlight=False)
                out.print(text, markup=False, highlight=False)

    def run(self, graph, kernels: bool):  # type: ignore[no-untyped-def]
        """The pipeline through load (through the graph stages without ``kernels``); the plan or None."""
        from kiln.driver.pipeline import compile_variant, graph_stages, load
        from kiln.lower.target import TargetError

        self.observe("import", graph)
        if not kernels:
            graph_stages(graph, self.binding, self.target, self.options, self.observe)
            return None
        plan = compile_variant(graph, self.binding, self.target, self.options, observe=self.observe)
        if plan.target is not None and not plan.whole_graph_reason:
            try:
                self.observe("load", load(plan))
            except TargetError as err:  # compiled for hardware this machine lacks (gpu without a CUDA device)
                self.not_loaded = str(err)
        return plan

    def summary(self, graph, plan, sections) -> dict:  # type: ignore[no-untyped-def]
        import collections

        report: dict = {
            "model": self.model,
            "target": self.target.name,
            "level": self.options.level,
            "precision": self.options.precision,
            "dims": self.binding,
            "stages": self.rows,
        }
        if self.not_loaded:
            report["not_loaded"] = self.not_loaded
        before = collections.Counter(n.op for n in graph.nodes)
        after = collections.Counter(n.op for n in self.seen.get("passes", self.last).nodes)  # type: ignore[attr-defined]
        report["ops"] = {op: [before.get(op, 0), after.get(op, 0)] for op in sorted(set(before) | set(after))}
        self.refusals = _refusals(self.seen["before fuse"]) if "before fuse" in self.seen else []
        report["fusion_refused"] = [
            {"node": r.node, "would_join": r.candidate, "reason": r.reason} for r in self.refusals
        ]
        self.layout = None
        if "before assign_layouts" in self.seen:
            from kiln.driver.pipeline import narrow_of
            from kiln.passes.layout import layout_decision

            before_layout = self.seen["before assign_layouts"]
            self.layout = layout_decision(before_layout, self.target, narrow_of(self.options))
            report["layout"] = dataclasses.asdict(self.layout)
        report["printed"] = self.printed
        if plan is not None:
            report["plan"] = _plan_summary(plan)
        report.update({section.key: section.data for section in sections})
        self.report = report
        return report

    def show(self, plan, sections) -> None:  # type: ignore[no-untyped-def]
        if self.not_loaded:
            out.print(f"[yellow]not loaded:[/] {escape(self.not_loaded)}")
        out.print(self.table)
        ops = Table(title="ops imported -> after the passes")
        for column in ("op", "imported", "optimized"):
            ops.add_column(column)
        for op, (imported, kept) in self.report["ops"].items():
            ops.add_row(escape(op), str(imported), str(kept))
        out.print(ops)
        if self.layout is not None:
            out.print(f"layout: {escape(self.layout.text())}")
        if "before fuse" in self.seen:
            _explain_refusals(self.refusals)
        if plan is not None:
            _explain_plan(plan)
        for section in sections:
            show_section(section)


def show_section(section) -> None:  # type: ignore[no-untyped-def]
    """A target's part of the report: its table (when it has rows), then its notes."""
    if section.rows:
        table = Table(title=escape(section.title))
        for column in section.columns:
            table.add_column(escape(column), overflow="fold")
        for row in section.rows:
            table.add_row(*(escape(cell) for cell in row))
        out.print(table)
    for note in section.notes:
        out.print(escape(note), highlight=False)


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
        runners = len(result.runners)  # type: ignore[attr-defined]
        entry = "one native entry (kiln_context_run)" if result.api is not None else "no native entry"  # type: ignore[attr-defined]
        text = f"{runners} segment runner(s) loaded, {entry}"
    elif stage == "verify":
        text = "\n".join(result) or "the kernel IR holds its invariants (checked with KILN_DEBUG=1 only)"  # type: ignore[arg-type]
    else:
        text = str(result) if result else "(nothing: no native segment)"
    return text


def _explain_profile(model: str, graph, binding: dict[str, int], shown: tuple, target, options) -> None:  # type: ignore[no-untyped-def]
    """``--profile``: per-kernel timers where the target's code has them, else ``runs`` runs and
    the target's own account of them (the gpu target: time in transfers and kernels); ``--trace``
    writes the timers as a Chrome/Perfetto trace."""
    runs, top, trace = shown
    from kiln import zoo as models
    from kiln.backends import backend
    from kiln.driver.pipeline import compile_plan, load
    from kiln.driver.profile import matmul_peak, profile_graph
    from kiln.driver.quantize import samples_from

    feeds = models.example_inputs(model, batch=binding.get("batch", 1)) if model in models.MODELS else None
    found = backend(target.backend)
    if not found.kernel_timers:
        if trace is not None:
            raise click.UsageError(f"--trace: target {target.name} has no per-kernel timers")
        executable = load(compile_plan(graph, target, options))
        feeds = feeds or samples_from(None, graph)[0]
        inputs = [feeds[v.name] for v in executable.plan.graph.inputs]
        with console.status(f"running {runs} time(s) on {target.name}..."):
            for _ in range(runs):
                executable.run(inputs)
        show_section(found.run_profile(executable, target))
        return
    with console.status("profiling (timers in every kernel)..."):
        result = profile_graph(graph, feeds, runs=runs, target=target, options=options)
    if trace is not None:
        from kiln.driver.profile import chrome_trace

        write_output_file(trace, json.dumps(chrome_trace(result, runs, f"{model} on {target.name}")), "trace")
        out.print(f"trace written to {trace} (open it in ui.perfetto.dev)")
    with console.status("measuring the matrix-multiply peak..."):
        peak = matmul_peak()
    total = sum(t.seconds for t in result.kernels)
    table = Table(
        title=f"profile: {runs} runs, median {result.run_seconds * 1e3:.2f} ms per run; matrix-multiply peak {peak:.0f} GFLOP/s (measured)"
    )
    for column in ("kernel", "kind", "computes", "ms", "%", "GFLOP/s", "% peak", "schedule"):
        table.add_column(column, overflow="fold")
    paths = _precision_paths(target)
    for timed in sorted(result.kernels, key=lambda t: -t.seconds)[:top]:
        rate = timed.gflops
        table.add_row(
            timed.kernel.name,
            _kind(timed.kernel, paths),
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
        entry = kinds.setdefault(_kind(timed.kernel, paths), [0, 0.0, 0.0])
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


def _refusals(graph):  # type: ignore[no-untyped-def]
    """Why the fusion pass left nodes apart (fuse records a reason for every refusal)."""
    from kiln.passes.fuse import Refusal, fuse

    refusals: list[Refusal] = []
    fuse(graph, refusals)
    return refusals


def _kind(kernel, paths: dict[str, str]) -> str:  # type: ignore[no-untyped-def]
    """A kernel's kind, with its precision when it is not float32 and the hardware path its
    products take (``matmul+epilogue int8 (avx512-vnni)``)."""
    precision = kernel_precision(kernel)
    if precision == "fp32":
        return kernel.kind
    return f"{kernel.kind} {precision}" + (f" ({paths[precision]})" if precision in paths else "")


def _precision_paths(target) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The hardware path of each reduced precision in ``target``'s code on this machine (cpu
    targets; {} for others, whose reduced precision is their compiler's)."""
    if target is None or target.backend != "cpu":
        return {}
    from kiln.backends.cpu import features

    return features.precision_path_names(target.isa, target.native)


def _plan_summary(plan) -> dict:  # type: ignore[no-untyped-def]
    from kiln.runtime.plan import Fallback

    steps = []
    paths = _precision_paths(plan.target)
    for step in plan.steps:
        if isinstance(step, Fallback):
            steps.append({"fallback": step.node.label, "op": step.node.op, "reason": step.reason})
            continue
        for kernel in step.kernels:
            schedule = kernel.schedule
            precision = kernel_precision(kernel)
            steps.append(
                {
                    "kernel": kernel.name,
                    "segment": step.number,
                    "kind": kernel.kind,
                    "precision": precision,
                    "precision_path": paths.get(precision),
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
        "products": [str(path) for path in plan.products],
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
    paths = _precision_paths(plan.target)
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
                _kind(kernel, paths),
                escape("; ".join(kernel.sources)),
                ", ".join(p for p in parts if p) or ("engine (parallel inside)" if engine_calls(kernel) else "serial"),
            )
    out.print(table)
    native = "no host fallback" if plan.is_native else f"{len(plan.fallbacks)} host fallback(s)"
    out.print(f"{sum(len(s.kernels) for s in plan.steps if not isinstance(s, Fallback))} kernels, {native}")
    out.print(f"memory plan: {plan.memory.describe()}")
