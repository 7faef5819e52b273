"""The compile pipeline's table of contents. ``kiln.compile``, ``kiln explain``, ``kiln diff``,
``--profile`` and the tuner all run this one sequence (``compile_plan``), so what explain shows is
what a compile does:

    import -> specialize -> fold -> decompose[target] -> graph passes -> lower[target]
           -> plan memory -> render[target] -> build[target] -> load[target]

Stages marked [target] ask the target's backend (``kiln.backends``). ``observe(stage, result)`` is
called after each stage with what it produced (a Graph, the kernels, the memory plan, the source,
the library path, the loaded runners): ``kiln explain --print-after STAGE`` prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.backends import backend as backend_of
from kiln.backends import parse
from kiln.driver.artifact import source_key
from kiln.driver.options import CompileOptions
from kiln.errors import KilnError
from kiln.ir.graph import Graph, Node
from kiln.ir.types import DType, TensorType
from kiln.lower.families import lowerings
from kiln.lower.kir import Buffer, Kernel, buffers_in
from kiln.lower.kir_verify import verify_kernel
from kiln.lower.lowering import CannotLower, Lowerer
from kiln.lower.memory import MemoryPlan, plan_memory
from kiln.lower.target import Target
from kiln.passes import PASS_NAMES, optimize, specialize
from kiln.passes.decompose import decompose
from kiln.passes.fold_constants import fold_constants
from kiln.passes.fuse import unfuse
from kiln.passes.quantized import quantized_model
from kiln.passes.widen_half import widen_half
from kiln.runtime.plan import Fallback, Plan, Segment

Observer = Callable[[str, Any], None]


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    per_target: bool = False  # the target's backend decides how (or whether) it runs


TOC: tuple[Stage, ...] = (
    Stage("import", "read the model (ONNX, torch) into kiln's typed graph IR"),
    Stage("specialize", "bind symbolic dims to this request's sizes; shapes become static"),
    Stage("fold", "evaluate what depends only on constants (so it needs no decomposition)"),
    Stage("decompose", "inline ONNX functions of ops the target cannot lower whole", per_target=True),
    Stage("passes", "graph passes: " + ", ".join(PASS_NAMES)),
    Stage("lower", "nodes -> kernels of the kernel IR (or host fallbacks, with reasons)", per_target=True),
    Stage("plan-memory", "one arena: intermediates placed by lifetime, engine scratch sized"),
    Stage("render", "kernels -> the target's source (C for cpu)", per_target=True),
    Stage("build", "source -> a loadable library (content-addressed cache)", per_target=True),
    Stage("load", "open the library: one runner per native segment", per_target=True),
)
STAGES = tuple(s.name for s in TOC)
# what --print-after accepts: every stage, and every graph pass by name
PRINTABLE = (*STAGES, *PASS_NAMES)


def describe_node(node: Node, graph: Graph) -> str:
    """How errors after import name a node: label, opset and the types it was compiled for (a
    fused group's opset is that of the ONNX ops it was made from)."""
    domain = "" if node.domain == "kiln" else node.domain
    types = ", ".join(f"%{v.name}: {v.type}" for v in node.inputs if v is not None)
    return f"{node.label} (opset {graph.opsets.get(domain, '?')}) with inputs {types}"


def unplannable(graph: Graph) -> str:
    """Why the graph cannot be planned statically ('' if it can)."""
    for value in graph.values():
        if not isinstance(value.type, TensorType) or not value.type.is_static:
            return f"%{value.name} has type {value.type} (dynamic shapes and sequences run on the reference)"
        if value.type.dtype is DType.STRING:
            return f"%{value.name} holds strings (they run on the reference)"
    for node in graph.nodes:
        if node.domain != "kiln" and any(True for _ in node.subgraphs()):
            return f"node {node.label} has subgraphs (control flow runs on the reference)"
    return ""


def resolve_target(target: Target | str | None) -> Target:
    if target is None:
        return parse("cpu")
    return parse(target) if isinstance(target, str) else target


def chooser(choices: dict | None, target: Target, options: CompileOptions) -> Callable[[str], tuple[dict, str]]:
    """Schedules for tunable kernels: what this compile was given (the tuner's candidates), else
    the tuning database's best (unless ``options.tuned`` is off), else the default."""
    from kiln.driver import tuning_db

    given = choices or {}

    def choose(key: str) -> tuple[dict, str]:
        if key in given:
            return dict(given[key]), "tuned" if given[key] else "default"
        if options.tuned:
            stored = tuning_db.best(key, repr(target))
            if stored:
                return stored, "tuned" if key in tuning_db.TUNED_HERE else "cached"
        return {}, "default"

    return choose


def compile_variant(
    graph: Graph,
    dims: dict[str, int],
    target: Target | str | None = None,
    options: CompileOptions | None = None,
    observe: Observer | None = None,
    **kwargs: Any,
) -> Plan:
    """specialize, then ``compile_plan``."""
    graph = specialize(graph, dims)
    if observe:
        observe("specialize", graph)
    return compile_plan(graph, target, options, observe=observe, **kwargs)


def compile_plan(
    graph: Graph,
    target: Target | str | None = None,
    options: CompileOptions | None = None,
    *,
    prebuilt: dict[str, Path] | None = None,
    choices: dict | None = None,
    build_library: bool = True,
    observe: Observer | None = None,
    expose: Callable[[Graph], Graph] | None = None,
) -> Plan:
    """Compile a graph whose symbolic dims are bound (``specialize``) for ``target`` (default:
    this machine's cpu): fold -> decompose -> passes -> lower -> plan memory -> render -> build.
    ``choices`` maps tuning keys to schedules (the tuner's candidates); without ``build_library``
    nothing is rendered or built (``kiln check`` wants the steps only); ``prebuilt`` maps source
    keys to libraries a loaded artifact brought (no compiler needed); ``expose`` rewrites the graph
    after the passes, before lowering (``kiln diff`` makes every surviving tensor an output)."""
    target = resolve_target(target)
    options = options or CompileOptions.from_env()
    options = options.with_(precision=resolve_precision(options.precision, target))
    stages = ["fold"]
    try:
        return _compile(graph, target, options, prebuilt, choices, build_library, stages, observe, expose)
    except KilnError:
        raise
    except Exception as err:  # an invariant broke: say where
        err.add_note(f"kiln stage: {stages[-1]}")
        raise


def resolve_precision(precision: str, target: Target) -> str:
    """The precision a compile for ``target`` runs at: ``auto`` becomes the best the target
    computes natively here (bf16, else fp32); one it cannot compute is a KilnError saying why."""
    offered = backend_of(target.backend).precisions(target)
    if precision == "auto":
        return "bf16" if offered.get("bf16") == "" else "fp32"
    reason = offered.get(precision, f"unknown precision {precision!r}")
    if reason:
        raise KilnError(f"precision {precision} is not available for target {target.name}: {reason}")
    return precision


def optimized(
    graph: Graph,
    target: Target,
    options: CompileOptions,
    observe: Observer | None = None,
    expose: Callable[[Graph], Graph] | None = None,
    stages: list[str] | None = None,
) -> Graph:
    """The graph stages: fold -> decompose[target] -> graph passes (-> ``expose``)."""
    backend = backend_of(target.backend)
    stages = stages if stages is not None else []

    def done(stage: str, result: Graph) -> None:
        if observe is not None:
            observe(stage, result)

    graph = quantized_model(graph)  # QOperator ops as QDQ; QDQ products marked for the int8 path
    graph = fold_constants(graph)  # what folds away needs no decomposition
    done("fold", graph)
    stages.append("decompose")
    graph = decompose(graph, keep=backend.keeps)
    if backend.widens_half:
        graph = widen_half(graph)
    done("decompose", graph)
    stages.append("passes")
    graph = optimize(graph, level=options.level, disable=options.passes_disabled, after=observe)
    # fusion is target-neutral; a group the target has no engine for is split back into its ops
    # (lowered one by one) rather than run on the host
    graph = unfuse(graph, lambda node: node.attrs.get("kind") != "attention" or "attention" in target.engines)
    if expose is not None:
        graph = expose(graph)
    done("passes", graph)
    return graph


def graph_stages(
    graph: Graph, dims: dict[str, int], target: Target, options: CompileOptions, observe: Observer | None = None
) -> Graph:
    """specialize, then the graph stages (what ``kiln explain --no-kernels`` shows)."""
    graph = specialize(graph, dims)
    if observe:
        observe("specialize", graph)
    return optimized(graph, target, options, observe)


def _compile(graph, target, options, prebuilt, choices, build_library, stages, observe, expose):  # type: ignore[no-untyped-def]
    """compile_plan's body; appends each stage's name to ``stages`` as it starts."""
    backend = backend_of(target.backend)

    def done(stage: str, result: Any) -> None:
        if observe is not None:
            observe(stage, result)

    graph = optimized(graph, target, options, observe, expose, stages)
    reason = unplannable(graph)
    if reason:
        return Plan(graph, [], {}, {}, [], [], {}, MemoryPlan({}, {}, 0, 0), None, "", whole_graph_reason=reason)
    stages.append("lower")
    lowerer = Lowerer(
        graph,
        target,
        lowerings(),
        chooser(choices, target, options),
        options.algorithms_disabled,
        options.precision,
        options.quantization,
    )
    steps: list[Segment | Fallback] = []
    current: list[Kernel] = []
    access: list[tuple[list[Buffer], list[Buffer]]] = []
    for node in graph.nodes:
        try:
            kernels = lowerer.lower(node)
        except KilnError:
            raise
        except CannotLower as err:
            if current:
                steps.append(Segment(len([s for s in steps if isinstance(s, Segment)]), current))
                current = []
            steps.append(Fallback(node, str(err)))
            access.append(
                ([lowerer.buffer(v) for v in node.inputs if v is not None], [lowerer.buffer(v) for v in node.outputs])
            )
            continue
        except Exception as err:  # a kiln bug: name the node it happened on
            err.add_note(f"kiln node: {describe_node(node, graph)}")
            raise
        current.extend(kernels)
        access.extend((k.reads, k.writes) for k in kernels)
    if current:
        steps.append(Segment(len([s for s in steps if isinstance(s, Segment)]), current))
    if options.debug:  # the kernel IR's invariants, static bounds included, before any source
        stages.append("kernel verification")
        problems = [p for s in steps if isinstance(s, Segment) for k in s.kernels for p in verify_kernel(k)]
        if problems:
            raise AssertionError("the kernel IR breaks its invariants:\n" + "\n".join(problems[:20]))
    done("lower", steps)
    roots = {v: lowerer.buffer(v) for v in graph.values()}
    inputs = [roots[v] for v in graph.inputs]
    outputs = [roots[v] for v in graph.outputs]
    # constants no step reads (weights only their packed copies serve) stay out of the plan
    used = {b for reads, writes in access for b in (*reads, *writes)} | set(outputs)
    used.update(b for step in steps if isinstance(step, Segment) for k in step.kernels for b in buffers_in(k.body))
    constants = {
        roots[v]: np.ascontiguousarray(a)
        for v, a in graph.constants.items()
        if lowerer.root(v) is v and roots[v] in used
    }
    constants.update(lowerer.packed)
    fixed = set(inputs) | set(outputs) | set(roots[v] for v in graph.constants) | set(lowerer.packed)
    temps = {b for b in roots.values() if b not in fixed} | set(lowerer.scratch)
    stages.append("plan-memory")
    memory = plan_memory(access, temps)
    memory.scratch_shared, memory.scratch_per_thread = backend.scratch(
        [k for s in steps if isinstance(s, Segment) for k in s.kernels], target
    )
    done("plan-memory", memory)
    table = {lowerer.status: 0}
    for buffer in [*dict.fromkeys(roots.values()), *lowerer.packed, *lowerer.scratch]:
        table.setdefault(buffer, len(table))
    segments = [s.kernels for s in steps if isinstance(s, Segment)]
    stages.append("render")
    source = backend.render(segments, table, options, target) if segments and build_library else ""
    done("render", source)
    library = None
    if source:
        stages.append("build")
        # a loaded artifact brings its libraries: no compiler needed
        library = (prebuilt or {}).get(source_key(source)) or backend.build(source, target, options)
        done("build", library)
    # how a run-time error names a kernel's node: op, opset and the types it was compiled for
    described = {n.label: describe_node(n, graph) for n in graph.nodes}
    labels = {int(k.name[1:]): described.get(k.sources[0], k.sources[0]) for kernels in segments for k in kernels}
    return Plan(graph, steps, table, roots, inputs, outputs, constants, memory, library, source, labels, target=target)
